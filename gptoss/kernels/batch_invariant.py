"""Batch-invariant forms of the projections and the MoE: a token's result does not depend on T.

The default kernels pick their algorithm by batch size: cuBLAS chooses its GEMM (and split-K) by
M, linear() takes the GEMV only up to GEMV_MAX_T tokens, the MoE runs the decode kernels up to
moe_decode.MAX_T tokens and then v2 or v3 tiles by rows per expert, and decode attention splits the
keys over more programs when fewer sequences run. Each choice changes the order of a float sum, so
a sequence's logits move in the last bits with the batch it shares, and on a random checkpoint
(where greedy margins are tiny) its greedy tokens change with them.

Here every choice is fixed by the weights' shapes alone: the projections (QKV, O, router, lm_head)
run the GEMV kernel with a fixed token block for any T (T/TB programs a block of W, which they
read from L2), the MoE runs the v2 kernels with one tile for every T, and decode attention takes
the split count of a lone sequence (gptoss.kernels.attention.paged_attention(batch_invariant=)).
Every row then goes through the same instructions on the same data, alone or in a batch, and the
results are bitwise equal; the rows of a tile never mix (an MMA sums each output on its own).
What it costs: the projections run on tiles made for decode (cuBLAS is faster at large T) and the
MoE's large batches on 32-row tiles. Prefill chunks must also fall the same way: a prompt split at
another token by the step budget attends over its cached part in other blocks.
"""

from __future__ import annotations

from torch import Tensor

from gptoss.kernels.linear import gemv
from gptoss.kernels.moe import combine, down_v2, gate_up_v2
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import route_and_group
from gptoss.kernels.moe_tiles import tiles_v2

# Tokens per program of the projections: at decode the padding rows are masked loads (no bytes),
# at prefill W is read once per 64 tokens, from L2 for all but the first token block.
TOKEN_BLOCK = 64
# The MoE's one tile: v2's 32-row xa tile, the best measured for 32-64 rows an expert (bench/results
# 2026-11-22 v5), so Offline decode batches lose least; decode pads its rows to 32.
MOE_BUCKET = 32


# Triton's interpreter (CPU tests) runs a program in about a millisecond whatever its size: wide
# programs keep the tiny model's 201088-row lm_head at ~50 of them. Fixed too, so still invariant.
INTERPRETER_BLOCK_N = 4096


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x [T, K] @ w [N, K]^T + b -> [T, N]; row t's bits depend on x[t], w and b only."""
    block_n = None if x.is_cuda else INTERPRETER_BLOCK_N
    return gemv(x, w, b, token_block=TOKEN_BLOCK, block_n=block_n)


def moe_forward(
    x: Tensor,
    router_weight: Tensor,
    router_bias: Tensor,
    top_k: int,
    w: MoEWeights,
    alpha: float,
    limit: float,
) -> Tensor:
    """x [T, H] -> [T, H]: gptoss.kernels.moe.moe_forward on one fixed path for every T."""
    if w.layout != "bits":
        raise ValueError(f"batch-invariant MoE runs the v2 kernels: needs the bits layout, got {w.layout!r}")
    e, h, i = w.shape
    x = x.contiguous()
    if x.shape[0] == 0:
        return x.clone()
    logits = linear(x, router_weight, router_bias)  # [T, E]
    r = route_and_group(logits, top_k)
    act = gate_up_v2(x, r, w, alpha, limit, tiles_v2(MOE_BUCKET, i, h, gate_up=True))
    return combine(down_v2(act, r, w, tiles_v2(MOE_BUCKET, h, i, gate_up=False)), r.weights, x.dtype)
