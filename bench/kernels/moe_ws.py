"""A batch-1 decode MoE GEMM with a warp group of its own issuing the weight copies (Gluon, Hopper):
the experiment v61 left open, since Triton 3.6 does not warp-specialize the split-K kernels' loops.
Timed in bench/results v63 against the engine's kernels.

ws_gemv(x, ids, w, s, k, bk, nbuf, regs, maxnreg, kparts, rbw, pf, loads_only) -> [kparts, slots, N]
float32, partial sums of W_e @ x for each slot's expert e (no bias, no SwiGLU: moe_ablate's "full"
product). One program a (4 16-row blocks, slot, K part):
- the default partition (4 warps, 24 registers) copies each K step's words [1, BK/64, 128] and scale
  words [1, BK/64, 8] of each row block by TMA into a ring of NBUF buffers, each with a "ready" (the
  copies' bytes) and an "empty" barrier;
- 4 / RBW consumer partitions of one warp each, RBW 16-row blocks each: wait "ready", read their words
  (16 bytes a lane, the v3 layout's mma.sync A fragments) and scale words into registers, arrive on
  "empty" at once, decode (moe_v3_step's PTX), mma.sync with x in every column of the B fragment (x
  read from global memory, shared by the warp's row blocks); PF reads the next step's words before
  this step's MMAs; no block barrier in their loop. loads_only: the copies alone (out holds an XOR).

Gluon kernels have no interpreter: `python bench/kernels/moe_ws.py` compiles the kernel for sm_90a
on CPU and prints its consumer loop's opcodes (tests/bench/test_moe_ws.py); the product is checked
against torch on a GPU (the same test file, and moe_ws_gpu.py before timing).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # moe_decode_sass, for the sm_90a compile

from gptoss.kernels.moe_v3 import weight_words  # noqa: E402
from gptoss.kernels.moe_v3_step import _V3_ASM  # noqa: E402


@gluon.constexpr_function
def _words_layout(kc):
    """[KC, 8 (g), 4 (t), 4 (s)] words of one warp: lane 4g + t holds its 4 consecutive words (the k16
    steps s) of each 64-K chunk, as the v3 layout stores them (one 16-byte read a lane a chunk)."""
    regs = [[0, 0, 0, 1], [0, 0, 0, 2]] + [[1 << b, 0, 0, 0] for b in range(kc.bit_length() - 1)]
    lanes = [[0, 0, 1, 0], [0, 0, 2, 0], [0, 1, 0, 0], [0, 2, 0, 0], [0, 4, 0, 0]]
    return gl.DistributedLinearLayout(regs, lanes, [], [], [kc, 8, 4, 4])


@gluon.constexpr_function
def _scales_layout(kc):
    """[1, KC, 8 (g)] scale words of one warp's row block: lane 4g + t holds word g (t broadcast)."""
    regs = [[0, 1 << b, 0] for b in range(kc.bit_length() - 1)]
    lanes = [[0, 0, 0], [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 4]]
    return gl.DistributedLinearLayout(regs, lanes, [], [], [1, kc, 8])


@gluon.jit
def _decode(w, sw, s_idx, KC: gl.constexpr, A_L: gl.constexpr):
    """w [KC, 8, 4, 4] words, sw [KC, 8, 1, 1] scale words (byte 2 s2 + h: rows g + 8h, K group s2),
    s_idx [1, 1, 1, 4] -> the A operand [16, KC * 64] bf16 (row 8h + g, K 64 kc + 16 s + 8 q + 2 t + nib)."""
    sh = (s_idx // 2) * 16
    f0 = ((sw >> sh) & 0xFF) * 0x800080 + 0x3F003F00
    f1 = ((sw >> (sh + 8)) & 0xFF) * 0x800080 + 0x3F003F00
    f0 = gl.broadcast(f0, w)[0]
    f1 = gl.broadcast(f1, w)[0]
    r0, r1, r2, r3 = gl.inline_asm_elementwise(
        _V3_ASM,
        "=r,=r,=r,=r,r,r,r",
        [w, f0, f1],
        dtype=(gl.uint32, gl.uint32, gl.uint32, gl.uint32),
        is_pure=True,
        pack=1,
    )
    q = gl.join(gl.join(r0, r1), gl.join(r2, r3))  # [kc, g, t, s, h, q]
    lo = (q & 0xFFFF).to(gl.uint16).to(gl.bfloat16, bitcast=True)
    hi = (q >> 16).to(gl.uint16).to(gl.bfloat16, bitcast=True)
    v = gl.permute(gl.join(lo, hi), (4, 1, 0, 3, 5, 2, 6))  # [h, g, kc, s, q, t, nib]
    return gl.convert_layout(gl.reshape(v, (16, KC * 64)), A_L, assert_trivial=True)


@gluon.jit
def _words(w_buf, s_buf, KC: gl.constexpr):
    """A row block's K step from its buffers: words [KC, 8, 4, 4], scale words [KC, 8, 1, 1]."""
    W_L: gl.constexpr = _words_layout(KC)
    w = w_buf.load(gl.BlockedLayout([1, 1, 4], [1, 1, 32], [1, 1, 1], [2, 1, 0]))
    w = gl.convert_layout(gl.reshape(w, (KC, 8, 4, 4)), W_L, assert_trivial=True)
    sw = s_buf.load(_scales_layout(KC))
    sw = gl.convert_layout(
        gl.reshape(sw, (KC, 8)), gl.SliceLayout(2, gl.SliceLayout(3, W_L)), assert_trivial=True
    )
    return w.to(gl.uint32, bitcast=True), sw.to(gl.uint32, bitcast=True)[:, :, None, None]


@gluon.jit
def _x_part(x_ptr, k0, K: gl.constexpr, BKP: gl.constexpr, B_L: gl.constexpr):
    """x[k0 : k0 + BKP] in every column of the B fragment (each lane loads its own K, no predicate on
    the column): the columns of the product are alike and column 0 is kept."""
    kx = k0 + gl.arange(0, BKP, layout=gl.SliceLayout(1, B_L))
    return gl.broadcast(
        gl.load(x_ptr + kx, mask=kx < K, other=0.0)[:, None], gl.zeros([BKP, 8], gl.bfloat16, B_L)
    )[0]


@gluon.jit
def _step_words(w_bufs, s_bufs, ready, empty, j, rb0, KSTEPS: gl.constexpr, NBUF: gl.constexpr,
                KC: gl.constexpr, RBW: gl.constexpr):  # fmt: skip
    """K step j's words of row blocks rb0 (and rb0 + 1 if RBW 2) into registers, then the buffer given
    back. Past the last step (the prefetch's last turn) nothing is waited on or given back; the words
    read then are never used."""
    live = j < KSTEPS
    idx = j % NBUF
    mbarrier.wait(ready.index(idx), (j // NBUF) & 1, pred=live)
    wa, sa = _words(w_bufs.index(idx).slice(rb0, 1), s_bufs.index(idx).slice(rb0, 1), KC)
    wb, sb = wa, sa
    if RBW == 2:
        wb, sb = _words(w_bufs.index(idx).slice(rb0 + 1, 1), s_bufs.index(idx).slice(rb0 + 1, 1), KC)
    fence_async_shared()  # the reads above before the next copy into this buffer
    mbarrier.arrive(empty.index(idx), pred=live)
    return wa, sa, wb, sb


@gluon.jit
def _xor(a, b):
    return a ^ b


@gluon.jit
def _consumer(x_ptr, out_ptr, w_bufs, s_bufs, ready, empty, rb0, row0, slot, N: gl.constexpr, K: gl.constexpr,
              KSTEPS: gl.constexpr, NBUF: gl.constexpr, BK: gl.constexpr, MODE: gl.constexpr,
              RBW: gl.constexpr, PF: gl.constexpr):  # fmt: skip
    """RBW row blocks from rb0 (each its own accumulator; x's fragment shared). The next K step's words
    come into registers before this step's MMAs if PF (a step's shared-memory reads off the MMAs'
    chain), else after them. MODE 0: the copies' structure alone (the words XORed, no dequant, no
    MMA; out holds the XOR, not a product)."""
    KC: gl.constexpr = BK // 64
    W_L: gl.constexpr = _words_layout(KC)
    I_L: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(0, W_L)))
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B_L: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    s_idx = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=I_L), 0), 0), 0)
    acc_a = gl.zeros([16, 8], gl.float32, MMA)
    acc_b = gl.zeros([16, 8], gl.float32, MMA)
    chk = gl.zeros([KC, 8, 4, 4], gl.uint32, W_L)
    gl.static_assert(RBW == 1 or RBW == 2, "one or two row blocks a consumer warp")
    p0 = gl.program_id(2) * KSTEPS  # this program's first K step (KPARTS programs share a row tile's K)
    wa, sa, wb, sb = _step_words(w_bufs, s_bufs, ready, empty, 0, rb0, KSTEPS, NBUF, KC, RBW)
    for i in range(KSTEPS):
        x0 = _x_part(x_ptr, (p0 + i) * BK, K, BK, B_L)
        if PF:
            na, nsa, nb, nsb = _step_words(w_bufs, s_bufs, ready, empty, i + 1, rb0, KSTEPS, NBUF, KC, RBW)
        if MODE == 0:
            chk = chk ^ wa ^ sa ^ wb ^ sb
        else:
            acc_a = mma_v2(_decode(wa, sa, s_idx, KC, A_L), x0, acc_a)
            if RBW == 2:
                acc_b = mma_v2(_decode(wb, sb, s_idx, KC, A_L), x0, acc_b)
        if not PF:
            na, nsa, nb, nsb = _step_words(w_bufs, s_bufs, ready, empty, i + 1, rb0, KSTEPS, NBUF, KC, RBW)
        wa, sa, wb, sb = na, nsa, nb, nsb
    n_l = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))[None, :]
    rows = row0 + rb0 * 16 + gl.arange(0, 16, layout=gl.SliceLayout(1, MMA))
    out = out_ptr + (gl.program_id(2) * gl.num_programs(1) + slot) * N + rows
    col_a = gl.sum(gl.where(n_l == 0, acc_a, 0.0), axis=1)
    if MODE == 0:
        col_a += gl.reduce(gl.reshape(chk, (KC * 128,)), 0, _xor).to(gl.float32)
    gl.store(out, col_a)
    if RBW == 2:
        gl.store(out + 16, gl.sum(gl.where(n_l == 0, acc_b, 0.0), axis=1))


@gluon.jit
def _producer(w_desc, s_desc, w_bufs, s_bufs, ready, empty, c, CW: gl.constexpr, KSTEPS: gl.constexpr,
              NBUF: gl.constexpr, BK: gl.constexpr):  # fmt: skip
    p0 = gl.program_id(2) * KSTEPS
    for i in range(KSTEPS):
        idx = i % NBUF
        mbarrier.wait(empty.index(idx), ((i // NBUF) & 1) ^ 1)  # a fresh barrier passes phase 1
        bar = ready.index(idx)
        mbarrier.expect(bar, CW * (w_desc.block_type.nbytes + s_desc.block_type.nbytes))
        for rb in gl.static_range(CW):  # TMA boxes are powers of 2: one 16-row block a copy
            kc = (p0 + i) * (BK // 64)
            tma.async_copy_global_to_shared(w_desc, [c + rb, kc, 0], bar, w_bufs.index(idx).slice(rb, 1))
            tma.async_copy_global_to_shared(s_desc, [c + rb, kc, 0], bar, s_bufs.index(idx).slice(rb, 1))


@gluon.jit
def _ws_kernel(x_ptr, ids_ptr, out_ptr, w_desc, s_desc, N: gl.constexpr, K: gl.constexpr, CW: gl.constexpr,
               BK: gl.constexpr, NBUF: gl.constexpr, REGS: gl.constexpr, MODE: gl.constexpr,
               KPARTS: gl.constexpr, RBW: gl.constexpr, PF: gl.constexpr):  # fmt: skip
    pid_n = gl.program_id(0)
    slot = gl.program_id(1)
    e = gl.load(ids_ptr + slot)
    c = e * (N // 16) + pid_n * CW  # the tile's first 16-row block in the descriptors
    KSTEPS: gl.constexpr = (K + BK - 1) // BK // KPARTS  # K steps a program
    w_bufs = gl.allocate_shared_memory(gl.int32, [NBUF, CW, BK // 64, 128], w_desc.layout)
    s_bufs = gl.allocate_shared_memory(gl.int32, [NBUF, CW, BK // 64, 8], s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NBUF, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(NBUF):
        mbarrier.init(ready.index(j), count=1)
        mbarrier.init(empty.index(j), count=CW // RBW)  # one arrival a consumer warp
    row0 = pid_n * CW * 16
    # The default partition (num_warps, a multiple of 4) issues the copies; each consumer is a worker
    # partition of one warp. The arguments are written out whole: tuples built here lose constexprs.
    gl.static_assert(CW == 4, "4 16-row blocks a program")
    if RBW == 1:
        gl.warp_specialize(
            [
                (_producer, (w_desc, s_desc, w_bufs, s_bufs, ready, empty, c, CW, KSTEPS, NBUF, BK)),
                (_consumer, (x_ptr, out_ptr, w_bufs, s_bufs, ready, empty, 0, row0, slot, N, K, KSTEPS, NBUF,
                             BK, MODE, RBW, PF)),
                (_consumer, (x_ptr, out_ptr, w_bufs, s_bufs, ready, empty, 1, row0, slot, N, K, KSTEPS, NBUF,
                             BK, MODE, RBW, PF)),
                (_consumer, (x_ptr, out_ptr, w_bufs, s_bufs, ready, empty, 2, row0, slot, N, K, KSTEPS, NBUF,
                             BK, MODE, RBW, PF)),
                (_consumer, (x_ptr, out_ptr, w_bufs, s_bufs, ready, empty, 3, row0, slot, N, K, KSTEPS, NBUF,
                             BK, MODE, RBW, PF)),
            ],
            [1, 1, 1, 1],
            [REGS, REGS, REGS, REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_producer, (w_desc, s_desc, w_bufs, s_bufs, ready, empty, c, CW, KSTEPS, NBUF, BK)),
                (_consumer, (x_ptr, out_ptr, w_bufs, s_bufs, ready, empty, 0, row0, slot, N, K, KSTEPS, NBUF,
                             BK, MODE, RBW, PF)),
                (_consumer, (x_ptr, out_ptr, w_bufs, s_bufs, ready, empty, 2, row0, slot, N, K, KSTEPS, NBUF,
                             BK, MODE, RBW, PF)),
            ],
            [1, 1],
            [REGS, REGS],
        )  # fmt: skip


def smem_layout() -> gl.NVMMASharedLayout:
    """The ring's shared layout: unswizzled, so a lane's 16 bytes stay together (no bank conflicts)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)


def ws_gemv(
    x: torch.Tensor,
    ids: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor,
    k: int,
    bk: int = 256,
    nbuf: int = 4,
    regs: int = 96,
    maxnreg: int = 64,
    kparts: int = 1,
    rbw: int = 1,
    pf: bool = False,
    loads_only: bool = False,
) -> torch.Tensor:
    """x [1, K] bf16 one token, ids [slots] int32, w / s a "v3" GEMM's words [E, N, Kp/2] uint8 and
    scales [E, N, Kp/32] -> [kparts, slots, N] float32, the product's partial sums over each part of K
    (kparts programs a row tile, each a shorter chain; see the module's doc)."""
    n = w.shape[1]
    if n % 64 or bk % 64 or (bk // 64) & (bk // 64 - 1) or x.shape != (1, k) or x.dtype != torch.bfloat16:
        raise ValueError(
            f"ws_gemv: N {n} must be a multiple of 64 (4 16-row blocks), BK {bk} 64 times a power of 2, "
            f"x one bf16 row of K {k}; got x {tuple(x.shape)} {x.dtype}"
        )
    if triton.cdiv(k, bk) % kparts or rbw not in (1, 2):
        raise ValueError(
            f"ws_gemv: kparts {kparts} must divide the {triton.cdiv(k, bk)} K steps, rbw {rbw} be 1 or 2"
        )
    words, s_words = weight_words(w, s)
    w_desc = TensorDescriptor.from_tensor(words, [1, bk // 64, 128], smem_layout())
    s_desc = TensorDescriptor.from_tensor(s_words, [1, bk // 64, 8], smem_layout())
    out = torch.empty((kparts, ids.numel(), n), dtype=torch.float32, device=x.device)
    grid = (n // 64, ids.numel(), kparts)
    _ws_kernel[grid](
        x,
        ids,
        out,
        w_desc,
        s_desc,
        N=n,
        K=k,
        CW=4,
        BK=bk,
        NBUF=nbuf,
        REGS=regs,
        MODE=0 if loads_only else 1,
        RBW=rbw,
        PF=pf,
        KPARTS=kparts,
        num_warps=4,
        maxnreg=maxnreg,
    )
    return out


def compile_sm90(n: int = 5760, k: int = 2880, bk: int = 256, nbuf: int = 4, regs: int = 96,
                 maxnreg: int = 64, kparts: int = 1, rbw: int = 1, pf: bool = False):  # fmt: skip
    """_ws_kernel compiled for sm_90a without a GPU (ptxas runs on CPU), at 20b's gate_up by default."""
    from moe_decode_sass import _compile

    lay = repr(smem_layout())
    sig = {"x_ptr": "*bf16", "ids_ptr": "*i32", "out_ptr": "*fp32"}
    sig |= {
        "w_desc": f"tensordesc<i32[1,{bk // 64},128],{lay}>",
        "s_desc": f"tensordesc<i32[1,{bk // 64},8],{lay}>",
    }
    consts = dict(N=n, K=k, CW=4, BK=bk, NBUF=nbuf, REGS=regs, MODE=1, KPARTS=kparts, RBW=rbw, PF=pf)
    return _compile(_ws_kernel, sig, consts, 4, 1, maxnreg)  # Gluon has no num_stages: its loops are ours


def main() -> None:
    import argparse
    import collections
    import re

    from moe_decode_sass import disassemble, mma_loops, opcode

    ap = argparse.ArgumentParser(description="moe_ws's kernel compiled for sm_90a on CPU: its consumer loop")
    for name, default in (
        ("bk", 256),
        ("nbuf", 4),
        ("regs", 96),
        ("maxnreg", 64),
        ("rbw", 1),
        ("pf", 0),
        ("kparts", 1),
    ):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    if a.rbw not in (1, 2):
        ap.error("--rbw must be 1 or 2 (row blocks a consumer warp)")
    kern = compile_sm90(
        bk=a.bk, nbuf=a.nbuf, regs=a.regs, maxnreg=a.maxnreg, kparts=a.kparts, rbw=a.rbw, pf=bool(a.pf)
    )
    res, _, ins = disassemble(kern)
    loop = collections.Counter(opcode(x) for x in min(mma_loops(ins), key=len))
    regs = sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", kern.asm["ptx"])))
    spills = sum(bool(re.search(r"\b(STL|LDL)\b", x)) for _, x in ins)
    print(
        f"warps {kern.metadata.num_warps}, regs {res.split('REG:')[1].split()[0]}, "
        f"smem {kern.metadata.shared}"
    )
    print(f"setmaxnreg {', '.join(f'{d} {r}' for d, r in regs)}; spills {spills}")
    print(
        f"consumer K loop {sum(loop.values())} ins: " + ", ".join(f"{o} {c}" for o, c in loop.most_common())
    )


if __name__ == "__main__":
    main()
