"""The engine's environment switches (GPTOSS_*): a name none of our code reads is refused.

The kernels read their A/B switches from the environment at import time (the tiles of the MoE, the
attention settings, ...), and a misspelt or retired one would be ignored, so a benchmark would
silently time the defaults under the name of a variant. The known names are every GPTOSS_* inside
a string literal of this package's other sources (comments do not count: a retired switch often
lives on in one), so a new switch needs no list kept by hand.

Standard library only: gptoss.vllm_plugin calls it inside vLLM's processes.
"""

from __future__ import annotations

import difflib
import functools
import io
import os
import re
import tokenize
from collections.abc import Mapping
from pathlib import Path

_NAME = re.compile(r"GPTOSS_[A-Z0-9_]+")
# String tokens: Python 3.12 splits an f-string into FSTRING_START / _MIDDLE / _END
_STRING_TOKENS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def names_in_source(text: str) -> set[str]:
    """The GPTOSS_* names inside the string literals (docstrings included) of Python source text."""
    found: set[str] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in _STRING_TOKENS:
            found.update(_NAME.findall(tok.string))
    return found


@functools.cache
def known() -> frozenset[str]:
    """Every switch name this package's code spells out."""
    here = Path(__file__).resolve()
    sources = (p for p in here.parent.rglob("*.py") if p != here)
    return frozenset().union(*(names_in_source(p.read_text(encoding="utf-8")) for p in sources))


def unknown(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPTOSS_* variables set in environ that no code of ours reads, sorted."""
    return sorted(k for k in environ if k.startswith("GPTOSS_") and k not in known())


def check_environment(environ: Mapping[str, str] = os.environ) -> None:
    """Raise ValueError naming each unknown GPTOSS_* variable (with the nearest known names)."""
    bad = unknown(environ)
    if not bad:
        return
    names = []
    for k in bad:
        near = difflib.get_close_matches(k, sorted(known()), n=2, cutoff=0.8)
        names.append(f"{k} (did you mean {' or '.join(near)}?)" if near else k)
    one = len(bad) == 1
    raise ValueError(
        f"unknown gptoss switch{'' if one else 'es'} in the environment: {', '.join(names)}. "
        f"No code of ours reads {'it' if one else 'them'}, so the run would time the defaults: "
        f"unset {'it or fix its name' if one else 'them or fix their names'}"
    )
