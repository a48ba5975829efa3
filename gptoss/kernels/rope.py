"""Split the fused q|k|v projection, apply YaRN RoPE to q and k, and optionally write k, v to the paged cache.

qkv [T, (Hq + 2*Hkv) * D] -> q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], new and contiguous, in
qkv.dtype. One program per token handles all its heads. cos_sin [max_pos, D] float32 holds
cat(cos, sin) per position (from `build_cos_sin`, made once), so the kernel does no trigonometry.
Bytes moved per token: read (Hq + 2*Hkv)*D*e + 4*D, write the same (Hq + 2*Hkv)*D*e, plus
2*Hkv*D*e' into the cache when given: at gpt-oss shapes in bf16 about 10 KB (+2 KB) per token.

Numerics follow `gptoss.model.apply_rope`: halves x1, x2 (non-interleaved), in float32,
(x1*cos - x2*sin, x2*cos + x1*sin), one rounding to the output dtype. The kernel is compiled with
enable_fp_fusion=False: an FMA would skip the rounding of one product, and where the two products
nearly cancel, that float32 difference is many bf16 ulps of the small result (12 ulps at 20b shapes,
test_small_ops::test_gpu_full_shapes on an H100); with each product rounded as torch rounds it, the
kernel is bit-exact with the reference on the GPU as in the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import pdl
from gptoss.kernels.fp8 import to_cache
from gptoss.kernels.rounding import round_to
from gptoss.kv_dtype import is_fp8
from gptoss.model import Rope


def build_cos_sin(rope: Rope, max_pos: int) -> Tensor:
    """The [max_pos, D] float32 table cat(cos, sin) of `rope` for positions 0..max_pos-1.

    Made with Rope.forward itself, so every entry equals what the reference computes per step.
    """
    positions = torch.arange(max_pos, device=rope.inv_freq.device)  # [P]
    cos, sin = rope(positions)  # [P, D/2] each
    return torch.cat((cos, sin), dim=-1).contiguous()  # [P, D]


@triton.jit
def _rotate(
    x_ptr,
    row_off,
    out_ptr,
    out_row,
    cos,
    sin,
    heads,
    D: tl.constexpr,
    HEADS: tl.constexpr,
    HALF: tl.constexpr,
):
    """Load `heads` heads of D at x_ptr + row_off, rotate them, store at out_ptr + out_row; return them."""
    h = tl.arange(0, HEADS)[:, None]  # [HEADS, 1]
    j = tl.arange(0, HALF)[None, :]  # [1, HALF]
    mask = (h < heads) & (j < D // 2)
    off = h * D + j  # [HEADS, HALF] first-half offsets
    x1 = tl.load(x_ptr + row_off + off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + row_off + off + D // 2, mask=mask, other=0.0).to(tl.float32)
    o1 = round_to(x1 * cos - x2 * sin, out_ptr.dtype.element_ty)
    o2 = round_to(x2 * cos + x1 * sin, out_ptr.dtype.element_ty)
    tl.store(out_ptr + out_row + off, o1, mask=mask)
    tl.store(out_ptr + out_row + off + D // 2, o2, mask=mask)
    return o1, o2, off, mask


@triton.jit
def _rope_qkv_kernel(
    qkv_ptr,
    pos_ptr,
    cs_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    stride_qkv,
    block_size,
    kc_s0,
    kc_s1,
    kc_s2,
    vc_s0,
    vc_s1,
    vc_s2,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    HQ_PAD: tl.constexpr,
    HKV_PAD: tl.constexpr,
    HALF: tl.constexpr,
    WRITE_CACHE: tl.constexpr,
    PDL: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    pdl.wait_then_release(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, HALF)[None, :]  # [1, HALF]
    jm = j < D // 2
    cos = tl.load(cs_ptr + pos * D + j, mask=jm, other=0.0)  # [1, HALF] float32
    sin = tl.load(cs_ptr + pos * D + D // 2 + j, mask=jm, other=0.0)
    row = t * stride_qkv
    _rotate(qkv_ptr, row, q_ptr, t * HQ * D, cos, sin, HQ, D, HQ_PAD, HALF)
    k1, k2, off, mask = _rotate(qkv_ptr, row + HQ * D, k_ptr, t * HKV * D, cos, sin, HKV, D, HKV_PAD, HALF)
    # v is a plain copy; loaded as the same two halves so the cache write shares the offsets.
    v1 = tl.load(qkv_ptr + row + (HQ + HKV) * D + off, mask=mask, other=0.0)
    v2 = tl.load(qkv_ptr + row + (HQ + HKV) * D + off + D // 2, mask=mask, other=0.0)
    tl.store(v_ptr + t * HKV * D + off, v1, mask=mask)
    tl.store(v_ptr + t * HKV * D + off + D // 2, v2, mask=mask)
    if WRITE_CACHE:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        blk = slot // block_size
        in_blk = slot % block_size
        h = tl.arange(0, HKV_PAD)[:, None]
        cmask = mask & (slot >= 0)  # slot -1: a padding token, nothing to store
        kc = kc_ptr + blk * kc_s0 + in_blk * kc_s1 + h * kc_s2 + j
        vc = vc_ptr + blk * vc_s0 + in_blk * vc_s1 + h * vc_s2 + j
        kv = kc_ptr.dtype.element_ty
        tl.store(kc, to_cache(k1, KV_FP8, kv), mask=cmask)
        tl.store(kc + D // 2, to_cache(k2, KV_FP8, kv), mask=cmask)
        tl.store(vc, to_cache(v1, KV_FP8, kv), mask=cmask)
        tl.store(vc + D // 2, to_cache(v2, KV_FP8, kv), mask=cmask)


def rope_qkv(
    qkv: Tensor,
    positions: Tensor,
    cos_sin: Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    k_cache: Tensor | None = None,
    v_cache: Tensor | None = None,
    slot_mapping: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """qkv [T, (Hq+2Hkv)*D], positions [T] int, cos_sin [P, D] float32 -> q [T,Hq,D], k, v [T,Hkv,D].

    With k_cache, v_cache [num_blocks, block_size, Hkv, D] and slot_mapping [T] int (flat slot
    block*block_size + offset, -1 = skip), roped k and v are also stored there (a float8_e4m3fn
    cache: rounded as gptoss.kernels.fp8.quantize). positions must lie
    in [0, P): they index the table unchecked (checking would need a host sync).
    """
    hq, hkv, d = num_q_heads, num_kv_heads, head_dim
    if qkv.dim() != 2 or qkv.shape[1] != (hq + 2 * hkv) * d or qkv.stride(1) != 1:
        raise ValueError(
            f"qkv must be [T, {(hq + 2 * hkv) * d}] with a contiguous last dim, got "
            f"{tuple(qkv.shape)} strides {qkv.stride()}"
        )
    T = qkv.shape[0]
    if positions.shape != (T,):
        raise ValueError(f"positions must be [{T}], got {tuple(positions.shape)}")
    if (
        cos_sin.dim() != 2
        or cos_sin.shape[1] != d
        or cos_sin.dtype != torch.float32
        or not cos_sin.is_contiguous()
    ):
        raise ValueError(
            f"cos_sin must be a contiguous float32 [P, {d}], got {tuple(cos_sin.shape)} {cos_sin.dtype}"
        )
    if d % 2:
        raise ValueError(f"head_dim must be even, got {d}")
    caches = (k_cache, v_cache, slot_mapping)
    write = slot_mapping is not None
    if any(c is None for c in caches) and not all(c is None for c in caches):
        raise ValueError("give all of k_cache, v_cache and slot_mapping, or none")
    if write:
        for c in (k_cache, v_cache):
            if c.dim() != 4 or c.shape[2:] != (hkv, d) or c.stride(3) != 1:
                raise ValueError(
                    f"caches must be [blocks, block_size, {hkv}, {d}] with a "
                    f"contiguous last dim, got {tuple(c.shape)}"
                )
        if v_cache.shape[:2] != k_cache.shape[:2]:
            raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
        if slot_mapping.shape != (T,):
            raise ValueError(f"slot_mapping must be [{T}], got {tuple(slot_mapping.shape)}")
    q = torch.empty(T, hq, d, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(T, hkv, d, dtype=qkv.dtype, device=qkv.device)
    v = torch.empty(T, hkv, d, dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q, k, v
    # Without a cache the cache pointers are placeholders the kernel never touches.
    kc, vc, slots = (k_cache, v_cache, slot_mapping) if write else (k, v, positions)
    cache_args = (
        (k_cache.shape[1], *k_cache.stride()[:3], *v_cache.stride()[:3]) if write else (1,) + (0,) * 6
    )
    half = triton.next_power_of_2(d // 2)
    _rope_qkv_kernel[(T,)](
        qkv,
        positions,
        cos_sin,
        q,
        k,
        v,
        kc,
        vc,
        slots,
        qkv.stride(0),
        *cache_args,
        HQ=hq,
        HKV=hkv,
        D=d,
        HQ_PAD=triton.next_power_of_2(hq),
        HKV_PAD=triton.next_power_of_2(hkv),
        HALF=half,
        WRITE_CACHE=write,
        KV_FP8=write and is_fp8(k_cache),
        num_warps=4 if hq * d <= 4096 else 8,
        enable_fp_fusion=False,  # each product rounded, as torch: no FMA (docstring)
        **pdl.args(qkv),
    )
    return q, k, v
