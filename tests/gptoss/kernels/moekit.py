"""What the MoE kernel tests share: the random MoE and its reference, tolerances, interpreter fixes."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated by triton.jit
pytest.importorskip("triton")

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402

from gptoss.config import PRESETS  # noqa: E402
from gptoss.kernels import moe_common  # noqa: E402
from gptoss.kernels.moe import MoEWeights, moe_forward, prepare_moe_weights, route  # noqa: E402
from gptoss.model import MoE  # noqa: E402
from gptoss.mxfp4 import E2M1_VALUES  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = torch.device("cpu" if INTERPRET else "cuda")
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
ALPHA, LIMIT = 1.702, 7.0
pytestmark = [  # interpreter noise: a runtime loop bound as a 1-element array; exp(-x) overflowing to inf
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]
gpu = pytest.mark.skipif(INTERPRET, reason="needs CUDA (compiled kernels)")


@pytest.fixture(scope="module", autouse=True)
def interpreter_like_the_gpu():
    """Two Triton 3.6 interpreter bugs, fixed so CPU runs round like the GPU: tl.dot multiplies
    bfloat16 operands as their raw uint16 bits, and float32 -> bfloat16 casts truncate (the GPU
    rounds to nearest even)."""
    if not INTERPRET:
        yield
        return
    from triton.runtime import interpreter as interp

    builder = interp.InterpreterBuilder
    dot, trunc = builder.create_dot, builder.create_fp_trunc

    def as_f32(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        return interp.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, *rest):
        return dot(self, as_f32(a), as_f32(b), *rest)

    def create_fp_trunc(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return trunc(self, src, dst_type)
        bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even (finite inputs)
        return interp.TensorHandle(bits.astype(np.uint16), tl.bfloat16)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builder, "create_dot", create_dot)
        mp.setattr(builder, "create_fp_trunc", create_fp_trunc)
        yield


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every act / y / out buffer starts as NaN, so a row no kernel writes fails the comparison."""
    monkeypatch.setattr(
        moe_common,
        "_empty",
        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device),
    )


def make_moe(
    e: int,
    h: int,
    i: int,
    k: int,
    dtype: torch.dtype,
    seed: int = 0,
    kernels: str = "v2",
    large: str | None = None,
) -> tuple[MoE, MoEWeights]:
    g = torch.Generator(DEV).manual_seed(seed)

    def scale_bytes(shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
        lo = 118 + round(0.5 * math.log2(2880 / fan_in))  # keeps activations O(1), as make_checkpoint
        return torch.randint(lo, lo + 5, shape, generator=g, device=DEV, dtype=torch.uint8)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=DEV) * std).to(dtype)

    w = {
        "router.weight": normal(e, h, std=1 / math.sqrt(h)),
        "router.bias": normal(e, std=0.5),
        "experts.gate_up_proj_blocks": torch.randint(
            0, 256, (e, 2 * i, h // 32, 16), generator=g, device=DEV, dtype=torch.uint8
        ),
        "experts.gate_up_proj_scales": scale_bytes((e, 2 * i, h // 32), h),
        "experts.gate_up_proj_bias": normal(e, 2 * i, std=0.02),
        "experts.down_proj_blocks": torch.randint(
            0, 256, (e, h, i // 32, 16), generator=g, device=DEV, dtype=torch.uint8
        ),
        "experts.down_proj_scales": scale_bytes((e, h, i // 32), i),
        "experts.down_proj_bias": normal(e, h, std=0.02),
    }
    ref = MoE(replace(PRESETS["tiny"], num_local_experts=e, num_experts_per_tok=k), w, dtype)
    names = (
        "gate_up_proj_blocks",
        "gate_up_proj_scales",
        "gate_up_proj_bias",
        "down_proj_blocks",
        "down_proj_scales",
        "down_proj_bias",
    )
    return ref, prepare_moe_weights(*(w["experts." + n] for n in names), kernels=kernels, large=large)


def reference(ref: MoE, x: torch.Tensor) -> torch.Tensor:
    """ref(x), except tokens whose k-th and (k+1)-th logits tie: torch.topk may take either expert
    there, so those tokens get MoE.forward's sum over the experts the kernel chose (a valid top-k:
    checked), through the reference Experts."""
    want = ref(x)
    logits = F.linear(x, ref.router_weight, ref.router_bias)  # [T, E]
    ids, weights = route(logits, ref.top_k)
    top = torch.topk(logits, ref.top_k, dim=-1).values
    assert torch.equal(logits.gather(1, ids.long()), top)  # the same logits, in the same order
    if ref.top_k < logits.shape[1]:
        s = logits.sort(dim=1, descending=True).values
        for t in (s[:, ref.top_k - 1] == s[:, ref.top_k]).nonzero().flatten().tolist():
            ys = [ref.experts(e, x[t : t + 1]).float() for e in ids[t].tolist()]  # [1, H] each
            want[t] = sum(w * y[0] for w, y in zip(weights[t].tolist(), ys, strict=False)).to(x.dtype)
    return want


def check_against_reference(ref: MoE, w: MoEWeights, x: torch.Tensor) -> float:
    got = moe_forward(x, ref.router_weight, ref.router_bias, ref.top_k, w, ALPHA, LIMIT)
    want = reference(ref, x)
    assert got.shape == want.shape and got.dtype == x.dtype
    bad = (~got.isfinite()).any(dim=1).nonzero().flatten().tolist()
    # Which tokens: an unwritten output row (stale memory) shows as a whole row, an overflow as a few
    assert not bad, f"non-finite outputs in token rows {bad[:16]} of {got.shape[0]}"
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err <= TOL[x.dtype], f"rel error {err:.2e} > {TOL[x.dtype]:.0e}"
    return err


def e2m1(code: torch.Tensor) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float64)[code.long()]


def run_ptx(text: str, ins: list[np.ndarray], n_out: int) -> list[np.ndarray]:
    """Evaluate inline-asm PTX with the few instructions _BITS_TO_BF16_ASM uses, on uint32 arrays."""
    regs: dict[str, np.ndarray] = {f"${n_out + i}": v.astype(np.uint32) for i, v in enumerate(ins)}

    def val(tok: str) -> np.ndarray:
        return regs[tok] if tok in regs else np.uint32(int(tok, 0))

    def bf16x2_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.zeros_like(a)
        for sh in (0, 16):  # exact products (bf16 x bf16 fits float32), rounded to nearest even
            fa = (((a >> sh) & 0xFFFF) << 16).view(np.float32).astype(np.float64)
            fb = (((b >> sh) & 0xFFFF) << 16).view(np.float32).astype(np.float64)
            bits = (fa * fb).astype(np.float32).view(np.uint32).astype(np.uint64)
            out |= (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) & 0xFFFF) << sh
        return out

    for stmt in text.split(";"):
        stmt = stmt.strip().strip("{}").strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, args = stmt.split(None, 1)
        a = [x.strip() for x in args.split(",")]
        with np.errstate(over="ignore"):
            if op == "mov.b32":
                r = val(a[1]).copy()
            elif op == "shl.b32":
                r = val(a[1]) << np.uint32(int(a[2]))
            elif op == "shf.l.wrap.b32":  # the top 32 bits of {hi:lo} << n
                n = np.uint32(int(a[3]) % 32)
                r = (val(a[2]) << n) | (val(a[1]) >> (np.uint32(32) - n)) if n else val(a[2])
            elif op == "and.b32":
                r = val(a[1]) & val(a[2])
            elif op == "or.b32":
                r = val(a[1]) | val(a[2])
            elif op == "mul.rn.bf16x2":
                r = bf16x2_mul(val(a[1]), val(a[2]))
            else:
                raise AssertionError(f"unexpected PTX {op}")
        regs[a[0]] = np.asarray(r, dtype=np.uint32)
    return [regs[f"${i}"] for i in range(n_out)]
