"""SASS of the batch-1 kernels that load before their PDL wait what never changes or what the host
wrote before the step, compiled for sm_90a on CPU: the preloading decode GEMV (gptoss.kernels.gemv_preload),
norm_logits (norm_route), the RMSNorm (rmsnorm), decode attention and its reduce.

    python bench/kernels/pdl_wait_sass.py [--json]

No GPU needed (as moe_decode_sass.py). For O [2880, 4096] and QKV [5120, 2880] (bf16, bias, PDL) at a
few tiles (BN x WARPS): registers, spills (STL/LDL), the global loads (LDG) issued before ACQBULK
(griddepcontrol.wait) and after it, and the order of ACQBULK and PREEXIT (launch_dependents). The
preload holds when all of W's loads (BN*K*2 / (16 * 32 * WARPS) 16-byte LDG a thread) and the bias's
come before ACQBULK and only x after it; with GPTOSS_GEMV_PRELOAD_EARLY (rows a program loads before the
wait) at 2 of 4, half of them; at 0, none. The one-wave GEMV (gemv_stream, BN 2 x 4 warps, one and two
tokens): its first block's W and bias before ACQBULK, x and the next blocks' after; its registers say
how many programs fit an SM (gemv_stream.PER_SM). norm_logits (20b: H 2880 in a 4096 tile over 8 warps):
its norm weight (float32), router row and bias before ACQBULK, x and the residual after.
rmsnorm (bf16, the MoE combine of 4 rows, H in a 4096 tile over 16 warps): its weight before ACQBULK,
nothing but x, the combine rows and weights and the residual after. Decode attention with RoPE inside
(attention_kernel, DECODE_CFG, a GQA group of 8 over 2 query tokens): the step's metadata, the
positions, their RoPE table rows and the new key's cache slot before ACQBULK; q, the new k and v (the
QKV output), the block table and the cache after; with GPTOSS_ATTN_PRELOAD its first K and V tile before
ACQBULK too. The attention reduce (16 splits of a GQA group of 8, as a full layer's batch-1 decode): the
sinks and the query start before ACQBULK, the partials after.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attn_sass import compile_decode  # noqa: E402
from moe_decode_sass import _compile, disassemble, norm_logits, opcode  # noqa: E402
from prefetch_sass import report  # noqa: E402

from gptoss.kernels.attention_reduce import _reduce_kernel  # noqa: E402
from gptoss.kernels.attention_settings import DECODE_CFG  # noqa: E402
from gptoss.kernels.gemv_preload import _gemv_preload_kernel, k_parts  # noqa: E402
from gptoss.kernels.gemv_stream import _gemv_stream_kernel  # noqa: E402
from gptoss.kernels.rmsnorm import _rmsnorm_kernel  # noqa: E402

SHAPES = {"o": (2880, 4096), "qkv": (5120, 2880)}  # name: (N, K)
TILES = ((4, 4), (8, 8), (2, 4))  # (BN, WARPS)


def compile_stats(k: int, bn: int, warps: int, early: int | None = None) -> dict:
    k1, k2 = k_parts(k)
    sig = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", T="i32", N="i32", K="i32")
    sig.update(stride_x="i32", stride_w="i32", stride_y="i32")
    consts = dict(HAS_BIAS=True, BN=bn, K1=k1, K2=k2, EARLY=early if early is not None else bn, PDL=True)
    return _load_stats(_compile(_gemv_preload_kernel, sig, consts, warps, 1))


def stream_stats(k: int, bn: int, warps: int, two: bool) -> dict:
    """gemv_stream's kernel (gptoss.kernels.gemv_stream) at W [N, k], as compile_stats."""
    k1, k2 = k_parts(k)
    sig = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", T="i32", N="i32", K="i32")
    sig.update(stride_x="i32", stride_w="i32", stride_y="i32")
    consts = dict(HAS_BIAS=True, BN=bn, K1=k1, K2=k2, TWO=two, PDL=True)
    return _load_stats(_compile(_gemv_stream_kernel, sig, consts, warps, 1))


def _load_stats(kernel) -> dict:
    res, _, ins = disassemble(kernel)
    ops = [opcode(x) for _, x in ins]
    wait = ops.index("ACQBULK")
    regs = int(res.split("REG:")[1].split()[0])
    return {
        "regs": regs,
        "spills": sum(op in ("STL", "LDL") for op in ops),
        "ldg_before_wait": sum(op == "LDG" for op in ops[:wait]),
        "ldg_after_wait": sum(op == "LDG" for op in ops[wait:]),
        "release": "PREEXIT" in ops,
        "wait_then_release": "PREEXIT" in ops and ops.index("PREEXIT") > wait,
    }


def stats() -> dict:
    out = {
        f"{name} {bn}x{warps}": compile_stats(k, bn, warps)
        for name, (_, k) in SHAPES.items()
        for bn, warps in TILES
    }
    # GPTOSS_GEMV_PRELOAD_EARLY: half of O's rows before the wait, and none
    out |= {f"o 4x4 early {e}": compile_stats(4096, 4, 4, e) for e in (2, 0)}
    out |= {  # gemv_stream at its default tile (BN 2 x 4 warps), one and two tokens
        f"stream {name} 2x4{' two' if two else ''}": stream_stats(k, 2, 4, two)
        for name, (_, k) in SHAPES.items()
        for two in (False, True)
    }
    sig = dict(x_ptr="*bf16", res_ptr="*bf16", w_ptr="*fp32", out_ptr="*bf16", r_ptr="*bf16", cw_ptr="*fp32")
    sig.update(stride_x="i32", stride_res="i32", stride_out="i32", stride_r="i32", H="i32", eps="fp32")
    rms = _compile(_rmsnorm_kernel, sig, dict(HAS_RESIDUAL=True, TOP_K=4, BLOCK=4096, PDL=True), 16, 1)
    out |= {"norm_logits": _load_stats(norm_logits(True)), "rmsnorm": _load_stats(rms)}
    out |= {
        f"attention{' rope' if rope else ''}": _load_stats(compile_decode(False, *DECODE_CFG, rope=rope))
        for rope in (False, True)
    }
    out["attention rope preload"] = _load_stats(compile_decode(False, *DECODE_CFG, rope=True, pre_kv=True))
    sig = dict(qstart_ptr="*i32", sink_ptr="*fp32", out_ptr="*bf16", pm_ptr="*fp32", pl_ptr="*fp32")
    sig.update(pacc_ptr="*fp32", num_splits="i32", hq="i32", stride_ot="i32", stride_oh="i32")
    red = _compile(_reduce_kernel, sig, dict(G=8, G_PAD=8, NS_PAD=16, D=64, PDL=True), 2, 3)
    return out | {"attention reduce": _load_stats(red)}


def main() -> None:
    report(__doc__, stats)


if __name__ == "__main__":
    main()
