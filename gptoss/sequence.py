"""One request's tokens, progress and KV blocks, as the scheduler and the model runner see it."""

from __future__ import annotations

import random
from enum import Enum, auto

from gptoss.sampling import SamplingParams


class Status(Enum):
    WAITING = auto()  # queued, or preempted and waiting to be recomputed
    RUNNING = auto()  # holds KV blocks; prefilling in chunks or decoding
    FINISHED = auto()


class Sequence:
    """Prompt plus output ids; `num_computed` of them have their K/V in the cache.

    Each step schedules `num_tokens - num_computed` tokens (capped by the token budget): the
    whole prompt, a chunk of it, or the one token sampled last step. When a step brings
    `num_computed` up to `num_tokens`, the logits of its last token give the next token.
    """

    __slots__ = (
        "seq_id",
        "request_id",
        "params",
        "token_ids",
        "num_prompt_tokens",
        "max_tokens",
        "num_computed",
        "status",
        "finish_reason",
        "stop_token_id",
        "full_blocks",
        "ring_blocks",
        "rng",
        "num_preemptions",
        "stop_ids",
        "lora",
    )

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        max_model_len: int,
        engine_seed: int = 0,
        lora: int = 0,
    ) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        self.params = params
        self.token_ids = list(prompt)
        self.num_prompt_tokens = len(prompt)
        # The length at which the request ends with "length": its output budget or the model's limit.
        self.max_tokens = min(len(prompt) + params.max_new_tokens, max_model_len)
        self.num_computed = 0
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.stop_token_id: int | None = None
        self.full_blocks: list[int] = []  # block i holds positions [i*bs, (i+1)*bs)
        self.ring_blocks: list[int] = []  # sliding layers: position p lives in ring[(p // bs) % R]
        # A private stream per request, so its samples depend only on its seed and its logits,
        # not on which other requests share the batch. Without a seed it derives from the engine's.
        seed = params.seed if params.seed is not None else f"{engine_seed}:{seq_id}"
        self.rng = None if params.greedy else random.Random(seed)
        self.num_preemptions = 0
        self.stop_ids = frozenset() if params.ignore_eos else frozenset(params.stop_token_ids)
        self.lora = lora  # the LoRA adapter's index in the engine's LoraStack; 0: none

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.name}, len={len(self.token_ids)}, "
            f"computed={self.num_computed}, prompt={self.num_prompt_tokens})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def append(self, token_id: int) -> None:
        """Add a sampled token and decide whether the request is done."""
        self.token_ids.append(token_id)
        if token_id in self.stop_ids:
            self.finish("stop", token_id)
        elif len(self.token_ids) >= self.max_tokens:
            self.finish("length")

    def finish(self, reason: str, stop_token_id: int | None = None) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.stop_token_id = stop_token_id
