"""RoPE and the KV-cache write inside decode attention (paged_attention's `rope`): the attention kernel
ropes q and this step's key itself and stores the roped key and v in the cache, so a decode layer
skips rope_qkv's launch (~2.9 us a layer at batch 1 on an H100).

Numerics are rope.py's bit for bit: the table row cat(cos, sin) at the token's position, halves
x1, x2 in float32, (x1*cos - x2*sin, x2*cos + x1*sin), one rounding to the storage dtype. rope.py
compiles without FMA contraction; the attention kernel keeps it (its softmax and dots are the
unfused path's), so here each product is rounded on its own (mul_rn) and no add can absorb it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from gptoss.kernels.rounding import rounded

# The interpreter has no libdevice, and numpy rounds every product anyway (no contraction there).
_INTERPRETED: tl.constexpr = tl.constexpr(bool(triton.knobs.runtime.interpret))


@triton.jit
def _mul_rn(a, b):
    """a * b rounded to float32 on its own: a mul.rn, which the compiler never fuses into an FMA."""
    if _INTERPRETED:
        r = a * b
    else:
        r = libdevice.mul_rn(a, b)
    return r


@triton.jit
def rope_table(pos, cs_ptr, ok, D: tl.constexpr):
    """cos_sin's row at pos [R] (rows where ok) -> (cos, sin), each [R, D] with every element's factor
    (the table holds D/2 of each: element d takes index d % (D/2)). The table and the positions are
    written before the step's first kernel, so the attention kernel loads them before its PDL wait."""
    HALF: tl.constexpr = D // 2
    d = tl.arange(0, D)[None, :]
    cs = cs_ptr + pos.to(tl.int64)[:, None] * D + d % HALF
    cos = tl.load(cs, mask=ok[:, None], other=0.0)
    sin = tl.load(cs + HALF, mask=ok[:, None], other=0.0)
    return cos, sin


@triton.jit
def rope_rows(x_ptr, base, cos, sin, ok, D: tl.constexpr):
    """Rows x[base + 0..D) (base [R] element offsets, rows where ok [R]) rotated by (cos, sin) of
    rope_table -> [R, D] in x's dtype, equal to rope_qkv's output bits (zeros where not ok)."""
    HALF: tl.constexpr = D // 2
    d = tl.arange(0, D)[None, :]
    m = ok[:, None]
    x = tl.load(x_ptr + base[:, None] + d, mask=m, other=0.0).to(tl.float32)
    # Each element's partner in the other half: x2 for x1, x1 for x2.
    y = tl.load(x_ptr + base[:, None] + (d + HALF) % D, mask=m, other=0.0).to(tl.float32)
    a = _mul_rn(x, cos)
    b = _mul_rn(y, sin)
    r = tl.where(d < HALF, a - b, a + b)  # x1*cos - x2*sin | x2*cos + x1*sin
    dt = x_ptr.dtype.element_ty
    return rounded(r, dt).to(dt)  # exact: r already holds a value of dt


@triton.jit
def store_kv(
    k,
    v,
    kc_ptr,
    vc_ptr,
    slot,
    ok,
    h,
    stride_cb,
    stride_cs,
    stride_ch,
    BS: tl.constexpr,
    D: tl.constexpr,
):
    """Store KV head h of token rows (where ok) at their flat cache slots `slot` [R] (int64: block * BS
    + offset, loaded before the PDL wait), as rope_qkv does; slot -1 (a padding token) stores nothing."""
    w = (ok & (slot >= 0))[:, None]
    off = (slot // BS) * stride_cb + (slot % BS) * stride_cs + h * stride_ch
    d = tl.arange(0, D)[None, :]
    tl.store(kc_ptr + off[:, None] + d, k.to(kc_ptr.dtype.element_ty), mask=w)
    tl.store(vc_ptr + off[:, None] + d, v.to(vc_ptr.dtype.element_ty), mask=w)


def rope_operands(
    rope: tuple[Tensor, Tensor, Tensor] | None, t: int, d: int, max_query_len: int
) -> tuple[Tensor, Tensor, Tensor] | None:
    """Check paged_attention's `rope` = (positions [T], cos_sin [P, D] float32, slot_mapping [T])."""
    if rope is None:
        return None
    if max_query_len != 1:
        raise ValueError(
            f"rope (RoPE and the cache write in attention) serves decode launches only "
            f"(max_query_len 1), got max_query_len {max_query_len}"
        )
    positions, cos_sin, slots = rope
    if positions.shape != (t,) or slots.shape != (t,):
        raise ValueError(
            f"rope: positions and slot_mapping must be [{t}], got {tuple(positions.shape)} and "
            f"{tuple(slots.shape)}"
        )
    if positions.is_floating_point() or slots.is_floating_point():
        raise ValueError("rope: positions and slot_mapping must be integer tensors")
    if (
        cos_sin.dim() != 2
        or cos_sin.shape[1] != d
        or cos_sin.dtype != torch.float32
        or not cos_sin.is_contiguous()
    ):
        raise ValueError(
            f"rope: cos_sin must be a contiguous float32 [P, {d}], got {tuple(cos_sin.shape)} {cos_sin.dtype}"
        )
    return positions, cos_sin, slots
