"""GPU timings of our MXFP4 MoE (gptoss.kernels.moe) next to vLLM's triton_kernels path, 20b shapes.

    python bench/kernels/moe_gpu.py            (CUDA only; E 32, H = I = 2880, top-4, bf16)

Each row: kernel "moe", case "M=<tokens>", ours_us, vllm_us (vLLM 0.26's monolithic Triton MXFP4
expert as OAITritonMxfp4ExpertsMonolithic calls it: triton_kernel_moe_forward, i.e. triton_kernels
routing + matmul_ogs for w13 with the fused SwiGLU (alpha 1.702, limit 7) + matmul_ogs for w2 with
scatter and gammas; weights converted by vLLM's own TRITON-backend loader
(convert_gpt_oss_weight_to_mxfp4_moe_kernel_format: float32 biases, _swizzle_mxfp4 into the Hopper
MX layouts, which also pins split_k = 1) and its make_mxfp4_moe_quant_config; None when vLLM is
missing or fails, with the reason printed), ratio =
ours_us / vllm_us (< 1: ours is faster) and hbm_frac (M <= 16: the expert weight and scale bytes
of the distinct experts the batch hits / ours_us / 3.0e12). Both timings include the router GEMM.
Times are triton.testing.do_bench medians (it flushes L2 between runs), in microseconds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gptoss.kernels.moe import moe_forward, prepare_moe_weights, route  # noqa: E402

E, H, I, TOP_K = 32, 2880, 2880, 4
ALPHA, LIMIT = 1.702, 7.0
MS = (1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384)
CHECK_M = 64
PEAK_BYTES_PER_S = 3.0e12  # H100 SXM HBM3, achievable copy bandwidth
EXPERT_BYTES = 2 * I * H // 2 + 2 * I * H // 32 + H * I // 2 + H * I // 32  # packed w13 + w2 and scales


def _us(fn: Callable[[], object]) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def _checkpoint() -> dict[str, torch.Tensor]:
    """Random layer in the checkpoint layout: uniform e2m1 bytes, scale bytes 118..122."""
    g = torch.Generator("cuda").manual_seed(0)

    def u8(*shape: int, lo: int = 0, hi: int = 256) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g, device="cuda", dtype=torch.uint8)

    def bf16(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device="cuda") * std).bfloat16()

    return {"router_w": bf16(E, H, std=H ** -0.5), "router_b": bf16(E, std=0.5),
            "gate_up_blocks": u8(E, 2 * I, H // 32, 16),
            "gate_up_scales": u8(E, 2 * I, H // 32, lo=118, hi=123),
            "gate_up_bias": bf16(E, 2 * I, std=0.02),
            "down_blocks": u8(E, H, I // 32, 16), "down_scales": u8(E, H, I // 32, lo=118, hi=123),
            "down_bias": bf16(E, H, std=0.02)}


def _ours(ck: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    w = prepare_moe_weights(ck["gate_up_blocks"], ck["gate_up_scales"], ck["gate_up_bias"],
                            ck["down_blocks"], ck["down_scales"], ck["down_bias"])
    return lambda x: moe_forward(x, ck["router_w"], ck["router_b"], TOP_K, w, ALPHA, LIMIT)


def _vllm(ck: dict[str, torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """vLLM's path, prepared as its Mxfp4 TRITON backend does; None (reason printed) if unavailable."""
    try:
        from vllm.utils.import_utils import has_triton_kernels

        if not has_triton_kernels():  # also aliases vllm.third_party.triton_kernels as triton_kernels
            raise ImportError("vllm reports no triton_kernels")
        from vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe import (
            triton_kernel_moe_forward,
        )
        from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
            Mxfp4MoeBackend,
            convert_gpt_oss_weight_to_mxfp4_moe_kernel_format,
            make_mxfp4_moe_quant_config,
        )

        # vLLM's parameters: w13 [E, 2I, H/2] (gate/up interleaved), w2 [E, H, I/2], scales as loaded.
        params = {"w13_weight": ck["gate_up_blocks"].reshape(E, 2 * I, H // 2),
                  "w2_weight": ck["down_blocks"].reshape(E, H, I // 2),
                  "w13_weight_scale": ck["gate_up_scales"], "w2_weight_scale": ck["down_scales"]}
        layer = torch.nn.Module()  # the conversion deletes the raw parameters from the layer
        for name, t in params.items():
            setattr(layer, name, torch.nn.Parameter(t.clone(), requires_grad=False))
        backend = Mxfp4MoeBackend.TRITON
        w13, w2, w13_pc, w2_pc, b13, b2 = convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(
            backend, layer, *(params[n] for n in ("w13_weight", "w2_weight", "w13_weight_scale",
                                                 "w2_weight_scale")),
            w13_bias=ck["gate_up_bias"], w2_bias=ck["down_bias"])
        quant = make_mxfp4_moe_quant_config(backend, w1_scale=w13_pc, w2_scale=w2_pc, gemm1_alpha=ALPHA,
                                            gemm1_beta=1.0, swiglu_limit=LIMIT, w1_bias=b13, w2_bias=b2)
    except Exception as e:  # noqa: BLE001 - the peer is optional: report why, ours still runs
        print(f"vLLM peer unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return None

    def forward(x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, ck["router_w"], ck["router_b"])  # [T, E], as gpt-oss's router
        return triton_kernel_moe_forward(x, w13, w2, logits, topk=TOP_K, renormalize=True,
                                         quant_config=quant, global_num_experts=E)

    return forward


def _peer_us(fn: Callable[[torch.Tensor], torch.Tensor] | None, x: torch.Tensor, m: int) -> float | None:
    if fn is None:
        return None
    try:
        return _us(lambda: fn(x))
    except Exception as e:  # noqa: BLE001
        print(f"M={m}: vLLM failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def _check(ours: Callable, peer: Callable | None, ck: dict[str, torch.Tensor]) -> None:
    if peer is None:
        return
    x = torch.randn(CHECK_M, H, device="cuda").bfloat16()
    try:
        a, b = ours(x).float(), peer(x).float()
    except Exception as e:  # noqa: BLE001
        print(f"check M={CHECK_M}: vLLM failed: {type(e).__name__}: {e}")
        return
    print(f"check M={CHECK_M}: ours vs vLLM rel error {float((a - b).norm() / b.norm()):.2e} "
          f"(bf16 roundings differ; ~1e-2 or below is agreement)")


def run(rows: list) -> None:
    """Append one dict per M to rows (see the module docstring for the keys)."""
    if not torch.cuda.is_available():
        raise RuntimeError("bench/kernels/moe_gpu.py needs a CUDA GPU")
    torch.manual_seed(0)
    ck = _checkpoint()
    ours, peer = _ours(ck), _vllm(ck)
    _check(ours, peer, ck)
    for m in MS:
        x = torch.randn(m, H, device="cuda").bfloat16()
        t_ours, t_peer = _us(lambda: ours(x)), _peer_us(peer, x, m)
        frac = None
        if m <= 16:
            hit = route(F.linear(x, ck["router_w"], ck["router_b"]), TOP_K)[0].unique().numel()
            frac = round(hit * EXPERT_BYTES / (t_ours * 1e-6) / PEAK_BYTES_PER_S, 3)
        rows.append({"kernel": "moe", "case": f"M={m}", "ours_us": round(t_ours, 2),
                     "vllm_us": None if t_peer is None else round(t_peer, 2),
                     "ratio": None if not t_peer else round(t_ours / t_peer, 3), "hbm_frac": frac})


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("moe_gpu.py needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    rows: list[dict] = []
    run(rows)
    cols = ["kernel", "case", "ours_us", "vllm_us", "ratio", "hbm_frac"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths)))


if __name__ == "__main__":
    main()
