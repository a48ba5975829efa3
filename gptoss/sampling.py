"""How the engine decodes one request (SamplingParams) and where gpt-oss stops (STOP_TOKEN_IDS)."""

from __future__ import annotations

from dataclasses import dataclass

# <|return|>, <|call|>, <|endoftext|>: where gpt-oss stops generating.
STOP_TOKEN_IDS: tuple[int, ...] = (200002, 200012, 199999)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    ignore_eos: bool = False  # True: run to max_new_tokens, whatever the stop ids
    seed: int | None = None  # None: derived from the engine's seed and the request's number
    stop_token_ids: tuple[int, ...] = STOP_TOKEN_IDS

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
