"""python -m gptoss.serve with two LoRA adapters (--lora a=PATH --lora b=PATH): a request picks one by
its model name (/v1/completions, as vLLM) or lora_path (/generate, as SGLang) and gets transformers +
PEFT's greedy tokens for it; the base model stays served under its own name; unknown names are
refused. Tiny checkpoint, float32, a real server process."""

from __future__ import annotations

import concurrent.futures
import sys

import pytest
import requests

from tests.backends.httpkit import PROMPTS, start_process, stop_process
from tests.gptoss.lorakit import hf_greedy, hf_model

pytest.importorskip("peft")
pytestmark = pytest.mark.timeout(300)
MAX_NEW = 8


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tiny_loras):
    args = [sys.executable, "-m", "gptoss.serve", "--model-path", str(tiny_checkpoint), "--port", "0",
            "--dtype", "float32", "--served-model-name", "tiny",
            "--lora", f"a={tiny_loras[0]}", "--lora", f"b={tiny_loras[1]}"]  # fmt: skip
    proc, line = start_process(args, "gptoss.serve: listening on ", timeout=240)
    yield line.split()[0]
    stop_process(proc)


@pytest.fixture(scope="module")
def want(tiny_checkpoint, tiny_loras) -> dict[str, list[list[int]]]:
    """PEFT's greedy tokens for each adapter, and transformers' alone for the base model."""
    out = {
        name: hf_greedy(hf_model(tiny_checkpoint, path), PROMPTS, MAX_NEW)
        for name, path in zip("ab", tiny_loras, strict=True)
    }
    return out | {"tiny": hf_greedy(hf_model(tiny_checkpoint), PROMPTS, MAX_NEW)}


def completion(url: str, model: str, prompt: list[int]) -> requests.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_NEW, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    return requests.post(f"{url}/v1/completions", json=body, timeout=120)


def generate(url: str, lora: str | None, prompt: list[int]) -> requests.Response:
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True},
    }
    return requests.post(f"{url}/generate", json=body | ({"lora_path": lora} if lora else {}), timeout=120)


def test_each_model_name_gets_its_adapters_tokens(server, want):
    for model in ("a", "b", "tiny"):
        for prompt, tokens in zip(PROMPTS, want[model], strict=True):
            r = completion(server, model, prompt)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model and r.json()["choices"][0]["token_ids"] == tokens
    assert want["a"] != want["tiny"] and want["b"] != want["tiny"] and want["a"] != want["b"]


def test_generate_picks_the_adapter_by_lora_path(server, want):
    for lora in ("a", "b", None):
        got = [generate(server, lora, p).json()["output_ids"] for p in PROMPTS]
        assert got == want[lora or "tiny"]


def test_concurrent_requests_naming_different_adapters(server, want):
    jobs = [(m, i) for m in ("a", "b", "tiny") for i in range(len(PROMPTS))]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        replies = list(pool.map(lambda j: completion(server, j[0], PROMPTS[j[1]]), jobs))
    assert [r.json()["choices"][0]["token_ids"] for r in replies] == [want[m][i] for m, i in jobs]


def test_models_lists_the_adapters_and_unknown_names_are_refused(server, tiny_loras):
    data = requests.get(f"{server}/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["parent"]) for m in data] == [("tiny", None), ("a", "tiny"), ("b", "tiny")]
    assert data[1]["root"] == str(tiny_loras[0])
    r = completion(server, "c", [1, 2, 3])
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "The model `c` does not exist; this server serves `tiny`, `a`, `b`"
    r = generate(server, "c", [1, 2, 3])
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "lora_path 'c' is not a loaded LoRA adapter (loaded: a, b)"
