"""Run untrusted generated code: one contained process per test case, capped and always killed."""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
ISOLATIONS = ("namespaces", "userns", "fallback")
# Throwaway uids for the program when we are root: random, so two concurrent runs never share
# an RLIMIT_NPROC budget or may signal each other.
UID_RANGE = (1_000_000_000, 2_000_000_000)
GRACE_S = 5.0  # the parent's backstop beyond the supervisor's own wall-clock limit
# With namespaces the program's whole filesystem is interpreter_view() (read-only), its working
# directory, a /dev with only null, zero, full, random and urandom, and a /proc of its own pid
# namespace. Nothing else of the host exists there: no other project's files, no site-packages.


@dataclass(frozen=True, slots=True)
class Limits:
    """Per test case. wall_s 60 is the MLPerf gpt-oss reference's LiveCodeBench timeout per test."""

    wall_s: float = 60.0
    memory_bytes: int = 4 << 30  # RLIMIT_AS
    max_procs: int = 16  # RLIMIT_NPROC; threads count too
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE
    tmpfs_bytes: int = 64 << 20  # the private working directory
    open_files: int = 64
    stdout_bytes: int = 64 << 20
    stderr_bytes: int = 16 << 10  # kept for diagnostics; the rest is read and dropped

    def __post_init__(self) -> None:
        if self.wall_s <= 0:
            raise ValueError(f"wall_s must be > 0, got {self.wall_s}")
        for name in ("memory_bytes", "max_procs", "file_bytes", "tmpfs_bytes", "open_files", "stdout_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def cpu_s(self) -> int:
        return math.ceil(self.wall_s)


class Status(enum.StrEnum):
    OK = "ok"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    OUTPUT_LIMIT = "output_limit"
    SANDBOX_ERROR = "sandbox_error"  # our machinery failed, not the program


@dataclass(frozen=True, slots=True)
class RunResult:
    status: Status
    stdout: bytes
    stderr: bytes
    exit_code: int | None = None
    signal: int | None = None
    detail: str = ""
    wall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Sandbox:
    """Runs programs under `limits` with the strongest isolation this machine allows."""

    limits: Limits = field(default_factory=Limits)
    isolation: str = "auto"
    base_dir: Path | None = None
    hide: tuple[str, ...] = ()  # files the program must not see, e.g. the expected outputs

    def __post_init__(self) -> None:
        if self.isolation == "auto":
            object.__setattr__(self, "isolation", detect_isolation())
        if self.isolation not in ISOLATIONS:
            raise ValueError(
                f"isolation must be auto or one of {', '.join(ISOLATIONS)}, got {self.isolation!r}"
            )
        if self.isolation != "fallback":  # everything outside the view is invisible anyway
            for path in self.hide:
                if inside_view(path):
                    raise ValueError(
                        f"cannot hide {path} from generated code: it is among the interpreter's files"
                    )

    def run(
        self, code: str, *, stdin: bytes = b"", fn_name: str | None = None, args: list | None = None
    ) -> RunResult:
        """Run `code` as a script reading `stdin`, or, with fn_name, call that function (or
        Solution().fn_name) with `args`; the returned value comes back as JSON on stdout."""
        case_dir = Path(tempfile.mkdtemp(prefix="sandbox-", dir=self.base_dir))
        try:
            return self._run(case_dir, code, stdin, fn_name, args)
        finally:
            shutil.rmtree(case_dir, ignore_errors=True)

    def _run(
        self, case_dir: Path, code: str, stdin: bytes, fn_name: str | None, args: list | None
    ) -> RunResult:
        os.chmod(case_dir, 0o711)  # fallback: the throwaway uid must reach work/ below, nothing else here
        workdir = case_dir / "work"
        workdir.mkdir(mode=0o700)
        (case_dir / "root").mkdir(mode=0o700)  # namespaces: where the sandbox's own root is built
        status_r, status_w = os.pipe()
        job = {
            "isolation": self.isolation,
            "uid": throwaway_uid(self.isolation),
            "workdir": str(workdir),
            "root": str(case_dir / "root"),
            "view": interpreter_view() if self.isolation != "fallback" else None,
            "status_fd": status_w,
            "kind": "stdin" if fn_name is None else "functional",
            "code": code,
            "fn_name": fn_name,
            "args": args if args is not None else [],
            "limits": {**asdict(self.limits), "cpu_s": self.limits.cpu_s},
        }
        # stdin is readable by the program's uid so that it may reopen it (open("/dev/stdin")).
        for name, data, mode in (("job.json", json.dumps(job).encode(), 0o600), ("stdin", stdin, 0o644)):
            fd = os.open(case_dir / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        started = time.monotonic()
        with open(case_dir / "stdin", "rb") as stdin_file:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(INIT_SCRIPT), str(case_dir / "job.json")],
                    stdin=stdin_file,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(status_w,),
                    start_new_session=True,
                    cwd=case_dir,
                )
            finally:
                os.close(status_w)
        with os.fdopen(status_r, "rb") as status_pipe:
            out, err, status, killed_for = collect(
                proc, status_pipe, self.limits, started + self.limits.wall_s + GRACE_S
            )
        elapsed = time.monotonic() - started
        return interpret(out, err, status, killed_for, elapsed)


def collect(proc: subprocess.Popen, status_pipe, limits: Limits, deadline: float):
    """Read stdout, stderr and the status pipe until all close; kill the group on a cap or the deadline."""
    buffers = {"out": bytearray(), "err": bytearray(), "status": bytearray()}
    caps = {"out": limits.stdout_bytes, "err": limits.stderr_bytes, "status": 1 << 16}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    sel.register(status_pipe, selectors.EVENT_READ, "status")
    killed_for = None
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                killed_for = killed_for or "deadline"
                kill_group(proc)
                break
            for key, _ in sel.select(timeout=remaining):
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = buffers[key.data]
                if key.data == "out" and len(buf) + len(chunk) > caps["out"]:
                    killed_for = "stdout"
                    kill_group(proc)
                    sel.unregister(key.fileobj)
                    continue
                if len(buf) < caps[key.data]:
                    buf += chunk[: caps[key.data] - len(buf)]
    finally:
        sel.close()
        kill_group(proc)  # normally a no-op: the supervisor already cleaned up
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    records = [json.loads(line) for line in bytes(buffers["status"]).splitlines() if line.strip()]
    return bytes(buffers["out"]), bytes(buffers["err"]), records[-1] if records else None, killed_for


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(proc.pid, signal.SIGKILL)


def interpret(
    out: bytes, err: bytes, status: dict | None, killed_for: str | None, elapsed: float
) -> RunResult:
    def result(s: Status, detail: str = "", **kw) -> RunResult:
        return RunResult(s, out, err, detail=detail, wall_s=elapsed, **kw)

    if killed_for == "stdout":
        return result(Status.OUTPUT_LIMIT, "stdout exceeded its cap")
    if status is None:
        if killed_for == "deadline":
            return result(Status.TIMEOUT, "killed by the parent's backstop deadline")
        return result(Status.SANDBOX_ERROR, "the supervisor exited without a status")
    match status["status"]:
        case "setup_error":
            return result(Status.SANDBOX_ERROR, status["message"])
        case "timeout":
            return result(Status.TIMEOUT, "wall-clock limit")
        case "signaled":
            sig = status["signal"]
            if sig == signal.SIGXCPU:
                return result(Status.TIMEOUT, "CPU time limit (SIGXCPU)", signal=sig)
            return result(Status.RUNTIME_ERROR, f"killed by {signal.Signals(sig).name}", signal=sig)
        case "exited" if status["code"] == 0:
            return result(Status.OK, exit_code=0)
        case "exited":
            tail = err.decode(errors="replace").strip().splitlines()
            return result(
                Status.RUNTIME_ERROR,
                tail[-1] if tail else f"exit code {status['code']}",
                exit_code=status["code"],
            )
    return result(Status.SANDBOX_ERROR, f"unknown status {status}")


def throwaway_uid(isolation: str) -> int | None:
    """A fresh uid for the program when we are root. Without a mount namespace it must be able to
    read the interpreter; if it cannot (pyenv under /root), the program stays root without any
    capability instead, behind the fallback's audit hooks. A user namespace maps only our own uid,
    so there the program is its root, with every capability dropped."""
    if os.geteuid() != 0 or isolation == "userns":
        return None
    if isolation == "fallback" and not interpreter_readable_by_others():
        return None
    return UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])


@functools.cache
def interpreter_readable_by_others() -> bool:
    return readable_by_others(stdlib_path())


def readable_by_others(paths: list[str]) -> bool:
    for path in paths:
        if not path or not os.path.isdir(path):
            continue
        p = Path(path)
        if any(a.stat().st_mode & 0o001 == 0 for a in (p, *p.parents)):
            return False
    return True


@functools.cache
def stdlib_path() -> list[str]:
    """sys.path of `python -I -S`, the sandbox's interpreter: the standard library and lib-dynload."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import json, sys; print(json.dumps(sys.path))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in json.loads(out) if p and os.path.isdir(p)]


@functools.cache
def interpreter_view() -> dict:
    """What a sandboxed program sees of the host, read-only: {"dirs", "files", "links"}.

    The standard library; the interpreter binary (so sys.executable still starts); the shared
    libraries of both (from ldd), with ld.so.cache to find them; and every symlink on the way to
    each (a venv's bin/python, /lib -> usr/lib), recreated as it is.
    """
    dirs, files, links = set(), set(), {}

    def add(path: str, into: set) -> None:
        hops, real = resolve_links(path)
        links.update(hops)
        into.add(real)

    for d in stdlib_path():
        add(d, dirs)
    add(sys.executable, files)
    binaries = [os.path.realpath(sys.executable)]
    for d in dirs:
        binaries += sorted(str(p) for p in Path(d).glob("lib-dynload/*.so"))
    for lib in shared_libraries(binaries):
        add(lib, files)
    if os.path.isfile("/etc/ld.so.cache"):
        add("/etc/ld.so.cache", files)
    # Outermost directories only; files and links inside a bound directory come with it.
    dirs = {d for d in dirs if not any(o != d and _inside(d, o) for o in dirs)}
    files = {f for f in files if not any(_inside(f, d) for d in dirs)}
    links = {k: v for k, v in links.items() if not any(_inside(k, d) for d in dirs)}
    return {"dirs": sorted(dirs), "files": sorted(files), "links": sorted(links.items())}


def inside_view(path: str) -> bool:
    view = interpreter_view()
    real = os.path.realpath(path)
    return any(_inside(real, d) for d in view["dirs"]) or real in view["files"]


def _inside(p: str, d: str) -> bool:
    return p == d or p.startswith(d.rstrip("/") + "/")


def resolve_links(path: str) -> tuple[dict[str, str], str]:
    """Every symlink met on the way to `path` ({link: target}), and the real path it ends at."""
    hops: dict[str, str] = {}
    path = os.path.abspath(path)
    for _ in range(64):
        parts = path.split("/")
        for i in range(2, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if os.path.islink(prefix):
                target = os.readlink(prefix)
                hops[prefix] = target
                path = os.path.normpath(os.path.join(os.path.dirname(prefix), target, *parts[i:]))
                break
        else:
            return hops, path
    raise OSError(f"too many levels of symbolic links in {path}")


def shared_libraries(binaries: list[str]) -> list[str]:
    """The shared libraries the binaries load (their paths as the loader finds them), by ldd."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise RuntimeError(
            "ldd is not installed: the sandbox cannot tell which libraries the interpreter needs"
        )
    out = subprocess.run([ldd, *binaries], capture_output=True, text=True, check=False).stdout
    libs = set()
    for line in out.splitlines():
        words = line.split()
        if "=>" in words and len(words) > words.index("=>") + 1:
            path = words[words.index("=>") + 1]  # "libc.so.6 => /lib/.../libc.so.6 (0x...)"
        elif words and words[0].startswith("/") and not words[0].endswith(":"):
            path = words[0]  # the loader: "/lib64/ld-linux-x86-64.so.2 (0x...)"
        else:
            continue
        if path.startswith("/") and os.path.isfile(path):
            libs.add(path)
    return sorted(libs)


_detected: str | None = None


def detect_isolation() -> str:
    """The strongest isolation that works here: namespaces as root, else user namespaces, else fallback."""
    global _detected
    if _detected is None:
        candidates = ("namespaces",) if os.geteuid() == 0 else ("userns",)
        for isolation in candidates:
            probe = Sandbox(Limits(wall_s=10), isolation).run("print(6 * 7)")
            if probe.status is Status.OK and probe.stdout == b"42\n":
                _detected = isolation
                break
        else:
            _detected = "fallback"
            print(
                "sandbox: namespaces are not available here; generated code runs with rlimits, "
                "a throwaway uid when root, and Python audit hooks only, and can read the host's files",
                file=sys.stderr,
            )
    return _detected
