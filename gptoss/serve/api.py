"""Request checks both APIs of gptoss.serve share (api_sglang: /generate, api_openai: /v1/completions).

Pure functions, no I/O: the handlers (gptoss/serve/app.py) feed them parsed JSON and write what
they return. A request the engine cannot honour exactly is refused with 400, never half-served: an
unknown sampling parameter, or a known one set to a value the engine does not implement.
"""

from __future__ import annotations

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


def as_int(v: Any, name: str, lo: int | None = None) -> int:
    if type(v) is not int:
        raise ApiError(400, f"{name} must be an integer, got {v!r}")
    if lo is not None and v < lo:
        raise ApiError(400, f"{name} must be >= {lo}, got {v}")
    return v


def as_num(v: Any, name: str) -> float:
    if type(v) not in (int, float):
        raise ApiError(400, f"{name} must be a number, got {v!r}")
    return float(v)


def as_bool(v: Any, name: str) -> bool:
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


def check_neutral(d: dict, keys: dict[str, Any], where: str) -> None:
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


def check_length(prompt: list[int], max_new: int, lim: Limits) -> None:
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


def sampling_params(
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
