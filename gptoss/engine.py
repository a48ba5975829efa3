"""The engine's synchronous core: LLMEngine (add, abort, step: schedule, run, postprocess), with its
config (gptoss.engine_config, re-exported here). gptoss.async_engine runs it on its own thread and
streams it to asyncio."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gptoss.engine_config import DTYPES, EngineConfig  # noqa: F401 - the config, importable from here
from gptoss.sampling import SamplingParams
from gptoss.switches import check_environment

if TYPE_CHECKING:  # torch-free at import (see LLMEngine.__init__)
    from gptoss.burst import Burst
    from gptoss.scheduler import Batch


@dataclass(slots=True)
class Delta:
    token_ids: list[int]  # new ids since the previous Delta (may be empty only when finishing)
    finish_reason: str | None  # None while running; "stop" | "length" | "abort" at the end
    stop_token_id: int | None = None  # the matched stop id when finish_reason == "stop"


class EngineError(RuntimeError):
    """The engine failed while this request was in flight; __cause__ holds the original error."""


def check_prompt(prompt: list[int], max_model_len: int, vocab_size: int) -> None:
    """Refuse a prompt the engine cannot run, with a message that says why (ValueError)."""
    if not prompt:
        raise ValueError("prompt is empty: at least one token id is needed")
    if len(prompt) >= max_model_len:
        raise ValueError(
            f"prompt has {len(prompt)} tokens but max_model_len is {max_model_len}: "
            f"at most {max_model_len - 1} prompt tokens leave room for one output token"
        )
    lo, hi = min(prompt), max(prompt)
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"prompt holds token id {bad}, outside the vocabulary [0, {vocab_size})")


class LLMEngine:
    """The synchronous core: add, abort, step. Not thread-safe; AsyncEngine drives it from one thread."""

    def __init__(self, config: EngineConfig) -> None:
        # torch is imported here, not at module level, so EngineConfig/Delta stay importable without it.
        from gptoss.block_manager import BlockManager
        from gptoss.model_runner import ModelRunner
        from gptoss.scheduler import Scheduler

        check_environment()  # a misspelt GPTOSS_* switch would time the defaults under its name
        if config.model_path is None:
            raise ValueError("EngineConfig.model_path is not set: give the checkpoint directory")
        if config.devices is not None:  # one listed device (gptoss.dp_engine runs several)
            config = replace(config, device=config.devices[0], devices=None)
        if config.device is None:
            import torch

            config = replace(config, device="cuda" if torch.cuda.is_available() else "cpu")
        self.config = config
        self.runner = ModelRunner(config)
        self.max_model_len = self.runner.max_model_len
        self.vocab_size = self.runner.vocab_size
        r = self.runner
        bm = BlockManager(
            r.num_full_blocks, config.block_size, r.window, r.num_ring_blocks, shared=r.kv_shared
        )
        watermark = max(1, self.runner.num_full_blocks // 100)
        self.scheduler = Scheduler(bm, config.max_num_seqs, config.max_num_batched_tokens, watermark)
        self.seqs: dict = {}  # request_id -> Sequence, until it finishes
        self._ids = itertools.count()
        self._burst: tuple[Batch, Burst] | None = None  # a multi-step burst in flight, and its batch
        self.warmup = None  # gptoss.warmup.WarmupStats once it ran
        self.runner.clock.lap("scheduler")
        if (
            config.warm_kernels
            and self.runner.kernel_runner is not None
            and self.runner.device.type == "cuda"
        ):
            from gptoss.warmup import warm_up

            self.warmup = warm_up(self)
            self.runner.clock.lap("warmup")

    def check_prompt(self, prompt: list[int]) -> None:
        check_prompt(prompt, self.max_model_len, self.vocab_size)

    def info(self) -> dict[str, object]:
        """The sizes the engine settled on (for run.json): limits, KV cache, MoE path, adapters."""
        r, c = self.runner, self.config
        return {
            "device": c.device,
            "max_model_len": self.max_model_len,
            "kv_cache_tokens": r.kv_cache_tokens,
            "kv_ring_blocks": r.num_ring_blocks,
            "kv_pool": "shared" if r.kv_shared else "split",  # shared: full and ring blocks are one pool
            "kv_blocks": r.num_full_blocks,
            "kv_max_seqs": self.scheduler.bm.max_seqs_of(self.max_model_len),  # at max_model_len
            "block_size": c.block_size,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "dtype": c.dtype,
            "kv_cache_dtype": c.kv_cache_dtype,
            "dense_moe": r.dense_moe,
            "kernels": r.kernels,
            "cuda_graphs": r.kernel_runner.graphs.sizes if r.kernel_runner is not None else [],
            "lora": {} if r.lora is None else {a.name: str(a.path) for a in r.lora.adapters},
            # the kernels compiled while the weights loaded (gptoss.precompile); None: it did not run
            "precompile": None if r.precompile is None else r.precompile.info(),
            # seconds and steps of the start-up warm-up (gptoss.warmup); None: it did not run
            "warmup": None
            if self.warmup is None
            else {"seconds": round(self.warmup.seconds, 2), "steps": len(self.warmup.step_tokens)},
            # seconds of each start-up phase, in order (gptoss.startup_clock)
            "startup_s": dict(r.clock.seconds),
        }

    def lora_index(self, name: str | None) -> int:
        """The loaded adapter a request names (0: none, the base model); ValueError if unknown."""
        if name is None:
            return 0
        if self.runner.lora is None:
            raise ValueError(f"LoRA adapter {name!r} requested, but the engine has none loaded (--lora)")
        return self.runner.lora.index(name)

    def add(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        lora: str | None = None,
        number: int | None = None,
    ) -> None:
        """`lora` names a loaded adapter (None: the base model). `number` (unique per engine) seeds a
        request that carries no seed; gptoss.dp_engine numbers requests across its replicas, so a
        sampled output does not depend on which replica ran it."""
        from gptoss.sequence import Sequence

        self.check_prompt(prompt)
        index = self.lora_index(lora)
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already running")
        number = next(self._ids) if number is None else number
        seq = Sequence(number, request_id, prompt, params, self.max_model_len, self.config.seed, lora=index)
        self.seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        return True

    def has_work(self) -> bool:
        """Requests to run, or a burst in flight still to read (its ids may all be past their ends)."""
        return len(self.scheduler) > 0 or self._burst is not None

    def step(self) -> list[tuple[str, Delta]]:
        if self._burst is not None:
            return self._land()
        batch = self.scheduler.schedule()
        if not batch:
            return []
        k = self._lookahead(batch)
        if k > 1:
            self._burst = (batch, self.runner.kernel_runner.launch_multi(batch, k))
            return self._land()
        sampled = self.runner.run(batch)
        out = []
        for seq in self.scheduler.postprocess(batch, sampled):
            out.append((seq.request_id, Delta([seq.token_ids[-1]], seq.finish_reason, seq.stop_token_id)))
            if seq.finish_reason is not None:
                del self.seqs[seq.request_id]
        return out

    def _lookahead(self, batch) -> int:
        """How many decode steps to run back to back on the device (1: an ordinary step).

        Only a pure decode batch on CUDA graphs, and only while no waiting request could join: a
        multi-step would delay its prefill. Capped by the longest remaining output (no step is
        wasted on every sequence), by the context limit, and by free KV blocks; while requests
        wait (for KV room: 120b Offline waits most of its run), by the shortest remaining output,
        so the blocks a finished sequence frees admit the next at once. The ordinary steps this
        replaces cost ~15 ms of host time each there (87 vs 72 ms a step at ~900 sequences)."""
        kr = self.runner.kernel_runner
        if self.config.decode_steps <= 1 or kr is None or not kr.can_multi_step(batch):
            return 1
        return self._burst_steps(batch, 0)

    def _burst_steps(self, batch: Batch, ahead: int) -> int:
        """_lookahead's count for a burst that starts `ahead` steps past the sequences' recorded ones
        (> 0: the continuation of a burst in flight), its blocks allocated; 1: no burst."""
        sch = self.scheduler
        if sch.can_admit_next():
            return 1
        left = [s.max_tokens - s.num_tokens - ahead for s in batch.seqs]
        k = min(
            self.config.decode_steps,
            max(left),
            min(self.max_model_len - s.num_computed - ahead for s in batch.seqs),
        )
        if sch.waiting:
            k = min(k, min(left))
        return k if k > 1 and sch.extend_decode(batch, ahead + k) else 1

    def _land(self) -> list[tuple[str, Delta]]:
        """Read the burst in flight and record its ids, launching its continuation first when the same
        batch goes on: the GPU then decodes while the host reads, records and schedules (the round
        trip it waited through before cost ~555 µs a burst at 120b batch 1, v34). Ids of a sequence
        that ended (a stop id, an abort) while a continuation ran for it are dropped, and no burst
        follows that continuation: its rows have changed."""
        batch, burst = self._burst
        self._burst = None
        nxt = self._continuation(batch, burst.k) if burst.carried else 1
        if nxt > 1:
            self._burst = (batch, self.runner.kernel_runner.launch_multi(batch, nxt, ahead=burst.k))
        tokens = burst.result()
        live = [(s, t) for s, t in zip(batch.seqs, tokens, strict=True) if not s.is_finished]
        out = []
        for seq, n in self.scheduler.postprocess_multi([s for s, _ in live], [t for _, t in live]):
            out.append((seq.request_id, Delta(seq.token_ids[-n:], seq.finish_reason, seq.stop_token_id)))
            if seq.finish_reason is not None:
                del self.seqs[seq.request_id]
        return out

    def _continuation(self, batch: Batch, k: int) -> int:
        """Steps of a burst to follow a k-step burst of `batch` still in flight (1: none). As _lookahead,
        counted from after that burst, and only while every sequence outlasts it by length and none
        ended or was aborted meanwhile (a stop id in it is found only once it is read; the ids
        computed past it are then dropped)."""
        if any(s.is_finished or s.max_tokens - s.num_tokens <= k for s in batch.seqs):
            return 1
        return self._burst_steps(batch, k)

    def fail_all(self) -> list[str]:
        """Drop every request after a failed step (its KV writes may be half done); return their ids."""
        self._burst = None  # a burst in flight writes only blocks that later launches overwrite
        ids = list(self.seqs)
        self.scheduler.abort_all()
        self.seqs.clear()
        return ids

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        lora: str | None | list[str | None] = None,
    ) -> list[list[int]]:
        """Run prompts to completion (offline use and tests); output ids in prompt order. `lora`:
        the adapter of every prompt, or one per prompt (None: the base model)."""
        params = params if isinstance(params, list) else [params] * len(prompts)
        loras = lora if isinstance(lora, list) else [lora] * len(prompts)
        base = next(self._ids)
        ids = [f"gen-{base}-{i}" for i in range(len(prompts))]
        for rid, prompt, p, name in zip(ids, prompts, params, loras, strict=True):
            self.add(rid, prompt, p, name)
        outputs: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_work():
            for rid, delta in self.step():
                outputs[rid] += delta.token_ids
        return [outputs[rid] for rid in ids]
