"""backends.server_process with small Python children: start-up failures quote the log, stop() leaves no
process of the group (grandchildren included), and the harness dying takes the server with it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from backends.server_process import ServerProcess, ServerStartError, free_port, group_members
from harness.loop import shared_loop
from tests.backends.vllm.vllmkit import REPO

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

# A server that starts a grandchild in its group, says so, and never listens.
STUCK = textwrap.dedent(
    """
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"loading weights ... grandchild {child.pid}", flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def _grandchild(log: Path) -> int:
    for _ in range(100):
        if m := re.search(r"grandchild (\d+)\n", log.read_text()):  # the whole line (unbuffered output)
            return int(m.group(1))
        time.sleep(0.1)
    raise AssertionError(f"no grandchild line in {log}")


def test_a_server_that_exits_at_once_fails_with_its_log_tail(tmp_path):
    code = "import sys\nprint('starting')\nsys.exit('error: unrecognized arguments: --frobnicate')"
    server = ServerProcess("the test server", [sys.executable, "-c", code], tmp_path / "s.log")
    server.start()
    with pytest.raises(ServerStartError) as e:
        shared_loop().run(
            server.wait_ready(f"http://127.0.0.1:{free_port()}/health", 60, "--start"), timeout=60
        )
    assert str(e.value) == (
        f"the test server exited with code 1 while starting (log: {tmp_path / 's.log'}); its last lines:\n"
        "starting\nerror: unrecognized arguments: --frobnicate"
    )
    assert group_members(server.pid) == []


def test_the_exception_lines_of_a_long_log_come_first(tmp_path):
    # vLLM's root cause sits in an engine process's traceback, far above the server's own.
    code = (
        "import sys\n"
        "print('(Worker pid=7) ERROR 11-23 [executor.py:953] OSError: header too large')\n"
        "print('(APIServer pid=6) WARNING [utils.py:1] limits can cause `OSError: [Errno 24]`')\n"
        "print('\\n'.join(f'  frame {i}' for i in range(40)))\n"
        "raise RuntimeError('Engine core initialization failed. See root cause above.')\n"
    )
    server = ServerProcess("the test server", [sys.executable, "-c", code], tmp_path / "s.log")
    server.start()
    with pytest.raises(ServerStartError) as e:
        shared_loop().run(
            server.wait_ready(f"http://127.0.0.1:{free_port()}/health", 60, "--start"), timeout=60
        )
    head, tail = str(e.value).split("its last lines:\n")
    assert head.endswith(
        "; its errors:\nOSError: header too large\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert len(tail.splitlines()) == 12 and tail.endswith(
        "RuntimeError: Engine core initialization failed. See root cause above."
    )


def test_a_server_not_ready_in_time_is_stopped_with_everything_it_started(tmp_path):
    server = ServerProcess("the test server", [sys.executable, "-c", STUCK], tmp_path / "s.log")
    server.start()
    grandchild = _grandchild(server.log_path)
    url = f"http://127.0.0.1:{free_port()}/health"
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as e:
        shared_loop().run(server.wait_ready(url, 1.5, "--start-timeout"), timeout=60)
    assert time.monotonic() - t0 < 15
    message = str(e.value)
    assert message.startswith(
        f"the test server did not answer GET {url} within 1.5 s (--start-timeout); stopped it after "
    )
    # every probe of the unused port was refused, and the message says so (counted, not swallowed)
    assert re.search(r"stopped it after [1-9]\d* failed probes, the last: ClientConnectorError: ", message)
    assert "loading weights ... grandchild" in message
    assert server.returncode == -15  # SIGTERM was enough
    assert group_members(server.pid) == [] and not _alive(grandchild)


def test_ready_then_stopped(tmp_path):
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "http.server",
        "--bind",
        "127.0.0.1",
        str(port),
        "--directory",
        str(tmp_path),
    ]
    server = ServerProcess("the test server", cmd, tmp_path / "s.log")
    server.start()
    loop = shared_loop()
    took = loop.run(server.wait_ready(f"http://127.0.0.1:{port}/", 60, "--start"), timeout=60)
    assert 0 <= took < 60 and server.returncode is None
    loop.run(server.stop(), timeout=60)
    assert server.returncode == -15 and group_members(server.pid) == []
    assert loop.run(server.exited(0.1), timeout=5) == -15


def test_a_server_that_ignores_sigterm_is_killed(tmp_path):
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up')\ntime.sleep(600)"
    server = ServerProcess("the test server", [sys.executable, "-c", code], tmp_path / "s.log")
    server.start()
    while "up" not in server.log_path.read_text():
        time.sleep(0.05)
    t0 = time.monotonic()
    shared_loop().run(server.stop(grace_s=0.5), timeout=60)
    assert time.monotonic() - t0 < 10
    assert server.returncode == -9 and group_members(server.pid) == []


# The harness: starts a server from its loop thread, prints the pids, then leaves without stop().
HARNESS = textwrap.dedent(
    """
    import os, re, sys
    from pathlib import Path
    from backends.server_process import ServerProcess
    from harness.loop import shared_loop

    stuck, log, how = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    server = ServerProcess("the test server", [sys.executable, "-c", stuck], log)

    async def start():
        server.start()

    shared_loop().run(start())
    while not (m := re.search(r"grandchild (\\d+)\\n", log.read_text())):
        pass
    print("PIDS", server.pid, m.group(1), flush=True)
    if how == "os._exit":
        os._exit(0)  # no Python cleanup at all: only the death signal is left
    sys.exit(0)  # a normal exit that never reached stop(): the atexit hook
    """
)


@pytest.mark.parametrize("how", ["os._exit", "sys.exit"])
def test_the_server_dies_with_the_harness(tmp_path, how):
    proc = subprocess.run(
        [sys.executable, "-c", HARNESS, STUCK, str(tmp_path / "s.log"), how],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    pids = [int(x) for x in next(x for x in proc.stdout.splitlines() if x.startswith("PIDS ")).split()[1:]]
    # The grandchild gets no signal from the kernel: after os._exit only the server gets its SIGTERM
    # (vLLM's server then stops its own engine processes), so only the server is checked there.
    server, grandchild = pids
    watched = [server] if how == "os._exit" else pids
    deadline = time.monotonic() + 30
    while any(map(_alive, watched)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in watched if _alive(p)]
    if how == "os._exit" and _alive(grandchild):
        os.kill(grandchild, 9)
    assert left == []
