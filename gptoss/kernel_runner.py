"""Runs scheduled batches on the Triton kernels: step metadata, CUDA graphs for decode, GPU sampling.

Block tables live on the device, one row per running sequence; a step sends only the blocks
added since the last step (O(changed)), and the step's table is a gather of its rows. Pure
decode steps replay a CUDA graph captured for the next batch size up the ladder
(gptoss.decode_graphs; padding rows read a dummy table row, attend to nothing but their own key and
write no cache slot). Prefill
and mixed steps run the same kernels eagerly. Sampling runs on the device from per-request
seeds; the only synchronisation per step is reading the sampled ids back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gptoss.block_manager import cdiv
from gptoss.burst import Burst
from gptoss.decode_graphs import DecodeGraph, DecodeGraphs
from gptoss.kernel_model import KernelModel, StepMeta
from gptoss.kernel_warm import warm_moe
from gptoss.kernels.decode_advance import greedy_advance, tail_argmax
from gptoss.kernels.sampling import sample
from gptoss.kernels.sampling_filter import filter_plan
from gptoss.model import GptOss
from gptoss.scheduler import Batch
from gptoss.sequence import Sequence, Status
from gptoss.startup_clock import StartupClock

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads engine-seeded requests over the 64-bit seed space


@dataclass(slots=True)
class _Row:
    seq: Sequence
    index: int
    full_synced: int = 0
    ring_synced: int = 0


def _greedy(logits: Tensor) -> Tensor:
    """[N, V] -> [N] argmax ids; -1 for a row holding NaN (the caller fails that request).

    argmax propagates NaN (a row holding one returns a NaN's index), so one value a row tells; a
    [N, V] NaN mask would be 0.35 GB at 1,800 rows of gpt-oss's vocabulary, past the step's budget."""
    ids = logits.argmax(-1)
    return torch.where(logits.gather(-1, ids[:, None]).squeeze(-1).isnan(), -1, ids)


class KernelRunner:
    def __init__(
        self,
        model: GptOss,
        caches: dict[str, Tensor],
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        engine_seed: int,
        cuda_graphs: bool,
        lora=None,  # gptoss.lora_stack.LoraStack
        max_step_tokens: int = 0,  # > 0 on CUDA: compile the MoE kernels of steps up to this size at start
        batch_invariant: bool = False,  # gptoss.kernels.batch_invariant
        *,
        clock: StartupClock,  # the model runner's: laps kernel_model, moe_warm (CUDA) and graphs
    ) -> None:
        cfg = model.cfg
        self.device = model.embed.device
        self.bs = block_size
        hkv, d = cfg.num_key_value_heads, cfg.head_dim
        views = {k: c.view(c.shape[0], 2, -1, block_size, hkv, d) for k, c in caches.items()}
        self.model = KernelModel(model, views, block_size, max_model_len, lora, batch_invariant)
        clock.lap("kernel_model")
        self.lora = lora is not None
        self.ring_len = self.model.ring_len
        self.engine_seed = engine_seed
        # One spare row: the padding rows of a graph batch point at it (all zeros).
        rows = max_num_seqs + 1
        self.dummy_row = max_num_seqs
        i32 = dict(dtype=torch.int32, device=self.device)
        self.full_tab = torch.zeros(rows, cdiv(max_model_len, block_size), **i32)
        self.ring_tab = torch.zeros(rows, self.ring_len, **i32)
        self.rows: dict[int, _Row] = {}
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        # (seconds of host work, model steps it launched: a burst's k, any other launch's 1) a launch,
        # for the bench: a mean per launch would overstate a burst step's host time k-fold
        self.host_times: list[tuple[float, int]] = []
        # Static decode inputs: rows 0 ids, 1 positions, 2 full slots, 3 ring slots, 4 table rows,
        # 5 LoRA adapter index.
        self.g_in = torch.zeros(6, max_num_seqs, dtype=torch.int64, device=self.device)
        self.g_host = torch.zeros(6, max_num_seqs, dtype=torch.int64)
        self.g_qs = torch.arange(max_num_seqs + 1, dtype=torch.int32, device=self.device)
        if self.device.type == "cuda":
            self.g_host = self.g_host.pin_memory()
        if self.device.type == "cuda" and max_step_tokens > 0:
            warm_moe(self.model, max_step_tokens)
            clock.lap("moe_warm")
        self.graphs = DecodeGraphs(
            max_num_seqs,
            self._graph_forward,
            self._capture_inputs,
            self.device,
            cuda_graphs and self.device.type == "cuda",
        )
        self.graphs.build()
        clock.lap("graphs")

    # ---- metadata --------------------------------------------------------------------------

    def _sync_tables(self, seqs: list[Sequence]) -> list[int]:
        """Give each seq a table row, send the blocks it gained; returns the rows in batch order."""
        for sid in [sid for sid, r in self.rows.items() if r.seq.status is not Status.RUNNING]:
            self.free_rows.append(self.rows.pop(sid).index)
        upd_r: list[int] = []
        upd_c: list[int] = []
        upd_v: list[int] = []
        ring_r: list[int] = []
        ring_c: list[int] = []
        ring_v: list[int] = []
        out = []
        for s in seqs:
            r = self.rows.get(s.seq_id)
            if r is None:
                r = self.rows[s.seq_id] = _Row(s, self.free_rows.pop())
            fb, rb = s.full_blocks, s.ring_blocks
            for c in range(r.full_synced, len(fb)):
                upd_r.append(r.index)
                upd_c.append(c)
                upd_v.append(fb[c])
            for c in range(r.ring_synced, len(rb)):
                ring_r.append(r.index)
                ring_c.append(c)
                ring_v.append(rb[c])
            r.full_synced, r.ring_synced = len(fb), len(rb)
            out.append(r.index)
        for tab, rr, cc, vv in (
            (self.full_tab, upd_r, upd_c, upd_v),
            (self.ring_tab, ring_r, ring_c, ring_v),
        ):
            if rr:
                idx = torch.tensor([rr, cc, vv], dtype=torch.int64).to(self.device, non_blocking=True)
                tab[idx[0], idx[1]] = idx[2].to(torch.int32)
        return out

    def host_ms_per_step(self, skip: int = 0) -> float:
        """Mean host milliseconds a model step (a prefill or mixed launch counts one) over the launches
        recorded after the first `skip`."""
        done = self.host_times[skip:]
        return 1000 * sum(t for t, _ in done) / max(1, sum(n for _, n in done))

    def _slots(self, s: Sequence, start: int, n: int) -> tuple[list[int], list[int]]:
        """Full and ring cache slots of positions [start, start + n); ring -1 where a later token of
        the same chunk takes the slot (only the last ring_len * bs positions are kept)."""
        bs, fb, rb, rl = self.bs, s.full_blocks, s.ring_blocks, self.ring_len
        full = [fb[p // bs] * bs + p % bs for p in range(start, start + n)]
        keep = start + n - rl * bs
        ring = [rb[(p // bs) % rl] * bs + p % bs if p >= keep and rb else -1 for p in range(start, start + n)]
        return full, ring

    # ---- steps ------------------------------------------------------------------------------

    @torch.inference_mode()
    def run(self, batch: Batch) -> list[int]:
        t0 = time.perf_counter()
        seqs, lens = batch.seqs, batch.num_new
        rows = self._sync_tables(seqs)
        starts = [s.num_computed for s in seqs]
        decode_only = all(n == 1 for n in lens)
        graph = self.graphs.for_batch(len(seqs)) if decode_only else None
        if graph is not None:
            hidden = self._replay(graph, seqs, starts, rows)
            sample_rows = None
        else:
            hidden = self._eager(seqs, starts, lens, rows)
            ends = np.cumsum(lens)
            sample_rows = [int(e) - 1 for e, want in zip(ends, batch.sample, strict=False) if want]
        picked = [s for s, want in zip(seqs, batch.sample, strict=False) if want]
        if not picked:
            self.host_times.append((time.perf_counter() - t0, 1))
            return []
        if sample_rows is not None and len(sample_rows) != hidden.shape[0]:
            hidden = hidden[torch.tensor(sample_rows, device=self.device)]
        ids = self._sample(hidden, picked)
        self.host_times.append((time.perf_counter() - t0, 1))
        out = ids.tolist()  # the step's one synchronisation
        if any(i < 0 for i in out):
            raise RuntimeError("the model produced NaN logits")
        return out

    def _sample(self, hidden: Tensor, seqs: list[Sequence]) -> Tensor:
        if all(s.params.greedy for s in seqs):
            return _greedy(self.model.lm_logits(hidden))  # the float32 copy's argmax
        f, i, rows = self._sampling_params(seqs)
        how = self._filter_args(seqs, rows)
        logits = self._draw_logits(hidden, how)
        return sample(logits, f[0], i[0].to(torch.int32), f[1], i[1], i[2], **how)

    def _draw_logits(self, hidden: Tensor, how: dict) -> Tensor:
        """The logits a sampled step draws from (how: _filter_args'). lm_head's own dtype unless every
        row is filtered: the draw widens each bf16 logit exactly as it reads it, so the ids of a
        float32 copy without its pass (at 1,024 rows of 201,088: 0.4 GB read and 0.8 GB written) and
        with half the draw's read, and sample() widens only the rows it filters (at most half). A
        batch filtered whole takes float32, as its filters do: never both copies of every row."""
        whole = how["filtered"] and how["rows"] is None
        return self.model.logits(hidden) if whole else self.model.lm_logits(hidden)

    def _filter_args(self, seqs: list[Sequence], filtered: list[bool]) -> dict:
        """sample()'s filter arguments, from host values: which path (filter_plan), and the filtered
        rows' indices when they are at most half the batch (the rest drawn unfiltered)."""
        k_cap, search = filter_plan([s.params.top_k for s in seqs], filtered)
        picked = [j for j, f in enumerate(filtered) if f]
        rows = None
        if 0 < len(picked) <= len(seqs) // 2:
            rows = torch.from_numpy(np.array(picked, dtype=np.int64)).to(self.device, non_blocking=True)
        return dict(filtered=bool(picked), k_cap=k_cap, top_p_search=search, rows=rows)

    def _sampling_params(self, seqs: list[Sequence]) -> tuple[Tensor, Tensor, list[bool]]:
        """Device tensors: float32 [2, N] (temperature, top_p), int64 [3, N] (top_k, seed, offset);
        and which rows are filtered (sampled with top_k > 0 or top_p < 1)."""
        f32 = np.empty((2, len(seqs)), dtype=np.float32)
        i64 = np.empty((3, len(seqs)), dtype=np.int64)
        filtered = [False] * len(seqs)
        for j, s in enumerate(seqs):
            p = s.params
            f32[0, j] = 0.0 if p.greedy else p.temperature
            f32[1, j] = p.top_p
            seed = p.seed if p.seed is not None else (self.engine_seed * _SEED_MIX + s.seq_id) % (1 << 62)
            i64[0, j], i64[1, j], i64[2, j] = p.top_k, seed, len(s.token_ids)
            filtered[j] = not p.greedy and (p.top_k > 0 or p.top_p < 1.0)
        f = torch.from_numpy(f32).to(self.device, non_blocking=True)
        i = torch.from_numpy(i64).to(self.device, non_blocking=True)
        return f, i, filtered

    def can_multi_step(self, batch: Batch) -> bool:
        """A pure decode batch that a captured graph covers. Top-k / top-p requests may join: their
        filters need no host sync (sampling_filter), so a burst draws them as a step would."""
        return all(n == 1 for n in batch.num_new) and self.graphs.for_batch(len(batch.seqs)) is not None

    @torch.inference_mode()
    def launch_multi(self, batch: Batch, k: int, ahead: int = 0) -> Burst:
        """k decode steps back to back with no host round trip: each step's sampled ids, positions
        and cache slots are fed to the next on the device (the blocks for all k positions must be
        allocated). Returns once they are queued; Burst.result() gives each sequence's k ids, those
        past its end the caller's to drop. ahead > 0: the continuation of a carried burst of `ahead`
        steps not yet recorded in the sequences; the inputs are on the device already, and only their
        cache slots are looked up again, in tables that may have gained blocks since."""
        t0 = time.perf_counter()
        seqs = batch.seqs
        n = len(seqs)
        g = self.graphs.for_batch(n)
        assert g is not None
        rows = self._sync_tables(seqs)
        ids_in, pos, full, ring, row_idx, _ = self.g_in[:, :n]
        if ahead:
            self._slots_on_device(pos, full, ring, row_idx)
            hidden = g.replay()[:n]
        else:
            hidden = self._replay(g, seqs, [s.num_computed for s in seqs], rows)
        greedy = all(s.params.greedy for s in seqs)
        # A greedy burst's last step advances the inputs too when the next position has a table column.
        carried = greedy and max(s.num_computed for s in seqs) + ahead + k < self.full_tab.shape[1] * self.bs
        if not greedy:
            f, i, filtered = self._sampling_params(seqs)
            temp, top_k, top_p, seeds = f[0], i[0].to(torch.int32), f[1], i[1]
            how = self._filter_args(seqs, filtered)
        out = torch.empty(k, n, dtype=torch.int64, device=self.device)
        tabs = (self.full_tab, self.ring_tab, self.bs, self.ring_len)
        for j in range(k):
            if j:
                hidden = g.replay()[:n]
            last = j + 1 == k
            if greedy:  # the argmax, its NaN check, the output and the next inputs: one launch
                logits = self.model.lm_logits(hidden)  # not widened: the argmax is the float32 one's
                argmax = tail_argmax(logits)
                greedy_advance(logits, argmax, out[j], self.g_in, *tabs, advance=carried or not last)
                del logits
                continue
            logits = self._draw_logits(hidden, how)
            ids = sample(logits, temp, top_k, top_p, seeds, pos + 1, **how)
            out[j] = ids
            # Freed before the next step's logits exist: two [n, V] float32 at once are more than
            # step_workspace_bytes reserves (an fp8 cache's ~1,800-row batch of 120b ran out of memory).
            del logits
            if last:
                break
            ids_in.copy_(ids.clamp(min=0))  # a NaN row (-1) fails the request on the host
            pos += 1
            self._slots_on_device(pos, full, ring, row_idx)
        self.host_times.append((time.perf_counter() - t0, k))
        return Burst(out, carried)

    def _slots_on_device(self, pos: Tensor, full: Tensor, ring: Tensor, row_idx: Tensor) -> None:
        """The static inputs' cache slots of positions pos, from the block tables on the device."""
        bs, rl = self.bs, self.ring_len
        blk = pos // bs
        full.copy_(self.full_tab[row_idx, blk] * bs + pos % bs)
        if rl:
            ring.copy_(self.ring_tab[row_idx, blk % rl] * bs + pos % bs)

    def _eager(self, seqs: list[Sequence], starts: list[int], lens: list[int], rows: list[int]) -> Tensor:
        ids: list[int] = []
        pos: list[int] = []
        full: list[int] = []
        ring: list[int] = []
        adapter: list[int] = []
        for s, a, n in zip(seqs, starts, lens, strict=False):
            ids += s.token_ids[a : a + n]
            adapter += [s.lora] * n
            pos += range(a, a + n)
            f, r = self._slots(s, a, n)
            full += f
            ring += r
        dev = self.device
        tok = torch.tensor([ids, pos, full, ring, adapter], dtype=torch.int64).to(dev, non_blocking=True)
        qs = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32).to(
            dev, non_blocking=True
        )
        seq_t = torch.tensor([starts, rows], dtype=torch.int32).to(dev, non_blocking=True)
        row_idx = seq_t[1].long()
        meta = StepMeta(
            query_start=qs,
            context_lens=seq_t[0],
            full_table=self.full_tab.index_select(0, row_idx),
            ring_table=self.ring_tab.index_select(0, row_idx),
            full_slots=tok[2],
            ring_slots=tok[3],
            max_query_len=max(lens),
            num_decode=next((i for i, n in enumerate(lens) if n != 1), len(lens)),
        )
        return self.model.forward(tok[0], tok[1], meta, tok[4] if self.lora else None)

    # ---- CUDA graphs ------------------------------------------------------------------------

    def _capture_inputs(self, b: int) -> None:
        """The static inputs of a b-row capture: every row padding."""
        self._fill_padding(0, b)
        self.g_in.copy_(self.g_host)

    def _fill_padding(self, n: int, b: int) -> None:
        """Rows [n, b) of the static inputs: token 0 at position 0, no slot, the dummy table row, no
        adapter."""
        h = self.g_host
        h[0:2, n:b] = 0
        h[2:4, n:b] = -1
        h[4, n:b] = self.dummy_row
        h[5, n:b] = 0

    def _graph_forward(self, b: int) -> Tensor:
        ids, pos, full, ring, rows, adapter = self.g_in[:, :b]
        meta = StepMeta(
            query_start=self.g_qs[: b + 1],
            context_lens=pos.to(torch.int32),
            full_table=self.full_tab.index_select(0, rows),
            ring_table=self.ring_tab.index_select(0, rows),
            full_slots=full,
            ring_slots=ring,
            max_query_len=1,
            num_decode=b,
        )
        return self.model.forward(ids, pos, meta, adapter if self.lora else None)

    def _replay(self, g: DecodeGraph, seqs: list[Sequence], starts: list[int], rows: list[int]) -> Tensor:
        n, b = len(seqs), g.size
        h = self.g_host.numpy()
        bs, rl = self.bs, self.ring_len
        for j, (s, p) in enumerate(zip(seqs, starts, strict=False)):
            h[0, j] = s.token_ids[p]
            h[1, j] = p
            h[2, j] = s.full_blocks[p // bs] * bs + p % bs
            h[3, j] = s.ring_blocks[(p // bs) % rl] * bs + p % bs if s.ring_blocks else -1
            h[4, j] = rows[j]
            h[5, j] = s.lora
        self._fill_padding(n, b)
        self.g_in[:, :b].copy_(self.g_host[:, :b], non_blocking=True)
        return g.replay()[:n]
