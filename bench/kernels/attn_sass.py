"""SASS statistics of decode attention (gptoss.kernels.attention_kernel), bf16 against float8 caches,
compiled for sm_90a on CPU.

    python bench/kernels/attn_sass.py [--cfg BLOCK_N,WARPS,STAGES ...]
    python bench/kernels/attn_sass.py --batch1 [--cfg ...] [--new-keys N]

--batch1: the kernel as a batch-1 step runs it instead (bf16, RoPE inside, the first tile preloaded,
new-keys tiles of --new-keys keys, default the engine's NEW_KEYS_N; 0: BLOCK_N), a full layer and a
sliding one (its ring, one pass): registers, shared memory, instructions before the PDL wait
(ACQBULK) and after it with their barriers, MMAs and MUFUs (after the wait: the step's latency chain,
with the code of loops a batch-1 step runs no time, as the context tiles past the preloaded one).

No GPU needed (moe_decode_sass's compile: GPUTarget("cuda", 90, 32), pointers and strides marked
16-divisible as at run time). The shape is a decode step of gpt-oss: 8 query heads a KV head, head
dim 64, 16-token blocks, a full layer split over keys and merged in the kernel. Per config and cache
dtype: registers, shared memory, and each key loop (a loop holding an HMMA) with its instruction
count and its commonest opcodes. The cached-key loops are the two longest of the short ones; the
float8 cache's conversions (F2FP.F16.E4M3.UNPACK_B, F2F.BF16.F16) and byte loads (LDS.U8) show
there.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_decode_sass import _compile, disassemble, mma_loops, opcode  # noqa: E402

from gptoss.kernels.attention_kernel import _attn_kernel  # noqa: E402
from gptoss.kernels.attention_settings import DECODE_CFG, NEW_KEYS_N, SMALL_DECODE_CFG  # noqa: E402

POINTERS = {
    "q_ptr": "bf16",
    "kn_ptr": "bf16",
    "vn_ptr": "bf16",
    "kc_ptr": "cache",
    "vc_ptr": "cache",
    "table_ptr": "i32",
    "qstart_ptr": "i32",
    "ctx_ptr": "i32",
    "sink_ptr": "fp32",
    "out_ptr": "bf16",
    "pm_ptr": "fp32",
    "pl_ptr": "fp32",
    "pacc_ptr": "fp32",
    "lock_ptr": "i32",
    "pos_ptr": "i32",
    "cs_ptr": "fp32",
    "slot_ptr": "i64",
}
SCALARS = {"qk_scale": "fp32", "window": "i32", "ring_len": "i32", "num_splits": "i32", "hq": "i32"}
STRIDES = (
    "stride_qt stride_qh stride_nt stride_nh stride_cb stride_cs stride_ch stride_tb stride_ot stride_oh"
)


def compile_decode(
    fp8: bool,
    block_n: int,
    warps: int,
    stages: int,
    pf_keys: int = 0,
    rope: bool = False,
    pre_kv: bool = False,
    new_n: int = 0,
    sliding: bool = False,
):
    """The decode kernel compiled for sm_90a: a full layer split over keys and merged in the kernel,
    or (sliding) a sliding layer's one pass over its ring, as batch 1 runs it."""
    cache = "fp8e4nv" if fp8 else "bf16"
    sig = {k: "*" + (cache if t == "cache" else t) for k, t in POINTERS.items()}
    sig |= SCALARS | dict.fromkeys(STRIDES.split(), "i32")
    consts = dict(G=8, G_PAD=8, BLOCK_Q=2, BLOCK_N=block_n, D=64, BS=16, RING=sliding, WINDOWED=sliding)
    consts |= dict(SPLIT=not sliding, MERGE=not sliding, NS_PAD=1 if sliding else 32)
    consts |= dict(PRECISION="tf32", UPCAST=False, PDL=True)
    consts |= dict(ROPE=rope, KV_FP8=fp8, PF_KEYS=pf_keys, PRE_KV=pre_kv, NEW_N=new_n)
    return _compile(_attn_kernel, sig, consts, warps, stages)


def key_loops(kernel) -> tuple[str, list[tuple[int, collections.Counter]]]:
    """Registers and each loop that holds an HMMA: its length and opcode counts, shortest first."""
    res, _, ins = disassemble(kernel)
    loops = [
        (len(body), collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0] for x in body))
        for body in mma_loops(ins)
    ]
    return re.search(r"REG:(\d+)", res)[1], sorted(loops, key=lambda loop: loop[0])


def batch1(cfg: tuple[int, int, int], new_n: int, sliding: bool) -> str:
    """One line of --batch1's table."""
    kernel = compile_decode(False, *cfg, rope=True, pre_kv=True, new_n=new_n, sliding=sliding)
    res, _, ins = disassemble(kernel)
    regs = re.search(r"REG:(\d+)", res)[1]
    ops = [opcode(x) for _, x in ins]
    wait = ops.index("ACQBULK")
    after = collections.Counter(ops[wait:])
    return (
        f"{'sliding' if sliding else 'full':7} {cfg}: regs {regs}, "
        f"before the wait {wait}, after {len(ops) - wait} (BAR {after['BAR']}, HMMA {after['HMMA']}, "
        f"MUFU {after['MUFU']})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cfg", nargs="+", default=None)
    ap.add_argument("--batch1", action="store_true")
    ap.add_argument("--new-keys", type=int, default=NEW_KEYS_N)
    args = ap.parse_args()
    if args.batch1:
        for cfg in args.cfg or [",".join(map(str, SMALL_DECODE_CFG))]:
            for sliding in (False, True):
                print(batch1(tuple(int(v) for v in cfg.split(",")), args.new_keys, sliding), flush=True)
        return
    for cfg in args.cfg or [",".join(map(str, DECODE_CFG))]:
        block_n, warps, stages = (int(v) for v in cfg.split(","))
        for fp8 in (False, True):
            k = compile_decode(fp8, block_n, warps, stages)
            regs, loops = key_loops(k)
            print(f"cfg {cfg}, {'fp8' if fp8 else 'bf16'} cache: regs {regs}, smem {k.metadata.shared}")
            for n, ops in loops:
                print(f"  loop {n:5d} ins: " + ", ".join(f"{op} {c}" for op, c in ops.most_common(10)))


if __name__ == "__main__":
    main()
