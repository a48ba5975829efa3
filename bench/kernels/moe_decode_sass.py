"""SASS statistics of the decode kernels (moe_decode, norm_logits, qkv_rope), compiled for sm_90a on CPU.

    python bench/kernels/moe_decode_sass.py

No GPU needed: triton.compile for GPUTarget("cuda", 90, 32) at the 20b shapes (bf16, E 32,
H = I = 2880, top-4), pointers and strides marked 16-divisible as at run time, and Triton's bundled
cuobjdump. One line per kernel and tiles: registers, shared memory, STL/LDL (spills), FTZ float
ops (the e2m1 code 0.5 is a bf16 subnormal: FTZ would zero it), the load kinds, and the K loop
(the innermost loop with an HMMA): instructions and HMUL2 (2 weight values each) per iteration, so
instructions a weight value = loop / (2 * HMUL2).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gptoss.kernels import moe_decode_flat as f  # noqa: E402
from gptoss.kernels import moe_decode_kernels as d  # noqa: E402
from gptoss.kernels.moe_tiles import DOWN_DEC_TILES, GATE_UP_DEC_TILES, DecTiles  # noqa: E402
from gptoss.kernels.norm_route import _norm_logits_kernel  # noqa: E402
from gptoss.kernels.qkv_rope import _qkv_rope_kernel  # noqa: E402

CUOBJDUMP = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
SHAPE = dict(N=2880, K=2880, TOP_K=4, E=32, BE=32, PREC="tf32", ASM=True, PDL=True)
GEMM_SIG = dict(w_ptr="*u8", s_ptr="*i32", b_ptr="*fp32", counts_ptr="*i32", rows_ptr="*i32", T="i32")


def _compile(kernel, sig: dict[str, str], consts: dict, warps: int, stages: int, maxnreg: int | None = None):
    idx = kernel.arg_names.index
    attrs = {
        (idx(k),): [["tt.divisibility", 16]]
        for k, t in sig.items()
        if t[0] == "*" or k.startswith("stride") or k == "K"  # as Triton specializes 2880 at run time
    }
    src = (GluonASTSource if kernel.is_gluon() else ASTSource)(
        kernel,
        {**sig, **dict.fromkeys(consts, "constexpr")},
        constexprs={(idx(k),): v for k, v in consts.items()},
        attrs=attrs,
    )
    return triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": warps, "num_stages": stages} | ({"maxnreg": maxnreg} if maxnreg else {}),
    )


def gate_up(t: DecTiles, route_tokens: int = 0, probe: int = 0):
    """route_tokens > 0: the kernel routes [T, E] logits itself (ROUTE) with BT = that many rows;
    probe: moe_decode.PROBE's timing-probe K step (slot kernels)."""
    sig = dict(x_ptr="*bf16", act_ptr="*bf16", **GEMM_SIG, stride_x="i32", alpha="fp32", limit="fp32")
    sig.update(logits_ptr="*fp32", ids_ptr="*i32", wts_ptr="*fp32", stride_l="i32")
    sig.update({f"stride_{s}": "i32" for s in ("we", "wp", "wn", "se", "sp", "sn")})
    consts = dict(SHAPE, BM=t.bm, BN=t.bn, BK=t.bk, SPLIT=t.split)
    consts.update(ROUTE=route_tokens > 0, KP=4, BT=max(1, route_tokens))
    if not t.per_sm:
        consts.update(PROBE=probe)
    kernel = f._gate_up_flat_kernel if t.per_sm else d._gate_up_dec_kernel
    return _compile(kernel, sig, consts, t.warps, t.stages, t.maxnreg)


def down(t: DecTiles):
    sig = dict(a_ptr="*bf16", y_ptr="*bf16", **GEMM_SIG)
    sig.update({f"stride_{s}": "i32" for s in ("we", "wn", "se", "sn")})
    consts = {k: v for k, v in SHAPE.items() if k != "TOP_K"} | dict(BM=t.bm, BN=t.bn, BK=t.bk, SPLIT=t.split)
    return _compile(f._down_flat_kernel if t.per_sm else d._down_dec_kernel, sig, consts, t.warps, t.stages)


def norm_logits(pdl: bool):
    sig = dict(x_ptr="*bf16", res_ptr="*bf16", nw_ptr="*fp32", h_ptr="*bf16", r_ptr="*bf16")
    sig.update(rw_ptr="*bf16", rb_ptr="*bf16", logits_ptr="*fp32")
    sig.update(T="i32", stride_x="i32", stride_res="i32", eps="fp32")
    consts = dict(H=2880, E=32, BH=4096, PDL=pdl)
    return _compile(_norm_logits_kernel, sig, consts, 8, 3)


def qkv_rope():
    sig = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", pos_ptr="*i64", cs_ptr="*fp32", out_ptr="*bf16")
    sig.update(kc_ptr="*bf16", vc_ptr="*bf16", slot_ptr="*i64", T="i32", K="i32", stride_x="i32")
    sig.update(stride_w="i32", stride_out="i32", block_size="i32", stride_cb="i32", stride_cs="i32")
    sig.update(stride_ch="i32")
    consts = dict(
        HQ=64, HKV=8, D=64, TB=16, BK=128, WRITE_CACHE=True, PRECISION="tf32", UPCAST=False, PDL=True
    )
    return _compile(_qkv_rope_kernel, sig, consts, 4, 6)


def disassemble(k) -> tuple[str, str, list[tuple[int, str]]]:
    """cuobjdump's resource usage, the SASS, and its instructions as (address, text)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    ins = [(int(m[1], 16), m[2]) for m in re.finditer(r"^\s+/\*([0-9a-f]{4,5})\*/\s+(.*?);", sass, re.M)]
    return res, sass, ins


def opcode(text: str) -> str:
    """The opcode of a SASS line, without its predicate (@P0, @!UP0) and modifiers (.L2)."""
    words = text.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def branches(ins: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """Every branch as (its address, its target); a target below the address closes a loop."""
    return [(addr, int(m[1], 16)) for addr, text in ins if (m := re.search(r"BRA\s.*?0x([0-9a-f]+)", text))]


def mma_loops(ins: list[tuple[int, str]]) -> list[list[str]]:
    """The bodies of the loops (a backward branch) that hold a tensor-core MMA."""
    loops = []
    for addr, target in branches(ins):
        if target < addr:
            body = [x for a, x in ins if target <= a <= addr]
            if any("HMMA" in x or "HGMMA" in x for x in body):
                loops.append(body)
    return loops


def stats(k, name: str) -> None:
    res, sass, ins = disassemble(k)
    loops = mma_loops(ins)
    k_loop = min(loops, key=len) if loops else []
    hmul2 = sum("HMUL2" in x for x in k_loop)
    per_value = f"{len(k_loop) / (2 * hmul2):.2f} a value" if hmul2 else "-"
    loads = collections.Counter(
        re.findall(r"\b(LDG[.A-Z0-9]*|LDGSTS[.A-Z0-9]*|LDS[.A-Z0-9]*|LDSM[.A-Z0-9]*)\b", sass)
    )
    regs = re.search(r"REG:(\d+)", res)[1]
    spills = sum(bool(re.search(r"\b(STL|LDL)\b", x)) for _, x in ins)
    loop_spills = sum(bool(re.search(r"\b(STL|LDL)\b", x)) for x in k_loop)
    ftz = len(re.findall(r"\.FTZ", sass))
    async_in_loop = sum("LDGSTS" in x for x in k_loop)
    print(
        f"{name}: regs {regs}, smem {k.metadata.shared}, spills {spills} ({loop_spills} in the K loop), "
        f"ftz {ftz}, "
        f"K loop {len(k_loop)} ins / {hmul2} HMUL2 ({per_value}), {async_in_loop} LDGSTS in it\n"
        f"    loads {dict(loads)}"
    )


def main() -> None:
    for t in [GATE_UP_DEC_TILES, DecTiles(1, 16, 512, 4, 4, 4), DecTiles(8, 32, 512, 4, 4, 3)]:
        stats(gate_up(t), f"gate_up {t}")
    for bm, tokens in ((1, 1), (8, 16)):  # the engine's decode router (GPTOSS_ROUTER=fused)
        t = dataclasses.replace(GATE_UP_DEC_TILES, bm=bm)
        stats(gate_up(t, tokens), f"gate_up routing T {tokens} in registers {t}")
    t = dataclasses.replace(GATE_UP_DEC_TILES, bm=1, maxnreg=80)  # GPTOSS_GATE_UP_MAXNREG=80
    stats(gate_up(t, 1), f"gate_up routing T 1 in registers {t}")
    for t in [DOWN_DEC_TILES, DecTiles(1, 32, 512, 4, 4, 3), DecTiles(8, 16, 1024, 8, 8, 3)]:
        stats(down(t), f"down {t}")
    for probe in (1, 2):  # the timing probes: the load path alone, the compute alone
        stats(
            gate_up(dataclasses.replace(GATE_UP_DEC_TILES, bm=1), probe=probe), f"gate_up BM 1 probe {probe}"
        )
    for per_sm in (2, 4):  # the flat kernels (GPTOSS_MOE_FLAT)
        for bm in (1, 8):
            stats(
                gate_up(dataclasses.replace(GATE_UP_DEC_TILES, bm=bm, per_sm=per_sm)), f"gate_up flat BM {bm}"
            )
            stats(down(dataclasses.replace(DOWN_DEC_TILES, bm=bm, per_sm=per_sm)), f"down flat BM {bm}")
        t = dataclasses.replace(GATE_UP_DEC_TILES, bm=1, per_sm=per_sm)
        stats(gate_up(t, 1), f"gate_up flat routing T 1 in registers {t}")
    for pdl in (False, True):
        stats(norm_logits(pdl), f"norm_logits kernel (a program per expert and token), PDL {pdl}")
    stats(qkv_rope(), "qkv_rope (QKV GEMV + RoPE + KV write), 20b")


if __name__ == "__main__":
    main()
