"""The detached GPU scripts count their failed steps (bench/gpu_detached.sh's failed() and finish): under
the stub binaries of gpu_stubs.py, one step made to crash is named with its exit status in the "step(s)
failed" line after the table, the other steps still run, and the script exits 1; with no crash it exits
0. Before, each of them dropped its steps' exit statuses and exited 0 whatever had crashed (as
sampling_gpu.sh did until v66, tests in test_sampling_gpu_script.py).

The crash is gpu_stubs.py's STUB_FAIL (a python3 call whose words hold it exits 4), its STUB_FAIL_ENV
(one made with that assignment in its environment exits 4: one mode's run, where the calls of all
modes read alike) or a stub that fails one ncu page."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.bench.gpu_stubs import run_script


def failed_lines(p: subprocess.CompletedProcess) -> list[str]:
    return [x for x in p.stdout.splitlines() if " step(s) failed: " in x]


def calls(tmp_path: Path) -> str:
    return (tmp_path / "calls.log").read_text()


def test_the_python3_stubs_answer_and_fail_as_asked(stubs, tmp_path):
    """The crashes these tests inject are the stubs', not the scripts' own (a call nobody answers
    would fail too: exit 3)."""
    sh = ["bash", "-c", 'python3 bench/kernels/attn_chain_gpu.py; echo "rc=$?"']
    out = subprocess.run(sh, env=stubs, capture_output=True, text=True, check=True).stdout
    assert out == "  ctx  alone  chained\n  4096    5.0     6.0\nrc=0\n"
    out = subprocess.run(sh, env={**stubs, "STUB_FAIL": "attn_chain"}, capture_output=True, text=True).stdout
    assert out == "rc=4\n"
    sh[2] = 'GPTOSS_X=1 python3 -m pytest; echo "rc=$?"; python3 -m pytest; echo "rc=$?"'
    out = subprocess.run(
        sh, env={**stubs, "STUB_FAIL_ENV": "GPTOSS_X=1"}, capture_output=True, text=True
    ).stdout
    assert out == "rc=4\n14 passed in 1.0s\nrc=0\n"


# attn_b1_gpu.sh: V20= leaves out the 20b (whose checkpoint goes to /tmp/ck20, after an rm of /mnt/ck120)
ATTN = {"V20": "", "LINEAR": "q,o"}


def test_attn_b1_without_a_crash_exits_0(stubs, tmp_path):
    p = run_script("attn_b1_gpu.sh", stubs, RES=str(tmp_path / "r"), **ATTN)
    assert p.returncode == 0, p.stdout + p.stderr
    assert failed_lines(p) == []
    assert (tmp_path / "r" / "table.txt").read_text() == "compiled tests | 14 passed in 1.0s\n"
    # the benches' tables after finish's: the A/B's last
    assert p.stdout.splitlines()[-2:] == ["default=", "old=attention.LIVE_SPLITS=False"]


@pytest.mark.parametrize(
    ("crash", "step"),
    [
        ({"STUB_FAIL": "attn_chain_gpu.py"}, "attention chains (exit 4)"),
        ({"STUB_FAIL": "linear_gpu.py"}, "decode GEMVs (exit 4)"),
        ({"STUB_FAIL": "decode_ab_gpu.py"}, "decode A/B 120b (exit 4)"),
        # the tests in the background, beside the checkpoint, cut by their limit: timeout's 124
        ({"TESTS_LIMIT": "1", "STUB_TESTS_SEE": "/nonexistent"}, "compiled tests (exit 124)"),
    ],
)
def test_attn_b1_a_crashed_step_fails_the_script(stubs, tmp_path, crash, step):
    p = run_script("attn_b1_gpu.sh", stubs, RES=str(tmp_path / "r"), **ATTN, **crash)
    assert p.returncode == 1, p.stdout + p.stderr
    assert failed_lines(p) == [f"1 step(s) failed: {step}"]
    assert f"FAILED: {step}" in p.stdout
    assert "== chains" in p.stdout  # the benches' tables after finish's, still printed
    log = calls(tmp_path)
    assert "attn_chain_gpu.py" in log and "decode_ab_gpu.py" in log  # the other steps ran


def test_calm_agreement_a_crashed_agreement_run_fails_the_script(stubs, tmp_path):
    res = tmp_path / "res"
    p = run_script("calm_agreement_gpu.sh", stubs, RES=str(res), VLLM="1", STUB_FAIL="--engine agreement")
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "1 step(s) failed: ours agreement (exit 4)"
    table = (res / "table.txt").read_text()
    assert "calm: plugin | greedy agreement" in table and "calm: lora | run_mlperf" in table


def test_calm_agreement_failed_kernel_tests_fail_the_script(stubs, tmp_path):
    p = run_script(
        "calm_agreement_gpu.sh", stubs, RES=str(tmp_path / "res"), KTESTS="1", STUB_FAIL="-m pytest"
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "1 step(s) failed: kernel tests (exit 4)"


@pytest.mark.parametrize(
    ("crash", "step"),
    [
        ({"STUB_FAIL": "20b-nopre"}, "20b-nopre (exit 4)"),  # its --out names it
        ({"STUB_FAIL": "record_specs"}, "record ck (exit 4)"),
        ({"STUB_FAIL": "--batch 5"}, "A/B 2 (exit 4)"),
        ({"STUB_FAIL": "-m pytest", "TESTS": "1"}, "warm-up and precompile tests (exit 4)"),  # background
    ],
)
def test_cold_start_a_crashed_step_fails_the_script(stubs, tmp_path, crash, step):
    (tmp_path / "specs").mkdir()
    cold = {"RES": str(tmp_path / "cold"), "SPECS": str(tmp_path / "specs"), "TESTS": "0"}
    cold |= {"WARM20": "pre nopre", "RUN120": "0", "AB": "--batch 3;--batch 5"}
    p = run_script("cold_start_gpu.sh", stubs, **{**cold, **crash})
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == f"1 step(s) failed: {step}"
    rows = [r.split(" |")[0] for r in (tmp_path / "cold" / "table.txt").read_text().splitlines()]
    assert rows[-4:] == ["20b-pre", "20b-nopre", "A/B 1", "A/B 2"]  # every step ran


AB = {"VLLM": "0", "SWEEP": "0", "TESTS": "none", "N": "20", "MODES": "v3"}


@pytest.mark.parametrize(
    ("crash", "step"),
    [
        ({"ATTN_SWEEP": "1", "STUB_FAIL": "--kv-cache-dtype fp8"}, "attention sweep fp8 (exit 4)"),
        # a NAME=ENV mode runs in the script's shell: its failure counts, its variable stays its own
        ({"STUB_FAIL_ENV": "GPTOSS_L2_PREFETCH=all"}, "ours pf (exit 4)"),
        ({"TESTS": "", "STUB_FAIL": "-m pytest"}, "compiled tests (exit 4)"),  # beside the checkpoint
        # moe_ncu_gpu.sh's own failed step makes its exit status 1, which this one counts
        ({"NCU_STEP": "1", "STUB_FAIL": "--sass-digest"}, "ncu step (exit 1)"),
        ({"SWEEP": "1", "SWEEP_PEER": "0", "STUB_FAIL": "moe_gpu.py"}, "sweep (exit 4)"),
    ],
)
def test_120b_ab_a_crashed_step_fails_the_script(stubs, tmp_path, crash, step):
    res = tmp_path / "ab"
    p = run_script(
        "gptoss_120b_ab_gpu.sh",
        stubs,
        RES=str(res),
        **{**AB, "B1_MODES": "pf=GPTOSS_L2_PREFETCH=all v2", **crash},
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == f"1 step(s) failed: {step}"
    # the batch-1 mode after pf ran, without pf's variable (STUB_FAIL_ENV would have failed it too)
    assert "rope=dflt k=v2 " in (res / "ours_v2.txt").read_text()
    if "ncu" in step:
        assert (res / "ncu.log").read_text().splitlines()[-1] == "1 step(s) failed: sass digest (exit 4)"
    if "tests" in step:  # the tail kept, though the job's status is pytest's
        assert "stub python3: failing -m pytest" in (res / "tests.txt").read_text()


def _pair_env(stubs: dict[str, str]) -> dict[str, str]:
    """Two stub GPUs, the A/B's Offline on v3 alone, DP_N 30."""
    bin_dir = Path(stubs["PATH"].split(":")[0])
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stub'\necho 'GPU 1: stub'\n")
    return {**stubs, "DP_N": "30", "MODES": "v3", "B1_MODES": "", "SWEEP": "0", "TESTS": "none", "N": "20"}


@pytest.mark.parametrize(
    ("crash", "step"),
    [
        # GPU 1's DP=1 run: gptoss_dp_gpu.sh exits 1 for a run that failed
        ({"STUB_FAIL": "run_mlperf.py --backend gptoss --devices cuda:0"}, "GPU 1 dp1 (exit 1)"),
        # GPU 0's A/B, in the background: gptoss_120b_ab_gpu.sh's own failed step
        ({"STUB_FAIL": "--engine gptoss"}, "GPU 0 A/B (exit 1)"),
        ({"STUB_FAIL": "--data-parallel-size 2"}, "DP=2 dp2 (exit 1)"),
    ],
)
def test_pair_a_crashed_run_fails_the_script(stubs, tmp_path, crash, step):
    p = run_script("gptoss_120b_pair_gpu.sh", _pair_env(stubs), **crash)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == f"1 step(s) failed: {step}"
    log = calls(tmp_path)
    assert "--engine vllm" in log and "--data-parallel-size 2" in log  # GPU 1's vLLM and DP=2 ran


def test_pair_without_a_crash_exits_0(stubs, tmp_path):
    p = run_script("gptoss_120b_pair_gpu.sh", _pair_env(stubs))
    assert p.returncode == 0, p.stdout + p.stderr
    assert failed_lines(p) == []
    assert "== v3 (GPU 0) beside vLLM (GPU 1)" in (Path(stubs["HOME"]) / "pair" / "table.txt").read_text()


I10 = {"TESTS": "tests/a.py", "PARTS": "ops"}


def test_issue10_without_a_crash_exits_0(stubs, tmp_path):
    res = tmp_path / "i10"
    p = run_script("issue10_table_gpu.sh", stubs, RES=str(res), **I10)
    assert p.returncode == 0, p.stdout + p.stderr
    assert failed_lines(p) == []
    assert (res / "table.txt").read_text().splitlines() == [
        "compiled tests | 14 passed in 1.0s",
        "kernels_gpu exit | 0",
        "kernels_gpu heads-first exit | 0",
        "attn_sweep exit | 0",
        "read_ceiling exit | 0",
    ]
    out = p.stdout.splitlines()
    # the attention rows again in the heads-first order (its variable set for that run only), the sweep
    at = out.index("== attention, heads first")
    assert out[at + 2 : at + 5] == [
        "attn-decode    B=64 ctx=8192 full  380.0 heads_first=1",
        "== decode attention sweep",
        "attention sweep: bench/kernels/attn_sweep.py",
    ]
    assert out[-2:] == ["== read ceiling", "   17.6 MB case  3900 GB/s"]
    # ORDER=0: neither
    p = run_script("issue10_table_gpu.sh", stubs, RES=str(res), **I10, ORDER="0")
    assert p.returncode == 0 and "== attention, heads first" not in p.stdout
    assert "heads-first" not in (res / "table.txt").read_text()


@pytest.mark.parametrize(
    ("crash", "step", "rows"),
    [
        ("read_ceiling_gpu.py", "read_ceiling (exit 4)", ["kernels_gpu exit | 0", "read_ceiling exit | 4"]),
        ("--only ops", "kernels_gpu (exit 4)", ["kernels_gpu exit | 4", "read_ceiling exit | 0"]),
        ("-m pytest", "compiled tests (exit 4)", ["kernels_gpu exit | 0", "read_ceiling exit | 0"]),
    ],
)
def test_issue10_a_crashed_step_fails_the_script(stubs, tmp_path, crash, step, rows):
    res = tmp_path / "i10"
    p = run_script("issue10_table_gpu.sh", stubs, RES=str(res), **I10, STUB_FAIL=crash, ORDER="0")
    assert p.returncode == 1, p.stdout + p.stderr
    assert failed_lines(p) == [f"1 step(s) failed: {step}"]
    assert (res / "table.txt").read_text().splitlines()[1:] == rows
    assert "== kernel table" in p.stdout and "== read ceiling" in p.stdout  # still printed after finish


@pytest.mark.parametrize(
    ("crash", "step", "row"),
    [
        ("--only attn", "kernels_gpu heads-first (exit 4)", "kernels_gpu heads-first exit | 4"),
        ("attn_sweep.py", "attn_sweep (exit 4)", "attn_sweep exit | 4"),
    ],
)
def test_issue10_a_crashed_attention_order_step_fails_the_script(stubs, tmp_path, crash, step, row):
    res = tmp_path / "i10"
    p = run_script("issue10_table_gpu.sh", stubs, RES=str(res), **I10, STUB_FAIL=crash)
    assert p.returncode == 1, p.stdout + p.stderr
    assert failed_lines(p) == [f"1 step(s) failed: {step}"]
    rows = (res / "table.txt").read_text().splitlines()
    assert row in rows and rows[-1] == "read_ceiling exit | 0"  # the steps after it ran


@pytest.mark.parametrize(
    ("parts", "crash", "failed", "ran"),
    [
        # one mode's runs (in the script's shell now) fail; the other mode's ran without its variable
        (
            "offline",
            {"STUB_FAIL_ENV": "GPTOSS_X=1"},
            "1 step(s) failed: offline a (exit 4)",
            "offline 1000x1024x1024 b | offline",
        ),
        (
            "b1 c16",
            {"STUB_FAIL_ENV": "GPTOSS_X=1"},
            "3 step(s) failed: b1 a r1 (exit 4),b1 a r2 (exit 4),c16 a (exit 4)",
            "gptoss b1 128x512 b r2 | batch-1 decode",
        ),
        # through | tail | tee: pytest's status (pipefail), not tee's
        (
            "tests kernels",
            {"STUB_FAIL": "-m pytest"},
            "1 step(s) failed: compiled tests (exit 4)",
            "flat P = 4",
        ),
        (
            "kernels attn",
            {"STUB_FAIL": "moe_gpu.py"},
            "1 step(s) failed: kernels (exit 4)",
            "attention sweep: ",
        ),
        (
            "c16 vllm",
            {"STUB_FAIL": "--parts vllm"},
            "1 step(s) failed: vllm c16 (exit 4)",
            "vllm b1 + offline | ",
        ),
        (  # gpu_detached.sh's vllm_engine (cold_start and moe_large call it too)
            "c16 vllm",
            {"STUB_FAIL": "--engine vllm"},
            "1 step(s) failed: vllm b1 + offline (exit 4)",
            "vllm c16 lora | ",
        ),
    ],
)
def test_moe_flat_a_crashed_step_fails_the_script(stubs, tmp_path, parts, crash, failed, ran):
    res = tmp_path / "flat"
    p = run_script("moe_flat_gpu.sh", stubs, RES=str(res), PARTS=parts, MODES="a=GPTOSS_X=1 b=", **crash)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == failed
    assert ran in p.stdout  # a step after the failed one, said or in the table


@pytest.mark.parametrize(
    ("parts", "crash", "step"),
    [
        ("tests kernels", {"STUB_FAIL": "-m pytest"}, "compiled tests (exit 4)"),
        ("offline", {"STUB_FAIL_ENV": "GPTOSS_MOE_V3_TMA=down"}, "offline tma r1 (exit 4)"),
        ("ogs", {"STUB_FAIL": "--variants vllm"}, "ogs (exit 4)"),
    ],
)
def test_moe_large_a_crashed_step_fails_the_script(stubs, tmp_path, parts, crash, step):
    res = tmp_path / "large"
    p = run_script(
        "moe_large_gpu.sh", stubs, RES=str(res), PARTS=parts, ROUNDS="1", ORDER="default tma ptr", **crash
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == f"1 step(s) failed: {step}"
    if parts == "offline":  # the mode after it ran
        assert "gptoss offline 1000x1024x1024 ptr r1 | offline" in (res / "table.txt").read_text()
    if parts.startswith("tests"):
        assert (res / "tests_full.txt").read_text() == "stub python3: failing -m pytest " + (
            "-q -n 0 -p no:cacheprovider tests/gptoss/kernels/test_moe_v3.py tests/gptoss/kernels/"
            "test_moe_v3_tiles.py tests/gptoss/kernels/test_moe_v3_tma.py tests/gptoss/kernels/"
            "test_moe_v3_wtma.py tests/gptoss/kernels/test_moe_tile_rows.py -k gpu and not v3ds\n"
        )


def test_moe_ncu_a_failed_digest_fails_the_script(stubs, tmp_path):
    p = run_script("moe_ncu_gpu.sh", stubs, RES=str(tmp_path / "ncu"), STUB_FAIL="--sass-digest")
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "1 step(s) failed: sass digest (exit 4)"
    assert "== table" in p.stdout  # finish's, in place of the "done" said last before


def test_moe_ncu_a_failed_ncu_page_fails_the_script(stubs, tmp_path):
    """ncu's details page fails (exit 2): said with its log as before, and counted; the source page
    still runs."""
    ncu = Path(stubs["PATH"].split(":")[0]) / "ncu"
    ncu.rename(ncu.with_name("ncu-base"))
    ncu.write_text(
        '#!/bin/sh\ncase "$*" in *"--page details"*) echo "==ERR== no GPU" >&2; exit 2 ;; esac\n'
        'exec "$(dirname "$0")/ncu-base" "$@"\n'
    )
    ncu.chmod(0o755)
    p = run_script("moe_ncu_gpu.sh", stubs, RES=str(tmp_path / "ncu"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "1 step(s) failed: ncu (exit 2)"
    assert "==ERR== no GPU" in p.stdout and "--page source" in calls(tmp_path)


def test_vllm_plugin_without_a_crash_exits_0(stubs, tmp_path):
    p = run_script("vllm_plugin_gpu.sh", stubs, RES=str(tmp_path / "plug"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert failed_lines(p) == []
    engines = [c.split("--engines ")[1].split()[0] for c in calls(tmp_path).splitlines() if "--engines" in c]
    assert engines == ["gptoss", "vllm"]


@pytest.mark.parametrize(
    ("crash", "step"),
    [
        ("--engines vllm", "plugin bench vllm (exit 4)"),
        ("-m pytest", "compiled tests (exit 4)"),  # through | tail | tee
        ("--table", "table (exit 4)"),
    ],
)
def test_vllm_plugin_a_crashed_step_fails_the_script(stubs, tmp_path, crash, step):
    p = run_script("vllm_plugin_gpu.sh", stubs, RES=str(tmp_path / "plug"), STUB_FAIL=crash)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == f"1 step(s) failed: {step}"
    assert "--engines gptoss" in calls(tmp_path)
