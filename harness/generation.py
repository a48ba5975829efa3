"""The generation-config JSON (MLPerf sampling settings) -> SamplingParams."""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness.config import MAX_NEW_TOKENS_ACCURACY, MAX_NEW_TOKENS_PERFORMANCE, SamplingParams

DEFAULT_GENERATION_CONFIG = Path(__file__).with_name("generation_config.json")

# "max_new_tokens" is what the MLCommons reference's generation_config.json uses: it applies to
# both modes, so a reference command line keeps its meaning here.
_KEYS = {
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_new_tokens",
    "max_new_tokens_performance",
    "max_new_tokens_accuracy",
}


class GenerationConfigError(ValueError):
    pass


def load_sampling(path: Path | None, *, accuracy: bool, max_new_tokens: int | None = None) -> SamplingParams:
    """SamplingParams from the JSON at `path` (default: harness/generation_config.json).

    Precedence for max_new_tokens: the --max-new-tokens flag, then the file's "max_new_tokens",
    then its per-mode key, then the MLPerf default (10240 performance / 32768 accuracy).
    """
    path = path or DEFAULT_GENERATION_CONFIG
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise GenerationConfigError(f"generation config {path} does not exist") from None
    except (OSError, json.JSONDecodeError) as e:
        raise GenerationConfigError(f"cannot read generation config {path}: {e}") from None
    if not isinstance(raw, dict):
        raise GenerationConfigError(
            f"generation config {path} must hold a JSON object, not {type(raw).__name__}"
        )
    values = {k: v for k, v in raw.items() if not k.startswith("_")}
    unknown = sorted(set(values) - _KEYS)
    if unknown:
        raise GenerationConfigError(
            f"generation config {path}: unknown key(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(_KEYS))}"
        )
    for key, value in values.items():
        if key == "seed" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise GenerationConfigError(f"generation config {path}: '{key}' must be a number, got {value!r}")
    for key in ("max_new_tokens", "max_new_tokens_performance", "max_new_tokens_accuracy", "top_k", "seed"):
        if values.get(key) is not None and values[key] != int(values[key]):
            raise GenerationConfigError(
                f"generation config {path}: '{key}' must be an integer, got {values[key]!r}"
            )
    mode_key = "max_new_tokens_accuracy" if accuracy else "max_new_tokens_performance"
    mode_default = MAX_NEW_TOKENS_ACCURACY if accuracy else MAX_NEW_TOKENS_PERFORMANCE
    if max_new_tokens is None:
        max_new_tokens = values.get("max_new_tokens", values.get(mode_key, mode_default))
    top_k = values.get("top_k", 0)
    try:
        return SamplingParams(
            max_new_tokens=int(max_new_tokens),
            temperature=float(values.get("temperature", 1.0)),
            top_p=float(values.get("top_p", 1.0)),
            top_k=0 if top_k == -1 else int(top_k),  # -1 is the reference's "disabled"
            seed=None if values.get("seed") is None else int(values["seed"]),
        )
    except ValueError as e:
        raise GenerationConfigError(f"generation config {path}: {e}") from None
