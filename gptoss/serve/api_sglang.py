"""SGLang's native /generate for gptoss.serve: the request's checks and the reply's meta_info.

Pure functions, no I/O (gptoss/serve/app.py does the HTTP); shared checks in gptoss/serve/api.py.
"""

from __future__ import annotations

import time
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

_GEN_KEYS = {
    "input_ids",
    "lora_path",
    "sampling_params",
    "stream",
    "rid",
    "log_metrics",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "text",
}
_SP_SUPPORTED = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "ignore_eos",
    "stop_token_ids",
    "sampling_seed",
    "stream_interval",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
}
_SP_NEUTRAL = {
    "min_p": 0.0,
    "min_new_tokens": 0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "n": 1,
    "stop": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
    "custom_params": None,
    "stop_regex": None,
}


def parse_generate(body: Any, lim: Limits) -> Request:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - _GEN_KEYS)
    if unknown:
        raise ApiError(400, f"unknown request field(s): {', '.join(unknown)}")
    if "text" in body:
        raise ApiError(400, "this server takes token ids: send input_ids instead of text")
    if body.get("return_logprob"):
        raise ApiError(400, "return_logprob is not supported by this server")
    if "input_ids" not in body:
        raise ApiError(400, "input_ids is required")
    if body["input_ids"] and isinstance(body["input_ids"][0], list):
        raise ApiError(
            400, "batched input_ids (a list of lists) are not supported: send one request per prompt"
        )
    prompt = token_ids(body["input_ids"], "input_ids", lim.vocab_size)
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ApiError(400, "sampling_params must be a JSON object")
    unknown = sorted(set(sp) - _SP_SUPPORTED - set(_SP_NEUTRAL))
    if unknown:
        raise ApiError(400, f"unknown sampling parameter(s): {', '.join(unknown)}")
    check_neutral(sp, _SP_NEUTRAL, "sampling parameter")
    max_new = as_int(sp.get("max_new_tokens", 128), "max_new_tokens", 1)
    top_k = as_int(sp.get("top_k", -1), "top_k")
    if top_k == 0 or top_k < -1:
        raise ApiError(400, f"top_k must be -1 (disable), or at least 1, got {top_k}")
    seed = sp.get("sampling_seed")
    stop_ids = sp.get("stop_token_ids")
    interval = sp.get("stream_interval")
    for key in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
        if key in sp:
            as_bool(sp[key], key)
    stream = as_bool(body.get("stream", False), "stream")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ApiError(400, "rid must be a string")
    lora = body.get("lora_path")  # SGLang's field: the name of a loaded adapter
    if lora is not None and lora not in lim.adapters:
        loaded = ", ".join(lim.adapters) or "none"
        raise ApiError(400, f"lora_path {lora!r} is not a loaded LoRA adapter (loaded: {loaded})")
    check_length(prompt, max_new, lim)
    return Request(
        prompt=prompt,
        params=sampling_params(
            max_new,
            as_num(sp.get("temperature", 1.0), "temperature"),
            as_num(sp.get("top_p", 1.0), "top_p"),
            max(top_k, 0),
            sp.get("ignore_eos", False),
            None if stop_ids is None else token_ids(stop_ids, "stop_token_ids", 1 << 31),
            None if seed is None else as_int(seed, "sampling_seed"),
        ),
        stream=stream,
        rid=rid or uuid.uuid4().hex,
        lora=lora,
        stream_interval=lim.stream_interval if interval is None else as_int(interval, "stream_interval", 1),
    )


def finish_reason(reason: str | None, stop_id: int | None, n: int, message: str = "") -> dict | None:
    """SGLang's finish_reason object for the engine's finish."""
    if reason is None:
        return None
    if reason == "stop":
        return {"type": "stop", "matched": stop_id}
    if reason == "length":
        return {"type": "length", "length": n}
    return {"type": "abort", "message": message or "aborted by the engine"}


def meta_info(req: Request, n: int, reason: dict | None, started: float) -> dict[str, Any]:
    meta = {
        "id": req.rid,
        "finish_reason": reason,
        "prompt_tokens": len(req.prompt),
        "completion_tokens": n,
        "cached_tokens": 0,
    }
    if reason is not None:
        meta["e2e_latency"] = time.monotonic() - started
    return meta
