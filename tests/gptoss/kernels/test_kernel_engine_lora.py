"""The engine on the Triton kernels with LoRA adapters against the torch reference engine with the
same adapters (tiny checkpoint, float32): the same greedy tokens for a batch that mixes two
adapters and the base model, through chunked prefill, mixed steps and (on a GPU) CUDA graphs and
multi-step decode. On CPU the kernels run in Triton's interpreter."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from gptoss.sampling import SamplingParams  # noqa: E402
from tests.gptoss.kernels.test_kernel_engine import make_engine, prompts_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def test_triton_lora_greedy_equals_torch_reference(kernel_checkpoint, kernel_loras):
    specs = (f"a={kernel_loras[0]}", f"b={kernel_loras[1]}")
    triton_eng = make_engine(kernel_checkpoint, "triton", lora=specs)
    torch_eng = make_engine(kernel_checkpoint, "torch", lora=specs)
    assert triton_eng.runner.kernel_runner is not None
    prompts = prompts_of([3, 70, 20], seed=8)  # 70 > the 64-token budget: chunked prefill
    params = [SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True) for n in (5, 4, 5)]
    adapters = ["a", "b", None]
    got = triton_eng.generate(prompts, params, adapters)
    assert got == torch_eng.generate(prompts, params, adapters)
    base = torch_eng.generate(prompts, params)
    assert [g != b for g, b in zip(got, base, strict=True)] == [True, True, False]
