"""Decode (T <= 8): the QKV projection, its bias, YaRN RoPE and the KV-cache write in one launch.

qkv_rope(x, Wqkv, b, positions, cos_sin, Hq, Hkv, D, k_cache, v_cache, slots) = rope_qkv(F.linear(x,
Wqkv, b), ...): two launches a layer at decode (cuBLAS's GEMM 13.7 us and RoPE 2.9 us at batch 1 on an
H100) become one. The GEMV is linear.py's: a program owns a block of W's rows and the whole of K,
computes y^T = W @ x^T on the tensor cores (the few tokens are the MMA's N side) and needs no other
program's result. Here a program owns 16 rows of one head's first half and the 16 matching rows of
its second half (dims d and d + D/2: RoPE's pairs), as two [16, BK] tiles and two dots a K step, so
the rotation is done in registers: grid ((Hq + 2 Hkv) * D / 32,) = 160 programs at gpt-oss's shapes,
as the GEMV's BN 32. Rows of the K and V heads also go to the token's cache slot.

Numerics are the two launches': the GEMV's float32 sums plus the bias, rounded to x.dtype (F.linear's
output), then rope.py's (x1*cos - x2*sin, x2*cos + x1*sin) in float32, no FMA, and one rounding. The
sums run in another order than cuBLAS's, so q, k and v can differ from the unfused path by an ulp.

Bytes: W (N*K*e: 29.5 MB a layer at gpt-oss's shapes), x (T*K*e a program, from L2), the bias, the
cos/sin rows, and q|k|v (T*N*e) plus the cache's 2*T*Hkv*D*e.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.rounding import round_to

MAX_T = 8  # linear.GEMV_MAX_T: past it every program re-reads many rows of x
HALF_ROWS = 16  # rows of each half a program owns (tl.dot's least M)
BK, WARPS, STAGES = 128, 4, 6  # linear.block_sizes's tile for K 2880


@triton.jit
def _qkv_rope_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    pos_ptr,
    cs_ptr,
    out_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    T,
    K,
    stride_x,
    stride_w,
    stride_out,
    block_size,
    stride_cb,
    stride_cs,
    stride_ch,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    TB: tl.constexpr,
    BK: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program p: head p // Q, dims c*16 .. c*16 + 15 and their D/2 partners (c = p % Q, Q = D / 32)."""
    pdl.wait_then_release(PDL)
    Q: tl.constexpr = D // 32  # programs a head
    p = tl.program_id(0)
    head = p // Q
    j = (p % Q) * 16 + tl.arange(0, 16)  # [16] first-half dims
    rows1 = head * D + j  # [16] W rows of the first half
    rows2 = rows1 + D // 2
    toks = tl.arange(0, TB)  # [TB]
    tok_ok = toks < T
    kk = tl.arange(0, BK)
    w1_base = w_ptr + rows1.to(tl.int64)[:, None] * stride_w + kk[None, :]  # [16, BK]
    w2_base = w_ptr + rows2.to(tl.int64)[:, None] * stride_w + kk[None, :]
    xt_base = x_ptr + toks[None, :].to(tl.int64) * stride_x + kk[:, None]  # [BK, TB]: x^T
    acc1 = tl.zeros((16, TB), dtype=tl.float32)
    acc2 = tl.zeros((16, TB), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = (k0 + kk) < K
        w1 = tl.load(w1_base + k0, mask=k_ok[None, :], other=0.0)
        w2 = tl.load(w2_base + k0, mask=k_ok[None, :], other=0.0)
        xt = tl.load(
            xt_base + k0, mask=tok_ok[None, :] & k_ok[:, None], other=0.0
        )  # padding tokens: no bytes
        if UPCAST:
            acc1 = tl.dot(w1.to(tl.float32), xt.to(tl.float32), acc1, input_precision="ieee")
            acc2 = tl.dot(w2.to(tl.float32), xt.to(tl.float32), acc2, input_precision="ieee")
        else:
            acc1 = tl.dot(w1, xt, acc1, input_precision=PRECISION)
            acc2 = tl.dot(w2, xt, acc2, input_precision=PRECISION)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    # F.linear's output: float32 sum + bias, one rounding; RoPE then reads those values.
    x1 = round_to(acc1 + tl.load(b_ptr + rows1).to(tl.float32)[:, None], DT).to(tl.float32)  # [16, TB]
    x2 = round_to(acc2 + tl.load(b_ptr + rows2).to(tl.float32)[:, None], DT).to(tl.float32)
    if head < HQ + HKV:  # q and k heads rotate; v heads pass through
        pos = tl.load(pos_ptr + toks, mask=tok_ok, other=0).to(tl.int64)  # [TB]
        cs = cs_ptr + pos[None, :] * D + j[:, None]  # [16, TB]
        cos = tl.load(cs, mask=tok_ok[None, :], other=0.0)
        sin = tl.load(cs + D // 2, mask=tok_ok[None, :], other=0.0)
        o1 = round_to(x1 * cos - x2 * sin, DT)
        o2 = round_to(x2 * cos + x1 * sin, DT)
    else:
        o1 = x1.to(DT)  # exact: x1 holds DT values
        o2 = x2.to(DT)
    out = out_ptr + toks[None, :].to(tl.int64) * stride_out + rows1[:, None]  # [16, TB]
    tl.store(out, o1, mask=tok_ok[None, :])
    tl.store(out + D // 2, o2, mask=tok_ok[None, :])
    if WRITE_CACHE:
        if head >= HQ:
            slot = tl.load(slot_ptr + toks, mask=tok_ok, other=-1).to(tl.int64)  # [TB]; -1: skip
            ok = tok_ok[None, :] & (slot >= 0)[None, :]
            at = (slot // block_size)[None, :] * stride_cb + (slot % block_size)[None, :] * stride_cs
            if head < HQ + HKV:
                dst = kc_ptr + at + (head - HQ) * stride_ch + j[:, None]  # [16, TB]
            else:
                dst = vc_ptr + at + (head - HQ - HKV) * stride_ch + j[:, None]
            tl.store(dst, o1.to(kc_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + D // 2, o2.to(kc_ptr.dtype.element_ty), mask=ok)


def suits(x: Tensor, w: Tensor) -> bool:
    """Whether qkv_rope serves this projection (else: linear + rope_qkv)."""
    return (
        x.is_cuda
        and x.dim() == 2
        and 1 <= x.shape[0] <= MAX_T
        and x.stride(1) == 1
        and w.stride(1) == 1
        and x.dtype == w.dtype
        and x.dtype in (torch.bfloat16, torch.float32)
    )


def qkv_rope(
    x: Tensor,
    w: Tensor,
    b: Tensor,
    positions: Tensor,
    cos_sin: Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_cache: Tensor | None = None,
    v_cache: Tensor | None = None,
    slot_mapping: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """x [T, K], w [(Hq + 2 Hkv) D, K], b [(Hq + 2 Hkv) D], positions [T], cos_sin [P, D] float32 ->
    q [T, Hq, D], k, v [T, Hkv, D] (views of one [T, (Hq + 2 Hkv) D] buffer); with the caches
    [blocks, block_size, Hkv, D] and slot_mapping [T] (-1: skip), k and v are stored there too.
    T in [1, 8]; positions must lie in [0, P) (unchecked: that would need a host sync)."""
    hq, hkv, d = num_q_heads, num_kv_heads, head_dim
    n = (hq + 2 * hkv) * d
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_T or x.stride(1) != 1:
        raise ValueError(f"qkv_rope: x must be [T, K] with T in [1, {MAX_T}], got {tuple(x.shape)}")
    t, k = x.shape
    if w.shape != (n, k) or w.stride(1) != 1 or b.shape != (n,) or not b.is_contiguous():
        raise ValueError(
            f"qkv_rope: w must be [{n}, {k}] and b [{n}] (contiguous rows), got "
            f"{tuple(w.shape)}, {tuple(b.shape)}"
        )
    if not x.dtype == w.dtype == b.dtype or x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(
            f"qkv_rope: x, w and b must share bfloat16 or float32, got {x.dtype}, {w.dtype}, {b.dtype}"
        )
    if d % 32:
        raise ValueError(f"qkv_rope: head_dim must be a multiple of 32, got {d}")
    if (
        positions.shape != (t,)
        or cos_sin.dim() != 2
        or cos_sin.shape[1] != d
        or cos_sin.dtype != torch.float32
    ):
        raise ValueError(
            f"qkv_rope: positions must be [{t}] and cos_sin a float32 [P, {d}], got "
            f"{tuple(positions.shape)}, {tuple(cos_sin.shape)} {cos_sin.dtype}"
        )
    caches = (k_cache, v_cache, slot_mapping)
    write = slot_mapping is not None
    if any(c is None for c in caches) and not all(c is None for c in caches):
        raise ValueError("qkv_rope: give all of k_cache, v_cache and slot_mapping, or none")
    if write and (
        k_cache.dim() != 4
        or k_cache.shape[2:] != (hkv, d)
        or v_cache.shape != k_cache.shape
        or v_cache.stride() != k_cache.stride()
        or k_cache.stride(3) != 1
        or slot_mapping.shape != (t,)
    ):
        raise ValueError(
            f"qkv_rope: caches must be two alike [blocks, block_size, {hkv}, {d}] (contiguous last dim) "
            f"and slot_mapping [{t}], got {tuple(k_cache.shape)}, {tuple(v_cache.shape)}, "
            f"{tuple(slot_mapping.shape)}"
        )
    out = torch.empty(t, n, dtype=x.dtype, device=x.device)  # [T, (Hq + 2 Hkv) D]
    kc, vc, slots = (k_cache, v_cache, slot_mapping) if write else (out, out, positions)
    cache_args = (k_cache.shape[1], *k_cache.stride()[:3]) if write else (1, 0, 0, 0)
    _qkv_rope_kernel[((hq + 2 * hkv) * d // 32,)](
        x,
        w,
        b,
        positions,
        cos_sin.contiguous(),
        out,
        kc,
        vc,
        slots,
        t,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        *cache_args,
        HQ=hq,
        HKV=hkv,
        D=d,
        TB=16,  # tl.dot's least N
        BK=max(16, min(BK, triton.next_power_of_2(k))),
        WRITE_CACHE=write,
        # float32 (tests) gets exact products, not tf32's 10-bit mantissas
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST=bool(triton.knobs.runtime.interpret),
        num_warps=WARPS,
        num_stages=STAGES,
        enable_fp_fusion=False,  # RoPE's products rounded as rope.py's (the GEMV is on the MMA)
        **pdl.args(x),
    )
    q = out[:, : hq * d].view(t, hq, d)
    k_ = out[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = out[:, (hq + hkv) * d :].view(t, hkv, d)
    return q, k_, v
