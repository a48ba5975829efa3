"""bench/calm_agreement_gpu.sh under the stub GPU tools: it draws the calm 20b, makes each known-wrong
copy from it with its edit, scores them all in one agreement run, then (VLLM=1) the plugin and LoRA
rows agreement-only, and (KTESTS=1) the compiled kernel tests; a copy that fails is said, left out
and counted as a failed step, not silently scored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.gpu_stubs import run_script


def _calls(stubs: dict[str, str]) -> list[str]:
    return Path(stubs["STUB_LOG"]).read_text().splitlines()


def test_draws_calm_makes_the_faults_and_scores_them(stubs, tmp_path):
    res, ck = tmp_path / "res", stubs["CKPT"]
    p = run_script("calm_agreement_gpu.sh", stubs, RES=str(res), VLLM="1")
    assert p.returncode == 0, p.stdout + p.stderr
    calls = _calls(stubs)
    assert f"-m gptoss.tools.make_checkpoint --preset 20b --device cuda --init calm --out {ck}" in calls
    faults = [
        c.removeprefix(f"bench/fault_checkpoint.py {ck} {ck}-") for c in calls if "fault_checkpoint" in c
    ]
    assert faults == [
        "nosink --edit self_attn\\.sinks$ set=-inf",
        "down12x2 --edit layers\\.12\\.mlp\\.experts\\.down_proj_scales$ add=1",
        "attn5x2 --edit layers\\.5\\.self_attn\\.o_proj\\.weight$ mul=2",
    ]
    (agree,) = [c for c in calls if "--engine agreement" in c]
    assert agree.endswith(
        f"--engine agreement --fault {ck}-nosink --fault {ck}-down12x2 --fault {ck}-attn5x2 --out {res}/ours"
    )
    (plugin,) = [c for c in calls if "vllm_plugin_gpu.py" in c]
    assert plugin == (
        f"bench/vllm_plugin_gpu.py --model-path {ck} --engines vllm,gptoss --decode  --throughput  "
        f"--out {res}/plugin"
    )
    (lora,) = [c for c in calls if "gptoss_lora_gpu.py" in c]
    assert f"--out {res}/lora --parts ours,mlperf --offline  --c16 " in lora
    table = (res / "table.txt").read_text()
    assert "calm: ours | workload gptoss greedy_agreement triton=torch 96.9%" in table
    assert "calm: plugin | greedy agreement 16x32 (pfx/pos)      97.9%/97.9%" in table
    assert (
        "calm: lora | run_mlperf --backend vllm --lora-modules: runs, greedy agreement with ours 100.0%"
        in table
    )
    assert "control: on the 9 of 16 sequences the adapter changed, vLLM +LoRA = ours 100.0%" in table
    assert "calm: lora_d1" not in table  # 9 sequences moved: enough, no stronger adapter
    assert (res / "done").exists()


@pytest.mark.parametrize("moved", ["3", "0"])
def test_an_adapter_that_moves_too_few_sequences_is_run_again_4x_stronger(stubs, tmp_path, moved):
    res, ck = tmp_path / "res", stubs["CKPT"]
    p = run_script("calm_agreement_gpu.sh", stubs, RES=str(res), VLLM="1", STUB_LORA_MOVED=moved)
    assert p.returncode == 0, p.stdout + p.stderr
    loras = [c.split("gptoss_lora_gpu.py ")[1] for c in _calls(stubs) if "gptoss_lora_gpu.py" in c]
    assert loras == [
        f"--model-path {ck} --out {res}/lora --parts ours,mlperf --offline  --c16 ",
        f"--model-path {ck} --out {res}/lora_d1 --parts ours,mlperf --offline  --c16  --delta 1",
    ]
    assert f"s] LoRA: the adapter changed {moved} of 16 sequences; again at delta 1" in p.stdout
    table = (res / "table.txt").read_text()
    assert ("control: on the 3 of 16 sequences" if moved == "3" else "changed none of our sequences") in table
    assert "calm: lora_d1 | run_mlperf" in table and "control: on the 12 of 16 sequences" in table


def test_a_fault_that_fails_is_said_and_left_out(stubs, tmp_path):
    res, ck = tmp_path / "res", stubs["CKPT"]
    Path(f"{ck}-down12x2").mkdir(parents=True)
    Path(f"{ck}-down12x2/config.json").mkdir()  # a folder where the file goes: the stub's write fails
    p = run_script("calm_agreement_gpu.sh", stubs, RES=str(res))
    # the run lacks that calibration row: the script says which copy and exits 1
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "1 step(s) failed: fault down12x2 (exit 1)"
    calls = _calls(stubs)
    (agree,) = [c for c in calls if "--engine agreement" in c]
    assert f"--fault {ck}-nosink --fault {ck}-attn5x2 --out" in agree
    assert "s] fault down12x2 failed" in p.stdout
    assert not any("vllm_plugin_gpu.py" in c for c in calls)  # VLLM unset
    assert not any("-m pytest" in c for c in calls)  # KTESTS unset


def test_ktests_runs_the_kernel_folder_compiled_and_rows_its_summary(stubs, tmp_path):
    res = tmp_path / "res"
    p = run_script("calm_agreement_gpu.sh", stubs, RES=str(res), KTESTS="1")
    assert p.returncode == 0, p.stdout + p.stderr
    (tests,) = [c for c in _calls(stubs) if "-m pytest" in c]
    assert tests == "-m pytest -q -p no:cacheprovider -rf tests/gptoss/kernels"
    assert "kernel tests | 14 passed in 1.0s" in (res / "table.txt").read_text()
