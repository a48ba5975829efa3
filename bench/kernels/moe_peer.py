"""vLLM 0.26's MXFP4 MoE as bench/kernels/moe_gpu.py's peer (triton_kernels routing + matmul_ogs, the
weights converted by its own TRITON-backend loader), and the check of ours against it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from timing import peer_failed

ALPHA, LIMIT, H, I, TOP_K = 1.702, 7.0, 2880, 2880, 4
CHECK_MS = (8, 64, 2048)  # the decode path (M 8), v2 (M 64) and, with a v3 copy, v3 (M 2048)


def vllm_moe(ck: dict[str, torch.Tensor], e: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """vLLM's path for e experts, prepared as its Mxfp4 TRITON backend does; None (reason printed) if
    unavailable."""
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
        params = {
            "w13_weight": ck["gate_up_blocks"].reshape(e, 2 * I, H // 2),
            "w2_weight": ck["down_blocks"].reshape(e, H, I // 2),
            "w13_weight_scale": ck["gate_up_scales"],
            "w2_weight_scale": ck["down_scales"],
        }
        layer = torch.nn.Module()  # the conversion deletes the raw parameters from the layer
        for name, t in params.items():
            setattr(layer, name, torch.nn.Parameter(t.clone(), requires_grad=False))
        backend = Mxfp4MoeBackend.TRITON
        w13, w2, w13_pc, w2_pc, b13, b2 = convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(
            backend,
            layer,
            *(params[n] for n in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale")),
            w13_bias=ck["gate_up_bias"],
            w2_bias=ck["down_bias"],
        )
        quant = make_mxfp4_moe_quant_config(
            backend,
            w1_scale=w13_pc,
            w2_scale=w2_pc,
            gemm1_alpha=ALPHA,
            gemm1_beta=1.0,
            swiglu_limit=LIMIT,
            w1_bias=b13,
            w2_bias=b2,
        )
    except Exception as e:  # noqa: BLE001 - the peer is optional: counted with why, ours still runs
        peer_failed("vLLM MoE peer unavailable", e)
        return None

    def forward(x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, ck["router_w"], ck["router_b"])  # [T, E], as gpt-oss's router
        return triton_kernel_moe_forward(
            x, w13, w2, logits, topk=TOP_K, renormalize=True, quant_config=quant, global_num_experts=e
        )

    return forward


def check(ours: Callable, peer: Callable | None) -> None:
    """Ours against vLLM at CHECK_MS: the decode path (M 8), v2 (M 64) and, with a v3 copy, v3 (M 2048)."""
    if peer is None:
        return
    for m in CHECK_MS:
        x = torch.randn(m, H, device="cuda").bfloat16()
        a = ours(x).float()  # a failure of ours is the bench's failure: it raises
        try:
            b = peer(x).float()
        except Exception as e:  # noqa: BLE001 - vLLM's own error, of any type: counted, its check skipped
            peer_failed(f"check M={m} vLLM", e)
            return
        print(
            f"check M={m}: ours vs vLLM rel error {float((a - b).norm() / b.norm()):.2e} "
            f"(bf16 roundings differ; ~1e-2 or below is agreement)"
        )
