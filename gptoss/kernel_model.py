"""gpt-oss forward on our Triton kernels: the same weights as gptoss.model, laid out for speed.

The reference model (gptoss.model.GptOss) stays the oracle; gptoss.kernel_layers takes its tensors
once at load time (q/k/v fused into one projection, experts prepared for the MoE kernel) and this
module runs a step as a fixed sequence of launches with no host synchronisation, so a decode step
can be captured in a CUDA graph. Per layer: add+RMSNorm, QKV GEMM, RoPE (+ KV write), paged
attention with sinks, O GEMM, add+RMSNorm, router GEMM + MXFP4 MoE; at decode sizes the second
add+RMSNorm and the router GEMV are one launch (norm_logits), the gate_up GEMM routes (ROUTER below)
and the MoE's combine joins the next add+RMSNorm. With LoRA adapters (gptoss.lora_stack) the QKV and
O GEMMs each add one shrink/expand pair (x @ A^T, masked to each token's adapter, then addmm of B;
the three QKV adapters run as one, B block-diagonal) and the MoE runs gptoss.kernels.moe_lora.

KV writes: full layers and decode-only steps write the step's K/V in the RoPE kernel, before
attention (attention reads the step's own keys from k/v, never from the cache); with
GPTOSS_ROPE_IN_ATTN (the default; not over an fp8 cache, a QKV adapter or the batch-invariant mode),
decode-only steps have no RoPE launch: attention ropes and writes them itself.
A prefill chunk on a sliding layer could overwrite ring slots its first queries still read, so
those layers write after attention.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from gptoss.kernel_layers import Layer, build_layers, moe_layouts
from gptoss.kernels import batch_invariant as bi
from gptoss.kernels import l2_prefetch, moe_decode
from gptoss.kernels.attention import paged_attention, reserve_tickets
from gptoss.kernels.kv_write import write_kv
from gptoss.kernels.linear import linear
from gptoss.kernels.lora_attn import lora_add
from gptoss.kernels.moe import expert_rows_v3, expert_rows_v3_logits, moe_forward, moe_rows, v3_decode
from gptoss.kernels.moe_layout import MoEWeights
from gptoss.kernels.moe_lora import experts_dec_lora, moe_forward_lora
from gptoss.kernels.moe_routing import Routing
from gptoss.kernels.moe_v3_dec_sizes import env_tokens
from gptoss.kernels.norm_route import norm_logits, norm_route
from gptoss.kernels.qkv_rope import qkv_rope
from gptoss.kernels.qkv_rope import suits as qkv_rope_suits
from gptoss.kernels.rmsnorm import fused_add_rms_norm
from gptoss.kernels.rope import build_cos_sin, rope_qkv
from gptoss.kv_dtype import is_fp8
from gptoss.model import GptOss

if TYPE_CHECKING:
    from gptoss.lora_stack import LoraStack

# Decode-sized steps (moe_decode.use_decode, or moe.v3_decode on one v3 copy) fuse the MoE's combine
# into the next add+RMSNorm (1 launch for 2) and take the router in fewer launches; at batch 1 a step
# is ~275 launches of a few µs each. GPTOSS_FUSED_DECODE=0 turns both off. GPTOSS_ROUTER picks the
# router at decode:
#   split  add+RMSNorm, F.linear (cuBLAS GEMV + its split-K reduce), route_and_group: 4 launches
#   norm   norm_route: add+RMSNorm + router GEMV in one launch, then route_and_group: 2
#   fused  norm_logits, then the gate_up GEMM routes the logits itself: 1, and no routing launch
# Measured on an H100 (bench/decode_variants_gpu.sh, batch 1, PDL on): combine fused 388.6 tok/s vs
# 384.3 unfused; norm with its earlier two-pass kernel 377.5 (one program: 339); 2026-11-26: fused
# 405.2 vs split 390.7 / 383.0 (the router's 4 launches, ~12.6 us a layer, became norm_logits' 2.8).
FUSED_DECODE = os.environ.get("GPTOSS_FUSED_DECODE", "1") != "0"
ROUTERS = ("split", "norm", "fused")
ROUTER = os.environ.get("GPTOSS_ROUTER", "fused")
if ROUTER not in ROUTERS:
    raise ValueError(f"GPTOSS_ROUTER={ROUTER!r}: choose one of {', '.join(ROUTERS)}")
# GPTOSS_QKV=fused: at T <= 8 the QKV GEMV, its bias, RoPE and the KV write are one launch
# (gptoss.kernels.qkv_rope) instead of cuBLAS's GEMM + rope_qkv. Off: on the H100 it was slower
# (371.0 vs 383-391 tok/s; 19.0 us a layer against cuBLAS's 12.9 + RoPE's 3.0): its 160 programs,
# each streaming 184 KB of W alone, are 1.2 waves on 132 SMs where cuBLAS splits K.
QKV_FUSED = os.environ.get("GPTOSS_QKV", "split") == "fused"
# GPTOSS_ROPE_IN_ATTN (default 1; 0 turns it off): decode-only steps skip rope_qkv;
# paged attention ropes q and the new key itself and writes the KV cache
# (gptoss.kernels.attention_rope), the same bits with one launch fewer a layer. Its first form, which
# roped the new key inside the pipelined tile loop (148 registers, 35 KB shared against 96 and
# 19.5), lost 5.5 % at 20b's batch 1 (v25); with the key roped once before the loops (118, 15.5 KB),
# H100, one process each (v26): 120b batch-1 128 -> 512 305.1 / 302.2 against 298.6 / 300.7 / 298.7
# tok/s (+1.4 %); 20b 414.4 against 413.2 (4 and 5 runs: the spread); 20b Offline 1000 x (1024 ->
# 1024), warm cache, 19,673 against 19,534 tok/s; kernels a step with PDL off 2.231 against 2.294 ms.
# On since its tests passed compiled on an H200 (v28: test_attention_rope.py, 14 of 14, the engine's
# greedy tokens with it equal to without).
ROPE_IN_ATTN = os.environ.get("GPTOSS_ROPE_IN_ATTN", "1") != "0"
# GPTOSS_DECODE_ON_LARGE (N for 1..N, or sizes and ranges such as 1,2,5-8): where the experts have two
# copies (20b: v2 for the decode kernels, v3 for large batches, moe_layout.large_copy), decode batches
# of these sizes take the v3 copy's decode GEMMs (120b's: the split-K gate_up that routes the logits
# and the split-K down) instead of the decode kernels on v2. Why: at batch 1 (H200, v38) 20b's v2
# gate_up added 21.2 us a layer and its down 10.7, where 120b's split-K kernels stream the same bytes
# in 15.3 and 9.0. Timed (H200, v40, 20b batch-1 128 -> 512, one process): on the v3 copy 606.2 /
# 619.4 tok/s against 559.7 / 556.1 on v2. Batches of 2 and 5-8 since v47, 9-16 since v59: the default is
# moe_v3_dec_sizes.SPLIT_K_TOKENS, where that comment has the figures (20b batch 2 +12.5 %, 8 +6.4 %).


def _decode_on_large(v: str | None) -> frozenset[int]:
    return env_tokens(v, "GPTOSS_DECODE_ON_LARGE", "MoE on the large v3 copy")


DECODE_ON_LARGE = _decode_on_large(os.environ.get("GPTOSS_DECODE_ON_LARGE"))

# GPTOSS_EMBED_IN_NORM (default 1; 0 turns it off): the first layer's add+RMSNorm gathers the token
# rows of the embedding itself (fused_add_rms_norm's rows=), one launch fewer a step, the same bits.
EMBED_IN_NORM = os.environ.get("GPTOSS_EMBED_IN_NORM", "1") != "0"

# GPTOSS_COMBINE_IN_NORM (default 1; 0 turns it off): past the decode sizes too, the MoE leaves its
# experts' rows uncombined (moe.moe_rows) and the next add + RMSNorm combines them, as the decode
# path does: the same bits, one launch fewer a layer, and the combined [T, H] never written and read
# back (at T 1,024: 5.9 MB each way; moe.combine took 9.3 µs of the MoE's 637.9 on an H200, v64).
COMBINE_IN_NORM = os.environ.get("GPTOSS_COMBINE_IN_NORM", "1") != "0"


def decode_copy(x: Tensor, w: MoEWeights, expert_lora: bool = False) -> MoEWeights | None:
    """The experts' copy a decode-sized x [T, H] runs the fused decode MoE on, or None (not a decode
    size: moe_forward). The large v3 copy at DECODE_ON_LARGE's sizes, where there is one and no
    expert adapter (expert_lora); else the primary copy's decode kernels (bits) or v3's."""
    if not expert_lora and w.large is not None and x.shape[0] in DECODE_ON_LARGE and v3_decode(x, w.large):
        return w.large
    if moe_decode.use_decode(x, w) or (not expert_lora and v3_decode(x, w)):
        return w
    return None


def decode_rows(
    x: Tensor, logits: Tensor, top_k: int, w: MoEWeights, alpha: float, limit: float
) -> tuple[Tensor, Routing]:
    """A decode batch's expert GEMMs on w (decode_copy's choice), the gate_up routing the logits [T, E]
    itself -> (the experts' rows y [T*k, H], the routing), on the decode kernels (bits) or v3's."""
    rows = moe_decode.experts_dec_logits if w.layout == "bits" else expert_rows_v3_logits
    return rows(x, logits, top_k, w, alpha, limit)


@dataclass(slots=True)
class StepMeta:
    """Per-step index tensors, built once on the host side of a step and read by every layer."""

    query_start: Tensor  # [S+1] int32 cumulative new-token offsets
    context_lens: Tensor  # [S] int32 positions already in the cache
    full_table: Tensor  # [S, max_blocks] int32
    ring_table: Tensor  # [S, ring_len] int32 (unused without sliding layers)
    full_slots: Tensor  # [T] int64 cache slot of each new token, full layers
    ring_slots: Tensor  # [T] int64 ring slot, or -1 for tokens the ring would drop at once
    max_query_len: int
    num_decode: int  # the first num_decode sequences feed one token each (decodes come first)

    @property
    def decode_only(self) -> bool:
        return self.num_decode == self.context_lens.shape[0]


class KernelModel:
    """forward(ids, positions, meta) -> hidden [T, H]; logits(hidden) -> [N, V] float32."""

    def __init__(
        self,
        ref: GptOss,
        caches: dict[str, Tensor],
        block_size: int,
        max_positions: int,
        lora: LoraStack | None = None,
        batch_invariant: bool = False,
    ) -> None:
        cfg = ref.cfg
        if cfg.quant_method != "mxfp4":
            raise ValueError("--kernels triton needs MXFP4 experts; this checkpoint stores bf16 experts")
        if batch_invariant and lora is not None:
            raise ValueError("--batch-invariant does not cover LoRA adapters (their GEMMs run on cuBLAS)")
        # gptoss.kernels.batch_invariant: every kernel choice fixed by shapes, none by the batch.
        self.batch_invariant = batch_invariant
        self.linear = bi.linear if batch_invariant else linear
        self.cfg = cfg
        self.hq, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps, self.top_k = cfg.rms_norm_eps, cfg.num_experts_per_tok
        self.alpha, self.limit = cfg.swiglu_alpha, cfg.swiglu_limit
        self.scale = cfg.head_dim**-0.5
        self.block_size = block_size
        self.ring_len = -(-cfg.sliding_window // block_size)
        self.max_positions = max_positions
        self.lora = lora  # when set, forward takes each token's adapter index
        self.caches = caches  # pool -> [layers, 2, num_blocks, bs, Hkv, D]
        # --kv-cache-dtype fp8: rope_qkv and write_kv round what they store (gptoss.kernels.fp8);
        # qkv_rope and the RoPE inside attention do not, so they stand aside.
        self.kv_fp8 = any(is_fp8(c) for c in caches.values())
        self.embed, self.norm, self.lm_head = ref.embed, ref.norm, ref.lm_head
        self.cos_sin = build_cos_sin(ref.rope, max_positions)  # [P, D] float32
        reserve_tickets(self.embed.device)  # before any CUDA-graph capture (GPTOSS_ATTN_REDUCE)
        # The invariant mode's MoE is one v2 tile (batch_invariant.moe): v2 weights only.
        kernels, large = ("v2", None) if batch_invariant else moe_layouts(ref)
        self.layers = build_layers(ref, lora, kernels, large)

    def forward(
        self, input_ids: Tensor, positions: Tensor, meta: StepMeta, lora_index: Tensor | None = None
    ) -> Tensor:
        """input_ids, positions [T] int64 -> hidden [T, H] after the final norm. With adapters loaded,
        lora_index [T] int64 gives each token's (0: none)."""
        # The first layer's norm gathers the rows itself (EMBED_IN_NORM): x is the table until then.
        x = self.embed if EMBED_IN_NORM else F.embedding(input_ids, self.embed)  # [T, H]
        mask = None if self.lora is None else self.lora.mask(lora_index)  # [T, W]
        residual: Tensor | None = None
        pending: Tensor | None = None  # [T, k] expert weights while x holds the MoE's uncombined rows
        t = input_ids.shape[0]
        warm = self._l2_warm(t, meta)
        for i, lay in enumerate(self.layers):
            kv = self.caches[lay.pool][lay.index]  # [2, num_blocks, bs, Hkv, D]
            kc, vc = kv[0], kv[1]
            ring = lay.pool == "ring"
            table = meta.ring_table if ring else meta.full_table
            slots = meta.ring_slots if ring else meta.full_slots
            write_first = not ring or meta.decode_only
            rows = input_ids if i == 0 and EMBED_IN_NORM else None
            h, residual = fused_add_rms_norm(
                x,
                residual,
                lay.ln1,
                self.eps,
                combine=pending,
                rows=rows,
                batch_invariant=self.batch_invariant,
            )
            rope = None  # set: attention ropes q, k and writes the cache itself
            if self._qkv_fused(h, lay, write_first):
                q, k, v = qkv_rope(
                    h, lay.wqkv, lay.bqkv, positions, self.cos_sin, self.hq, self.hkv, self.d, kc, vc, slots
                )
            elif self._rope_in_attn(lay, meta):
                qkv = self.linear(h, lay.wqkv, lay.bqkv)  # [T, (Hq + 2 Hkv) D]
                q, k, v = qkv.view(t, -1, self.d).split((self.hq, self.hkv, self.hkv), dim=1)
                rope = (positions, self.cos_sin, slots)
            else:
                qkv = self.linear(h, lay.wqkv, lay.bqkv)  # [T, (Hq + 2 Hkv) D]
                if lay.lora_qkv is not None:
                    lora_add(qkv, h, *lay.lora_qkv, mask, fused=not self.batch_invariant)
                if write_first:
                    q, k, v = rope_qkv(qkv, positions, self.cos_sin, self.hq, self.hkv, self.d, kc, vc, slots)
                else:
                    q, k, v = rope_qkv(qkv, positions, self.cos_sin, self.hq, self.hkv, self.d)
            o = self._attention(
                q, k, v, kc, vc, table, meta, lay, rope, lay.wo if "o" in warm else None, "kv" in warm
            )
            if not write_first:
                write_kv(k, v, kc, vc, slots)
            x = self.linear(o.view(t, -1), lay.wo, lay.bo)  # [T, H]
            if lay.lora_o is not None:
                lora_add(x, o.view(t, -1), *lay.lora_o, mask, fused=not self.batch_invariant)
            pending = None
            if self.batch_invariant:
                h, residual = fused_add_rms_norm(x, residual, lay.ln2, self.eps, batch_invariant=True)
                x = bi.moe_forward(h, lay.router_w, lay.router_b, self.top_k, lay.moe, self.alpha, self.limit)
            elif FUSED_DECODE and (w := decode_copy(x, lay.moe, lay.lora_moe is not None)) is not None:
                x, residual, pending = self._decode_moe(x, residual, lay, w, lora_index)
                if "qkv" in warm and i + 1 < len(self.layers):  # beside the down GEMM just launched
                    l2_prefetch.prefetch_l2(self.layers[i + 1].wqkv)
            elif lay.lora_moe is not None:
                h, residual = fused_add_rms_norm(x, residual, lay.ln2, self.eps)
                x = moe_forward_lora(
                    h,
                    lay.router_w,
                    lay.router_b,
                    self.top_k,
                    lay.moe,
                    lay.lora_moe,
                    lora_index,
                    self.alpha,
                    self.limit,
                )
            else:
                h, residual = fused_add_rms_norm(x, residual, lay.ln2, self.eps)
                a = (h, lay.router_w, lay.router_b, self.top_k, lay.moe, self.alpha, self.limit)
                if COMBINE_IN_NORM:  # the experts' rows for the next add + RMSNorm (decode sizes: combined)
                    x, pending = moe_rows(*a)
                else:
                    x = moe_forward(*a)
        out, _ = fused_add_rms_norm(
            x, residual, self.norm, self.eps, combine=pending, batch_invariant=self.batch_invariant
        )
        return out

    def _decode_moe(
        self, x: Tensor, residual: Tensor, lay: Layer, w: MoEWeights, lora_index: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Decode sizes: add + RMSNorm, the router (ROUTER) and the expert GEMMs on w (decode_copy's
        choice of lay's experts) -> (the experts' rows y [T*k, H], the new residual, the routing
        weights [T, k] the next add+RMSNorm combines with). A layer with expert adapters routes before
        the GEMMs (their shrink needs the routing), by norm_route unless ROUTER is split, and its GEMMs
        add the LoRA expand (moe_lora). A v3 copy of the experts (moe.v3_decode: 120b's one copy, or
        20b's large one with DECODE_ON_LARGE) takes the same routers on the v3 GEMMs: 3 launches a
        layer where moe_forward took 7 (H100, 120b, batch 1, v23: 281.4 tok/s; 275.1 with norm_route,
        259.1 through moe_forward, 290.3 on the v2 decode kernels)."""
        a = (lay.router_w, lay.router_b)
        bits = w.layout == "bits"
        if ROUTER == "fused" and lay.lora_moe is None:  # the gate_up GEMM routes the logits itself
            h, residual, logits = norm_logits(x, residual, lay.ln2, self.eps, *a)
            y, r = decode_rows(h, logits, self.top_k, w, self.alpha, self.limit)
            return y, residual, r.weights
        if ROUTER == "split":
            h, residual = fused_add_rms_norm(x, residual, lay.ln2, self.eps)
            r = moe_decode.route(h, *a, self.top_k)
        else:
            h, residual, r = norm_route(x, residual, lay.ln2, self.eps, *a, self.top_k)
        if lay.lora_moe is not None:
            y = experts_dec_lora(h, r, w, lay.lora_moe, lora_index, self.alpha, self.limit)
        elif bits:
            y = moe_decode.experts_dec(h, r, w, self.alpha, self.limit, combined=False)
        else:
            y = expert_rows_v3(h, r, w, self.alpha, self.limit)
        return y, residual, r.weights

    def _l2_warm(self, t: int, meta: StepMeta) -> frozenset[str]:
        """The L2 prefetches (GPTOSS_L2_PREFETCH's parts) this step's layers issue: decode-only steps of
        up to l2_prefetch.MAX_T tokens, outside the batch-invariant mode; "moe" is the MoE's own."""
        small = meta.decode_only and t <= l2_prefetch.MAX_T and not self.batch_invariant
        return l2_prefetch.ON if small else frozenset()

    def _qkv_fused(self, h: Tensor, lay: Layer, write_first: bool) -> bool:
        """Whether this layer's QKV + RoPE + KV write take qkv_rope (GPTOSS_QKV=fused, decode sizes)."""
        return (
            QKV_FUSED
            and not self.kv_fp8
            and write_first
            and lay.lora_qkv is None
            and not self.batch_invariant
            and qkv_rope_suits(h, lay.wqkv)
        )

    def _rope_in_attn(self, lay: Layer, meta: StepMeta) -> bool:
        """Whether this layer's attention takes the un-roped q, k, v and does RoPE and the KV write
        (GPTOSS_ROPE_IN_ATTN, decode-only steps, no QKV adapter, not in the batch-invariant mode)."""
        return (
            ROPE_IN_ATTN
            and not self.kv_fp8
            and meta.decode_only
            and meta.max_query_len == 1
            and lay.lora_qkv is None
            and not self.batch_invariant
        )

    def _attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        kc: Tensor,
        vc: Tensor,
        table: Tensor,
        meta: StepMeta,
        lay: Layer,
        rope: tuple[Tensor, Tensor, Tensor] | None = None,
        l2_next: Tensor | None = None,
        prefetch_kv: bool = False,
    ) -> Tensor:
        """Decodes and prefill chunks in separate launches when a step mixes them: the decode launch
        splits long contexts over programs, the chunk launch tiles queries. rope (decode-only steps):
        q, k, v are views of the QKV output, roped and cached by the attention kernel. l2_next: a
        weight prefetched into L2 beside the (last) attention kernel; prefetch_kv: the decode launch's
        programs prefetch their cached K/V before their PDL wait (paged_attention)."""
        ring_len = self.ring_len if lay.pool == "ring" else None
        n, s = meta.num_decode, meta.context_lens.shape[0]
        parts = [(0, n, 1), (n, s, meta.max_query_len)] if 0 < n < s else [(0, s, meta.max_query_len)]
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous, also for views of qkv
        for a, b, max_q in parts:
            paged_attention(
                q,
                k,
                v,
                kc,
                vc,
                table[a:b],
                meta.query_start[a : b + 1],
                meta.context_lens[a:b],
                lay.sinks,
                self.scale,
                lay.window,
                ring_len,
                max_q,
                out=out,
                max_context_hint=self.max_positions,
                batch_invariant=self.batch_invariant,
                rope=rope,
                l2_next=l2_next if b == s else None,
                prefetch_kv=prefetch_kv,
            )
        return out

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, H] -> [N, V] float32."""
        return self.lm_logits(hidden).float()

    def lm_logits(self, hidden: Tensor) -> Tensor:
        """hidden [N, H] -> [N, V] in the weights' dtype (an argmax needs no float32 copy)."""
        if self.batch_invariant:
            return bi.linear(hidden, self.lm_head)
        return F.linear(hidden, self.lm_head)
