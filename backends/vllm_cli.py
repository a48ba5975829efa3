"""AsyncEngineArgs keyword arguments -> the command line of vLLM's OpenAI server, read off vLLM's own parser.

--vllm-process server starts `python -m vllm.entrypoints.openai.api_server` with the engine options
the inline path gives AsyncEngineArgs (backends.vllm_args.engine_kwargs). Each keyword becomes the
server flag whose argparse dest it is, written the way that flag's action reads it back (--x / --no-x
for switches, one word per item for nargs lists, JSON for dicts), so the server builds the same
engine. vLLM is imported only here, when a server is about to start.
"""

from __future__ import annotations

import enum
import functools
import json
from typing import Any

from backends.vllm_args import VllmOptionError

MODULE = "vllm.entrypoints.openai.api_server"


@functools.cache
def server_parser() -> Any:
    """The api_server's argument parser (vLLM 0.32 keeps it in launchers/, 0.26 in openai/)."""
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog=MODULE))


def _refuse(key: str, value: Any, why: str) -> VllmOptionError:
    return VllmOptionError(
        f"{key}={value!r}: cannot be passed to vLLM's server ({why}); run it with --vllm-process inline"
    )


def _flag(key: str, value: Any, actions: dict[str, Any]) -> list[str]:
    name = "--" + key.replace("_", "-")
    action = actions.get(name)
    if action is None or action.dest != key:
        raise _refuse(key, value, f"vLLM's api_server has no flag {name}")
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        if action.default is not None:
            raise _refuse(key, value, f"{name} cannot be set back to None")
        return []
    if action.nargs == 0:  # a switch: store_true, or BooleanOptionalAction with its --no- twin
        if not isinstance(value, bool):
            raise _refuse(key, value, f"{name} is a switch")
        if value:
            return [name]
        negative = "--no-" + name[2:]
        if negative in actions:
            return [negative]
        if not action.default:
            return []  # store_true left off: its default, False
        raise _refuse(key, value, f"{name} cannot be switched off")
    if action.nargs == "?" and value is True:  # a flag that is True bare, or takes a value
        return [name]
    if isinstance(value, list | tuple):
        if action.nargs in ("+", "*"):
            return [name, *(_word(key, v) for v in value)]
        return [name, json.dumps(list(value))]
    if isinstance(value, dict):
        return [name, json.dumps(value)]
    return [name, _word(key, value)]


def _word(key: str, value: Any) -> str:
    if isinstance(value, bool | int | float | str):
        return str(value)
    # e.g. a config dataclass that --vllm-arg parsed from JSON: its JSON would list every default
    raise _refuse(key, value, f"a {type(value).__name__} value")


def server_flags(kwargs: dict[str, Any]) -> list[str]:
    """Server flags for AsyncEngineArgs kwargs (and api_server-only settings such as host, port),
    in the order given. An option the server has no flag for is a VllmOptionError."""
    actions = server_parser()._option_string_actions  # argparse's own registry of option strings
    argv: list[str] = []
    for key, value in kwargs.items():
        argv += _flag(key, value, actions)
    return argv
