"""Inside the sandbox: isolate, limit, drop privileges, then run one untrusted program.

evaluation/sandbox.py starts this file as `python -I -S sandbox_init.py JOB.json` with fd 0 = the
test's stdin, fd 1/2 = pipes the parent caps, and the status pipe at job["status_fd"]. Of the
project it loads only sandbox_program.py, by path. Three processes, so that the program never
controls its supervisor:

  A (this script) loads the interpreter state, unshares the namespaces and forks B.
  B is pid 1 of the new pid namespace. It builds a new root: an empty tmpfs holding read-only binds
    of only the interpreter's files (job["view"]: its binary, shared libraries and standard
    library), a minimal /dev, a fresh /proc and a private tmpfs as the working directory, and
    pivots into it, so no other file of the host exists for the program. It forks C, enforces the
    wall-clock limit and writes C's fate to the status pipe. When B exits, the kernel kills
    everything left in the namespace.
  C sets the rlimits, becomes a throwaway uid (or drops every capability inside a user namespace),
    closes the status pipe and runs the program.

isolation "namespaces" (root) and "userns" (unprivileged user namespaces) isolate mounts, network,
pids and IPC; "fallback" has none of that and leans on rlimits, a throwaway uid when root, and
Python audit hooks, which a determined program can get around.
"""

import ctypes
import importlib.util
import json
import os
import platform
import signal
import sys


def load_program_module():
    """sandbox_program.py, loaded by path: -I keeps the evaluation package off sys.path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_program.py")
    spec = importlib.util.spec_from_file_location("sandbox_program", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


program = load_program_module()
libc, check, report, SetupError = program.libc, program.check, program.report, program.SetupError

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 0x400, 0x800, 0x200000, 0x1000000
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR, ENOSYS = -100, 0x8000, 0x1, 442, 38
MNT_DETACH = 2
# pivot_root has no libc wrapper; its number differs between architectures.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    check(
        libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {fstype or source} on {target}",
    )


# ---------------------------------------------------------------- A: interpreter state, namespaces
def main() -> None:
    with open(sys.argv[1]) as f:
        job = json.load(f)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    try:
        # The prelude modules are loaded before the filesystem is locked down; the rest of the
        # standard library stays importable from the read-only view. -S: no site-packages.
        exec(program.PRELUDE, {})
        isolation = job["isolation"]
        if isolation != "fallback":
            uid, gid = os.getuid(), os.getgid()
            flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
            check(libc.unshare(flags | (CLONE_NEWUSER if isolation == "userns" else 0)), "unshare")
            if isolation == "userns":
                for name, text in (
                    ("setgroups", "deny"),
                    ("uid_map", f"0 {uid} 1"),
                    ("gid_map", f"0 {gid} 1"),
                ):
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
        pid = os.fork()
    except (SetupError, OSError) as e:
        report(job, {"status": "setup_error", "message": f"A: {e}"})
        os._exit(1)
    if pid == 0:
        supervise(job)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


# ---------------------------------------------------------------- B: supervisor, pid 1
def supervise(job: dict) -> None:
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(PR_SET_DUMPABLE, 0)  # C may not open our status pipe through /proc
        if job["isolation"] != "fallback":
            build_filesystem(job)
        pid = os.fork()
    except (SetupError, OSError) as e:
        report(job, {"status": "setup_error", "message": f"B: {e}"})
        os._exit(1)
    if pid == 0:
        program.run_program(job)

    def on_timeout(signum, frame) -> None:
        report(job, {"status": "timeout"})
        finish(job)

    signal.signal(signal.SIGALRM, on_timeout)
    signal.setitimer(signal.ITIMER_REAL, job["limits"]["wall_s"])
    _, status = os.waitpid(pid, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    if os.WIFSIGNALED(status):
        report(job, {"status": "signaled", "signal": os.WTERMSIG(status)})
    else:
        report(job, {"status": "exited", "code": os.WEXITSTATUS(status)})
    finish(job)


def finish(job: dict) -> None:
    """Leave nothing running: pid 1 exiting kills its namespace; without one, kill by uid or group."""
    if job["isolation"] == "fallback":
        if job["uid"] is not None:
            reap_uid(job["uid"])
        else:
            os.killpg(0, signal.SIGKILL)  # A, B and C share a group the parent made for them
    os._exit(0)


def reap_uid(uid: int) -> None:
    pid = os.fork()
    if pid == 0:
        os.setuid(uid)
        # kill(-1) as the throwaway uid reaches exactly its processes; it reports success even
        # when it reached none, so look in /proc for survivors (a fork may race the first kill).
        for _ in range(100):
            os.kill(-1, signal.SIGKILL)
            if program.count_processes(uid) <= 1:  # only this reaper is left
                os._exit(0)
        os._exit(1)
    os.waitpid(pid, 0)


def build_filesystem(job: dict) -> None:
    """A new root holding only job["view"], /dev, /proc and the working directory; then pivot into it."""
    os.umask(0o022)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted below may propagate to the host
    root = job["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    view = job["view"]
    for d in view["dirs"]:
        os.makedirs(root + d, mode=0o755, exist_ok=True)
        mount(d, root + d, None, MS_BIND | MS_REC)
    for f in view["files"]:
        os.makedirs(os.path.dirname(root + f), mode=0o755, exist_ok=True)
        open(root + f, "w").close()
        mount(f, root + f, None, MS_BIND)
    for link, target in view["links"]:
        os.makedirs(os.path.dirname(root + link), mode=0o755, exist_ok=True)
        os.symlink(target, root + link)
    minimal_dev(root + "/dev")
    for d in (job["workdir"], "/proc"):
        os.makedirs(root + d, mode=0o755, exist_ok=True)
    make_readonly(root)
    owner = 0 if job["uid"] is None else job["uid"]
    mount(
        "tmpfs",
        root + job["workdir"],
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={job['limits']['tmpfs_bytes']},mode=0700,uid={owner},gid={owner}",
    )
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    pivot_root(root)


def pivot_root(root: str) -> None:
    """Make `root` the filesystem root and drop the host's tree (not just hide it, as chroot would)."""
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {platform.machine()}")
    os.chdir(root)
    # pivot_root(".", "."): the old root ends up stacked on the new one, and is detached at once.
    check(libc.syscall(number, b".", b"."), f"pivot_root into {root}")
    check(libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")


DEVICES = ("null", "zero", "full", "random", "urandom")


def minimal_dev(dev: str) -> None:
    """A /dev with only the harmless devices: GPUs (/dev/nvidia*, world-writable) and disks are absent."""
    os.makedirs(dev, mode=0o755, exist_ok=True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"{dev}/{name}", "w").close()
            mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")
    os.symlink("/proc/self/fd", f"{dev}/fd")


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def make_readonly(root: str) -> None:
    """Every mount at or below `root` read-only."""
    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = libc.syscall(
        SYS_MOUNT_SETATTR, AT_FDCWD, root.encode(), AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    if ret == 0:
        return
    if ctypes.get_errno() != ENOSYS:
        check(ret, f"mount_setattr({root}, read-only, recursive)")
    # Kernel < 5.12: remount each mount read-only, keeping the flags a user namespace may not drop.
    keep = {
        "nosuid": MS_NOSUID,
        "nodev": MS_NODEV,
        "noexec": MS_NOEXEC,
        "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME,
        "relatime": MS_RELATIME,
        "strictatime": MS_STRICTATIME,
    }
    with open("/proc/self/mountinfo") as f:
        rows = [line.split() for line in f]
    for row in rows:
        point = row[4].encode().decode("unicode_escape")  # mountinfo writes blanks as \040
        if point != root and not point.startswith(root + "/"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in row[5].split(","):
            flags |= keep.get(opt, 0)
        mount(None, point, None, flags)


if __name__ == "__main__":
    main()
