"""The v3 MoE's down GEMM kernel (moe_v3.down_v3 launches it): a kernel that finds its expert tile
and a tile body (BM wide, or BM/2 for short tiles: Tiles.half) that runs moe_v3_kernels._v3_gemm's
K loop, then the LoRA expand and the bias."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels.moe_common import _expert_offset, _expert_tile_at, _lora_expand, _tile_rows
from gptoss.kernels.moe_v3_kernels import _v3_gemm
from gptoss.kernels.moe_v3_step import _v3_ptrs


@triton.jit
def _down_v3_tile(
    a_ptr,
    w_t,
    s_t,
    g,
    bias,
    y_ptr,
    rows_ptr,
    lb_e,
    ls_ptr,
    n_ld,
    e,
    slot0,
    n_rows,
    n,
    T,
    N: tl.constexpr,
    K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
    desc,
    off_e,
    TMA: tl.constexpr,
    WTMA: tl.constexpr = False,
    UNMASKED: tl.constexpr = False,
):
    """One tile: y[rows, n] = act[rows] @ W2_e[n]^T + bias, BM rows from slot0. TMA: act's rows are
    expert by expert (gate_up's SORTED), read by desc (block [BM, BK]) from row off_e + slot0."""
    rows, valid = _tile_rows(rows_ptr, T, e, slot0, n_rows, BM)
    if TMA:
        acc = _v3_gemm(
            desc, off_e + slot0, valid, w_t, s_t, g, K, BN, BM, BK, EVEN_K, SCALED, SWZ, PREC, True, WTMA
        )
    else:
        acc = _v3_gemm(
            a_ptr, rows.to(tl.int64) * K, valid, w_t, s_t, g, K, BN, BM, BK, EVEN_K, SCALED, SWZ, PREC,
            False, WTMA, UNMASKED,
        )  # fmt: skip
    if LORA:
        acc = _lora_expand(acc, lb_e, ls_ptr, rows, valid, n_ld, LW, PREC)
    tl.store(
        y_ptr + rows.to(tl.int64)[None, :] * N + n[:, None],
        (acc + bias).to(y_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _down_v3_kernel(
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
    HALF: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
    desc=None,
    desc_half=None,
    TMA: tl.constexpr = False,
    w_desc=None,
    s_desc=None,
    WTMA: tl.constexpr = False,
    UNMASKED: tl.constexpr = False,
):
    """y[a, n] = act[a] @ W2_e^T + b2_e for the rows a of tile pid_m; N = H, K = I. HALF as gate_up's.
    TMA: act expert by expert, read through desc (block [BM, BK]) and desc_half ([BM/2, BK]). WTMA: the
    weights and scales by TMA through w_desc and s_desc (moe_v3.weight_descriptors). UNMASKED: act's
    rows loaded without a row mask (_v3_gemm; moe_common.UNMASKED_ROWS)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    e, slot0, n_rows, n_tiles = _expert_tile_at(counts_ptr, pid_m, E, BE, BM)
    if pid_m >= n_tiles:
        return
    off_e = _expert_offset(counts_ptr, e, E, BE) if TMA else 0
    EVEN_K: tl.constexpr = ((K + 63) // 64 * 64 if SWZ else K) % BK == 0
    n = pid_n * BN + tl.arange(0, BN)
    n_ld = n % N
    e64 = e.to(tl.int64)
    if WTMA:  # the tile's first 16-row block in the [E * N/16, ...] descriptors
        w_t, s_t, g = w_desc, s_desc, e * (N // 16) + pid_n * (BN // 16)
    else:
        w_t, s_t, g = _v3_ptrs(
            w_ptr + e64 * stride_we, s_ptr + e64 * stride_se, pid_n * BN, stride_wn, stride_sn, N, BN, BK, SWZ
        )
    bias = tl.load(b_ptr + e64 * N + n_ld)[:, None]  # [BN, 1]
    args = (
        w_t,
        s_t,
        g,
        bias,
        y_ptr,
        rows_ptr,
        lb_ptr + e64 * stride_lbe,
        ls_ptr,
        n_ld,
        e,
        slot0,
        n_rows,
        n,
        T,
    )
    if HALF and n_rows - slot0 <= BM // 2:
        _down_v3_tile(
            a_ptr, *args, N, K, BM // 2, BN, BK, EVEN_K, SCALED, SWZ, PREC, LORA, LW, desc_half, off_e, TMA,
            WTMA, UNMASKED,
        )  # fmt: skip
    else:
        _down_v3_tile(
            a_ptr, *args, N, K, BM, BN, BK, EVEN_K, SCALED, SWZ, PREC, LORA, LW, desc, off_e, TMA, WTMA,
            UNMASKED,
        )  # fmt: skip
