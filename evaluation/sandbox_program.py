"""Stage C of the sandbox: limits, privileges and Python-level guards, then the program itself.

Loaded by path from sandbox_init.py (never imported by the evaluator). The expected outputs never
enter this process: a stdin program's stdout, or a function's return value as JSON, is compared by
the parent.
"""

import ctypes
import json
import os
import resource
import sys
import types

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
# LiveCodeBench runs every solution after these star imports; generated code relies on them.
PRELUDE_MODULES = (  # fmt: skip
    "string",
    "re",
    "datetime",
    "collections",
    "heapq",
    "bisect",
    "copy",
    "math",
    "random",
    "statistics",
    "itertools",
    "functools",
    "operator",
    "io",
    "sys",
    "json",
    "typing",
)
PRELUDE = "\n".join(f"import {m}\nfrom {m} import *" for m in PRELUDE_MODULES)

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def check(ret: int, what: str) -> None:
    if ret != 0:
        raise SetupError(f"{what}: {os.strerror(ctypes.get_errno())}")


def report(job: dict, record: dict) -> None:
    os.write(job["status_fd"], (json.dumps(record) + "\n").encode())


def run_program(job: dict) -> None:
    limits = job["limits"]
    try:
        nproc = limits["max_procs"]
        if job["isolation"] == "fallback" and job["uid"] is None:
            nproc += count_processes(os.getuid())  # RLIMIT_NPROC counts all of this user's processes
        for name, value in (
            ("RLIMIT_CPU", limits["cpu_s"]),
            ("RLIMIT_AS", limits["memory_bytes"]),
            ("RLIMIT_FSIZE", limits["file_bytes"]),
            ("RLIMIT_NOFILE", limits["open_files"]),
            ("RLIMIT_CORE", 0),
            ("RLIMIT_NPROC", nproc),
        ):
            hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, SIGKILL a second later
            resource.setrlimit(getattr(resource, name), (value, hard))
        workdir = job["workdir"]
        if job["uid"] is not None:
            if job["isolation"] == "fallback":
                os.chown(workdir, job["uid"], job["uid"])
            for fd in (1, 2):  # our pipes: let the program reopen them as /dev/stdout, /dev/stderr
                os.fchown(fd, job["uid"], job["uid"])
            os.setgroups([])
            os.setgid(job["uid"])
            os.setuid(job["uid"])
        elif os.geteuid() == 0:  # root of a user namespace, or root whose interpreter others cannot read
            drop_capabilities()
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        os.chdir(workdir)
        os.umask(0o077)
        os.environ.clear()
        os.environ.update(
            PATH="/usr/local/bin:/usr/bin:/bin",
            HOME=workdir,
            TMPDIR=workdir,
            LANG="C.UTF-8",
            OMP_NUM_THREADS="1",
            OPENBLAS_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
        )
        sys.set_int_max_str_digits(50000)
        sys.setrecursionlimit(50000)
        # The program is __main__ (dataclasses, typing and pickle look classes up there), and
        # `import __main__` no longer reaches the sandbox's own globals.
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        namespace = main.__dict__
        exec(PRELUDE, namespace)
    except (SetupError, OSError, ValueError) as e:
        report(job, {"status": "setup_error", "message": f"C: {e}"})
        os._exit(1)
    os.close(job["status_fd"])
    sys.addaudithook(make_guard(job))
    if job["kind"] == "stdin":
        os._exit(run_stdin(job["code"], namespace))
    os._exit(run_functional(job["code"], namespace, job["fn_name"], job["args"]))


def count_processes(uid: int) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        try:
            n += entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid
        except OSError:  # noqa: S112 - exited while we looked
            continue
    return n


def drop_capabilities() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two words each; all zero
    check(libc.capset(header, data), "capset")


# What a program may write outside its directory without namespaces: its own streams, /dev/null.
WRITABLE = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/")


def make_guard(job: dict):
    """Python-level refusals. Always: sockets and ctypes. Without namespaces also child processes,
    signals and writes outside the working directory, which the kernel refuses when namespaces exist."""
    banned = {"socket.__new__", "socket.connect", "socket.bind", "ctypes.dlopen", "ctypes.call_function"}
    fallback = job["isolation"] == "fallback"
    if fallback:
        banned |= {"os.fork", "os.forkpty", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
                   "os.spawn", "os.kill", "os.killpg", "os.chmod", "os.chown"}  # fmt: skip
    banned_modules = set()
    if fallback:
        # _posixsubprocess.fork_exec forks without an audit event: disarm it, and refuse a fresh copy.
        import _posixsubprocess

        def refuse(*args, **kwargs):
            raise PermissionError("sandbox: starting processes is not allowed")

        _posixsubprocess.fork_exec = refuse
        banned_modules.add("_posixsubprocess")
    workdir = job["workdir"] + "/"
    writes = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.symlink", "os.link"}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def hook(event: str, args: tuple) -> None:
        if event in banned or (event == "import" and args[0] in banned_modules):
            what = f"importing {args[0]}" if event == "import" else event
            raise (ImportError if event.startswith(("ctypes", "import")) else PermissionError)(
                f"sandbox: {what} is not allowed"
            )
        writing = event in writes or (event == "open" and isinstance(args[2], int) and args[2] & write_flags)
        if fallback and writing and isinstance(args[0], (str, bytes)):
            full = os.path.abspath(os.fsdecode(args[0]))
            if not (full + "/").startswith(workdir) and not full.startswith(WRITABLE):
                raise PermissionError(f"sandbox: writing {full} is not allowed")

    return hook


def run_stdin(code: str, namespace: dict) -> int:
    import threading
    import traceback

    rc = 0
    try:
        exec(compile(code, "solution.py", "exec"), namespace)
    except SystemExit:  # noqa: S110 - as in LiveCodeBench, exit() ends the program normally whatever its code
        pass
    except BaseException:  # noqa: BLE001 - the traceback on stderr, exit code 1
        traceback.print_exc()
        rc = 1
    for t in threading.enumerate():  # competitive code often runs main() in a big-stack thread
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001 - the output did not all get out: a failed run, and why
        traceback.print_exc()
        return 1
    return rc


def run_functional(code: str, namespace: dict, fn_name: str, args: list) -> int:
    import traceback

    out = os.dup(1)
    os.dup2(2, 1)  # the program's own prints must not mix with the result
    try:
        exec(compile(code, "solution.py", "exec"), namespace)
        target = namespace["Solution"]() if "Solution" in namespace else None
        method = getattr(target, fn_name) if target is not None else namespace[fn_name]
        value = method(*args)
        if isinstance(value, tuple):  # as LiveCodeBench: a tuple answer may stand for a list
            value = list(value)
        payload = json.dumps({"value": plain(value)})
        sys.stdout.flush()  # its prints, to stderr now
    except BaseException:  # noqa: BLE001 - the traceback on stderr, exit code 1
        traceback.print_exc()
        return 1
    os.write(out, payload.encode())
    return 0


def plain(value):
    """A JSON-able copy of a returned value; anything else becomes a marker no answer can equal."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: plain(v) for k, v in value.items()}
    return {"__unserializable__": type(value).__name__}
