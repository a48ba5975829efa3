"""How --lora names an adapter: `NAME=PATH` or `PATH` (no torch, so EngineConfig can check it)."""

from __future__ import annotations


def split_lora_spec(spec: str) -> tuple[str, str]:
    """--lora `NAME=PATH` or `PATH` -> (name, path); a bare PATH is named after its folder."""
    name, sep, path = spec.partition("=")
    if not sep:
        path, name = spec, spec.rstrip("/").rsplit("/", 1)[-1]
    if not name or not path:
        raise ValueError(f"lora {spec!r}: expected NAME=PATH or PATH")
    return name, path
