"""bf16 subnormal checks for the v2 dequant (bench/kernels/moe_gpu.py prints them first): the e2m1 code
0.5 lands on the bf16 subnormal 2^-127 and is multiplied by 2^(s-1) (mul.rn.bf16x2), so torch.matmul
and tl.dot on subnormal inputs, that multiply, and the v2 PTX dequant against
gptoss.mxfp4.dequantize bit for bit must all keep subnormals. CUDA only."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gptoss.kernels import moe
from gptoss.mxfp4 import dequantize


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(a_ptr + i[:, None] * N + i[None, :])
    b = tl.load(b_ptr + i[:, None] * N + i[None, :])
    tl.store(c_ptr + i[:, None] * N + i[None, :], tl.dot(a, b))


@triton.jit
def _mul_kernel(a_ptr, c_ptr, f, N: tl.constexpr):
    """c = a * f in bf16 (one mul.rn.bf16x2 a pair), f a bf16 power of two."""
    i = tl.arange(0, N)
    tl.store(c_ptr + i, tl.load(a_ptr + i) * f.to(tl.bfloat16))


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, out_ptr, BN: tl.constexpr, BK: tl.constexpr):
    """out [BN, BK] = the v2 ASM dequant of words [BN, BK/2] bytes and scale words [BN, BK/128]."""
    n = tl.arange(0, BN)[:, None]
    w = tl.load(w_ptr + n * (BK // 2) + tl.arange(0, BK // 2)[None, :])
    s = tl.load(s_ptr + n * (BK // 128) + tl.arange(0, BK // 128)[None, :])
    d = tl.reshape(moe._dequant_bits(w[None, :, :], s[None, :, :], 1, BN, BK, tl.float32, True), (BN, BK))
    tl.store(out_ptr + n * BK + tl.arange(0, BK)[None, :], d)


def subnormal_checks() -> None:
    """Whether bf16 subnormals survive the paths the v2 dequant relies on (printed: read it before
    trusting v2)."""
    sub = torch.full((64, 64), 0x0040, dtype=torch.int16, device="cuda").view(torch.bfloat16)  # 2^-127
    ones = torch.ones(64, 64, dtype=torch.bfloat16, device="cuda")
    want = 64 * 2.0**-127  # each dot product: 64 subnormals
    mm = torch.matmul(sub, ones).float()
    c = torch.empty(64, 64, dtype=torch.float32, device="cuda")
    _dot_kernel[(1,)](sub, ones, c, N=64)
    prod = torch.empty(64, dtype=torch.bfloat16, device="cuda")
    _mul_kernel[(1,)](sub[0], prod, 2.0**126, N=64)
    print(f"subnormal torch.matmul: nonzero {bool((mm != 0).all())}, exact {bool((mm == want).all())}")
    print(f"subnormal tl.dot:       nonzero {bool((c != 0).all())}, exact {bool((c == want).all())}")
    print(f"subnormal bf16 mul:     2^-127 * 2^126 == 0.5: {bool((prod.float() == 0.5).all())}")
    g = torch.Generator("cuda").manual_seed(3)
    blocks = torch.randint(0, 256, (64, 8, 16), generator=g, device="cuda", dtype=torch.uint8)
    scales = torch.randint(100, moe.MAX_SCALE_V2 + 1, (64, 8), generator=g, device="cuda", dtype=torch.uint8)
    out = torch.empty(64, 256, dtype=torch.float32, device="cuda")
    _dequant_kernel[(1,)](
        moe._to_bits_layout(blocks.reshape(64, 128)), scales.view(torch.int32), out, BN=64, BK=256
    )
    ref = dequantize(blocks, scales, torch.float32)
    print(
        f"v2 PTX dequant == mxfp4.dequantize: {bool(torch.equal(out, ref))} "
        f"(codes 0.5: {int((ref.abs() == torch.exp2(scales.float() - 128).repeat_interleave(32, 1)).sum())})"
    )
