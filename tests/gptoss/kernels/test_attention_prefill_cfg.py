"""Prefill attention's launch settings (attention.PREFILL_CFG for full layers, PREFILL_SLIDING_CFG for
sliding ones; GPTOSS_ATTN_PREFILL / GPTOSS_ATTN_PREFILL_SLIDING): each setting a launch takes keeps
the attention test_attention_kernel's torch reference gives. Interpreter on CPU, compiled with CUDA.
"""

from __future__ import annotations

import pytest
import torch

from tests.gptoss.kernels.test_attention_kernel import (  # conftest set TRITON_INTERPRET first
    DEV,
    PREFILLS,
    TOL,
    assert_rows_close,
    make_step,
    reference,
    run_kernel,
)
from tests.gptoss.kernels.test_attention_splits import _LaunchRecorder, reread_settings

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
# Compiled, the engine's dtype: float32 tiles of BLOCK_N 128 over 256 rows need 263 KB of shared
# memory, past the H200's 227 KB (v56); the interpreter has no such limit, and float32's tolerance.
DTYPE = torch.bfloat16 if DEV.type == "cuda" else torch.float32


@pytest.mark.parametrize(
    ("full", "sliding"),
    [((32, 4, 3, 64), (32, 8, 3, 128)), ((128, 4, 2, 256), (16, 4, 4, 32))],
    ids=str,
)
def test_prefill_launch_settings_keep_the_result(full, sliding, monkeypatch):
    """Each pool's launch takes its own (BLOCK_N, warps, stages, rows), rows = BLOCK_Q tokens x 8
    heads; chunks with context and without, across the window and block edges, equal the reference."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "PREFILL_CFG", full)
    monkeypatch.setattr(attention, "PREFILL_SLIDING_CFG", sliding)
    rec = _LaunchRecorder(
        attention._attn_kernel, ("BLOCK_N", "BLOCK_Q", "num_warps", "num_stages", "WINDOWED")
    )
    monkeypatch.setattr(attention, "_attn_kernel", rec)
    for seqs in (PREFILLS[1], PREFILLS[2]):
        ctx, qlen = [c for c, _ in seqs], [n for _, n in seqs]
        st = make_step(ctx, qlen, 16, 2, DTYPE, seed=sum(qlen), fill=float("nan"))
        for pool in ("full", "ring"):
            assert_rows_close(run_kernel(st, pool), reference(st, pool), TOL[DTYPE])
    took = {
        (r["WINDOWED"], r["BLOCK_N"], r["num_warps"], r["num_stages"], r["BLOCK_Q"] * 8) for r in rec.launches
    }
    assert took == {(False, *full), (True, *sliding)}


def test_prefill_settings_from_the_environment(monkeypatch):
    """Unset: (64, 8, 3, 128) for full layers, (16, 4, 3, 64) for sliding ones; set: the four counts
    of each; a bad value is refused by name."""

    try:
        for name in ("GPTOSS_ATTN_PREFILL", "GPTOSS_ATTN_PREFILL_SLIDING"):
            monkeypatch.delenv(name, raising=False)
        mod = reread_settings()
        assert (mod.PREFILL_CFG, mod.PREFILL_SLIDING_CFG) == ((64, 8, 3, 128), (16, 4, 3, 64))
        monkeypatch.setenv("GPTOSS_ATTN_PREFILL_SLIDING", "32,4,3,64")
        monkeypatch.setenv("GPTOSS_ATTN_PREFILL", "32,8,3,256")
        mod = reread_settings()
        assert (mod.PREFILL_CFG, mod.PREFILL_SLIDING_CFG) == ((32, 8, 3, 256), (32, 4, 3, 64))
        for bad, why in [
            ("32,4,3", "four counts"),
            ("32,4,3,96", "rows a power of two >= 16"),
            ("32,4,3,8", "rows a power of two >= 16"),
            ("48,4,3,64", "BLOCK_N must be a power of two"),
            ("32,4,64", "four counts"),
            ("32,x,3,64", "three positive counts"),
        ]:
            monkeypatch.setenv("GPTOSS_ATTN_PREFILL", bad)
            with pytest.raises(ValueError, match=f"GPTOSS_ATTN_PREFILL.*{why}"):
                reread_settings()
    finally:
        monkeypatch.undo()
        reread_settings()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cfg", [(64, 8, 3, 128), (16, 4, 3, 64), (32, 4, 3, 64), (64, 4, 3, 64)], ids=str)
def test_gpu_prefill_settings_at_full_shapes(cfg, monkeypatch):
    """Compiled, 120b's heads (64 over 8): a 1024-token chunk after 100 cached tokens and a 300-token
    prompt, each pool on the setting under test, against the reference in bf16."""
    from gptoss.kernels import attention

    monkeypatch.setattr(attention, "PREFILL_CFG", cfg)
    monkeypatch.setattr(attention, "PREFILL_SLIDING_CFG", cfg)
    st = make_step([100, 0], [1024, 300], 64, 8, torch.bfloat16, seed=5, fill=float("nan"))
    for pool in ("full", "ring"):
        assert_rows_close(run_kernel(st, pool), reference(st, pool), TOL[torch.bfloat16])
