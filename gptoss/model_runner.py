"""Loads the model, sizes and owns the KV cache, and runs one scheduled batch: ids in, sampled ids out."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from gptoss.block_manager import cdiv, longest_seq_blocks
from gptoss.checkpoint import load_config
from gptoss.kv_dtype import kv_torch_dtype
from gptoss.model import GptOss
from gptoss.moe_dense import DenseMoE, dense_nbytes
from gptoss.paged_attention import PagedAttention, StepContext
from gptoss.sampler import sample
from gptoss.scheduler import Batch
from gptoss.startup_clock import StartupClock

if TYPE_CHECKING:
    from gptoss.engine_config import EngineConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Without --kv-cache-tokens, the KV cache on CUDA gets the free memory left after the kernels' second
# copy of the experts and a reserve for a step's activations (step_workspace_bytes), at most
# CUDA_KV_MAX_SHARE of it. A flat 0.85 share before left ~8 GB idle on an 80 GB H100 (20b): 1000 x
# (1024 -> 1024) then ran ~900 sequences at a time and ended on a second wave and preemptions. CPU:
# a share of MemAvailable, capped, since the host runs other things and the tiny model needs little.
CUDA_KV_MAX_SHARE = 0.95
CUDA_RESERVE_BYTES = 1 << 30  # cuBLAS workspaces, CUDA graph pools, the allocator's slack
CPU_KV_SHARE = 0.25
CPU_KV_CAP_BYTES = 1 << 30
# Models whose decoded experts fit in this run every expert on every token (gptoss.moe_dense).
DENSE_MOE_MAX_BYTES = 256 << 20


def step_workspace_bytes(mc, tokens: int, seqs: int, itemsize: int) -> int:
    """A step's activations at its largest, twice over for the caching allocator's fragmentation: per
    token the hidden rows (x, residual, normed, the MoE's sum), QKV and the attention output, the
    MoE's k rows of act [I] and y [H]; per sequence its logits (the lm_head's output, its float32
    copy, and a top-k/top-p draw's masked float32 copy)."""
    h, d = mc.hidden_size, mc.head_dim
    qkv = (mc.num_attention_heads + 2 * mc.num_key_value_heads) * d
    per_token = itemsize * (4 * h + qkv + mc.num_attention_heads * d)
    per_token += itemsize * mc.num_experts_per_tok * (mc.intermediate_size + h)
    logits = seqs * mc.vocab_size * (itemsize + 4 + 4)
    return 2 * tokens * per_token + logits


def cuda_kv_budget(free: int, large_copy: int, workspace: int) -> int:
    """Bytes for the KV cache out of `free` device memory, the weights already loaded."""
    left = free - large_copy
    return max(0, min(int(left * CUDA_KV_MAX_SHARE), left - workspace - CUDA_RESERVE_BYTES))


@dataclass(frozen=True, slots=True)
class KvGeometry:
    n_full: int  # full-attention layers
    n_ring: int  # sliding-window layers
    per_slot: int  # bytes of one layer's K and V for one token
    block_size: int
    ring_len: int  # blocks of a sequence's ring

    @property
    def shared(self) -> bool:
        """One pool for both kinds (block_manager.py): when they are as many, as in gpt-oss."""
        return self.n_full == self.n_ring > 0


def kv_blocks(g: KvGeometry, budget: int, tokens: int | None, max_num_seqs: int, max_model_len: int) -> int:
    """Blocks of the full pool (shared: of the one pool) for `budget` bytes, or for --kv-cache-tokens.

    Shared: --kv-cache-tokens N is the pool's N token slots, which a sequence fills with its length
    plus up to one window; unset, enough for every sequence at full length with its ring, or what
    memory allows. Split: the full layers pay per token after a ring for every sequence."""
    bs = g.block_size
    if g.shared:
        if tokens is not None:
            return tokens // bs
        per_seq = cdiv(max_model_len, bs) + g.ring_len
        return min(max_num_seqs * per_seq, budget // (g.n_full * bs * g.per_slot))
    if tokens is None:
        rings = g.n_ring * max_num_seqs * g.ring_len * bs * g.per_slot
        tokens = min(max_num_seqs * max_model_len, (budget - rings) // max(1, g.n_full * g.per_slot))
    return tokens // bs


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.device = torch.device(config.device)
        self.clock = StartupClock(self.device)  # engine.info()["startup_s"]
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch sees no CUDA device")
        self.dtype = DTYPES[config.dtype]
        self.block_size = config.block_size
        self.kernels = config.kernels or ("triton" if self.device.type == "cuda" else "torch")
        if self.kernels == "triton":
            _check_triton(self.device)
        elif config.batch_invariant:
            raise ValueError(f"batch_invariant needs the triton kernels; {self.device.type} runs torch here")
        pre = None  # the recorded kernel specializations compiling while the weights load
        if self.kernels == "triton" and self.device.type == "cuda" and config.precompile:
            from gptoss.precompile import Precompile

            pre = Precompile.for_model(load_config(config.model_path))
        self.batch_invariant = config.batch_invariant
        self.lora = None  # gptoss.lora_stack.LoraStack of the --lora adapters
        if config.lora:  # checked against config.json before the weights load: bad adapters fail fast
            from gptoss.lora_stack import LoraStack

            self.lora = LoraStack.load(config.lora, load_config(config.model_path), self.device, self.dtype)
        self.model = GptOss.from_checkpoint(config.model_path, self.device, self.dtype)
        self.clock.lap("weights")  # with the checks, the adapters and the precompile's start before it
        mc = self.model.cfg
        dense = sum(dense_nbytes(block.mlp, self.dtype) for block in self.model.layers)
        self.dense_moe = self.kernels == "torch" and dense <= DENSE_MOE_MAX_BYTES
        if self.dense_moe:  # a small model: decode its experts once, skip the per-expert loop
            for block in self.model.layers:
                block.mlp = DenseMoE(block.mlp)
        self.vocab_size = mc.vocab_size
        self.num_kv_heads = mc.num_key_value_heads
        if config.max_model_len is not None and config.max_model_len > mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len {config.max_model_len} exceeds the checkpoint's "
                f"max_position_embeddings {mc.max_position_embeddings}"
            )
        max_model_len = config.max_model_len or mc.max_position_embeddings

        windows = [mc.window(i) for i in range(mc.num_hidden_layers)]
        self.window = mc.sliding_window if any(w is not None for w in windows) else None
        n_full = sum(w is None for w in windows)
        n_ring = len(windows) - n_full
        self.kv_dtype = kv_torch_dtype(config.kv_cache_dtype, self.dtype)
        per_slot = 2 * mc.num_key_value_heads * mc.head_dim * self.kv_dtype.itemsize  # one layer's K+V
        ring_len = cdiv(self.window, self.block_size) if self.window else 0
        bs = self.block_size

        geometry = KvGeometry(n_full, n_ring, per_slot, bs, ring_len)
        self.kv_shared = geometry.shared
        tokens = config.kv_cache_tokens
        budget = self._kv_budget(config) if tokens is None else 0
        blocks = kv_blocks(geometry, budget, tokens, config.max_num_seqs, max_model_len)
        if blocks < 1:
            raise ValueError(f"KV cache of {tokens or blocks * bs} tokens holds no block of {bs}")
        self.num_full_blocks = blocks
        # Split: a sequence never holds more ring blocks than full blocks, nor more than ring_len.
        self.num_ring_blocks = blocks if self.kv_shared else min(blocks, config.max_num_seqs * ring_len)
        capacity = longest_seq_blocks(blocks, ring_len, self.kv_shared) * bs
        if capacity < max_model_len:
            if config.max_model_len is not None:
                slots = (
                    f" ({blocks * bs} slots, with a sequence's last {self.window} for the sliding layers)"
                    if self.kv_shared
                    else ""
                )
                raise ValueError(
                    f"the KV cache holds {capacity} tokens{slots}, fewer than "
                    f"max_model_len {config.max_model_len}: raise --kv-cache-tokens or lower --max-model-len"
                )
            max_model_len = capacity  # nothing longer could ever run
        self.max_model_len = max_model_len
        self.kv_cache_tokens = blocks * bs  # the pool's slots (shared: full and ring blocks alike)
        # CPU: the lm_head is the largest matmul of a small model's step. Without AMX a bf16 GEMM
        # is no faster than float32 and its output must then be converted, so it runs in float32
        # (exact: bf16 widens losslessly) on a weight prepacked for oneDNN, ~20% faster than
        # F.linear at decode batch sizes.
        self._lm_head = (
            _cpu_lm_head(self.model.lm_head, config.max_num_seqs) if self.device.type == "cpu" else None
        )
        self.attn = PagedAttention(
            windows,
            self.num_full_blocks,
            self.num_ring_blocks,
            bs,
            mc.num_key_value_heads,
            mc.head_dim,
            self.kv_dtype,
            self.device,
            shared=self.kv_shared,
        )
        self.kernel_runner = None
        self.clock.lap("kv_cache")
        # gptoss.precompile.PrecompileStats; waited for before the first kernel launch (the MoE's warm-up)
        self.precompile = pre.wait() if pre is not None else None
        if pre is not None:
            self.clock.lap("precompile_wait")
        if self.kernels == "triton":
            from gptoss.kernel_runner import KernelRunner

            self.kernel_runner = KernelRunner(
                self.model,
                self.attn.cache,
                bs,
                max_model_len,
                config.max_num_seqs,
                config.seed,
                config.cuda_graphs,
                self.lora,
                max_step_tokens=config.max_num_batched_tokens,
                batch_invariant=config.batch_invariant,
                clock=self.clock,
            )

    def _kv_budget(self, config: EngineConfig) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            large = 0  # the kernels' second copy of the experts (none in batch-invariant mode: v2 only)
            if self.kernels == "triton" and not self.batch_invariant:
                from gptoss.kernel_layers import large_copy_bytes

                large = large_copy_bytes(self.model)
            work = step_workspace_bytes(
                self.model.cfg, config.max_num_batched_tokens, config.max_num_seqs, self.dtype.itemsize
            )
            return cuda_kv_budget(free, large, work)
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        return min(int(avail * CPU_KV_SHARE), CPU_KV_CAP_BYTES)

    @torch.inference_mode()
    def run(self, batch: Batch) -> list[int]:
        """Feed the batch's new tokens through the model; sample where a sequence's tokens run out."""
        if self.kernel_runner is not None:
            return self.kernel_runner.run(batch)
        seqs, lens = batch.seqs, batch.num_new
        starts = [s.num_computed for s in seqs]
        ids = list(
            itertools.chain.from_iterable(
                s.token_ids[a : a + n] for s, a, n in zip(seqs, starts, lens, strict=True)
            )
        )
        ctx = StepContext.build(
            starts,
            lens,
            [s.full_blocks for s in seqs],
            [s.ring_blocks for s in seqs],
            self.block_size,
            self.window,
            self.num_kv_heads,
            self.device,
        )
        input_ids = torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True)
        lora_index = None  # [T] each token's adapter, when any sequence of the batch has one
        if self.lora is not None and any(s.lora for s in seqs):
            per_seq = torch.tensor([s.lora for s in seqs])
            lora_index = per_seq.repeat_interleave(torch.tensor(lens)).to(self.device, non_blocking=True)
        self.attn.ctx = ctx
        try:
            hidden = self.model(
                input_ids, ctx.positions, self.attn, self.lora if lora_index is not None else None, lora_index
            )  # [T, H]
        finally:
            self.attn.ctx = None
        ends = list(itertools.accumulate(lens))
        rows = [e - 1 for e, s in zip(ends, batch.sample, strict=True) if s]
        if not rows:
            return []
        picked = [s for s, want in zip(seqs, batch.sample, strict=True) if want]
        logits = self._logits(hidden[torch.tensor(rows, device=self.device)])  # [N, V] float32
        return sample(logits, picked)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] → logits [N, V] float32."""
        if self._lm_head is None:
            return self.model.compute_logits(hidden)
        return self._lm_head(hidden.float())


def _cpu_lm_head(weight: torch.Tensor, batch_hint: int):
    """x [N, H] float32 → x @ weight.T in float32: oneDNN-prepacked when this torch has it."""
    w = weight.float()  # [V, H]
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, batch_hint)

        def fast(x: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

        probe = torch.randn(3, w.shape[1])
        works = torch.allclose(fast(probe), F.linear(probe, w), rtol=1e-4, atol=1e-4)
    except (AttributeError, RuntimeError):  # a torch build without these oneDNN ops
        works = False
    return fast if works else (lambda x: F.linear(x, w))


def _check_triton(device: torch.device) -> None:
    """--kernels triton needs Triton, and on a CPU its interpreter (slow: meant for tests)."""
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        raise ValueError("--kernels triton needs the triton package (pip install triton==3.6.0)")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "--kernels triton on a CPU runs only in Triton's interpreter: set TRITON_INTERPRET=1 "
            "(slow, for tests), or use --kernels torch"
        )
