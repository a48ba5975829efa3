"""The detached GPU scripts (bench/moe_large_gpu.sh, moe_flat_gpu.sh, moe_ncu_gpu.sh over
bench/gpu_detached.sh, decode_variants_gpu.sh, gptoss_120b_pair_gpu.sh and gptoss_dp_gpu.sh) run end to
end on CPU with the stub binaries of gpu_stubs.py standing in for the GPU's python3, nvidia-smi and ncu:
a script that breaks costs a device call, so its control flow is tested here (the stubs answer as the
real tools print; the picker and the ncu digest are the real ones). gptoss_120b_ab_gpu.sh's tests are in
test_gptoss_120b_ab_script.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.gpu_stubs import run_script


def test_moe_large_picks_tiles_and_runs_offline_with_them(stubs, tmp_path):
    res = tmp_path / "large"
    p = run_script("moe_large_gpu.sh", stubs, RES=str(res), KMS="1024", ROUNDS="1", ORDER="default picked")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (res / "done").exists()
    table = (res / "table.txt").read_text().splitlines()
    assert table[0] == "picked GPTOSS_MOE_V3_TILES | gate_up@128=128,128,128,8,4,half"
    assert "  1024 vllm             622.5 - -    1293.0  22.6%" in table
    assert any(
        r.startswith("gptoss offline 1000x1024x1024 default r1 |")
        and r.endswith("tiles=dflt wtma=auto unmasked=0")
        for r in table
    )
    picked = [r for r in table if r.startswith("gptoss offline 1000x1024x1024 picked r1 |")]
    assert len(picked) == 1 and picked[0].endswith(
        "tiles=gate_up@128=128,128,128,8,4,half wtma=auto unmasked=0"
    )
    assert table[-1].startswith("vllm b1 + offline | workload x offline")
    assert "--rounds 3" in (tmp_path / "calls.log").read_text()  # KROUNDS' default


def test_moe_large_offline_modes_set_the_tma_switch(stubs, tmp_path):
    res = tmp_path / "large"
    p = run_script(
        "moe_large_gpu.sh",
        stubs,
        RES=str(res),
        PARTS="offline",
        ROUNDS="1",
        ORDER="tma default tma-all wtma wtma-all ptr unmasked bogus",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [r for r in (res / "table.txt").read_text().splitlines() if r.startswith("gptoss offline")]
    assert [
        (
            r.split(" |")[0].split()[-2],
            r.split(" tma=")[1].split()[0],
            r.split("wtma=")[1].split()[0],
            r.split("unmasked=")[1].split()[0],
        )
        for r in rows
    ] == [
        ("tma", "down", "auto", "0"),
        ("default", "0", "auto", "0"),  # the engine's defaults
        ("tma-all", "all", "auto", "0"),
        ("wtma", "0", "1", "0"),
        ("wtma-all", "all", "1", "0"),
        ("ptr", "0", "0", "0"),
        ("unmasked", "0", "auto", "1"),  # GPTOSS_MOE_UNMASKED_ROWS=1
    ]
    assert (
        "unknown ORDER mode bogus (default, picked, tma, tma-all, wtma, wtma-all, ptr, unmasked)" in p.stdout
    )


def test_moe_large_kernel_parts_make_no_checkpoint(stubs, tmp_path):
    """The kernel bench makes its own weights: no 20b written (at a 120b's CKPT it would land there)."""
    p = run_script("moe_large_gpu.sh", stubs, RES=str(tmp_path / "r"), PARTS="tests kernels", KEXPERTS="128")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "r" / "tests_full.txt").read_text() == "14 passed in 1.0s\n"  # the whole log kept
    assert not (tmp_path / "ck").exists()
    calls = (tmp_path / "calls.log").read_text()
    assert "make_checkpoint" not in calls and "--experts 128" in calls
    assert "tests/gptoss/kernels/test_moe_v3_wtma.py" in calls


def test_a_missing_vllm_bench_script_stops_at_once(stubs, tmp_path):
    p = run_script("moe_large_gpu.sh", stubs, RES=str(tmp_path / "r"), VLLM_SCRIPT=str(tmp_path / "nope.py"))
    assert p.returncode == 1
    assert f"no {tmp_path / 'nope.py'}: set VLLM_SCRIPT to the payload's bench_vllm.py" in p.stdout
    assert (tmp_path / "r" / "done").exists()  # the poller is released whatever the ending
    assert (
        not (tmp_path / "calls.log").exists() or "gptoss_gpu.py" not in (tmp_path / "calls.log").read_text()
    )


def test_moe_flat_modes_and_vllm_rows(stubs, tmp_path):
    res = tmp_path / "flat"
    p = run_script("moe_flat_gpu.sh", stubs, RES=str(res), PARTS="offline vllm", MODES="a=GPTOSS_X=1 b=")
    assert p.returncode == 0, p.stdout + p.stderr
    table = (res / "table.txt").read_text().splitlines()
    assert [r.split(" |")[0] for r in table] == [
        "gptoss offline 1000x1024x1024 a",
        "gptoss offline 1000x1024x1024 b",
        "vllm c16 lora",
        "vllm b1 + offline",
    ]
    assert (res / "lora_vllm").is_dir()  # the stub wrote where --out said, not into the checkout


def test_moe_ncu_digests_what_ncu_wrote(stubs, tmp_path):
    res = tmp_path / "ncu"
    p = run_script("moe_ncu_gpu.sh", stubs, RES=str(res))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = (res / "table.txt").read_text().splitlines()
    assert lines[0].split()[:3] == ["id", "kernel", "us"]
    assert lines[1].split()[:3] == ["0", "_gate_up_v3_kernel", "480.2"]
    assert lines[2].startswith("kernel table 0: 2 instructions, 800 samples")
    assert lines[4] == "  opcodes: BAR 75.0%, DEPBAR 25.0%"
    assert lines[5].split()[:3] == ["75.0%", "00001160", "BAR.SYNC.DEFER_BLOCKING"]


def test_moe_ncu_step_target_profiles_the_engines_decode_step(stubs, tmp_path):
    """TARGET=step: ncu over profile_gpu.py --ncu (one decode step at BATCH) on CKPT, made if missing,
    without waiting for vLLM; one line a kernel name; the source page of the MoE GEMMs."""
    res = tmp_path / "step"
    p = run_script("moe_ncu_gpu.sh", stubs, RES=str(res), TARGET="step", BATCH="2")
    assert p.returncode == 0, p.stdout + p.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    step = f"profile_gpu.py --model-path {tmp_path / 'ck'} --batch 2 --steps 1 --ncu"
    profiled = [c for c in calls if c.startswith("ncu --profile-from-start off")]
    assert len(profiled) == 2 and all(c.endswith(step) for c in profiled)
    assert "--page details" in profiled[0] and "-k regex:gate_up|down -c 2" in profiled[1]
    assert any("make_checkpoint --preset 20b" in c for c in calls)  # CKPT was missing
    assert "waiting for vLLM" not in p.stdout and not any("moe_ncu.py --ms" in c for c in calls)
    lines = (res / "table.txt").read_text().splitlines()
    assert lines[0].split()[:3] == ["n", "kernel", "us"]
    assert lines[1].split()[:3] == ["1", "_gate_up_v3_kernel", "480.2"]


def test_decode_variants_keep_commas_inside_a_value(stubs, tmp_path):
    res = tmp_path / "d20"
    variants = "dd=GPTOSS_MOE_KERNELS=v3,GPTOSS_V3_DEC_DOWN_TILES=16,32,128,2,2,4 plain="
    p = run_script(
        "decode_variants_gpu.sh",
        stubs,
        OUT=str(res),
        TESTS="none",
        AGREEMENT="0",
        PROFILE_VARIANTS="dd",
        VARIANTS=variants,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = (res / "decode_table.txt").read_text().splitlines()
    assert [r.split()[0] + " " + " ".join(r.split()[-2:]) for r in rows] == [
        "dd: k=v3 tiles=16,32,128,2,2,4",
        "plain: k=auto tiles=dflt",
    ]
    # the profiles: one without PDL and one with it (PROFILE_PDL's default), under the variant's values
    for pdl in (0, 1):
        text = (res / f"profile_b1_dd_pdl{pdl}.txt").read_text()
        assert text == f"profile pdl={pdl} tiles=16,32,128,2,2,4\n"


def _pair(env: dict[str, str], **extra: str) -> str:
    """gptoss_120b_pair_gpu.sh on two stub GPUs, DP_N 30; its final table."""
    bin_dir = Path(env["PATH"].split(":")[0])
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stub'\necho 'GPU 1: stub'\n")
    p = run_script("gptoss_120b_pair_gpu.sh", env, DP_N="30", **extra)
    assert p.returncode == 0, p.stdout + p.stderr
    return (Path(env["HOME"]) / "pair" / "table.txt").read_text()


def _run_mlperf_flags(tmp_path: Path) -> list[str]:
    """Each run_mlperf call's flags before --model-path, in the order the stub saw them."""
    calls = (tmp_path / "calls.log").read_text().splitlines()
    return [
        c.split("--model-path")[0].split("run_mlperf.py ")[1].strip() for c in calls if "run_mlperf.py" in c
    ]


def test_pair_runs_dp1_beside_our_ab_then_both_gpu_runs_of_dp2_runs(stubs, tmp_path):
    table = _pair(stubs, MODES="v3", B1_MODES="", SWEEP="0", TESTS="none", N="20", DP2_RUNS="dp2 vllm-dp2")
    calls = (tmp_path / "calls.log").read_text().splitlines()
    runs = _run_mlperf_flags(tmp_path)
    assert runs == [
        "--backend gptoss --devices cuda:0",
        "--backend gptoss --data-parallel-size 2 --device cuda",
        "--backend vllm --data-parallel-size 2",
    ]
    engines = [c.split("--engine ")[1].split()[0] for c in calls if "gptoss_gpu.py" in c]
    assert sorted(engines) == ["gptoss", "vllm"]  # ours on GPU 0, vLLM on GPU 1, one run each
    assert "== v3 (GPU 0) beside vLLM (GPU 1)" in table


def test_pair_gpu0_dp_runs_fp8_dp1_beside_dp1_and_counts_each_runs_leftovers(stubs, tmp_path):
    table = _pair(stubs, PEER="0", GPU0_DP="dp1-fp8", DP2_RUNS="dp2 dp2-fp8", STUB_LEAVE="1")
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert not [c for c in calls if "gptoss_gpu.py" in c]  # GPU 0 ran no A/B
    runs = _run_mlperf_flags(tmp_path)
    assert sorted(runs[:2]) == [  # the two DP=1 runs at once, one a GPU
        "--backend gptoss --devices cuda:0",
        "--backend gptoss --devices cuda:0 --kv-cache-dtype fp8",
    ]
    assert runs[2:] == [
        "--backend gptoss --data-parallel-size 2 --device cuda",
        "--backend gptoss --data-parallel-size 2 --device cuda --kv-cache-dtype fp8",
    ]
    rows = [json.loads(line) for line in (Path(stubs["HOME"]) / "dpres" / "results.jsonl").open()]
    assert sorted(r["run"] for r in rows) == ["dp1", "dp1-fp8", "dp2", "dp2-fp8"]
    # each run's group holds the one process its stub left, though the other GPU's ran at the same time
    assert [r["procs_left"] for r in rows] == [1, 1, 1, 1]
    assert "dp1-fp8" in table and "dp2-fp8" in table


def test_dp_refuses_an_unknown_run(stubs, tmp_path):
    p = run_script("gptoss_dp_gpu.sh", stubs, "10", "4", "4", "dp3-fp8", OUT=str(tmp_path / "dp"))
    assert p.returncode == 2
    assert (
        "unknown run dp3-fp8 (dp1, dp2, vllm-tp2, vllm-dp2, vllm-tp2ep, each with or without -fp8)"
        in p.stdout
    )
