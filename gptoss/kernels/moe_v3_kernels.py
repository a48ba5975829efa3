"""The v3 MoE's shared K loop (_v3_gemm, on moe_v3_step's dequant + dot) and its gate_up kernel
(moe_v3.gate_up_v3 launches it): a kernel that finds its expert tile and a tile body (a BM-wide one,
or the BM/2 one for short tiles: Tiles.half) that runs the K loop, the LoRA expand and the SwiGLU on
its interleaved rows; and the pass that lays x's rows out expert by expert for gate_up's TMA tiles.
The down kernel is moe_v3_down's."""

from __future__ import annotations

import triton
import triton.language as tl

from gptoss.kernels import pdl
from gptoss.kernels.l2_prefetch import prefetch_part
from gptoss.kernels.moe_common import _expert_offset, _expert_tile_at, _lora_expand, _slot_expert, _tile_rows
from gptoss.kernels.moe_routing import route_in_registers
from gptoss.kernels.moe_v3_step import _v3_ptrs, _v3_step


@triton.jit
def _v3_gemm(
    x,
    row_off,
    valid,
    w_ptrs,
    s_ptrs,
    g,
    K: tl.constexpr,
    ROWS: tl.constexpr,
    BM: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    TMA: tl.constexpr = False,
    WTMA: tl.constexpr = False,
    UNMASKED: tl.constexpr = False,
):
    """acc [ROWS, BM] = W [ROWS, K] @ x[rows]^T: the K loop both GEMMs share. x a pointer and row_off
    [BM] the element offsets of the tile's x rows, each a real row (rows past the expert's are row 0:
    _tile_rows), whose columns of acc past `valid` are never stored: those rows load zeros, one
    predicate a cp.async; UNMASKED, no row mask and only K's tail masked, the same bits in fewer
    instructions (moe_common.UNMASKED_ROWS). Or TMA: x a tensor descriptor of rows laid out expert by
    expert and row_off the tile's first row, one TMA copy a K step instead of a cp.async and a 64-bit
    address per row a thread. Its rows past the expert's are the next expert's (finite: every row is
    written) or past the end (zeros): their columns of acc are never stored. K past the end reads
    zeros, as the masked weights do. WTMA: the weights by TMA too (moe_v3_step._v3_step: w_ptrs,
    s_ptrs descriptors, g the first 16-row block)."""
    kk = tl.arange(0, BK)
    if not TMA:
        x_t = x + row_off[None, :] + kk[:, None]  # [BK, BM]
    acc = tl.zeros([ROWS, BM], tl.float32)
    for k0 in range(0, K, BK):
        if TMA:
            xt = tl.trans(x.load([row_off, k0]))  # [BK, BM]
        elif not UNMASKED:
            xt = tl.load(x_t + k0, mask=valid[None, :] & ((k0 + kk) < K)[:, None], other=0.0)
        elif K % BK == 0:
            xt = tl.load(x_t + k0)
        else:
            xt = tl.load(x_t + k0, mask=((k0 + kk) < K)[:, None], other=0.0)
        acc = _v3_step(acc, xt, w_ptrs, s_ptrs, g, k0, K, ROWS, BK, EVEN_K, SCALED, SWZ, PREC, WTMA)
    return acc


@triton.jit
def _gate_up_v3_tile(
    x_ptr,
    w_g,
    s_g,
    g,
    b_e,
    act_ptr,
    rows_ptr,
    lb_e,
    ls_ptr,
    stride_lbp,
    e,
    slot0,
    n_rows,
    pid_n,
    T,
    stride_x,
    alpha,
    limit,
    N: tl.constexpr,
    K: tl.constexpr,
    TOP_K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
    SORTED: tl.constexpr,
    off_e,
    x_desc,
    XTMA: tl.constexpr,
    routed=None,
    WTMA: tl.constexpr = False,
    UNMASKED: tl.constexpr = False,
):
    """One tile: act[rows, pid_n's BN columns] = swiglu(x[rows // k] @ W13_e^T + b13_e), BM rows from
    slot0. The 2*BN weight rows are gate and up interleaved by 8 (moe_layout._interleave8), one dot.
    SORTED: act's rows expert by expert (row off_e + slot, off_e the expert's first), for down's TMA.
    routed: the kernel's routing in registers (flat ids, assignments, places: moe_routing._group),
    whose rows_ptr is not yet written; else the rows come from rows_ptr."""
    if routed is None:
        rows, valid = _tile_rows(rows_ptr, T, e, slot0, n_rows, BM)
    else:
        flat, a, pos = routed
        slot = slot0 + tl.arange(0, BM)
        valid = slot < n_rows
        sel = (flat[None, :] == e) & (pos[None, :] == slot[:, None])  # [BM, A]: e's slot-th assignment
        rows = tl.sum(tl.where(sel, a[None, :], 0), axis=1)
    if XTMA:  # x's rows expert by expert (_gather_sorted_kernel), read by x_desc
        acc = _v3_gemm(
            x_desc,
            off_e + slot0,
            valid,
            w_g,
            s_g,
            g,
            K,
            2 * BN,
            BM,
            BK,
            EVEN_K,
            SCALED,
            SWZ,
            PREC,
            True,
            WTMA,
        )
    else:
        x_rows = (rows // TOP_K).to(tl.int64) * stride_x
        acc = _v3_gemm(
            x_ptr, x_rows, valid, w_g, s_g, g, K, 2 * BN, BM, BK, EVEN_K, SCALED, SWZ, PREC, False, WTMA,
            UNMASKED,
        )  # fmt: skip
    r = tl.arange(0, 2 * BN)  # acc row r: plane (r // 8) % 2, act column pid_n * BN + (r // 16) * 8 + r % 8
    plane = (r // 8) % 2
    col = (pid_n * BN + (r // 16) * 8 + r % 8) % N  # past-the-end columns read valid rows; never stored
    if LORA:  # + B_e @ s^T: B's planes [2, N, LW] are contiguous, so plane p's row c is row p N + c
        acc = _lora_expand(acc, lb_e, ls_ptr, rows, valid, plane * (stride_lbp // LW) + col, LW, PREC)
    acc += tl.load(b_e + plane * N + col)[:, None]
    # rows 16b + 8h + g -> [b, g, BM, h]: h sits in a thread's registers (the fragment's rows g, g + 8)
    gate, up = tl.split(tl.permute(tl.reshape(acc, (2 * BN // 16, 2, 8, BM)), (0, 2, 3, 1)))
    gate = tl.minimum(tl.reshape(gate, (BN, BM)), limit)  # act column pid_n * BN + 8b + g
    up = tl.minimum(tl.maximum(tl.reshape(up, (BN, BM)), -limit), limit)
    act = (up + 1.0) * (gate * tl.sigmoid(alpha * gate))
    n = pid_n * BN + tl.arange(0, BN)
    dst = off_e + slot0 + tl.arange(0, BM) if SORTED else rows
    tl.store(
        act_ptr + dst.to(tl.int64)[None, :] * N + n[:, None],
        act.to(act_ptr.dtype.element_ty),
        mask=(n < N)[:, None] & valid[None, :],
    )


@triton.jit(do_not_specialize=["T"])  # T changes every step: no recompiles on its value
def _gate_up_v3_kernel(
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
    stride_wn,
    stride_se,
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
    HALF: tl.constexpr,
    SCALED: tl.constexpr,
    SWZ: tl.constexpr,
    PREC: tl.constexpr,
    LORA: tl.constexpr,
    LW: tl.constexpr,
    SORTED: tl.constexpr = False,
    x_desc=None,
    x_desc_half=None,
    XTMA: tl.constexpr = False,
    logits_ptr=None,
    ids_ptr=None,
    wts_ptr=None,
    stride_l=0,
    ROUTE: tl.constexpr = False,
    KP: tl.constexpr = 1,
    BT: tl.constexpr = 1,
    w_desc=None,
    s_desc=None,
    WTMA: tl.constexpr = False,
    w2_ptr=None,
    s2_ptr=None,
    w2_bytes=0,
    s2_bytes=0,
    PF: tl.constexpr = False,
    PF_NT: tl.constexpr = 32,
    PDL: tl.constexpr = False,
    UNMASKED: tl.constexpr = False,
):
    """act[a, n] = swiglu(x[a // k] @ W13_e^T + b13_e) for the rows a of tile pid_m; N = I, K = H.
    HALF: a tile with <= BM/2 rows runs the BM/2 body (its weights still pass once). SORTED: act's
    rows expert by expert (_gate_up_v3_tile); XTMA: so are x's, read through x_desc ([BM, BK]
    blocks) and x_desc_half ([BM/2, BK]). ROUTE (T <= BM: one tile an expert): every program routes
    the [T, E] logits in registers (moe_routing._topk, _group: the routing kernel's decisions) and
    takes the pid_m-th expert with rows; program (0, 0) stores the routing for down and the combine.
    WTMA: the weights and scales by TMA through w_desc and s_desc (moe_v3.weight_descriptors).
    PF (SWZ): first warm L2 with the tile's W13 words and scales (all of K) and this program's share
    of expert e's W2 bytes (w2_ptr, s2_ptr: the uint8 tensors, w2_bytes, s2_bytes an expert), for
    the down GEMM after it (gptoss.kernels.l2_prefetch); PF_NT = the program's threads. PDL: launched
    with programmatic dependent launch (moe_v3.ROUTE_PDL): wait for the kernel ahead, then release.
    UNMASKED: x's rows loaded without a row mask (_v3_gemm; moe_common.UNMASKED_ROWS)."""
    pdl.wait_then_release(PDL)
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    if ROUTE:
        first = (pid_n == 0) & (pid_m == 0)
        flat, a, pos, cnt = route_in_registers(
            logits_ptr, T, stride_l, first, ids_ptr, wts_ptr, counts_ptr, rows_ptr, E, TOP_K, KP, BE, BT
        )
        e, n_rows, _ = _slot_expert(cnt, tl.arange(0, BE), pid_m)
        slot0 = 0
        if n_rows == 0:  # past the active experts
            return
        routed = (flat, a, pos)
    else:
        e, slot0, n_rows, n_tiles = _expert_tile_at(counts_ptr, pid_m, E, BE, BM)
        if pid_m >= n_tiles:
            return
        routed = None
    e64 = e.to(tl.int64)
    if PF:
        rb: tl.constexpr = 2 * BN // 16  # the tile's 16-row blocks
        nb = tl.minimum(rb, 2 * N // 16 - pid_n * rb)
        blk = e64 * stride_we + pid_n * rb * stride_wn
        prefetch_part(w_ptr + blk, nb * stride_wn * 4, 0, 1, PF_NT)
        prefetch_part(s_ptr + e64 * stride_se + pid_n * rb * stride_sn, nb * stride_sn * 4, 0, 1, PF_NT)
        prefetch_part(w2_ptr + e64 * w2_bytes, w2_bytes, pid_n, tl.num_programs(0), PF_NT)
        prefetch_part(s2_ptr + e64 * s2_bytes, s2_bytes, pid_n, tl.num_programs(0), PF_NT)
    off_e = _expert_offset(counts_ptr, e, E, BE) if SORTED or XTMA else 0
    EVEN_K: tl.constexpr = ((K + 63) // 64 * 64 if SWZ else K) % BK == 0  # SWZ: K padded to 64
    if WTMA:  # the tile's first 16-row block in the [E * 2N/16, ...] descriptors
        w_g, s_g, g = w_desc, s_desc, e * (2 * N // 16) + pid_n * (2 * BN // 16)
    else:
        w_g, s_g, g = _v3_ptrs(
            w_ptr + e64 * stride_we,
            s_ptr + e64 * stride_se,
            pid_n * 2 * BN,
            stride_wn,
            stride_sn,
            2 * N,
            2 * BN,
            BK,
            SWZ,
        )
    args = (
        w_g,
        s_g,
        g,
        b_ptr + e64 * 2 * N,
        act_ptr,
        rows_ptr,
        lb_ptr + e64 * stride_lbe,
        ls_ptr,
        stride_lbp,
    )
    if HALF and n_rows - slot0 <= BM // 2:
        _gate_up_v3_tile(
            x_ptr, *args, e, slot0, n_rows, pid_n, T, stride_x, alpha, limit,
            N, K, TOP_K, BM // 2, BN, BK, EVEN_K, SCALED, SWZ, PREC, LORA, LW, SORTED, off_e,
            x_desc_half, XTMA, routed, WTMA, UNMASKED,
        )  # fmt: skip
    else:
        _gate_up_v3_tile(
            x_ptr, *args, e, slot0, n_rows, pid_n, T, stride_x, alpha, limit,
            N, K, TOP_K, BM, BN, BK, EVEN_K, SCALED, SWZ, PREC, LORA, LW, SORTED, off_e,
            x_desc, XTMA, routed, WTMA, UNMASKED,
        )  # fmt: skip


@triton.jit
def _gather_sorted_kernel(
    x_ptr,
    out_ptr,
    counts_ptr,
    rows_ptr,
    T,
    stride_x,
    H: tl.constexpr,
    TOP_K: tl.constexpr,
    E: tl.constexpr,
    BE: tl.constexpr,
    BT: tl.constexpr,
    BH: tl.constexpr,
):
    """out[off_e + j] = x[rows[e, j] // k] for expert e = program 0 and its slots j of program 1's block:
    x's rows laid out expert by expert, for gate_up's TMA tiles (gate_up_v3's tma_x)."""
    e, pid = tl.program_id(0), tl.program_id(1)
    cnt = tl.load(counts_ptr + e)
    if pid * BT >= cnt:
        return
    j = pid * BT + tl.arange(0, BT)
    ok = j < cnt
    src = (tl.load(rows_ptr + e * T + j, mask=ok, other=0) // TOP_K).to(tl.int64) * stride_x
    dst = (_expert_offset(counts_ptr, e, E, BE) + j).to(tl.int64) * H
    for h0 in range(0, H, BH):
        h = h0 + tl.arange(0, BH)
        m = ok[:, None] & (h < H)[None, :]
        tl.store(
            out_ptr + dst[:, None] + h[None, :], tl.load(x_ptr + src[:, None] + h[None, :], mask=m), mask=m
        )
