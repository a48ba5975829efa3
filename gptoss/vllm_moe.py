"""Our MXFP4 MoE as vLLM's quantization method for gpt-oss's experts; gptoss.vllm_plugin registers it.

Through vLLM's own extension points only (vLLM 0.26.0 and 0.32.0, gptoss.vllm_plugin.TESTED_VLLM):
- GptossMxfp4Config replaces vLLM's "gpt_oss_mxfp4" config (register_quantization_config, which
  overrides a registered name). vLLM's checkpoint detection maps gpt-oss's "mxfp4" to that name,
  so every gpt-oss MXFP4 checkpoint gets it. It also accepts float32 activations (vLLM's: bf16).
- It gives each RoutedExperts layer a GptossMoEMethod (a FusedMoEMethodBase): the parameters vLLM's
  own method has, under the same names and shapes, so vLLM's gpt-oss loader fills them unchanged;
  then one monolithic step from the router's logits, our routing included (gptoss.vllm_experts).
- On CUDA our kernels run on one v3 copy of the experts (moe_layout.vllm_layouts).
- With GPTOSS_VLLM_MOE_MAX_TOKENS (CUDA only) it also builds vLLM's own method on the same layer and
  hands it the steps of more tokens (vLLM's Triton MXFP4 MoE; both layouts stay loaded).
"""

from __future__ import annotations

import torch
from vllm.config import get_current_vllm_config
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe import FusedMoEConfig, FusedMoEMethodBase, RoutedExperts
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config, GptOssMxfp4MoEMethod
from vllm.model_executor.utils import set_weight_attrs
from vllm.platforms import current_platform

from gptoss import mxfp4, vllm_env
from gptoss.vllm_experts import GptossExperts

logger = init_logger(__name__)

SWIGLU_ALPHA = 1.702  # gpt-oss's; its config.json has no such key (vLLM hard-codes it too)
SWIGLU_LIMIT = 7.0  # the default when config.json has no swiglu_limit
PEER_BACKEND = "TRITON"  # the vLLM backend the fallback was measured against (monolithic, unpadded)

_built: dict[str, object] = {}  # what this process built, for the report


def register_config() -> None:
    register_quantization_config(GptOssMxfp4Config.get_name())(GptossMxfp4Config)


class GptossMxfp4Config(GptOssMxfp4Config):
    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float32]  # our kernels' dtypes (float32: exact greedy tests)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, RoutedExperts):
            return GptossMoEMethod(layer.moe_config)
        return super().get_quant_method(layer, prefix)  # linear, attention: as vLLM's


class GptossMoEMethod(FusedMoEMethodBase):
    def __init__(self, moe: FusedMoEConfig) -> None:
        super().__init__(moe)
        self.weight_dtype = "gpt_oss_mxfp4"  # vLLM's gpt-oss loader takes its MXFP4 path on this
        if moe.moe_parallel_config.use_ep:
            raise vllm_env.VllmPluginError(
                "the gptoss MoE plugin does not shard experts (expert parallel): use vLLM's own MoE"
            )
        hf = get_current_vllm_config().model_config.hf_config
        self.limit = float(getattr(hf, "swiglu_limit", None) or SWIGLU_LIMIT)
        self.path = "triton" if current_platform.is_cuda() else "torch"
        self.max_tokens = vllm_env.max_tokens()
        self.peer: GptOssMxfp4MoEMethod | None = None
        if self.max_tokens is not None:
            if self.path != "triton":
                raise vllm_env.VllmPluginError(
                    f"{vllm_env.MAX_TOKENS_ENV} hands large batches to vLLM's own MXFP4 MoE, "
                    "which this machine has only on CUDA: unset it"
                )
            self.peer = GptOssMxfp4MoEMethod(moe)
            backend = getattr(self.peer.mxfp4_backend, "name", str(self.peer.mxfp4_backend))
            if backend != PEER_BACKEND or not self.peer.is_monolithic:
                raise vllm_env.VllmPluginError(
                    f"{vllm_env.MAX_TOKENS_ENV}: vLLM chose its {backend} MXFP4 MoE here; the fallback "
                    f"is tested with {PEER_BACKEND} only (e.g. VLLM_MOE_BACKEND / moe_backend=triton)"
                )
        self.experts: GptossExperts | None = None

    @property
    def is_monolithic(self) -> bool:
        return True  # router logits in, output out: routing is ours

    def get_fused_moe_quant_config(self, layer: torch.nn.Module) -> None:
        return None  # no vLLM modular kernel runs our experts

    def maybe_roundup_sizes(self, hidden_size, intermediate_size, act_dtype, moe_parallel_config):
        source = self.peer if self.peer is not None else super()
        return source.maybe_roundup_sizes(hidden_size, intermediate_size, act_dtype, moe_parallel_config)

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ) -> None:
        self.dtype = params_dtype
        if self.peer is not None:  # the peer's own parameters: both methods read them at load
            sizes = (num_experts, hidden_size, intermediate_size_per_partition)
            self.peer.create_weights(layer, *sizes, params_dtype, **extra_weight_attrs)
            return
        e, h, i = num_experts, hidden_size, intermediate_size_per_partition
        if h % mxfp4.BLOCK or i % mxfp4.BLOCK:
            raise vllm_env.VllmPluginError(f"MXFP4 experts need H, I multiples of 32, got H={h}, I={i}")
        u8 = torch.uint8
        shapes = {
            "w13_weight": ((e, 2 * i, h // 2), u8),
            "w13_weight_scale": ((e, 2 * i, h // mxfp4.BLOCK), u8),
            "w2_weight": ((e, h, i // 2), u8),
            "w2_weight_scale": ((e, h, i // mxfp4.BLOCK), u8),
        }
        if self.moe.has_bias:
            shapes |= {"w13_bias": ((e, 2 * i), torch.float32), "w2_bias": ((e, h), torch.float32)}
        layer.params_dtype, layer.num_experts = params_dtype, num_experts
        for name, (shape, dtype) in shapes.items():
            param = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, param)
            set_weight_attrs(param, extra_weight_attrs)
            if name.endswith("_scale"):
                param.quant_method = "block"  # as vLLM's method marks its MXFP4 scales

    @staticmethod
    def _layouts(layer: torch.nn.Module) -> tuple[str, str | None]:
        """The experts' layouts on CUDA (moe_layout.vllm_layouts: one v3 copy unless
        GPTOSS_MOE_KERNELS says otherwise)."""
        from gptoss.kernels import moe_layout

        hf = get_current_vllm_config().model_config.hf_config
        packed = (layer.w13_weight, layer.w13_weight_scale, layer.w2_weight, layer.w2_weight_scale)
        per_layer = sum(p.data.numel() for p in packed)  # uint8: bytes
        total = torch.cuda.get_device_properties(layer.w13_weight.device).total_memory
        return moe_layout.vllm_layouts(per_layer * int(getattr(hf, "num_hidden_layers", 1)), total)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        activation = getattr(layer.activation, "value", layer.activation)
        if activation != "swigluoai" or layer.apply_router_weight_on_input:
            raise vllm_env.VllmPluginError(
                f"the gptoss MoE plugin runs gpt-oss's experts only (activation {activation!r})"
            )
        w13, w2 = layer.w13_weight.data, layer.w2_weight.data
        b13, b2 = getattr(layer, "w13_bias", None), getattr(layer, "w2_bias", None)
        kernels, large = None, None  # with a peer our kernels run only decode steps: v2's decode kernels
        if self.path == "triton" and self.peer is None:
            kernels, large = self._layouts(layer)
        self.experts = GptossExperts(
            w13,
            layer.w13_weight_scale.data,
            b13.data if b13 is not None else w13.new_zeros(w13.shape[:2], dtype=torch.float32),
            w2,
            layer.w2_weight_scale.data,
            b2.data if b2 is not None else w2.new_zeros(w2.shape[:2], dtype=torch.float32),
            top_k=self.moe.experts_per_token,
            alpha=SWIGLU_ALPHA,
            limit=self.limit,
            dtype=self.dtype,
            path=self.path,
            kernels=kernels,
            large=large,
        )
        if self.peer is not None:
            self.peer.process_weights_after_loading(layer)  # rewrites the parameters in its layout
        elif self.path == "triton":
            for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
                p = getattr(layer, name)  # our kernels hold their own copy: free vLLM's
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self._report(layer)

    def apply_monolithic(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        router_logits: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [T, H], router_logits [T, E] -> [T, H]."""
        if self.peer is not None and x.shape[0] > self.max_tokens:
            return self.peer.apply_monolithic(layer, x, router_logits)
        return self.experts(x, router_logits)

    def _report(self, layer: torch.nn.Module) -> None:
        import vllm

        first = not _built
        _built["layers"] = int(_built.get("layers", 0)) + 1
        _built.update(
            method=f"{type(self).__module__}.{type(self).__qualname__}",
            path=self.path,
            kernels=self.experts.kernels,
            large_copy=self.experts.large,
            fallback=None
            if self.peer is None
            else f"vLLM's {PEER_BACKEND} MXFP4 MoE above {self.max_tokens} tokens a step",
            dtype=str(self.dtype).removeprefix("torch."),
            device=str(layer.w13_weight.device),
            vllm_version=vllm.__version__,
        )
        if first:
            logger.info("gptoss MoE plugin: gpt-oss's experts run on our %s MXFP4 MoE", self.path)
        vllm_env.write_report(dict(_built))
