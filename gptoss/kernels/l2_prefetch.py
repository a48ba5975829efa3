"""Warm the L2 cache with weights that the next kernels will stream (Hopper's bulk prefetch).

Why. A batch-1 decode step is a chain of kernels that each stream one weight (QKV, O, the experts)
and are bound by memory latency, not bandwidth: on an H200 the O GEMV moves 23.6 MB in ~11.8 us
(2 TB/s of ~4.3), the experts' gate_up ~34 MB in 22 us, and attention between them reads almost
nothing for ~10 us. The L2 holds 60 MB. So the bytes of the next GEMM can be on their way while the
current kernel runs: `cp.async.bulk.prefetch.L2.global [addr], size` asks the copy engine to bring
`size` bytes into L2 without a register or shared-memory destination, and the consumer then finds
its loads in L2 (or merged with the lines in flight) instead of waiting a DRAM round trip per stage.

Three forms:
  prefetch_part (a @jit helper): a program's share of a byte range, split over its threads, one
      bulk prefetch each. A kernel that knows what comes next calls it (the MoE's gate_up, which
      routes in registers, warms its own tile and its share of the same expert's down weights).
  prefetch_l2 (a launch): a small kernel of one warp a program whose only work is to prefetch a
      tensor. Launched with PDL right after a kernel that releases its dependents at its start
      (all of ours), it runs beside that kernel: it releases its own dependents at once, prefetches,
      then waits for its predecessor, so the kernel after it still sees every earlier write
      (griddepcontrol.wait covers only the grid just before; waiting last keeps the chain whole).
  prefetch_lines (a @jit helper): one 128-byte line a pointer (prefetch.global.L2). Decode
      attention ("kv") calls it before its PDL wait for the cached K and V rows of its keys: rows of
      one KV head are 128 bytes apart from the next head's, so a bulk range would fetch all heads.

Measured: it loses (H200, random 120b, batch-1 128 -> 512, one process each, bench/results v30):
the default 337.0 / 337.3 / 334.7 tok/s; moe 312.1; o,qkv 297.4; all 285.2; moe with per-thread
128-byte line prefetches from the load/store unit instead of bulk ones 312.7. So the step is not
short of bytes in flight that another kernel could have sent: the prefetch launches sit between
kernels whose programs fill the SMs (the next kernel starts only once all 132 of the prefetch's
programs were placed and released it), and the gate_up's extra 17.6 MB of the down's weights slow
its own stream by more than the down then saves. Off by default; the switch stays for A/B runs.
v61 (H200, random 20b, batch 1, bench/decode_ab_gpu.py) gave the split-K gate_up that the engine now
runs the same prefetch of the down's weights, one bulk prefetch a row block by one thread (commit
34ccb46, reverted): 664.3 tok/s without against 620.3, 614.8 with the evict_last hint, 632.4 for half
of each row block; the gate_up +3.5 us a layer, the down -0.1 to -0.3. The down does not wait on
HBM at one token: with its weights in L2 (one weight copy, bench/kernels/moe_ablate_gpu.py --layers 1)
it takes 9.2 us against 8.6 from HBM; its instructions and its warps' waits at ~10 warps an SM
hold it (moe_v3_dec_sass.py --ops; bench/moe_ncu_gpu.sh).

The prefetch is a hint: it changes no value, so a kernel's bits are the same with and without it.
The interpreter runs no PTX, and GPUs before Hopper lack the instruction, so `supported` is false
there and the callers leave it out.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from gptoss.kernels import pdl
from gptoss.kernels.device_info import sm_count

# GPTOSS_L2_PREFETCH: which prefetches decode steps of up to MAX_T tokens issue, a comma list of
#   moe  the gate_up GEMM (one token: 4 experts, ~52 MB at 120b, inside L2's 60 MB) warms its own
#        tile of W13 and its share of the same expert's W2 for the down GEMM after it
#   o    a prefetch launch beside attention warms the O projection's weight
#   qkv  a prefetch launch beside the MoE's down GEMM warms the next layer's QKV weight
#   kv   a decode attention program, before its PDL wait (while the QKV projection still runs),
#        prefetches the cached K and V rows of its first ATTN_KEYS keys (prefetch_lines), so its
#        key loop finds them in L2 (after v31; not yet timed)
# "all" is all four; empty or 0, none (the default: moe, o and qkv each lost at batch 1, see above).
PARTS = ("moe", "o", "qkv", "kv")
ATTN_KEYS = 256  # attention.MIN_SPLIT_KEYS: a batch-1 split's keys, whole
MAX_T = 16


def parse_parts(v: str | None) -> frozenset[str]:
    if v in (None, "", "0"):
        return frozenset()
    if v == "all":
        return frozenset(PARTS)
    parts = frozenset(p.strip() for p in v.split(","))
    if not parts <= set(PARTS):
        raise ValueError(f"GPTOSS_L2_PREFETCH={v!r}: a comma list of {', '.join(PARTS)}, or all, or 0")
    return parts


ON = parse_parts(os.environ.get("GPTOSS_L2_PREFETCH"))

# A thread's bulk prefetch of $2 bytes at $1 (16-byte aligned, a multiple of 16; none when $2 <= 0).
# The dummy output is what inline_asm_elementwise needs; is_pure=False keeps the instruction.
_PREFETCH_ASM: tl.constexpr = tl.constexpr("""
{
.reg .pred p;
setp.gt.s32 p, $2, 0;
@p cp.async.bulk.prefetch.L2.global [$1], $2;
mov.u32 $0, 0;
}
""")


@triton.jit
def chunks(nbytes, part, parts, NT: tl.constexpr):
    """(lo, size) [NT] of part `part` of `parts` of [0, nbytes): the part and each thread's chunk of
    it rounded up to 16 bytes, so every lo stays 16-aligned; size 0 past the end (nbytes a multiple
    of 16, so every size is one too)."""
    nbytes = nbytes.to(tl.int64)
    share = ((nbytes + parts - 1) // parts + 15) // 16 * 16
    chunk = ((share + NT - 1) // NT + 15) // 16 * 16
    lo = part * share + tl.arange(0, NT).to(tl.int64) * chunk  # part * share is int64
    hi = tl.minimum(tl.minimum(lo + chunk, part * share + share), nbytes)
    return lo, tl.maximum(hi - lo, 0).to(tl.int32)


@triton.jit
def prefetch_part(base, nbytes, part, parts, NT: tl.constexpr):
    """Prefetch part `part` of `parts` of the bytes [base, base + nbytes) into L2 (`chunks`), NT
    threads a program (32 x num_warps: one chunk each); base 16-byte aligned."""
    lo, size = chunks(nbytes, part, parts, NT)
    tl.inline_asm_elementwise(
        _PREFETCH_ASM,
        "=r,l,r",
        [base.to(tl.pointer_type(tl.uint8)) + lo, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


# One L2 prefetch of the line holding $1 where $2 is non-zero (the load/store unit's prefetch: no
# register or shared-memory destination, no wait).
_LINE_ASM: tl.constexpr = tl.constexpr("""
{
.reg .pred p;
setp.ne.s32 p, $2, 0;
@p prefetch.global.L2 [$1];
mov.u32 $0, 0;
}
""")


@triton.jit
def prefetch_lines(ptrs, mask):
    """Prefetch into L2 the line of each pointer of ptrs where mask holds (any shape, one each)."""
    tl.inline_asm_elementwise(
        _LINE_ASM,
        "=r,l,r",
        [ptrs.to(tl.pointer_type(tl.uint8)), mask.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _prefetch_kernel(ptr, nbytes, NT: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
    prefetch_part(ptr, nbytes, tl.program_id(0), tl.num_programs(0), NT)
    if PDL:
        gdc_wait()


def supported(t: Tensor) -> bool:
    """Whether bulk prefetches run for t's kernels: a compiled CUDA kernel on Hopper or later."""
    return pdl.compiled_on_hopper(t)


def prefetch_l2(t: Tensor) -> None:
    """Launch the prefetch of t's bytes (contiguous, 16-byte aligned) on the current stream, one
    program an SM; a no-op where `supported` is false. With PDL on (gptoss.kernels.pdl) it overlaps
    the kernel before it; without, it runs after it and still warms L2 for the kernels after."""
    if not supported(t):
        return
    if not t.is_contiguous() or t.data_ptr() % 16:
        raise ValueError(f"prefetch_l2 needs a contiguous, 16-byte aligned tensor, got strides {t.stride()}")
    nbytes = t.numel() * t.element_size() // 16 * 16  # a tail under 16 bytes is not worth a chunk
    if nbytes == 0:
        return
    _prefetch_kernel[(sm_count(t),)](t, nbytes, NT=32, num_warps=1, **pdl.args(t))
