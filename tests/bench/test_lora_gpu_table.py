"""bench/lora_gpu_table.py, bench/gptoss_lora_gpu.py's table: the LoRA agreement row of run_mlperf
--backend vllm against ours, and its control, each engine's adapted tokens against our tokens without
the adapter (an adapter that moves no token would let any two engines agree, applied or not)."""

from bench.lora_gpu_table import table

OURS = [[1, 2, 3, 4], [5, 6, 7, 8]]
BASE = [[1, 2, 9, 9], [9, 9, 9, 9]]  # parts from OURS at the 3rd token of the first, the 1st of the second
VLLM = [[1, 2, 3, 4], [5, 6, 0, 0]]


def rows(vllm_tokens) -> list[dict]:
    return [
        {"engine": "gptoss", "what": "greedy", "tokens": OURS},
        {"engine": "gptoss", "what": "greedy_base", "tokens": BASE},
        {
            "engine": "vllm",
            "what": "greedy",
            "via": "run_mlperf --lora-modules",
            "exit": 1,
            "tokens": vllm_tokens,
        },
    ]


def test_the_agreement_row_comes_with_both_controls(capsys):
    table(rows(VLLM))
    out = capsys.readouterr().out.splitlines()
    assert (
        "run_mlperf --backend vllm --lora-modules: runs, greedy agreement with ours 75.0% (target >= 90%)"
        in out
    )
    assert "control: ours +LoRA against ours without the adapter 25.0% (the adapter must move tokens)" in out
    assert "control: vLLM +LoRA against ours without the adapter 25.0% (the adapter must move tokens)" in out
    assert "control: on the 2 of 2 sequences the adapter changed, vLLM +LoRA = ours 75.0%" in out


def test_an_adapter_that_moves_nothing_is_said(capsys):
    r = rows(VLLM)
    r[1]["tokens"] = OURS
    table(r)
    out = capsys.readouterr().out
    assert "control: ours +LoRA against ours without the adapter 100.0%" in out
    assert "control: the adapter changed none of our sequences, so the agreement says nothing of it" in out


def test_only_the_changed_sequences_count(capsys):
    r = rows([[1, 2, 3, 4], [0, 0, 0, 0]])
    r[1]["tokens"] = [[1, 2, 9, 9], OURS[1]]  # the adapter moved the first sequence only
    table(r)
    assert (
        "control: on the 1 of 2 sequences the adapter changed, vLLM +LoRA = ours 100.0%"
        in capsys.readouterr().out
    )


def test_a_failed_vllm_run_has_no_agreement_and_no_vllm_control(capsys):
    table(rows(None))
    out = capsys.readouterr().out
    assert "FAILED (exit 1, see mlperf_vllm_lora.log)" in out
    assert "control: ours +LoRA against ours without the adapter 25.0%" in out
    assert "control: vLLM" not in out and "sequences the adapter changed" not in out
