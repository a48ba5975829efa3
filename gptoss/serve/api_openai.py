"""OpenAI's /v1/completions for gptoss.serve: the request's checks and the completion objects.

Pure functions, no I/O (gptoss/serve/app.py does the HTTP); shared checks in gptoss/serve/api.py.
"""

from __future__ import annotations

import uuid
from typing import Any

from gptoss.serve.api import (
    ApiError,
    Limits,
    Request,
    as_bool,
    as_int,
    as_num,
    check_length,
    check_neutral,
    sampling_params,
    token_ids,
)

_CMPL_KEYS = {
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stream",
    "stream_options",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "return_token_ids",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "user",
    "add_special_tokens",
    "request_id",
    "echo",
    "logprobs",
    "suffix",
    "best_of",
    "min_p",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "truncate_prompt_tokens",
}
_CMPL_NEUTRAL = {
    "n": 1,
    "echo": False,
    "logprobs": None,
    "suffix": None,
    "best_of": 1,
    "min_p": 0.0,
    "min_tokens": 0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "truncate_prompt_tokens": None,
}


def parse_completion(body: Any, lim: Limits, model: str, encode) -> Request:
    """encode(text) -> ids tokenizes a text prompt (the offline o200k_harmony tokenizer)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - _CMPL_KEYS)
    if unknown:
        raise ApiError(400, f"unknown request field(s): {', '.join(unknown)}")
    check_neutral(body, _CMPL_NEUTRAL, "parameter")
    # As vLLM: a request names the base model or a LoRA adapter (--lora NAME=PATH) as its model.
    if body.get("model") not in (None, model, *lim.adapters):
        served = ", ".join(f"`{m}`" for m in (model, *lim.adapters))
        raise ApiError(
            404, f"The model `{body['model']}` does not exist; this server serves {served}", "NotFoundError"
        )
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        prompt = encode(prompt)
    elif isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        raise ApiError(400, "batched prompts are not supported: send one request per prompt")
    prompt = token_ids(prompt, "prompt", lim.vocab_size)
    max_new = as_int(body.get("max_tokens", 16), "max_tokens", 1)
    top_k = as_int(body.get("top_k", 0) if body.get("top_k") is not None else 0, "top_k")
    if top_k < -1:
        raise ApiError(400, f"top_k must be 0 or -1 (disable), or at least 1, got {top_k}")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "stop must be a string or a list of non-empty strings")
    opts = body.get("stream_options") or {}
    stream = as_bool(body.get("stream", False), "stream")
    if opts and not stream:
        raise ApiError(400, "stream_options can only be set when stream is true")
    seed = body.get("seed")
    stop_ids = body.get("stop_token_ids")
    check_length(prompt, max_new, lim)
    temp = body.get("temperature")
    top_p = body.get("top_p")
    return Request(
        prompt=prompt,
        params=sampling_params(
            max_new,
            1.0 if temp is None else as_num(temp, "temperature"),
            1.0 if top_p is None else as_num(top_p, "top_p"),
            max(top_k, 0),
            as_bool(body.get("ignore_eos", False), "ignore_eos"),
            None if stop_ids is None else token_ids(stop_ids, "stop_token_ids", 1 << 31),
            None if seed is None else as_int(seed, "seed"),
        ),
        stream=stream,
        rid=f"cmpl-{uuid.uuid4().hex}",
        api="completions",
        lora=body["model"] if body.get("model") in lim.adapters else None,
        stream_interval=1,
        stop=stop,
        include_usage=as_bool(opts.get("include_usage", False), "stream_options.include_usage"),
        return_token_ids=as_bool(body.get("return_token_ids") or False, "return_token_ids"),
        skip_special_tokens=as_bool(body.get("skip_special_tokens", True), "skip_special_tokens"),
        include_stop_str=as_bool(body.get("include_stop_str_in_output", False), "include_stop_str_in_output"),
    )


def completion_choice(
    req: Request, text: str, ids: list[int], reason: str | None, stop_reason: Any, first: bool
) -> dict[str, Any]:
    c: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": reason,
        "stop_reason": stop_reason,
    }
    if req.return_token_ids:
        c["token_ids"] = ids
        if first:
            c["prompt_token_ids"] = req.prompt
    return c


def completion(
    req: Request, model: str, created: int, choices: list[dict], usage: int | None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": req.rid,
        "object": "text_completion",
        "created": created,
        "model": req.lora or model,  # the adapter's name when the request named one
        "choices": choices,
    }
    if usage is not None:
        p = len(req.prompt)
        out["usage"] = {"prompt_tokens": p, "completion_tokens": usage, "total_tokens": p + usage}
    return out
