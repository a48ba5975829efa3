"""bench/kernels/sampling_sass.py compiles the Gumbel draw's pass 1 for sm_90a on CPU at each SCREEN
mode: the screened modes put the logs in a branch of their own, which leaves a step that skips it
well under half the unscreened step's instructions; mode 2 alone shares the row's best (atomics and
volatile loads). A screen that stopped skipping the logs, or a mode 1 that touched memory, fails."""

from __future__ import annotations

import re

import pytest

from tests.bench.gpu_stubs import run_compiler_tool

LINE = re.compile(
    r"^screen (\d)( cut)?: regs (\d+), loop ([\d.]+) an element, (.*); atomics (\d+), volatile loads (\d+)$",
    re.M,
)


@pytest.mark.parametrize("cut", [False, True])
def test_the_screened_step_skips_the_logs_and_only_mode_2_shares(cut: bool):
    p = run_compiler_tool("sampling_sass.py", *(["--cut"] if cut else []))
    assert p.returncode == 0, p.stderr
    modes = {int(m[1]): m for m in LINE.finditer(p.stdout)}
    assert sorted(modes) == [0, 1, 2] and all(bool(m[2]) == cut for m in modes.values())
    unscreened = float(modes[0][4])
    assert modes[0][5] == "logs on every sampled step" and modes[0].group(6, 7) == ("0", "0")
    for mode in (1, 2):
        logs, rest = map(float, re.fullmatch(r"logs branch ([\d.]+), rest ([\d.]+)", modes[mode][5]).groups())
        assert logs > 0.6 * unscreened  # the logs' polynomials: what a skipped step saves
        assert rest < 0.6 * unscreened  # the hash, the bound and the load: what every step pays
    assert modes[1].group(6, 7) == ("0", "0")
    assert int(modes[2][6]) >= 1 and int(modes[2][7]) >= 1
