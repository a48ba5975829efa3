"""Request validation and reply shapes of gptoss.serve: SGLang's /generate and OpenAI's /v1/completions.

Pure functions, no I/O: the handlers (gptoss/serve/app.py) feed them parsed JSON and write what
they return. A request the engine cannot honour exactly is refused with 400, never half-served: an
unknown sampling parameter, or a known one set to a value the engine does not implement.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from gptoss.sampling import STOP_TOKEN_IDS, SamplingParams


class ApiError(Exception):
    """Answered as {"error": {"message", "type", "code"}} with HTTP status `status`."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.type = type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": None, "code": self.status}}


@dataclass(frozen=True, slots=True)
class Limits:
    vocab_size: int
    max_model_len: int
    stream_interval: int = 1  # the server's default, as SGLang's --stream-interval
    adapters: tuple[str, ...] = ()  # the --lora adapter names a request may pick


@dataclass(frozen=True, slots=True)
class Request:
    """One validated generation request, whichever API it came through."""

    prompt: list[int]
    params: SamplingParams
    stream: bool
    rid: str
    api: str = "generate"  # "generate" | "completions"
    stream_interval: int = 1
    lora: str | None = None  # the LoRA adapter to run through (None: the base model)
    # OpenAI extras
    stop: tuple[str, ...] = ()
    include_usage: bool = False
    return_token_ids: bool = False
    skip_special_tokens: bool = True
    include_stop_str: bool = False


def _int(v: Any, name: str, lo: int | None = None) -> int:
    if type(v) is not int:
        raise ApiError(400, f"{name} must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ApiError(400, f"{name} must be >= {lo}, got {v}")
    return v


def _num(v: Any, name: str) -> float:
    if type(v) not in (int, float):
        raise ApiError(400, f"{name} must be a number, got {v!r}")
    return float(v)


def _bool(v: Any, name: str) -> bool:
    if type(v) is not bool:
        raise ApiError(400, f"{name} must be true or false, got {v!r}")
    return v


def token_ids(v: Any, name: str, vocab: int) -> list[int]:
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        raise ApiError(400, f"{name} must be a list of token ids (integers)")
    bad = next((x for x in v if not 0 <= x < vocab), None)
    if bad is not None:
        raise ApiError(400, f"{name} holds token id {bad}, outside the vocabulary [0, {vocab})")
    return v


def _neutral(d: dict, keys: dict[str, Any], where: str) -> None:
    """Known parameters the engine does not implement are accepted only at their no-op value."""
    for key, neutral in keys.items():
        if (
            key in d
            and d[key] is not None
            and d[key] != neutral
            and not (neutral is None and d[key] in ([], {}, ""))
        ):
            raise ApiError(
                400,
                f"{where} '{key}'={d[key]!r} is not supported by this server "
                f"(only {neutral!r}); it would change the output",
            )


def _check_length(prompt: list[int], max_new: int, lim: Limits) -> None:
    if not prompt:
        raise ApiError(400, "the prompt is empty: send at least one token id")
    total = len(prompt) + max_new
    if total > lim.max_model_len:
        raise ApiError(
            400,
            f"Requested token count exceeds the model's maximum context length of "
            f"{lim.max_model_len} tokens: {len(prompt)} prompt tokens + {max_new} new tokens = "
            f"{total}. Shorten the prompt or lower the maximum number of new tokens.",
        )


def _params(
    max_new: int,
    temperature: float,
    top_p: float,
    top_k: int,
    ignore_eos: bool,
    stop_ids: list[int] | None,
    seed: int | None,
) -> SamplingParams:
    # As SGLang and vLLM: stop_token_ids add to the model's stop tokens; ignore_eos drops the latter.
    stop = list(dict.fromkeys(([] if ignore_eos else list(STOP_TOKEN_IDS)) + (stop_ids or [])))
    try:
        return SamplingParams(
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            ignore_eos=not stop,
            seed=seed,
            stop_token_ids=tuple(stop),
        )
    except ValueError as e:
        raise ApiError(400, str(e)) from None


# ----------------------------------------------------------------------------- SGLang /generate

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
    _neutral(sp, _SP_NEUTRAL, "sampling parameter")
    max_new = _int(sp.get("max_new_tokens", 128), "max_new_tokens", 1)
    top_k = _int(sp.get("top_k", -1), "top_k")
    if top_k == 0 or top_k < -1:
        raise ApiError(400, f"top_k must be -1 (disable), or at least 1, got {top_k}")
    seed = sp.get("sampling_seed")
    stop_ids = sp.get("stop_token_ids")
    interval = sp.get("stream_interval")
    for key in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
        if key in sp:
            _bool(sp[key], key)
    stream = _bool(body.get("stream", False), "stream")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ApiError(400, "rid must be a string")
    lora = body.get("lora_path")  # SGLang's field: the name of a loaded adapter
    if lora is not None and lora not in lim.adapters:
        loaded = ", ".join(lim.adapters) or "none"
        raise ApiError(400, f"lora_path {lora!r} is not a loaded LoRA adapter (loaded: {loaded})")
    _check_length(prompt, max_new, lim)
    return Request(
        prompt=prompt,
        params=_params(
            max_new,
            _num(sp.get("temperature", 1.0), "temperature"),
            _num(sp.get("top_p", 1.0), "top_p"),
            max(top_k, 0),
            sp.get("ignore_eos", False),
            None if stop_ids is None else token_ids(stop_ids, "stop_token_ids", 1 << 31),
            None if seed is None else _int(seed, "sampling_seed"),
        ),
        stream=stream,
        rid=rid or uuid.uuid4().hex,
        lora=lora,
        stream_interval=lim.stream_interval if interval is None else _int(interval, "stream_interval", 1),
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


# ----------------------------------------------------------------------------- OpenAI /v1/completions

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
    _neutral(body, _CMPL_NEUTRAL, "parameter")
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
    max_new = _int(body.get("max_tokens", 16), "max_tokens", 1)
    top_k = _int(body.get("top_k", 0) if body.get("top_k") is not None else 0, "top_k")
    if top_k < -1:
        raise ApiError(400, f"top_k must be 0 or -1 (disable), or at least 1, got {top_k}")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "stop must be a string or a list of non-empty strings")
    opts = body.get("stream_options") or {}
    stream = _bool(body.get("stream", False), "stream")
    if opts and not stream:
        raise ApiError(400, "stream_options can only be set when stream is true")
    seed = body.get("seed")
    stop_ids = body.get("stop_token_ids")
    _check_length(prompt, max_new, lim)
    temp = body.get("temperature")
    top_p = body.get("top_p")
    return Request(
        prompt=prompt,
        params=_params(
            max_new,
            1.0 if temp is None else _num(temp, "temperature"),
            1.0 if top_p is None else _num(top_p, "top_p"),
            max(top_k, 0),
            _bool(body.get("ignore_eos", False), "ignore_eos"),
            None if stop_ids is None else token_ids(stop_ids, "stop_token_ids", 1 << 31),
            None if seed is None else _int(seed, "seed"),
        ),
        stream=stream,
        rid=f"cmpl-{uuid.uuid4().hex}",
        api="completions",
        lora=body["model"] if body.get("model") in lim.adapters else None,
        stream_interval=1,
        stop=stop,
        include_usage=_bool(opts.get("include_usage", False), "stream_options.include_usage"),
        return_token_ids=_bool(body.get("return_token_ids") or False, "return_token_ids"),
        skip_special_tokens=_bool(body.get("skip_special_tokens", True), "skip_special_tokens"),
        include_stop_str=_bool(body.get("include_stop_str_in_output", False), "include_stop_str_in_output"),
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
