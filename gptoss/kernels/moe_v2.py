"""The v2 MoE GEMMs (the default): weights in the bits layout (gptoss.kernels.moe_layout), a rotate
and a mask per bf16x2 register, split-K warps at decode and xa tiles in between; see
gptoss.kernels.moe for the whole forward."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels.moe_common import _expert_tile, _lora_args, _lora_expand, _precision
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.moe_tiles import Tiles, _grid

# v2 dequant on CUDA: a word in the v2 layout and the bf16x2 factor (2^(s-1), 2^(s-1)) -> its 4
# bf16x2 MMA registers (see _to_bits_layout): 9 integer ops and 4 multiplies for 8 values. The
# outputs are written last and the factor copied first, so any register sharing is harmless.
_BITS_TO_BF16_ASM: tl.constexpr = tl.constexpr("""
{
.reg .b32 a, b, c, d, e, f;
mov.b32 f, $5;
shl.b32 a, $4, 4; and.b32 a, a, 0x81C081C0; mul.rn.bf16x2 a, a, f;
shf.l.wrap.b32 b, $4, $4, 10; and.b32 b, b, 0x81C081C0; mul.rn.bf16x2 b, b, f;
shf.l.wrap.b32 c, $4, $4, 14; and.b32 c, c, 0x81C081C0; mul.rn.bf16x2 c, c, f;
shl.b32 d, $4, 8; and.b32 d, d, 0x01000100; and.b32 e, $4, 0x80C080C0; or.b32 d, d, e; mul.rn.bf16x2 d, d, f;
mov.b32 $0, a; mov.b32 $1, b; mov.b32 $2, c; mov.b32 $3, d;
}
""")


@triton.jit
def _dequant_bits(
    w, sw, S: tl.constexpr, BN: tl.constexpr, BKS: tl.constexpr, dtype: tl.constexpr, ASM: tl.constexpr
):
    """w [S, BN, BKS/2] uint8 (v2 layout), sw [S, BN, BKS/128] int32 (4 scale bytes each) -> [S, BN, BKS].

    ASM (CUDA): _BITS_TO_BF16_ASM; LLVM folds the split into bf16 halves and the regrouping into
    no instructions (checked in the sm_90a SASS). Portable (the interpreter runs no PTX): the same
    registers by shifts, each bf16-placed value moved to fp16's bits (e2m1 * 2^-14, converted to
    float32 exactly) and scaled by 2^(s - 127 + 14) in float32.
    """
    G: tl.constexpr = BKS // 32
    sw = sw.to(tl.uint32, bitcast=True)
    s = tl.join(tl.join(sw & 0xFF, (sw >> 16) & 0xFF), tl.join((sw >> 8) & 0xFF, sw >> 24))
    s = tl.reshape(s, (S, BN, G))  # [S, BN, G] group g's scale byte (little endian)
    # The words arrive as bytes: a uint8 load is what makes Triton give each thread 8 consecutive K
    # (one word) of the MMA operand; LLVM folds the reassembly into the 4-byte load.
    b01, b23 = tl.split(tl.reshape(w, (S, BN, G, 4, 2, 2)))  # bytes (0, 2), (1, 3)
    b0, b2 = tl.split(b01)
    b1, b3 = tl.split(b23)
    w = (
        b0.to(tl.uint32) | (b1.to(tl.uint32) << 8) | (b2.to(tl.uint32) << 16) | (b3.to(tl.uint32) << 24)
    )  # [S, BN, G, 4]
    if ASM:
        f = tl.broadcast_to((s.to(tl.uint32) * 0x800080 + 0x3F003F00)[:, :, :, None], (S, BN, G, 4))
        r0, r1, r2, r3 = tl.inline_asm_elementwise(
            _BITS_TO_BF16_ASM,
            "=r,=r,=r,=r,r,r",
            [w, f],
            dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32),
            is_pure=True,
            pack=1,
        )
    else:
        r0 = (w << 4) & 0x81C081C0
        r1 = ((w << 10) | (w >> 22)) & 0x81C081C0
        r2 = ((w << 14) | (w >> 18)) & 0x81C081C0
        r3 = (w & 0x80C080C0) | ((w << 8) & 0x01000100)
    q = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (S, BN, BKS // 2))  # word-major, register j
    if ASM:
        lo = (q & 0xFFFF).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        hi = (q >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        out = tl.reshape(tl.join(lo, hi), (S, BN, BKS)).to(dtype)
    else:
        v = tl.join(q & 0xFFFF, q >> 16)  # [S, BN, BKS/2, 2] bf16-placed bits
        v = ((v & 0x8000) | ((v & 0x01C0) << 3)).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        scale = ((s.to(tl.int32) + 14) << 23).to(tl.float32, bitcast=True)  # [S, BN, G]
        v = tl.reshape(v, (S, BN, G, 32)) * scale[:, :, :, None]
        out = tl.reshape(v, (S, BN, BKS)).to(dtype)
    return out


@triton.jit
def _v2_ptrs(
    w_base,
    s_base,
    x_base,
    n_ld,
    row_off,
    stride_wn,
    stride_sn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    XA: tl.constexpr,
):
    """Tile pointers at k0 = 0 and the K offsets of their masks. SPLIT 1: weight bytes [BN, BK/2],
    scale words [BN, BK/128], x [BK, BM] (XA: [BM, BK]); else each of the SPLIT warps owns a K slice
    of BK/SPLIT, first dim."""
    if SPLIT == 1:
        kw = tl.arange(0, BK // 2)[None, :]
        w = w_base + n_ld[:, None] * stride_wn + kw
        s = s_base + n_ld[:, None] * stride_sn + tl.arange(0, BK // 128)[None, :]
        if XA:
            kx = tl.arange(0, BK)[None, :]
            x = x_base + row_off[:, None] + kx
        else:
            kx = tl.arange(0, BK)[:, None]
            x = x_base + row_off[None, :] + kx
    else:
        BKS: tl.constexpr = BK // SPLIT
        sp = tl.arange(0, SPLIT)[:, None, None]
        kw = sp * (BKS // 2) + tl.arange(0, BKS // 2)[None, None, :]
        kx = sp * BKS + tl.arange(0, BKS)[None, :, None]
        w = w_base + n_ld[None, :, None] * stride_wn + kw
        s = (
            s_base
            + n_ld[None, :, None] * stride_sn
            + sp * (BKS // 128)
            + tl.arange(0, BKS // 128)[None, None, :]
        )
        x = x_base + row_off[None, None, :] + kx
    return w, s, x, kw, kx


@triton.jit
def _v2_step(
    acc,
    x,
    w_ptrs,
    s_ptrs,
    kw,
    k0,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    EVEN_K: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    XA: tl.constexpr,
):
    """acc += x @ dequant(W[:, k0:k0+BK])^T as the MMA wants it: acc [BN, BM] (SPLIT 1), [BM, BN] (XA:
    both wgmma operands in shared memory, so the MMA runs async under the next step's dequant) or
    [SPLIT, BN, BM]."""
    if EVEN_K:
        w = tl.load(w_ptrs + k0 // 2)
    else:  # K tail: zero words decode to zeros
        w = tl.load(w_ptrs + k0 // 2, mask=(k0 // 2 + kw) < K // 2, other=0)
    sw = tl.load(s_ptrs + k0 // 128)  # scale rows are padded to 16 bytes: never past a row
    if SPLIT == 1:
        wd = tl.reshape(_dequant_bits(w[None, :, :], sw[None, :, :], 1, BN, BK, x.dtype, ASM), (BN, BK))
        if XA:
            out = tl.dot(x, tl.trans(wd), acc, input_precision=PREC)
        else:
            out = tl.dot(wd, x, acc, input_precision=PREC)
    else:
        wd = _dequant_bits(w, sw, SPLIT, BN, BK // SPLIT, x.dtype, ASM)
        out = tl.dot(wd, x, acc, input_precision=PREC)
    return out


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _gate_up_v2_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    act_ptr,
    counts_ptr,
    rows_ptr,
    lb_ptr,
    ls_ptr,
    stride_lbe,
    stride_lbp,
    T,
    stride_x,
    stride_we,
    stride_wp,
    stride_wn,
    stride_se,
    stride_sp,
    stride_sn,
    alpha,
    limit,
    N: tl.constexpr,
    K: tl.constexpr,
    TOP_K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    XA: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """_gate_up_kernel on v2 weights (scale strides in int32 words): act = swiglu(x @ W13^T + b13)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)  # [BN] act columns = weight-row pairs
    n_ld = n % N  # past-the-end columns reload valid rows; never stored
    e64 = e.to(tl.int64)
    w_g, s_g, x_t, kw, kx = _v2_ptrs(
        w_ptr + e64 * stride_we,
        s_ptr + e64 * stride_se,
        x_ptr,
        n_ld,
        (rows // TOP_K).to(tl.int64) * stride_x,
        stride_wn,
        stride_sn,
        BM,
        BN,
        BK,
        SPLIT,
        XA,
    )
    if XA:
        acc_g = tl.zeros([BM, BN], tl.float32)
        x_ok = valid[:, None]
    elif SPLIT == 1:
        acc_g = tl.zeros([BN, BM], tl.float32)
        x_ok = valid[None, :]  # rows past the tile's assignments: not read (zeros)
    else:
        acc_g = tl.zeros([SPLIT, BN, BM], tl.float32)
        x_ok = valid[None, None, :]
    acc_u = tl.zeros_like(acc_g)
    for k0 in range(0, K, BK):
        xt = tl.load(x_t + k0, mask=x_ok & ((k0 + kx) < K), other=0.0)
        acc_g = _v2_step(acc_g, xt, w_g, s_g, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, XA)
        acc_u = _v2_step(
            acc_u, xt, w_g + stride_wp, s_g + stride_sp, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, XA
        )
    if SPLIT > 1:  # the warps' K slices: one reduction through shared memory
        acc_g = tl.sum(acc_g, 0)
        acc_u = tl.sum(acc_u, 0)
    if XA:  # the epilogue below works on [BN, BM]
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    if LORA:  # + B_e @ s^T: the LoRA expand of the rows' shrunk x (gptoss.kernels.moe_lora)
        acc_g = _lora_expand(acc_g, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, PREC)
        acc_u = _lora_expand(
            acc_u, lb_ptr + e64 * stride_lbe + stride_lbp, ls_ptr, rows, valid, n_ld, LW, PREC
        )
    gate = acc_g + tl.load(b_ptr + e64 * 2 * N + n_ld)[:, None]  # [BN, BM]
    up = acc_u + tl.load(b_ptr + e64 * 2 * N + N + n_ld)[:, None]
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    act = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
    tl.store(
        act_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        act.to(act_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _down_v2_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    counts_ptr,
    rows_ptr,
    lb_ptr,
    ls_ptr,
    stride_lbe,
    T,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    N: tl.constexpr,
    K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    PREC: tl.constexpr,
    ASM: tl.constexpr,
    XA: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
):
    """_down_kernel on v2 weights: y = act @ W2^T + b2."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, rows, valid, n_tiles = _expert_tile(counts_ptr, rows_ptr, T, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    EVEN_K: tl.constexpr = K % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N
    e64 = e.to(tl.int64)
    w_t, s_t, a_t, kw, kx = _v2_ptrs(
        w_ptr + e64 * stride_we,
        s_ptr + e64 * stride_se,
        a_ptr,
        n_ld,
        rows.to(tl.int64) * K,
        stride_wn,
        stride_sn,
        BM,
        BN,
        BK,
        SPLIT,
        XA,
    )
    if XA:
        acc = tl.zeros([BM, BN], tl.float32)
        a_ok = valid[:, None]
    elif SPLIT == 1:
        acc = tl.zeros([BN, BM], tl.float32)
        a_ok = valid[None, :]
    else:
        acc = tl.zeros([SPLIT, BN, BM], tl.float32)
        a_ok = valid[None, None, :]
    for k0 in range(0, K, BK):
        at = tl.load(a_t + k0, mask=a_ok & ((k0 + kx) < K), other=0.0)
        acc = _v2_step(acc, at, w_t, s_t, kw, k0, K, BN, BK, SPLIT, EVEN_K, PREC, ASM, XA)
    if SPLIT > 1:
        acc = tl.sum(acc, 0)
    if XA:
        acc = tl.trans(acc)
    if LORA:
        acc = _lora_expand(acc, lb_ptr + e64 * stride_lbe, ls_ptr, rows, valid, n_ld, LW, PREC)
    y = acc + tl.load(b_ptr + e64 * N + n_ld)[:, None]
    tl.store(
        y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        y.to(y_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


def gate_up_v2(
    x: Tensor,
    r: Routing,
    w: MoEWeights,
    alpha: float,
    limit: float,
    tiles: Tiles,
    lora: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """gate_up on v2 weights (layout "bits")."""
    (t, h), k = x.shape, r.ids.shape[1]
    e, _, i = w.shape
    act = common._empty((t * k, i), x.dtype, x.device)
    s13 = w.s13.view(torch.int32)  # scales read as 4-byte words
    w13 = w.w13
    largs, lkw = _lora_args(lora, x, planes=True)
    _gate_up_v2_kernel[_grid(t, k, e, i, tiles)](
        x,
        w13,
        s13,
        w.b13,
        act,
        r.counts,
        r.rows,
        *largs,
        t,
        x.stride(0),
        *w13.stride()[:3],
        *s13.stride()[:3],
        alpha,
        limit,
        N=i,
        K=h,
        TOP_K=k,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        SPLIT=tiles.split,
        PREC=_precision(x),
        ASM=common._use_asm(x),
        XA=tiles.xa,
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return act


def down_v2(
    act: Tensor, r: Routing, w: MoEWeights, tiles: Tiles, lora: tuple[Tensor, Tensor] | None = None
) -> Tensor:
    """down on v2 weights (layout "bits")."""
    a, i = act.shape
    e, h, _ = w.shape
    t = r.ids.shape[0]
    y = common._empty((a, h), act.dtype, act.device)
    w2, s2 = w.w2, w.s2.view(torch.int32)
    largs, lkw = _lora_args(lora, act, planes=False)
    _down_v2_kernel[_grid(t, r.ids.shape[1], e, h, tiles)](
        act,
        w2,
        s2,
        w.b2,
        y,
        r.counts,
        r.rows,
        *largs,
        t,
        *w2.stride()[:2],
        *s2.stride()[:2],
        N=h,
        K=i,
        E=e,
        BE=triton.next_power_of_2(e),
        BM=tiles.bm,
        BN=tiles.bn,
        BK=tiles.bk,
        SPLIT=tiles.split,
        PREC=_precision(act),
        ASM=common._use_asm(act),
        XA=tiles.xa,
        **lkw,
        num_warps=tiles.warps,
        num_stages=tiles.stages,
    )
    return y
