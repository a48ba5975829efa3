"""How much device memory the KV cache gets (gptoss.model_runner): the activation reserve and the
budget rule, at gpt-oss-20b's shapes."""

from __future__ import annotations

from gptoss.config import PRESETS
from gptoss.model_runner import CUDA_RESERVE_BYTES, cuda_kv_budget, step_workspace_bytes

GB = 10**9


def test_workspace_of_a_20b_step():
    # per token: bf16 x 4 hidden rows (4 * 2880) + QKV (5120) + attention out (4096) = 20736, and the
    # MoE's 4 rows of act (2880) and y (2880) = 23040: 87,552 bytes; doubled over 16,384 tokens; plus
    # 1,024 sequences' logits over the 201,088-token vocabulary: the bf16 output, its float32 copy,
    # and a filtered draw's masked float32 copy
    assert step_workspace_bytes(PRESETS["20b"], 16384, 1024, 2) == 2 * 16384 * 87552 + 1024 * 201088 * 10


def test_budget_is_what_is_left_after_the_reserve():
    free, large, work = 70 * GB, 10 * GB, 4 * GB
    assert cuda_kv_budget(free, large, work) == 60 * GB - 4 * GB - CUDA_RESERVE_BYTES
    # the old flat 0.85 share would have given 51 GB: 4.9 GB (~200k tokens of 20b's KV) less


def test_budget_never_passes_the_max_share_nor_goes_negative():
    assert cuda_kv_budget(100 * GB, 0, 0) == int(100 * GB * 0.95)
    assert cuda_kv_budget(5 * GB, 0, 8 * GB) == 0
