"""What of ours runs inside vLLM's worker: a worker extension, and the process that asks it.

    python -m tests.backends.vllm.plugin_probe CKPT vllm|gptoss   # prints one JSON line

GptossProbe is mixed into vLLM's worker class (--vllm-arg worker_extension_cls=...) and answers
collective_rpc("gptoss_probe") from inside the worker: the gptoss modules loaded there, the class
of every MoE layer's quantization method, and the config class registered for "gpt_oss_mxfp4".
This module imports nothing at its top, so the probe adds nothing of gptoss to the worker.
The main process builds the backend through create() from run_mlperf's flags, as a run does.
"""

from __future__ import annotations

PROBE = "tests.backends.vllm.plugin_probe.GptossProbe"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class GptossProbe:
    def gptoss_probe(self) -> dict:
        import sys

        from vllm.model_executor.layers.fused_moe import RoutedExperts
        from vllm.model_executor.layers.quantization import get_quantization_config

        model = self.model_runner.get_model()
        methods = [_qualname(type(m.quant_method)) for m in model.modules() if isinstance(m, RoutedExperts)]
        return {
            "modules": sorted(m for m in sys.modules if m == "gptoss" or m.startswith("gptoss.")),
            "moe_methods": sorted(set(methods)),
            "moe_layers": len(methods),
            "gpt_oss_mxfp4": _qualname(get_quantization_config("gpt_oss_mxfp4")),
        }


def main(argv: list[str]) -> None:
    import json
    from pathlib import Path

    from backends import vllm as vllm_backend
    from harness.config import SamplingParams
    from harness.loop import shared_loop
    from tests.backends.vllm.vllmkit import ENGINE_FLAGS, INLINE, generate, run_config

    ckpt, impl = argv
    flags = [*ENGINE_FLAGS, *INLINE, "--vllm-moe", impl, "--vllm-arg", f"worker_extension_cls={PROBE}"]
    loop = shared_loop()
    backend = vllm_backend.create(run_config(Path(ckpt), flags))
    loop.run(backend.__aenter__(), timeout=600)
    try:
        prompts = [[4, 8, 15, 16, 23, 42], list(range(100, 160))]
        greedy = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
        tokens = generate(loop, backend, prompts, greedy)
        probes = loop.run(backend._llm.collective_rpc("gptoss_probe"), timeout=120)
        print("PROBE " + json.dumps({"workers": probes, "tokens": tokens, "moe": backend.describe()["moe"]}))
    finally:
        loop.run(backend.__aexit__(None, None, None), timeout=120)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
