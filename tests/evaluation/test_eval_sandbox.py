"""Generated code in the sandbox: each hostile program is contained, fails within its limit, and
leaves nothing behind. Runs in every isolation this machine offers (namespaces and fallback here)."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import evaluation
from evaluation.sandbox import GRACE_S, UID_RANGE, Limits, Sandbox, Status, detect_isolation

ISOLATIONS = sorted({detect_isolation(), "fallback"})
LIMITS = Limits(wall_s=1.5, memory_bytes=512 << 20, max_procs=8, file_bytes=1 << 20, stdout_bytes=1 << 20)


def leftovers(base: Path) -> list[str]:
    """Processes of sandboxes under `base`: by their command line, or (a program's own children) by
    the working directory in their environment. Not by uid alone: sandboxes of another test run on
    the same machine use throwaway uids too."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            uid = os.stat(f"/proc/{pid}").st_uid
            environ = Path(f"/proc/{pid}/environ").read_bytes() if UID_RANGE[0] <= uid < UID_RANGE[1] else b""
        except OSError:  # noqa: S112 - the process exited while we looked: not a leftover
            continue
        if str(base) in cmdline or str(base).encode() in environ:
            found.append(f"{pid} uid={uid} {cmdline[:80]}")
    return found


@pytest.fixture(params=ISOLATIONS)
def sandbox(request, tmp_path):
    base = tmp_path / "cases"
    base.mkdir()
    mounts = Path("/proc/self/mountinfo").read_text()
    yield Sandbox(LIMITS, request.param, base_dir=base)
    assert leftovers(base) == [], "a sandboxed process outlived its run"
    assert list(base.iterdir()) == [], "a case directory was left behind"
    assert Path("/proc/self/mountinfo").read_text() == mounts, "the host's mounts changed"


def within_limit(result) -> bool:
    """Ended by the sandbox's own limits: by its deadline (the parent's backstop) at the latest, not
    by running on. Not tighter: starting the sandbox on a busy machine takes time of its own."""
    return result.wall_s < LIMITS.wall_s + GRACE_S + 5.0


def test_ordinary_programs_run(sandbox):
    r = sandbox.run("import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))", stdin=b"1 2 3\n")
    assert (r.status, r.stdout) == (Status.OK, b"6\n")
    r = sandbox.run(
        "class Solution:\n    def f(self, a, b):\n        print('noise')\n        return (a + b, [a])",
        fn_name="f",
        args=[1, 2],
    )
    assert (r.status, r.stdout) == (Status.OK, b'{"value": [3, [1]]}')
    assert b"noise" in r.stderr
    r = sandbox.run("import threading\nthreading.Thread(target=lambda: print(gcd(12, 18))).start()")
    assert (r.status, r.stdout) == (Status.OK, b"6\n")  # prelude's `from math import *`, thread joined
    r = sandbox.run("open('scratch.txt', 'w').write('ok'); print(open('scratch.txt').read())")
    assert (r.status, r.stdout) == (Status.OK, b"ok\n")
    as_main = "import __main__, dataclasses, typing\n@dataclasses.dataclass\nclass P:\n    x: 'int'\n"
    as_main += "print(typing.get_type_hints(P)['x'].__name__, hasattr(__main__, 'libc'), __name__)"
    r = sandbox.run(as_main)
    assert (r.status, r.stdout) == (
        Status.OK,
        b"int False __main__\n",
    )  # the sandbox's globals are out of reach
    streams = "open('/dev/null', 'w').write('x')\nopen('/dev/stdout', 'w').write(open('/dev/stdin').read())"
    r = sandbox.run(streams, stdin=b"echo\n")
    assert (r.status, r.stdout) == (Status.OK, b"echo\n")


def test_infinite_loop_times_out(sandbox):
    r = sandbox.run("while True:\n    pass")
    assert r.status is Status.TIMEOUT and within_limit(r)


def test_sleeping_forever_times_out_on_the_wall_clock(sandbox):
    r = sandbox.run("import time\ntime.sleep(3600)")
    assert r.status is Status.TIMEOUT and within_limit(r)


def test_fork_bomb_is_contained(sandbox):
    r = sandbox.run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except Exception:\n        pass"
    )
    assert r.status is Status.TIMEOUT and within_limit(r)


def test_process_count_is_capped(sandbox):
    code = """
import os, time
n = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except Exception as e:
    print(type(e).__name__)
print(n)
"""
    r = sandbox.run(code)
    assert r.status is Status.OK and within_limit(r)
    error, count = r.stdout.decode().split()
    if sandbox.isolation == "fallback":
        assert (error, count) == ("PermissionError", "0")  # forking is refused outright
    else:
        assert error == "BlockingIOError" and int(count) < LIMITS.max_procs
    # The sleeping children died with the sandbox: the fixture finds no leftovers.


def test_ten_gigabyte_allocation_fails(sandbox):
    r = sandbox.run("x = bytearray(10 * 2**30)\nprint(len(x))")
    assert r.status is Status.RUNTIME_ERROR and r.detail == "MemoryError" and within_limit(r)
    # Growing step by step hits the same wall (a roomier clock: the pages are really touched).
    roomy = Sandbox(Limits(wall_s=20, memory_bytes=256 << 20), sandbox.isolation, base_dir=sandbox.base_dir)
    r = roomy.run("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))")
    assert r.status is Status.RUNTIME_ERROR and r.detail == "MemoryError"


def test_writing_outside_its_directory_fails(sandbox, tmp_path):
    targets = [
        tmp_path / "escaped.txt",
        Path(__file__).parent / "escaped.txt",
        Path("/tmp/escaped-sandbox.txt"),
    ]
    code = (
        "import sys\nfor p in sys.argv_targets:\n    try:\n        open(p, 'w').write('x')\n"
        "        print('WROTE', p)\n    except OSError as e:\n        print(type(e).__name__)\n"
    )
    r = sandbox.run(code.replace("sys.argv_targets", repr([str(t) for t in targets])))
    assert r.status is Status.OK
    assert b"WROTE" not in r.stdout and len(r.stdout.splitlines()) == 3
    assert not any(t.exists() for t in targets)


def test_file_size_is_capped(sandbox):
    r = sandbox.run("open('big', 'wb').write(b'x' * (4 << 20))")
    assert r.status is Status.RUNTIME_ERROR and "File too large" in r.detail


def test_network_is_unreachable(sandbox):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:  # noqa: S112 - the listener's timeout only lets the loop see `stop`
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    attempts = f"""
import subprocess, sys
def attempt(name, fn):
    try:
        fn()
        print(name, 'CONNECTED')
    except BaseException as e:
        print(name, type(e).__name__)
def plain():
    import socket
    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'leak')
def raw():
    import _socket
    s = _socket.socket()
    s.connect(('127.0.0.1', {port}))
def child():
    code = "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)"
    subprocess.run([sys.executable, '-c', code], check=True, capture_output=True)
attempt('plain', plain)
attempt('raw', raw)
attempt('child', child)
"""
    try:
        r = sandbox.run(attempts)
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert r.status is Status.OK
    lines = r.stdout.decode().splitlines()
    assert [line.split()[0] for line in lines] == ["plain", "raw", "child"]
    assert not any("CONNECTED" in line for line in lines)
    assert accepted == []


def test_killing_its_parent_or_other_processes_fails(sandbox):
    sentinel = subprocess.Popen(["sleep", "30"])
    try:
        code = f"""
import os, signal
for pid in (os.getppid(), 1, {os.getpid()}, {sentinel.pid}):
    try:
        os.kill(pid, signal.SIGKILL)
        print(pid, 'KILLED')
    except OSError as e:
        print(pid, type(e).__name__)
"""
        r = sandbox.run(code)
        assert r.status is Status.OK  # the supervisor survived and reported normally
        assert b"KILLED" not in r.stdout and len(r.stdout.splitlines()) == 4
        assert sentinel.poll() is None
    finally:
        sentinel.kill()
        sentinel.wait()


def test_huge_stdout_is_cut_off(sandbox):
    r = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert r.status is Status.OUTPUT_LIMIT and within_limit(r)
    assert len(r.stdout) <= LIMITS.stdout_bytes


def test_daemon_that_escapes_its_session_is_killed(sandbox):
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
    code += "print('parent done')"
    r = sandbox.run(code)
    if sandbox.isolation == "fallback":
        assert r.status is Status.RUNTIME_ERROR and "os.fork is not allowed" in r.detail
    else:
        assert (r.status, r.stdout) == (Status.OK, b"parent done\n")
    time.sleep(0.1)
    # The fixture checks that the daemon is gone.


def test_signals_and_exit_codes(sandbox):
    r = sandbox.run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    if sandbox.isolation == "fallback":
        assert r.status is Status.RUNTIME_ERROR and "os.kill is not allowed" in r.detail
    else:
        assert (r.status, r.signal) == (Status.RUNTIME_ERROR, signal.SIGSEGV)
    r = sandbox.run("raise ValueError('boom')")
    assert (r.status, r.exit_code, r.detail) == (Status.RUNTIME_ERROR, 1, "ValueError: boom")
    r = sandbox.run("print('partial')\nexit(3)")  # LiveCodeBench counts exit() as a normal end
    assert (r.status, r.stdout) == (Status.OK, b"partial\n")
    r = sandbox.run("def broken(:\n    pass")
    assert r.status is Status.RUNTIME_ERROR and "SyntaxError" in r.detail


# Generated code relies on these (LiveCodeBench's prelude and beyond); several are extension
# modules in lib-dynload that load shared libraries (libmpdec, libz, libcrypto, libsqlite3, libffi).
STDLIB_MODULES = (
    "json",
    "collections",
    "itertools",
    "heapq",
    "math",
    "re",
    "bisect",
    "functools",
    "decimal",
    "fractions",
    "statistics",
    "datetime",
    "array",
    "struct",
    "random",
    "string",
    "typing",
    "dataclasses",
    "enum",
    "operator",
    "copy",
    "io",
    "zlib",
    "hashlib",
    "sqlite3",
    "unicodedata",
    "threading",
    "queue",
    "textwrap",
    "pickle",
    "csv",
)


def test_the_program_sees_only_the_interpreter(sandbox, tmp_path):
    """No file of the host outside the interpreter's own is there: not /etc, not this checkout, not a
    world-readable temp file; the standard library still imports and sys.executable still starts."""
    if sandbox.isolation == "fallback":
        pytest.skip("a private filesystem needs a mount namespace (the fallback says so when chosen)")
    from evaluation.sandbox import interpreter_view

    exposed = tmp_path / "exposed.txt"
    exposed.write_text("secret")
    exposed.chmod(0o644)
    outside = [
        str(exposed),
        __file__,
        str(Path(evaluation.__file__).with_name("sandbox.py")),
        "/etc/passwd",
        "/etc/hostname",
        str(Path(sys.prefix) / "pyvenv.cfg"),
        "/proc/1/environ",
    ]
    probe = f"""
import os, sys, subprocess
for path in {outside!r}:
    try:
        open(path, 'rb').read()
        print('READ', path)
    except OSError as e:
        print(type(e).__name__)
import {", ".join(STDLIB_MODULES)}
print(decimal.Decimal(1) / 7, zlib.crc32(b'x'), hashlib.sha256(b'x').hexdigest()[:8],
      sqlite3.sqlite_version > '3')
print(sorted(os.listdir('/')))
print(subprocess.run([sys.executable, '-c', 'import heapq; print(heapq.nsmallest(1, [3, 2]))'],
                     capture_output=True, text=True).stdout.strip())
try:
    import numpy
    print('numpy')
except ImportError as e:
    print(type(e).__name__)
"""
    r = sandbox.run(probe)
    assert r.status is Status.OK, r.stderr.decode()[-2000:]
    lines = r.stdout.decode().splitlines()
    # /proc/1 is the sandbox's own supervisor, which the throwaway uid may not read.
    assert lines[: len(outside)] == ["FileNotFoundError"] * (len(outside) - 1) + ["PermissionError"], lines
    assert lines[len(outside)] == "0.1428571428571428571428571429 2363233923 2d711642 True"
    view = interpreter_view()
    tops = {p.split("/")[1] for p in [*view["dirs"], *view["files"], *(link for link, _ in view["links"])]}
    tops |= {"dev", "proc", str(sandbox.base_dir.resolve()).split("/")[1]}
    assert lines[len(outside) + 1] == str(sorted(tops))
    assert lines[len(outside) + 2 :] == [
        "[2]",
        "ModuleNotFoundError",
    ]  # the interpreter runs; no site-packages
    r = sandbox.run("import os\nprint(sorted(os.listdir('/dev')))")
    devices = ["fd", "full", "null", "random", "stderr", "stdin", "stdout", "urandom", "zero"]
    assert r.stdout.decode() == f"{devices}\n"  # no GPUs, no disks


def test_the_interpreters_view_is_its_stdlib_binary_and_libraries():
    from evaluation.sandbox import interpreter_view, stdlib_path

    view = interpreter_view()
    stdlib = Path(os.path.dirname(os.__file__)).resolve()
    assert [Path(d) for d in view["dirs"]] == [stdlib]  # the standard library, lib-dynload inside it
    assert os.path.realpath(sys.executable) in view["files"]
    assert all(Path(f).is_file() and f == os.path.realpath(f) for f in view["files"])
    assert any(Path(f).name.startswith("libc.so") for f in view["files"])
    assert not any("site-packages" in p for p in [*view["dirs"], *view["files"], *stdlib_path()])
    if os.path.islink(sys.executable):  # a venv's bin/python: the same chain of links inside
        assert (sys.executable, os.readlink(sys.executable)) in view["links"]


def test_hiding_a_file_the_interpreter_needs_is_refused():
    if detect_isolation() == "fallback":
        pytest.skip("needs a mount namespace")
    with pytest.raises(ValueError, match="cannot hide .*: it is among the interpreter's files"):
        Sandbox(LIMITS, detect_isolation(), hide=(os.__file__,))


@pytest.mark.skipif(os.geteuid() != 0, reason="as root, a user namespace is available too")
def test_user_namespace_isolation_shows_only_the_interpreter_too(tmp_path):
    sandbox = Sandbox(LIMITS, "userns", base_dir=tmp_path)
    probe = f"""
import errno, json, os
print(os.path.exists({__file__!r}), os.path.exists('/etc/passwd'), os.getuid())
try:
    open(json.__file__, 'a')  # root of the user namespace, but the view is mounted read-only
except OSError as e:
    print(errno.errorcode[e.errno])
"""
    r = sandbox.run(probe)
    assert (r.status, r.stdout) == (Status.OK, b"False False 0\nEROFS\n"), r.stderr.decode()[-2000:]


def test_fallback_refuses_the_unaudited_way_to_fork(tmp_path):
    sandbox = Sandbox(LIMITS, "fallback", base_dir=tmp_path)
    r = sandbox.run("import _posixsubprocess\n_posixsubprocess.fork_exec(*[None] * 23)")
    assert r.status is Status.RUNTIME_ERROR
    assert r.detail == "PermissionError: sandbox: starting processes is not allowed"
    fresh = "import sys\ndel sys.modules['_posixsubprocess']\nimport _posixsubprocess"
    r = sandbox.run(fresh)
    assert r.detail == "ImportError: sandbox: importing _posixsubprocess is not allowed"
