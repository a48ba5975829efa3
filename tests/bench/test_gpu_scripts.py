"""The detached GPU scripts (bench/moe_large_gpu.sh, moe_flat_gpu.sh, moe_ncu_gpu.sh over
bench/gpu_detached.sh) run end to end on CPU with stub binaries standing in for the GPU's python3,
nvidia-smi and ncu: a script that breaks costs a device call, so its control flow is tested here
(the stubs answer as the real tools print; the picker and the ncu digest are the real ones)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PYTHON_STUB = r"""#!/usr/bin/env bash
last=${*: -1}
echo "$*" >> "$STUB_LOG"
case "$*" in
  *"import mlperf_loadgen"*) exit 0 ;;
  -|"- "*) exec "$REAL_PYTHON" "$@" ;;  # the scripts' inline tables, read from stdin
  *rand_dataset.py*) ;;
  # no run.json: the dp table shows the run as an error; STUB_LEAVE leaves a process behind in its group
  *run_mlperf.py*) [ -z "${STUB_LEAVE:-}" ] || (sleep 20 > /dev/null 2>&1 &) ;;
  *make_checkpoint*|*make_lora*)
    mkdir -p "$last"; echo '{}' > "$last/config.json"; echo '{}' > "$last/adapter_config.json" ;;
  *moe_pick.py*|*"moe_ncu.py --digest"*|*"moe_ncu.py --sass-digest"*) exec "$REAL_PYTHON" "$@" ;;
  *"-m pytest"*)  # (tmp paths hold "pytest" too); STUB_TESTS_SEE: a file the tests wait 5 s to see
    if [ -n "${STUB_TESTS_SEE:-}" ]; then
      for _ in $(seq 50); do [ -e "$STUB_TESTS_SEE" ] && break; sleep 0.1; done
      [ -e "$STUB_TESTS_SEE" ] || { echo "1 failed: no $STUB_TESTS_SEE"; exit 1; }
    fi
    echo "14 passed in 1.0s" ;;
  *moe_gpu.py*--no-vllm*)
    echo "     M variant       graph us   gate_up      down  eager us    HBM"
    echo "  1024 v3               805.8     520.8     275.0     815.9  17.5%"
    echo "  1024 L-gu128k128s4   1190.0     470.0     272.8    1190.5  11.8%  spread 1.0%"
    echo "  1024 L-dn128k64s4     841.1     517.1     304.1     847.1  16.8%" ;;
  *moe_gpu.py*) echo "     M variant       graph us   gate_up      down  eager us    HBM"
                echo "  1024 vllm             622.5 - -    1293.0  22.6%" ;;
  *gptoss_lora_gpu.py*)  # the folder after --out (a pattern over "$*" would act on each word)
    prev=; for a in "$@"; do [ "$prev" = --out ] && mkdir -p "$a"; prev=$a; done; echo lora ;;
  *profile_gpu.py*) echo "profile pdl=${GPTOSS_PDL:-unset} tiles=${GPTOSS_V3_DEC_DOWN_TILES:-dflt}" ;;
  *gptoss_gpu.py*"--engine gptoss --decode"*)
    echo "batch-1 decode 128->512  400.0  -  tok/s wtma=${GPTOSS_MOE_V3_WTMA:-unset}" \
      "rope=${GPTOSS_ROPE_IN_ATTN:-dflt} k=${GPTOSS_MOE_KERNELS:-auto}" \
      "tiles=${GPTOSS_V3_DEC_DOWN_TILES:-dflt}" ;;
  *"gptoss_gpu.py"*"--engine vllm"*) echo "workload x"; echo "offline 1000x(1024->1024)  -  15000.0 tok/s" ;;
  *attn_sweep.py*) echo "attention sweep: $*" ;;
  *gptoss_gpu.py*) echo "offline 1000x(1024->1024)  17000.0  -  tok/s k=${GPTOSS_MOE_KERNELS:-auto}" \
    "tma=${GPTOSS_MOE_V3_TMA:-unset} tiles=${GPTOSS_MOE_V3_TILES:-dflt} wtma=${GPTOSS_MOE_V3_WTMA:-unset}" ;;
  *) echo "stub python3: unexpected $*" >&2; exit 3 ;;
esac
"""
NCU_STUB = r"""#!/usr/bin/env bash
echo "ncu $*" >> "$STUB_LOG"
case "$*" in
  *"--page details"*)
    echo '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'
    echo '"0","_gate_up_v3_kernel","GPU Speed Of Light Throughput","Duration","usecond","480.25"' ;;
  *"--page source"*)
    echo '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"'
    echo '"00001160","BAR.SYNC.DEFER_BLOCKING 0x0","600","580"'
    echo '"00001110","DEPBAR.LE SB0, 0x6","200","190"' ;;
  *) exit 0 ;;
esac
"""


@pytest.fixture
def stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {
        "python3": PYTHON_STUB,
        "ncu": NCU_STUB,
        "nvidia-smi": "#!/bin/sh\necho 'GPU 0: stub'\n",
    }.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    (home / "vllm_ready").touch()
    (tmp_path / ".wc1").mkdir()
    (tmp_path / ".wc1" / "bench_vllm.py").touch()
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(home),
        "REAL_PYTHON": sys.executable,
        "STUB_LOG": str(tmp_path / "calls.log"),
        "CKPT": str(tmp_path / "ck"),
        "VLLM_SCRIPT": str(tmp_path / ".wc1" / "bench_vllm.py"),
    }


def _run(script: str, env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", f"bench/{script}", *args],
        cwd=REPO,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_moe_large_picks_tiles_and_runs_offline_with_them(stubs, tmp_path):
    res = tmp_path / "large"
    p = _run("moe_large_gpu.sh", stubs, RES=str(res), KMS="1024", ROUNDS="1", ORDER="default picked")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (res / "done").exists()
    table = (res / "table.txt").read_text().splitlines()
    assert table[0] == "picked GPTOSS_MOE_V3_TILES | gate_up@128=128,128,128,8,4,half"
    assert "  1024 vllm             622.5 - -    1293.0  22.6%" in table
    assert any(
        r.startswith("gptoss offline 1000x1024x1024 default r1 |") and r.endswith("tiles=dflt wtma=0")
        for r in table
    )
    picked = [r for r in table if r.startswith("gptoss offline 1000x1024x1024 picked r1 |")]
    assert len(picked) == 1 and picked[0].endswith("tiles=gate_up@128=128,128,128,8,4,half wtma=0")
    assert table[-1].startswith("vllm b1 + offline | workload x offline")
    assert "--rounds 3" in (tmp_path / "calls.log").read_text()  # KROUNDS' default


def test_moe_large_offline_modes_set_the_tma_switch(stubs, tmp_path):
    res = tmp_path / "large"
    p = _run(
        "moe_large_gpu.sh",
        stubs,
        RES=str(res),
        PARTS="offline",
        ROUNDS="1",
        ORDER="tma default tma-all wtma wtma-all bogus",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [r for r in (res / "table.txt").read_text().splitlines() if r.startswith("gptoss offline")]
    assert [
        (r.split(" |")[0].split()[-2], r.split(" tma=")[1].split()[0], r.split("wtma=")[1].split()[0])
        for r in rows
    ] == [
        ("tma", "down", "0"),
        ("default", "0", "0"),
        ("tma-all", "all", "0"),
        ("wtma", "0", "1"),
        ("wtma-all", "all", "1"),
    ]
    assert "unknown ORDER mode bogus (default, picked, tma, tma-all, wtma, wtma-all)" in p.stdout


def test_moe_large_kernel_parts_make_no_checkpoint(stubs, tmp_path):
    """The kernel bench makes its own weights: no 20b written (at a 120b's CKPT it would land there)."""
    p = _run("moe_large_gpu.sh", stubs, RES=str(tmp_path / "r"), PARTS="tests kernels", KEXPERTS="128")
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "r" / "tests_full.txt").read_text() == "14 passed in 1.0s\n"  # the whole log kept
    assert not (tmp_path / "ck").exists()
    calls = (tmp_path / "calls.log").read_text()
    assert "make_checkpoint" not in calls and "--experts 128" in calls
    assert "tests/gptoss/kernels/test_moe_v3_wtma.py" in calls


def test_a_missing_vllm_bench_script_stops_at_once(stubs, tmp_path):
    p = _run("moe_large_gpu.sh", stubs, RES=str(tmp_path / "r"), VLLM_SCRIPT=str(tmp_path / "nope.py"))
    assert p.returncode == 1
    assert f"no {tmp_path / 'nope.py'}: set VLLM_SCRIPT to the payload's bench_vllm.py" in p.stdout
    assert (tmp_path / "r" / "done").exists()  # the poller is released whatever the ending
    assert (
        not (tmp_path / "calls.log").exists() or "gptoss_gpu.py" not in (tmp_path / "calls.log").read_text()
    )


def test_moe_flat_modes_and_vllm_rows(stubs, tmp_path):
    res = tmp_path / "flat"
    p = _run("moe_flat_gpu.sh", stubs, RES=str(res), PARTS="offline vllm", MODES="a=GPTOSS_X=1 b=")
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
    p = _run("moe_ncu_gpu.sh", stubs, RES=str(res))
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
    p = _run("moe_ncu_gpu.sh", stubs, RES=str(res), TARGET="step", BATCH="2")
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
    p = _run(
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
    p = _run("gptoss_120b_pair_gpu.sh", env, DP_N="30", **extra)
    assert p.returncode == 0, p.stdout + p.stderr
    return (Path(env["HOME"]) / "pair" / "table.txt").read_text()


def _run_mlperf_flags(tmp_path: Path) -> list[str]:
    """Each run_mlperf call's flags before --model-path, in the order the stub saw them."""
    calls = (tmp_path / "calls.log").read_text().splitlines()
    return [
        c.split("--model-path")[0].split("run_mlperf.py ")[1].strip() for c in calls if "run_mlperf.py" in c
    ]


def _ab(stubs, tmp_path, **extra: str) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    """gptoss_120b_ab_gpu.sh under the stubs with RES=tmp_path/ab: (the process, RES, the stub's calls)."""
    res = tmp_path / "ab"
    p = _run("gptoss_120b_ab_gpu.sh", stubs, RES=str(res), **extra)
    assert p.returncode == 0, p.stdout + p.stderr
    return p, res, (tmp_path / "calls.log").read_text().splitlines()


def test_120b_ab_runs_fp8_modes_every_test_file_and_the_attention_sweep(stubs, tmp_path):
    _, res, calls = _ab(
        stubs,
        tmp_path,
        VLLM="0",
        SWEEP="0",
        N="20",
        TESTS="all",
        TEST_FILES="tests/a.py tests/b.py",
        ATTN_SWEEP="1",
        MODES="v3 v3-fp8 w=GPTOSS_MOE_V3_WTMA=1",
        B1_MODES="v2-fp8 rope=GPTOSS_ROPE_IN_ATTN=1",
    )
    assert (tmp_path / "ck" / "config.json").exists()  # a CKPT outside /mnt/ck120 mounts nothing
    assert (res / "tests_full.txt").read_text() == "14 passed in 1.0s\n"
    pytest_calls = [c for c in calls if "-m pytest" in c]
    assert pytest_calls == ["-m pytest -q -p no:cacheprovider -rf tests/a.py tests/b.py"]  # TESTS=all: no -k
    sweeps = [c.split("--kv-cache-dtype ")[1] for c in calls if "attn_sweep.py" in c]
    assert sweeps == ["auto", "fp8"]
    ours = [c for c in calls if "--engine gptoss" in c]
    assert len(ours) == 5
    assert [("--throughput 20x1024x1278" in c, "--kv-cache-dtype fp8" in c) for c in ours] == [
        (True, False),
        (True, True),
        (True, False),
        (False, True),
        (False, False),
    ]
    assert f"--out {res}/v3-fp8 " in ours[1] + " "
    assert "--max-num-seqs 1792" in ours[1] and "--max-num-seqs" not in ours[0]
    # NAME-fp8 runs NAME's kernels; NAME=ENV=VALUE the default kernels under that variable
    assert "k=v3 " in (res / "ours_v3-fp8.txt").read_text()
    assert "rope=dflt k=v2 " in (res / "ours_v2-fp8.txt").read_text()
    assert "rope=1 k=v3 " in (res / "ours_rope.txt").read_text()
    assert "wtma=1 rope=dflt k=v3 " in (res / "ours_w.txt").read_text()
    assert f"--out {res}/w " in ours[2] + " "


def test_120b_ab_vllm_b1_runs_vllm_at_batch_1_alone(stubs, tmp_path):
    p, _, calls = _ab(
        stubs, tmp_path, SWEEP="0", TESTS="none", MODES="", B1_MODES="pf=GPTOSS_L2_PREFETCH=all", VLLM_B1="1"
    )
    vllm = [c for c in calls if "--engine vllm" in c]
    assert len(vllm) == 1 and "--decode 128x512 --max-model-len 4096 " in vllm[0] + " "
    assert "--throughput" not in vllm[0]
    assert [c for c in calls if "--engine gptoss" in c][0].count("--decode 128x512") == 1
    # without the sweep, our batch-1 modes run before the wait for vLLM's install, vLLM after it
    log = p.stdout.splitlines()
    wait = next(i for i, x in enumerate(log) if "waiting for vLLM" in x)
    assert next(i for i, x in enumerate(log) if "ours pf" in x) < wait


def test_120b_ab_tests_beside_the_checkpoint_then_profile_and_ncu_before_vllm(stubs, tmp_path):
    """The compiled tests run while the checkpoint is written and are done before the first timed run;
    PROFILE=1 and NCU_STEP=1 profile batch 1 on the same checkpoint after our modes, before vLLM."""
    env = dict(TESTS="", MODES="", B1_MODES="d=", VLLM_B1="1", SWEEP="0", PROFILE="1", NCU_STEP="1")
    # the tests end only once the checkpoint exists: run one after the other, they would fail
    env["STUB_TESTS_SEE"] = str(tmp_path / "ck" / "config.json")
    p, res, calls = _ab(stubs, tmp_path, **env)
    order = [
        next(i for i, c in enumerate(calls) if k in c)
        for k in (
            "--engine gptoss",
            "profile_gpu.py --model-path",
            "ncu --profile-from-start",
            "--engine vllm",
        )
    ]
    assert order == sorted(order)
    ck = str(tmp_path / "ck")
    assert f"profile_gpu.py --model-path {ck} --batch 1 --steps 10" in calls[order[1]]
    assert f"profile_gpu.py --model-path {ck} --batch 1 --steps 1 --ncu" in calls[order[2]]
    assert "compiled tests | 14 passed in 1.0s" in (res / "table.txt").read_text()
    assert "profile pdl=unset" in (res / "profile.txt").read_text()
    log = p.stdout
    assert (
        log.index("compiled tests (beside the checkpoint)")
        < log.index("ours d")
        < log.index("ncu on the step")
    )


def test_120b_ab_sweep_without_its_peer_waits_for_vllm_once_after_the_batch_1_modes(stubs, tmp_path):
    """SWEEP_PEER=0: the sweep times ours alone at SWEEP_MS, without waiting for vLLM's install; the
    one wait comes after our batch-1 modes, before vLLM's run."""
    env = dict(TESTS="none", MODES="", B1_MODES="gu=GPTOSS_V3_DEC_GATE_UP=1", VLLM_B1="1")
    env |= dict(SWEEP_PEER="0", SWEEP_MS="1", SWEEP_VARIANTS="v3-dd-w,v3-dd-gu-w-s8")
    p, _, calls = _ab(stubs, tmp_path, **env)
    sweep = [c for c in calls if "moe_gpu.py" in c]
    assert len(sweep) == 1 and "--ms 1 " in sweep[0] and sweep[0].endswith("--variants v3-dd-w,v3-dd-gu-w-s8")
    log = p.stdout.splitlines()
    waits = [i for i, x in enumerate(log) if "waiting for vLLM" in x]
    sweep_at = next(i for i, x in enumerate(log) if "decode-batch MoE sweep" in x)
    assert len(waits) == 1 and sweep_at < next(i for i, x in enumerate(log) if "ours gu" in x) < waits[0]
    assert len([c for c in calls if "--engine vllm" in c]) == 1


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
    p = _run("gptoss_dp_gpu.sh", stubs, "10", "4", "4", "dp3-fp8", OUT=str(tmp_path / "dp"))
    assert p.returncode == 2
    assert (
        "unknown run dp3-fp8 (dp1, dp2, vllm-tp2, vllm-dp2, vllm-tp2ep, each with or without -fp8)"
        in p.stdout
    )
