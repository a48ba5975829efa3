"""Batch 1's decode MoE GEMMs in one launch: the gate_up tiles, then the down tiles, which wait on a
counter a slot until that slot's act row is complete (an experiment: does one launch pay the ramp and
tail once, where two launches pay them twice? bench/results v46-v58: a pure read of the down's
17.6 MB reaches 69 % of the copy bandwidth alone, of the gate_up's 35.2 MB 84 %).

fused1(x, ids, w, alpha, limit, gate_up_tiles, down_tiles, phase) -> (act [k, I], y [k, H]):
act[j] = swiglu(x @ W13_e^T + b13_e), y[j] = act[j] @ W2_e^T + b2_e, e = ids[j], as moe_v3_dec_gu's
gate_up and moe_v3_dec's down compute them (the same K step, moe_v3_dec._v3_split_step).
phase 0: one launch; programs 0.. are the gate_up's (slot-major, so slot 0's act row is done first),
then the down's, each spinning on its slot's counter (acquire) that the gate_up programs raise
(release, after a block barrier) — every program is resident at once at these sizes (one wave), and
a block is dispatched in order, so the spin cannot starve the programs it waits on. The last down
program sets the counters back to zero, so a CUDA graph can replay the launch. phase 1 / 2: the
same code as two launches (the gate_up's programs only, then the down's), the A/B.
Both GEMMs take the same warps (the down's split); act is read past L1 (.cg). On an H200 a down tile
of BN 16, BK 128 faulted ("misaligned address"); fused1 refuses tiles that
moe_v3_dec_sizes.split_copies_fit refuses (the engine's kernels take cp.async for them).

Measured (bench/results v58, H200, 20b shapes): one launch lost to the same code as two launches in
every pair tried, 26.17-29.10 against 24.06-26.55 us; two launches equal the engine's kernels.

Timing: moe_fused1_gpu.py. Tests: tests/bench/test_moe_fused1.py (interpreter: programs run one by
one in order, so every spin passes at once).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gptoss.kernels.moe_common import _precision
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_tiles import DecTiles
from gptoss.kernels.moe_v3 import _scaled, weight_descriptors
from gptoss.kernels.moe_v3_dec import _v3_split_step
from gptoss.kernels.moe_v3_dec_sizes import split_copies_fit


@triton.jit
def _acc_one(x_t, kx, w_desc, s_desc, c, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             SPLIT: tl.constexpr, NS: tl.constexpr, ASM: tl.constexpr, PREC: tl.constexpr,
             CG: tl.constexpr):  # fmt: skip
    """sum over the split of W [BN, K] @ x [K] for one token (column 0 of a BM 1 dot) -> [BN]."""
    acc = tl.zeros([SPLIT, BN, 1], tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=NS):
        if CG:  # act written by other programs of this launch: never from a stale L1 line
            xt = tl.load(x_t + k0, mask=(k0 + kx) < K, other=0.0, cache_modifier=".cg")
        else:
            xt = tl.load(x_t + k0, mask=(k0 + kx) < K, other=0.0)
        acc = _v3_split_step(acc, xt, w_desc, s_desc, c, k0, K, 1, BN, BK, SPLIT, True, ASM, PREC, True)
    return tl.reshape(tl.sum(acc, 0), (BN,))


@triton.jit
def _fused1_kernel(
    x_ptr,
    ids_ptr,
    act_ptr,
    y_ptr,
    b13_ptr,
    b2_ptr,
    cnt_ptr,
    alpha,
    limit,
    gw_desc,
    gs_desc,
    dw_desc,
    ds_desc,
    H: tl.constexpr,
    I: tl.constexpr,
    TOP_K: tl.constexpr,
    GBN: tl.constexpr,
    GBK: tl.constexpr,
    DBN: tl.constexpr,
    DBK: tl.constexpr,
    SPLIT: tl.constexpr,
    GNS: tl.constexpr,
    DNS: tl.constexpr,
    PHASE: tl.constexpr,
    ASM: tl.constexpr,
    PREC: tl.constexpr,
):
    GB: tl.constexpr = (2 * I + GBN - 1) // GBN  # gate_up programs a slot
    DB: tl.constexpr = (H + DBN - 1) // DBN  # down programs a slot
    pid = tl.program_id(0)
    if PHASE == 2:
        pid += GB * TOP_K
    if pid < GB * TOP_K:  # gate_up tile (slot s, weight rows pid_n GBN..): GBN / 2 act columns
        s, pid_n = pid // GB, pid % GB
        e = tl.load(ids_ptr + s)
        GKS: tl.constexpr = GBK // SPLIT
        gkx = tl.arange(0, SPLIT)[:, None, None] * GKS + tl.arange(0, GKS)[None, :, None]
        c = e * (2 * I // 16) + pid_n * (GBN // 16)
        pre = _acc_one(x_ptr + gkx, gkx, gw_desc, gs_desc, c, H, GBN, GBK, SPLIT, GNS, ASM, PREC, False)
        r = tl.arange(0, GBN)
        NC: tl.constexpr = GBN // 2
        col = (pid_n * NC + (r // 16) * 8 + r % 8) % I  # row 16b + 8h + g: plane h's column 8b + g
        pre += tl.load(b13_ptr + e.to(tl.int64) * 2 * I + ((r // 8) % 2) * I + col)
        gate, up = tl.split(tl.permute(tl.reshape(pre, (GBN // 16, 2, 8)), (0, 2, 1)))
        gate = tl.minimum(tl.reshape(gate, (NC,)), limit)
        up = tl.minimum(tl.maximum(tl.reshape(up, (NC,)), -limit), limit)
        gn = pid_n * NC + tl.arange(0, NC)
        tl.store(
            act_ptr + s * I + gn,
            ((up + 1.0) * (gate * tl.sigmoid(alpha * gate))).to(act_ptr.dtype.element_ty),
            mask=gn < I,
        )
        if PHASE == 0:
            tl.debug_barrier()  # every thread's act stores before the release
            tl.atomic_add(cnt_ptr + s, 1, sem="release", scope="gpu")
    else:  # down tile (slot s, columns pid_n DBN..)
        q = pid - GB * TOP_K
        s, pid_n = q // DB, q % DB
        if PHASE == 0:
            while tl.atomic_add(cnt_ptr + s, 0, sem="acquire", scope="gpu") < GB:
                if ASM:  # back off: a waiting program leaves the SM's issue slots to the gate_up's
                    tl.inline_asm_elementwise(
                        "nanosleep.u32 256; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
                    )
            tl.debug_barrier()
        e = tl.load(ids_ptr + s)
        DKS: tl.constexpr = DBK // SPLIT
        dkx = tl.arange(0, SPLIT)[:, None, None] * DKS + tl.arange(0, DKS)[None, :, None]
        c = e * (H // 16) + pid_n * (DBN // 16)
        yv = _acc_one(
            act_ptr + s * I + dkx, dkx, dw_desc, ds_desc, c, I, DBN, DBK, SPLIT, DNS, ASM, PREC, True
        )
        dn = pid_n * DBN + tl.arange(0, DBN)
        yv += tl.load(b2_ptr + e.to(tl.int64) * H + dn % H)
        tl.store(y_ptr + s * H + dn, yv.to(y_ptr.dtype.element_ty), mask=dn < H)
        if PHASE == 0:  # the last down program: every spin has passed, so the counters go back to 0
            if tl.atomic_add(cnt_ptr + TOP_K, 1, sem="acq_rel", scope="gpu") == DB * TOP_K - 1:
                for j in tl.static_range(TOP_K + 1):
                    tl.atomic_xchg(cnt_ptr + j, 0, sem="relaxed", scope="gpu")


def fused1(
    x: torch.Tensor,
    ids: torch.Tensor,
    w: MoEWeights,
    alpha: float,
    limit: float,
    gt: DecTiles,
    dt: DecTiles,
    phase: int = 0,
    counters: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [1, H] one token, ids [k] int32 distinct experts, "v3" weights; gt / dt: the gate_up's and the
    down's BN, BK and stages (BM 1; both take gt.split warps, dt.split must equal it). counters:
    k + 1 int32 zeros, kept between calls (phase 0 leaves them zero)."""
    if w.layout != "v3" or gt.split != dt.split:
        raise ValueError(f"fused1: v3 weights and one split for both GEMMs, got {w.layout!r}, {gt}, {dt}")
    if not (split_copies_fit(gt) and split_copies_fit(dt)):
        raise ValueError(f"fused1: TMA copies of 2 chunks a warp or more (split_copies_fit), got {gt}, {dt}")
    e, h, i = w.shape
    k = ids.numel()
    act = torch.empty((k, i), dtype=x.dtype, device=x.device)
    y = torch.empty((k, h), dtype=x.dtype, device=x.device)
    cnt = torch.zeros(k + 1, dtype=torch.int32, device=x.device) if counters is None else counters
    gb, db = triton.cdiv(2 * i, gt.bn), triton.cdiv(h, dt.bn)
    gd = weight_descriptors(w.w13, w.s13, gt.bn, gt.bk)
    dd = weight_descriptors(w.w2, w.s2, dt.bn, dt.bk)
    args = (
        x,
        ids,
        act,
        y,
        w.b13,
        w.b2,
        cnt,
        alpha,
        limit,
        gd["w_desc"],
        gd["s_desc"],
        dd["w_desc"],
        dd["s_desc"],
    )
    consts = dict(H=h, I=i, TOP_K=k, GBN=gt.bn, GBK=gt.bk, DBN=dt.bn, DBK=dt.bk, SPLIT=gt.split)
    consts |= dict(GNS=gt.stages, DNS=dt.stages, ASM=_scaled(x, True), PREC=_precision(x))
    stages = max(gt.stages, dt.stages)
    phases = [(0, (gb + db) * k)] if phase == 0 else [(1, gb * k), (2, db * k)]
    for ph, grid in phases:
        _fused1_kernel[(grid,)](*args, **consts, PHASE=ph, num_warps=gt.split, num_stages=stages)
    return act, y
