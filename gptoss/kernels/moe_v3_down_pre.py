"""Batch 1's down GEMM with its weights read while the gate_up still runs (GPTOSS_V3_DEC_DOWN_PRELOAD).

y [k, H] = act [k, I] @ W2_e^T + b2_e for the k assignments of one token, e its s-th expert, on the
"v3" words (moe_layout._to_v3_layout): moe_v3_dec.down_v3_dec's contract at T 1 (ONE_TOKEN).

Why. At batch 1 the down moves 17.6 MB at ~1.8 TB/s (41-43 % of a copy's bandwidth, bench/results
v36 and v46) after the gate_up has moved 35 MB at the same rate; a pure read of 17.6 MB alone
reaches only 69 %, its ramp and tail a third of its time. The split-K down cannot start a load
before the gate_up ends: its expert comes from the routing the gate_up writes, and its first K step
needs act. But the expert is known from the router logits, written two kernels before (norm_route),
and the weights never change. So each program here routes the logits itself (moe_routing._topk_one,
the gate_up's own choice, the same bits), loads its whole share of W2 (BN rows x all of K) and the
bias into registers, and only then waits for the gate_up (PDL's griddepcontrol.wait), as
gemv_preload does for the projections. The gate_up releases its dependents at its start
(moe_v3_dec_gu's RELEASE), so programs that find room on the SMs beside the gate_up's stream their
rows while it runs. After the wait: act's row from L2, the dequant (moe_v3_step._dequant_v3, K in
natural order) times act in float32, a row sum (tl.sum), the bias, one store.

Reading the logits before the wait is safe: the down's programs are placed only after every gate_up
program has passed its own wait (the release follows it), and the gate_up launches after norm_route
has finished (plainly, or waiting for it with PDL), so the logits are written and visible. Without
PDL (GPTOSS_PDL=0, the interpreter, older GPUs) the wait and the release are skipped and the kernel
runs after the gate_up as any other.

A program: rows [pid*BN, pid*BN + BN) of expert e = the s-th choice, K as KC1 + KC2 64-K chunks (I
2880 = 45 chunks: 32 + 16, 3 masked, whose zero words decode to zeros). Registers hold BN * K / 2
bytes of words a program: 23 KB at BN 16, 48 words a thread at 4 warps. sm_90a SASS (compiled on CPU,
bench/kernels/down_pre_sass.py): 232-234 registers, no spills, 12 LDG.128 a thread before the wait,
6.35 instructions a weight value after it (the dequant to float32, then a product and a sum each:
twice the split-K down's 2.9 in its whole K loop); 2 warps or BN 32 at 4 warps spill.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from torch import Tensor

from gptoss.kernels import moe_common as common
from gptoss.kernels import pdl
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_routing import Routing, _topk_one
from gptoss.kernels.moe_v3 import _check, _scaled, _weight_args
from gptoss.kernels.moe_v3_step import _dequant_v3

# Off until timed in the engine (bench/decode_ab_gpu.py: a variant with this and moe_v3_dec_gu.RELEASE).
PRELOAD = common.env_switch("GPTOSS_V3_DEC_DOWN_PRELOAD", "0")


def tile_from_env(v: str | None) -> tuple[int, int]:
    """(BN, num_warps) from GPTOSS_V3_DEC_DOWN_PRELOAD_TILE="BN,WARPS" (unset or empty: 16, 4); BN a
    multiple of 16 and a power of two (whole v3 row blocks), WARPS a power of two."""
    if v in (None, ""):
        return 16, 4
    parts = v.split(",")
    ok = len(parts) == 2 and all(p.isdigit() and int(p) > 0 and not int(p) & (int(p) - 1) for p in parts)
    if not ok or int(parts[0]) < 16:
        raise ValueError(
            f"GPTOSS_V3_DEC_DOWN_PRELOAD_TILE must be BN,WARPS (powers of two, BN >= 16), got {v!r}"
        )
    return int(parts[0]), int(parts[1])


TILE = tile_from_env(os.environ.get("GPTOSS_V3_DEC_DOWN_PRELOAD_TILE"))


def chunk_parts(k: int) -> tuple[int, int]:
    """K's 64-K chunks as (KC1, KC2): KC1 the largest power of two <= the chunks, KC2 the next power
    of two >= the rest (0: none). I 2880: 45 chunks -> (32, 16)."""
    if k < 1:
        raise ValueError(f"K must be positive, got {k}")
    kc = -(-k // 64)
    kc1 = 1 << (kc.bit_length() - 1)
    return kc1, (triton.next_power_of_2(kc - kc1) if kc > kc1 else 0)


@triton.jit
def _words(w_base, s_base, rb, c0, stride_wn, stride_sn, KC: tl.constexpr, KCT: tl.constexpr):
    """Words [RB, KC, 8, 4, 4] and scale words [RB, KC, 8] of chunks c0.. (zeros past the KCT
    chunks of a row), as moe_v3_step._v3_ptrs lays them out: 16 bytes a lane."""
    kc = c0 + tl.arange(0, KC)
    lane = (tl.arange(0, 8) * 16)[:, None, None] + (tl.arange(0, 4) * 4)[None, :, None]
    lane = lane + tl.arange(0, 4)[None, None, :]
    ok = kc < KCT
    w = w_base + rb[:, None, None, None, None] * stride_wn + kc[None, :, None, None, None] * 128
    w = tl.load(w + lane[None, None, :, :, :], mask=ok[None, :, None, None, None], other=0)
    s = s_base + rb[:, None, None] * stride_sn + kc[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    return w, tl.load(s, mask=ok[None, :, None], other=0)


@triton.jit
def _down_pre_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    logits_ptr,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    N: tl.constexpr,
    K: tl.constexpr,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    KP: tl.constexpr,
    BE: tl.constexpr,
    BN: tl.constexpr,
    KC1: tl.constexpr,
    KC2: tl.constexpr,
    ASM: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (row block, slot s): y[s, block] = act[s] @ W2_e^T + b2_e, e the token's s-th expert."""
    pid_n, s = tl.program_id(0), tl.program_id(1)
    _, _, e = _topk_one(logits_ptr, s, E, TOP_K, KP, BE)  # written two kernels back (module doc)
    RB: tl.constexpr = BN // 16
    KCT: tl.constexpr = (K + 63) // 64
    e64 = e.to(tl.int64)
    w_base, s_base = w_ptr + e64 * stride_we, s_ptr + e64 * stride_se
    rb = (pid_n * RB + tl.arange(0, RB)) % (N // 16)  # past-the-end blocks reload valid rows
    w1, s1 = _words(w_base, s_base, rb, 0, stride_wn, stride_sn, KC1, KCT)
    w2, s2 = w1, s1  # unused unless KC2 > 0
    if KC2 > 0:
        w2, s2 = _words(w_base, s_base, rb, KC1, stride_wn, stride_sn, KC2, KCT)
    n = pid_n * BN + tl.arange(0, BN)
    bias = tl.load(b_ptr + e64 * N + n % N).to(tl.float32)
    pdl.wait_then_release(PDL)  # act is the gate_up's: nothing of it before this
    k1 = tl.arange(0, KC1 * 64)
    a1 = tl.load(a_ptr + s * K + k1, mask=k1 < K, other=0.0).to(tl.float32)
    acc = tl.sum(_dequant_v3(w1, s1, RB, KC1, tl.float32, ASM) * a1[None, :], axis=1)
    if KC2 > 0:
        k2 = KC1 * 64 + tl.arange(0, KC2 * 64)
        a2 = tl.load(a_ptr + s * K + k2, mask=k2 < K, other=0.0).to(tl.float32)
        acc += tl.sum(_dequant_v3(w2, s2, RB, KC2, tl.float32, ASM) * a2[None, :], axis=1)
    tl.store(y_ptr + s * N + n, (acc + bias).to(y_ptr.dtype.element_ty), mask=n < N)


def down_v3_pre(
    act: Tensor, r: Routing, w: MoEWeights, logits: Tensor, tile: tuple[int, int] | None = None
) -> Tensor:
    """act [k, I] (one token's assignments, in order) -> y [k, H] in act.dtype, y[s] = act[s] @
    W2_e^T + b2_e, e the s-th expert of logits [1, E] (moe_routing._topk_one's choice, the one the
    gate_up made and stored in r.ids). tile: (BN, warps), default TILE."""
    if w.layout != "v3":
        raise ValueError(f"down_v3_pre: weights in the {w.layout!r} layout; it reads the 'v3' layout only")
    _check(act, w)
    k = r.ids.shape[1]
    e, h, i = w.shape
    if act.shape[0] != k or logits.shape != (1, e) or logits.stride(-1) != 1:
        raise ValueError(
            f"down_v3_pre: one token's {k} act rows and logits [1, {e}] contiguous, got act "
            f"{tuple(act.shape)} and logits {tuple(logits.shape)}"
        )
    bn, warps = TILE if tile is None else tile
    if bn % 16 or bn & (bn - 1):
        raise ValueError(f"down_v3_pre: BN {bn} must be a power of two of whole 16-row blocks")
    kc1, kc2 = chunk_parts(i)
    y = common._empty((k, h), act.dtype, act.device)
    act = act.contiguous()
    w2, s2, w_strides, s_strides = _weight_args(w.w2, w.s2, True)
    _down_pre_kernel[(triton.cdiv(h, bn), k)](
        act,
        w2,
        s2,
        w.b2,
        y,
        logits,
        *w_strides,
        *s_strides,
        N=h,
        K=i,
        E=e,
        TOP_K=k,
        KP=triton.next_power_of_2(k),
        BE=triton.next_power_of_2(e),
        BN=bn,
        KC1=kc1,
        KC2=kc2,
        ASM=_scaled(act, True),
        num_warps=warps,
        **pdl.args(act),
    )
    return y


def takes(logits: Tensor | None) -> bool:
    """Whether moe.expert_rows_v3 gives this kernel the down (and the gate_up its early release):
    switched on (PRELOAD) and one token's logits routed in the gate_up."""
    return PRELOAD and logits is not None and logits.shape[0] == 1
