"""The tail of a greedy multi-step decode step (KernelRunner.launch_multi), in one launch after the argmax.

Between two replays of the decode graph, each greedy row r needs: its id checked (argmax propagates
NaN, so a NaN at the argmax means the row holds one: -1, which the host fails), stored as this step's
output, and the next step's static inputs advanced in place: the id (a -1 as 0, never read back),
its position + 1, and that position's full and ring cache slots from the row's block tables. As
torch ops that was ~20 launches a step (gather, isnan, where, clamp, the copies, the slot
arithmetic), each a few µs of the GPU's time at batch 1, where a 120b step is ~2.7 ms; here it is
one program a row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _advance_kernel(
    logits_ptr,
    stride_l,
    argmax_ptr,
    out_ptr,
    ids_ptr,
    pos_ptr,
    full_ptr,
    ring_ptr,
    rows_ptr,
    full_tab_ptr,
    stride_ft,
    ring_tab_ptr,
    stride_rt,
    BS: tl.constexpr,
    RING_LEN: tl.constexpr,
    ADVANCE: tl.constexpr,
):
    r = tl.program_id(0)
    idx = tl.load(argmax_ptr + r)
    # widened first: the interpreter holds bf16 as raw bits, where NaN would equal itself
    x = tl.load(logits_ptr + r.to(tl.int64) * stride_l + idx).to(tl.float32)
    idx = tl.where(x != x, -1, idx)  # NaN: the only value unequal to itself
    tl.store(out_ptr + r, idx)
    if ADVANCE:
        tl.store(ids_ptr + r, tl.maximum(idx, 0))
        p = tl.load(pos_ptr + r) + 1
        tl.store(pos_ptr + r, p)
        row = tl.load(rows_ptr + r)
        blk = p // BS
        tl.store(full_ptr + r, tl.load(full_tab_ptr + row * stride_ft + blk).to(tl.int64) * BS + p % BS)
        if RING_LEN > 0:
            slot = tl.load(ring_tab_ptr + row * stride_rt + blk % RING_LEN).to(tl.int64) * BS + p % BS
            tl.store(ring_ptr + r, slot)


def greedy_advance(
    logits: Tensor,
    argmax: Tensor,
    out: Tensor,
    inputs: Tensor,
    full_tab: Tensor,
    ring_tab: Tensor,
    block_size: int,
    ring_len: int,
    advance: bool,
) -> None:
    """logits [N, V] (any float dtype), argmax [N] int64 (logits.argmax(-1)); out [N] int64 gets the ids,
    -1 for a row whose argmax is NaN. advance: inputs [6, >= N] int64 (KernelRunner.g_in: ids,
    positions, full slots, ring slots, table rows, adapters) take the next step's values in rows
    0-3 of columns [0, N): as `ids.clamp(min=0)`, `pos + 1`, and each new position's slot in
    full_tab / ring_tab (int32 [rows, blocks]; ring_len 0: no ring slots)."""
    n = logits.shape[0]
    if argmax.shape != (n,) or out.shape != (n,) or inputs.shape[0] != 6 or inputs.shape[1] < n:
        raise ValueError(
            f"shapes disagree: logits {tuple(logits.shape)}, argmax {tuple(argmax.shape)}, "
            f"out {tuple(out.shape)}, inputs {tuple(inputs.shape)}"
        )
    if not argmax.dtype == out.dtype == inputs.dtype == torch.int64:
        raise ValueError("argmax, out and inputs must be int64")
    if logits.stride(-1) != 1 or inputs.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("logits, out and inputs must be contiguous along their last dim")
    if n == 0:
        return
    ids, pos, full, ring, rows = inputs[0], inputs[1], inputs[2], inputs[3], inputs[4]
    _advance_kernel[(n,)](
        logits,
        logits.stride(0),
        argmax,
        out,
        ids,
        pos,
        full,
        ring,
        rows,
        full_tab,
        full_tab.stride(0),
        ring_tab,
        ring_tab.stride(0),
        BS=block_size,
        RING_LEN=ring_len,
        ADVANCE=advance,
        num_warps=1,
    )
