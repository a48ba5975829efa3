"""An AttentionFn over a paged KV cache: many sequences per step, sinks, sliding rings.

The cache of a layer is two tensors [slots * Hkv, D] (row = slot * Hkv + head), so one gather
yields context already laid out [B, Hkv, L, D] for a batched matmul. `StepContext.build` turns
the scheduled sequences into index tensors once per step; every layer reuses them.

Sliding layers keep a ring of R = ceil(window / bs) blocks per sequence. A prefill chunk may
overwrite ring slots that its own first queries still need, so chunks read their context
before the step's writes and attend over context + their new K/V. A decode writes its one
token first and then reads: the slot it overwrites held position p - R*bs, out of the window.
Decodes attend as one padded batch; prefill chunks attend in groups padded to their longest
chunk, as long as the padding stays small.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gptoss.block_manager import cdiv
from gptoss.kv_dtype import is_fp8, quantize

# Prefill scores are [B, Hq, Q, K] float32; slice the queries to keep them under this many elements.
MAX_SCORE_ELEMS = 1 << 26
MAX_GROUP_KEYS = 1 << 16  # B * K of a prefill group, so one query slice stays small


@dataclass(slots=True)
class KVIndex:
    """Which cache rows one group reads from one pool, and what each query may see."""

    rows: Tensor  # [B * Hkv * L] int64 cache rows, ordered [B, Hkv, L] (padding reads real rows)
    bias: Tensor  # decode [B, 1, 1, L]; prefill [B, Q, L + Q]: 0 where visible, -inf where not
    length: int  # L


@dataclass(slots=True)
class Group:
    """Sequences attended together. Prefill chunks of different lengths are padded to the
    longest: `pad_src` picks each padded query row's token row, `unpad` the real rows back."""

    start: int  # first token row of the group in the step
    num_tokens: int  # its real token rows
    batch: int  # B sequences
    qlen: int  # Q (padded) new tokens per sequence: 1 for the decode group
    full: KVIndex
    ring: KVIndex | None
    pad_src: Tensor | None = None  # [B * Q] token rows (None: no padding)
    unpad: Tensor | None = None  # [num_tokens] rows of the padded output


@dataclass(slots=True)
class StepContext:
    positions: Tensor  # [T] int64 position of each new token
    groups: list[Group]
    full_rows: Tensor  # [T * Hkv] cache rows the step's K/V go to, full layers
    ring_src: Tensor | None  # [T'] token rows whose K/V go to the ring (the last R*bs of each chunk)
    ring_rows: Tensor | None  # [T' * Hkv] their ring cache rows

    @staticmethod
    def build(
        starts: list[int],
        lens: list[int],
        full_tables: list[list[int]],
        ring_tables: list[list[int]],
        block_size: int,
        window: int | None,
        num_kv_heads: int,
        device: torch.device,
    ) -> StepContext:
        """Index tensors for sequences feeding positions [starts[i], starts[i] + lens[i]).

        Sequences with lens == 1 must come first; they form the decode group.
        """
        bs, hkv = block_size, num_kv_heads
        ring_len = cdiv(window, bs) if window else 0
        num_decode = next((i for i, n in enumerate(lens) if n != 1), len(lens))
        if any(n == 1 for n in lens[num_decode:]):
            raise ValueError("single-token sequences must come first in the step")
        start_t = torch.tensor(starts, dtype=torch.int64)  # [S]
        len_t = torch.tensor(lens, dtype=torch.int64)  # [S]
        full_t = _pad(full_tables)  # [S, max blocks]
        ring_t = _pad(ring_tables) if ring_len else None  # [S, <= R]
        heads = torch.arange(hkv)

        def rows_of(slots: Tensor) -> Tensor:  # [...] slots -> [..., Hkv] rows
            return slots[..., None] * hkv + heads

        seq_of = torch.repeat_interleave(torch.arange(len(lens)), len_t)  # [T]
        row_start = torch.cumsum(len_t, 0) - len_t  # [S]
        pos = start_t[seq_of] + torch.arange(int(len_t.sum())) - row_start[seq_of]  # [T]
        full_rows = rows_of(full_t[seq_of, pos // bs] * bs + pos % bs).view(-1)
        ring_src = ring_rows = None
        if ring_t is not None:
            keep = pos >= (start_t + len_t)[seq_of] - ring_len * bs  # [T]
            ring_src = keep.nonzero().squeeze(1)
            p = pos[ring_src]
            ring_rows = rows_of(ring_t[seq_of[ring_src], (p // bs) % ring_len] * bs + p % bs).view(-1)

        groups = []
        if num_decode:
            # Decodes read after the step's writes, so their context ends with their own token.
            s = start_t[:num_decode] + 1
            full = _decode_index(*_full_context(s, full_t[:num_decode], bs), rows_of)
            ring = None
            if ring_t is not None:
                ring = _decode_index(*_ring_context(s, ring_t[:num_decode], bs, window, ring_len), rows_of)
            groups.append(Group(0, num_decode, num_decode, 1, full, ring))
        for a, b in _prefill_spans(starts, lens, num_decode):
            s, qs = start_t[a:b], lens[a:b]
            q = max(qs)
            full = _chunk_index(*_full_context(s, full_t[a:b], bs), rows_of, s, q, None)
            ring = None
            if ring_t is not None:
                ring = _chunk_index(
                    *_ring_context(s, ring_t[a:b], bs, window, ring_len), rows_of, s, q, window
                )
            g = Group(int(row_start[a]), sum(qs), b - a, q, full, ring)
            if any(n != q for n in qs):
                j = torch.arange(q)
                real = j < len_t[a:b, None]  # [B, Q]
                offs = (row_start[a:b] - row_start[a])[:, None]
                g.pad_src = g.start + torch.where(real, offs + j, 0).view(-1)
                g.unpad = (torch.arange(b - a)[:, None] * q + j).masked_select(real)
            groups.append(g)

        def dev(x: Tensor | None) -> Tensor | None:
            return x if x is None or device.type == "cpu" else x.to(device, non_blocking=True)

        for g in groups:
            g.pad_src, g.unpad = dev(g.pad_src), dev(g.unpad)
            for ix in (g.full, g.ring):
                if ix is not None:
                    ix.rows, ix.bias = dev(ix.rows), dev(ix.bias)
        return StepContext(dev(pos), groups, dev(full_rows), dev(ring_src), dev(ring_rows))


def _pad(tables: list[list[int]]) -> Tensor:
    width = max(1, max(map(len, tables)))
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64)


def _prefill_spans(starts: list[int], lens: list[int], first: int) -> list[tuple[int, int]]:
    """Consecutive prefill chunks [a, b) attended as one group: padding stays within a quarter
    of the real tokens and the padded keys (B * (L + Q)) within MAX_GROUP_KEYS."""
    spans: list[tuple[int, int]] = []
    a = first
    for i in range(first + 1, len(lens) + 1):
        if i < len(lens):
            q = max(lens[a : i + 1])
            padded, real = (i + 1 - a) * q, sum(lens[a : i + 1])
            keys = (i + 1 - a) * (max(starts[a : i + 1]) + q)
            if 4 * padded <= 5 * real and keys <= MAX_GROUP_KEYS:
                continue
        spans.append((a, i))
        a = i
    return spans


def _rows(slots: Tensor, rows_of) -> Tensor:
    """slots [B, L] → cache rows ordered [B, Hkv, L], flat."""
    return rows_of(slots).transpose(1, 2).reshape(-1)


def _full_context(ends: Tensor, table: Tensor, bs: int) -> tuple[Tensor, Tensor]:
    """Context = positions [0, ends), left-aligned → (kpos [B, L] with -1 for padding, slots [B, L])."""
    width = int(ends.max())
    kpos = torch.arange(width).expand(len(ends), width)
    kpos = torch.where(kpos < ends[:, None], kpos, -1)
    p = kpos.clamp(min=0)
    return kpos, table.gather(1, p // bs) * bs + p % bs


def _ring_context(ends: Tensor, table: Tensor, bs: int, window: int, ring_len: int) -> tuple[Tensor, Tensor]:
    """Context = up to `window` positions before `ends`, right-aligned → (kpos, slots) as above."""
    width = int(ends.clamp(max=window).max())
    kpos = ends[:, None] - width + torch.arange(width)
    kpos = torch.where(kpos >= 0, kpos, -1)
    p = kpos.clamp(min=0)
    return kpos, table.gather(1, (p // bs) % ring_len) * bs + p % bs


def _decode_index(kpos: Tensor, slots: Tensor, rows_of) -> KVIndex:
    """Bias [B, 1, 1, L] against decode scores [B, Hkv, G, L]: padding is -inf."""
    bias = torch.zeros(kpos.shape, dtype=torch.float32).masked_fill_(kpos < 0, float("-inf"))
    return KVIndex(_rows(slots, rows_of), bias[:, None, None], kpos.shape[1])


def _chunk_index(
    kpos: Tensor, slots: Tensor, rows_of, starts: Tensor, qlen: int, window: int | None
) -> KVIndex:
    """Chunks of Q queries at [start, start + Q) over their L context keys, then their own Q
    keys: bias [B, Q, L + Q]. Padded queries see keys like real ones (no all -inf rows);
    padded keys sit after every real query, so causality hides them."""
    qpos = starts[:, None] + torch.arange(qlen)  # [B, Q]
    kall = torch.cat([kpos, qpos], 1)  # [B, L + Q]
    dist = qpos[:, :, None] - kall[:, None, :]  # [B, Q, L + Q]
    seen = (dist >= 0) & (kall >= 0)[:, None, :]
    if window is not None:
        seen &= dist < window
    bias = torch.zeros(seen.shape, dtype=torch.float32).masked_fill_(~seen, float("-inf"))
    return KVIndex(_rows(slots, rows_of), bias, kpos.shape[1])


class PagedAttention:
    """The AttentionFn the model calls; owns the KV caches of every layer."""

    def __init__(
        self,
        layer_windows: list[int | None],
        num_full_blocks: int,
        num_ring_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        shared: bool = False,
    ) -> None:
        """shared: full and sliding layers draw on one pool of num_full_blocks (block_manager.py);
        cache tensor j then holds full layer j and sliding layer j, which need as many of each."""
        windows = {w for w in layer_windows if w is not None}
        if len(windows) > 1:
            raise ValueError(f"one sliding window size is supported, got {sorted(windows)}")
        self.window = windows.pop() if windows else None
        self.layer_windows = layer_windows
        # Layer → (pool, index in that pool's cache).
        counts = {"full": 0, "ring": 0}
        self.where: list[tuple[str, int]] = []
        for w in layer_windows:
            kind = "full" if w is None else "ring"
            self.where.append((kind, counts[kind]))
            counts[kind] += 1

        def alloc(layers: int, blocks: int) -> Tensor:
            # [layers, 2 (k, v), slots * Hkv, D]. Zeroed: padded reads must see finite numbers.
            rows = blocks * block_size * num_kv_heads
            return torch.zeros(layers, 2, rows, head_dim, dtype=dtype, device=device)

        if shared:
            if counts["full"] != counts["ring"]:
                raise ValueError(f"a shared KV pool needs as many full as sliding layers, got {counts}")
            both = alloc(counts["full"], num_full_blocks)
            self.cache = {"full": both, "ring": both}  # one storage; block ids keep the kinds apart
        else:
            self.cache = {
                "full": alloc(counts["full"], num_full_blocks),
                "ring": alloc(counts["ring"], num_ring_blocks),
            }
        self.ctx: StepContext | None = None

    def __call__(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, window: int | None, scale: float
    ) -> Tensor:
        ctx = self.ctx
        assert ctx is not None, "PagedAttention called outside a step"
        if window != self.layer_windows[layer]:
            raise ValueError(
                f"layer {layer} attends with window {window}, cache built for {self.layer_windows[layer]}"
            )
        kind, idx = self.where[layer]
        kc, vc = self.cache[kind][idx]  # [rows, D] each
        d = kc.shape[-1]
        if is_fp8(kc):
            # An e4m3 cache (--kv-cache-dtype fp8) holds quantize(k); attention sees every key as
            # stored, this step's too. Rows move as bytes (uint8 views: CPU torch lacks float8
            # index_copy_ / index_select) and widen to q's dtype where they are read.
            sk, sv = quantize(k).view(torch.uint8), quantize(v).view(torch.uint8)
            k, v = sk.view(kc.dtype).to(q.dtype), sv.view(vc.dtype).to(q.dtype)
            kc, vc = kc.view(torch.uint8), vc.view(torch.uint8)

            def read(cache: Tensor, rows: Tensor) -> Tensor:
                return cache.index_select(0, rows).view(torch.float8_e4m3fn).to(q.dtype)
        else:
            k, v = k.to(kc.dtype), v.to(vc.dtype)
            sk, sv = k, v

            def read(cache: Tensor, rows: Tensor) -> Tensor:
                return cache.index_select(0, rows)

        ix_of = (lambda g: g.full) if kind == "full" else (lambda g: g.ring)
        # Prefill chunks read their context before this step's writes can land on a ring slot.
        early = {
            i: (read(kc, ix_of(g).rows), read(vc, ix_of(g).rows))
            for i, g in enumerate(ctx.groups)
            if g.qlen > 1
        }
        if kind == "full":
            kc.index_copy_(0, ctx.full_rows, sk.reshape(-1, d))
            vc.index_copy_(0, ctx.full_rows, sv.reshape(-1, d))
        else:
            kc.index_copy_(0, ctx.ring_rows, sk[ctx.ring_src].reshape(-1, d))
            vc.index_copy_(0, ctx.ring_rows, sv[ctx.ring_src].reshape(-1, d))
        outs = []
        for i, g in enumerate(ctx.groups):
            ix = ix_of(g)
            rows = slice(g.start, g.start + g.num_tokens)
            if g.qlen == 1:
                kx, vx = read(kc, ix.rows), read(vc, ix.rows)
                outs.append(_decode(q[rows], kx, vx, ix, sinks, scale))
                continue
            if g.pad_src is None:
                qg, kg, vg = q[rows], k[rows], v[rows]
            else:
                qg, kg, vg = (t.index_select(0, g.pad_src) for t in (q, k, v))
            ck, cv = early[i]
            out = _prefill(qg, kg, vg, ck, cv, ix, sinks, scale, g.batch, g.qlen)
            outs.append(out if g.unpad is None else out.index_select(0, g.unpad))
        return outs[0] if len(outs) == 1 else torch.cat(outs)


def _softmax_with_sink(scores: Tensor, sink: Tensor) -> Tensor:
    """Softmax over the last dim with one extra logit per head (the sink) that takes no value."""
    m = torch.maximum(scores.amax(-1, keepdim=True), sink)
    e = torch.exp(scores - m)
    return e / (e.sum(-1, keepdim=True) + torch.exp(sink - m))


def _decode(q: Tensor, kx: Tensor, vx: Tensor, ix: KVIndex, sinks: Tensor, scale: float) -> Tensor:
    """q [B, Hq, D]; kx/vx [B*Hkv*L, D] gathered context incl. the new token → [B, Hq, D]."""
    b, hq, d = q.shape
    hkv = kx.shape[0] // (b * ix.length)
    g = hq // hkv
    kk = kx.view(b, hkv, ix.length, d)
    vv = vx.view(b, hkv, ix.length, d)
    qq = q.view(b, hkv, g, d)
    scores = torch.matmul(qq, kk.transpose(2, 3)).float().mul_(scale) + ix.bias  # [B, Hkv, G, L]
    p = _softmax_with_sink(scores, sinks.float().view(1, hkv, g, 1))
    return torch.matmul(p.to(vv.dtype), vv).view(b, hq, d)  # [B, Hkv, G, D]


def _prefill(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ck: Tensor,
    cv: Tensor,
    ix: KVIndex,
    sinks: Tensor,
    scale: float,
    b: int,
    qlen: int,
) -> Tensor:
    """B chunks: q [B*Q, Hq, D], k/v [B*Q, Hkv, D]; context ck/cv [B*Hkv*L, D] → [B*Q, Hq, D]."""
    hq, d = q.shape[1:]
    hkv = k.shape[1]
    g, L = hq // hkv, ix.length
    kk = torch.cat([ck.view(b, hkv, L, d), k.view(b, qlen, hkv, d).transpose(1, 2)], 2)  # [B, Hkv, K, D]
    vv = torch.cat([cv.view(b, hkv, L, d), v.view(b, qlen, hkv, d).transpose(1, 2)], 2)
    keys = kk.shape[2]
    kt = kk.view(b * hkv, keys, d).transpose(1, 2)  # [B*Hkv, D, K]
    vv = vv.view(b * hkv, keys, d)
    qq = q.view(b, qlen, hkv, g, d).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, Q, D]
    sink = sinks.float().view(1, hkv, g, 1, 1)
    step = max(1, MAX_SCORE_ELEMS // (b * hq * keys))
    outs = []
    for a in range(0, qlen, step):  # query slices bound the [B, Hq, Q, K] scores
        qs = qq[:, :, :, a : a + step]
        n = qs.shape[3]
        scores = torch.bmm(qs.reshape(b * hkv, g * n, d), kt).float().mul_(scale)
        scores = scores.view(b, hkv, g, n, keys) + ix.bias[:, None, None, a : a + step]
        p = _softmax_with_sink(scores, sink).to(vv.dtype)
        outs.append(torch.bmm(p.view(b * hkv, g * n, keys), vv).view(b, hkv, g, n, d))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, 3)  # [B, Hkv, G, Q, D]
    return out.permute(0, 3, 1, 2, 4).reshape(b * qlen, hq, d)
