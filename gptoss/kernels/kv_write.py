"""The paged KV-cache write as a launch of its own: token t's K and V go to flat slot slot_mapping[t]
of a layer's caches, a full layer's blocks or a sliding layer's ring alike (the caller's slots say
which), -1 skipping the token. The RoPE kernels (rope_qkv, qkv_rope) and decode attention with `rope`
write the cache themselves where they can; this write serves where they cannot, a prefill chunk on a
sliding layer, which must write after attention lest it overwrite ring slots its first queries still
read (gptoss.kernel_model), and the tests and benchmarks that fill a cache directly."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels.fp8 import to_cache
from gptoss.kv_dtype import is_fp8


@triton.jit
def _write_kv_kernel(
    kn_ptr,
    vn_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    stride_nt,
    stride_nh,
    stride_cb,
    stride_cs,
    stride_ch,
    HKV: tl.constexpr,
    H_PAD: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """Program t: copies token t's [Hkv, D] K and V into its cache slot, unless the slot is -1
    (KV_FP8: rounded to e4m3, gptoss.kernels.fp8)."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    hh = tl.arange(0, H_PAD)[:, None]
    d = tl.arange(0, D)[None, :]
    mask = hh < HKV
    src = t.to(tl.int64) * stride_nt + hh * stride_nh + d
    dst = (slot // BS) * stride_cb + (slot % BS) * stride_cs + hh * stride_ch + d
    kv = kc_ptr.dtype.element_ty
    tl.store(kc_ptr + dst, to_cache(tl.load(kn_ptr + src, mask=mask), KV_FP8, kv), mask=mask)
    tl.store(vc_ptr + dst, to_cache(tl.load(vn_ptr + src, mask=mask), KV_FP8, kv), mask=mask)


def write_kv(k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Store token t's K/V [Hkv, D] at flat slot slot_mapping[t] (block * bs + offset) of the
    caches [num_blocks, bs, Hkv, D]; -1 skips the token, with no host sync. Moves
    4 x T x Hkv x D x itemsize bytes (read K, V; write K, V)."""
    t, hkv, d = k_new.shape
    bs = k_cache.shape[1]
    if slot_mapping.shape != (t,) or k_cache.shape[2:] != (hkv, d) or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"shapes disagree: k_new {tuple(k_new.shape)}, cache "
            f"{tuple(k_cache.shape)}, slots {tuple(slot_mapping.shape)}"
        )
    if k_new.stride() != v_new.stride() or k_cache.stride() != v_cache.stride():
        raise ValueError("k and v tensors must have the same strides")
    if k_new.stride(-1) != 1 or k_cache.stride(-1) != 1 or d & (d - 1) or bs & (bs - 1):
        raise ValueError("contiguous last dims and power-of-two head_dim and block_size needed")
    if t == 0:
        return
    _write_kv_kernel[(t,)](
        k_new,
        v_new,
        k_cache,
        v_cache,
        slot_mapping,
        k_new.stride(0),
        k_new.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        HKV=hkv,
        H_PAD=triton.next_power_of_2(hkv),
        D=d,
        BS=bs,
        KV_FP8=is_fp8(k_cache),
        num_warps=1,
    )
