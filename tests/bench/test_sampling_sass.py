"""bench/kernels/sampling_sass.py compiles the Gumbel draw's pass 1 for sm_90a on CPU at each SCREEN
mode: the screened modes put the logs in a branch of their own, which leaves a step that skips it
well under half the unscreened step's instructions; mode 2 alone shares the row's best (atomics and
volatile loads). A screen that stopped skipping the logs, or a mode 1 that touched memory, fails."""

from __future__ import annotations

import re

import pytest

from tests.bench.gpu_stubs import run_compiler_tool

LINE = re.compile(
    r"^screen (\d)( cut)?( bf16)?: regs (\d+), loop ([\d.]+) an element, (.*); "
    r"atomics (\d+), volatile loads (\d+)$",
    re.M,
)


@pytest.mark.parametrize("flags", [[], ["--cut"], ["--bf16"]])
def test_the_screened_step_skips_the_logs_and_only_mode_2_shares(flags: list[str]):
    p = run_compiler_tool("sampling_sass.py", *flags)
    assert p.returncode == 0, p.stderr
    modes = {int(m[1]): m for m in LINE.finditer(p.stdout)}
    assert sorted(modes) == [0, 1, 2]
    assert all((bool(m[2]), bool(m[3])) == ("--cut" in flags, "--bf16" in flags) for m in modes.values())
    unscreened = float(modes[0][5])
    assert modes[0][6] == "logs on every sampled step" and modes[0].group(7, 8) == ("0", "0")
    for mode in (1, 2):
        logs, rest = map(float, re.fullmatch(r"logs branch ([\d.]+), rest ([\d.]+)", modes[mode][6]).groups())
        assert logs > 0.6 * unscreened  # the logs' polynomials: what a skipped step saves
        assert rest < 0.6 * unscreened  # the hash, the bound and the load: what every step pays
    assert modes[1].group(7, 8) == ("0", "0")
    assert int(modes[2][7]) >= 1 and int(modes[2][8]) >= 1
