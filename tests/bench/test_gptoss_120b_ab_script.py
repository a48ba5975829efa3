"""bench/gptoss_120b_ab_gpu.sh (the 120b A/B of our engine against vLLM on one GPU) end to end on CPU
under the stub binaries of gpu_stubs.py: its modes, tests, sweeps, profiles and the order it runs them in."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.bench.gpu_stubs import first_at, run_script


def _ab(stubs, tmp_path, **extra: str) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    """gptoss_120b_ab_gpu.sh under the stubs with RES=tmp_path/ab: (the process, RES, the stub's calls)."""
    res = tmp_path / "ab"
    p = run_script("gptoss_120b_ab_gpu.sh", stubs, RES=str(res), **extra)
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
    assert pytest_calls == [
        "-m pytest -q -n 0 -p no:cacheprovider -rf tests/a.py tests/b.py"
    ]  # TESTS=all: no -k
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
    wait = first_at(log, "waiting for vLLM")
    assert first_at(log, "ours pf") < wait


def test_120b_ab_tests_beside_the_checkpoint_then_profile_and_ncu_before_vllm(stubs, tmp_path):
    """The compiled tests run while the checkpoint is written and are done before the first timed run;
    PROFILE=1 and NCU_STEP=1 profile batch 1 on the same checkpoint after our modes, before vLLM."""
    env = dict(TESTS="", MODES="", B1_MODES="d=", VLLM_B1="1", SWEEP="0", PROFILE="1", NCU_STEP="1")
    # the tests end only once the checkpoint exists: run one after the other, they would fail
    env["STUB_TESTS_SEE"] = str(tmp_path / "ck" / "config.json")
    p, res, calls = _ab(stubs, tmp_path, **env)
    order = [
        first_at(calls, k)
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
    assert "declare -x" not in log  # the mode d= exports nothing (v34's log held the environment)
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
    sweep_at = first_at(log, "decode-batch MoE sweep")
    assert len(waits) == 1 and sweep_at < first_at(log, "ours gu") < waits[0]
    assert len([c for c in calls if "--engine vllm" in c]) == 1


def test_120b_ab_passes_tile_values_with_at_signs_and_semicolons_whole(stubs, tmp_path):
    """bench/results v46's next run: a GPTOSS_MOE_V3_TILES value (its own '=', '@', ';' and ',') as a
    MODES entry, and a decode tiles variable as a batch-1 mode, reach the engine's process unsplit."""
    tiles = "gate_up@16=32,64,128,4,3,half,r96;down@32=64,128,128,4,2,half,r128"
    ours_only = {"VLLM": "0", "SWEEP": "0", "TESTS": "none", "N": "20"}
    _, res, calls = _ab(
        stubs,
        tmp_path,
        **ours_only,
        MODES=f"v3 occ=GPTOSS_MOE_V3_TILES={tiles}",
        B1_MODES="default= k512=GPTOSS_V3_DEC_GATE_UP_TILES=16,32,512,2,2,3",
    )
    assert f"v3tiles={tiles} " in (res / "ours_occ.txt").read_text() + " "
    assert "v3tiles=dflt" in (res / "ours_v3.txt").read_text()
    assert "gu=16,32,512,2,2,3 " in (res / "ours_k512.txt").read_text()
    assert "gu=dflt " in (res / "ours_default.txt").read_text()
    assert len([c for c in calls if "--engine gptoss" in c]) == 4
