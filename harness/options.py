"""Flags from dataclasses: each options dataclass's flag fields become a group of argparse flags,
and the parsed flags become the dataclass again (harness/cli.py, bench scripts, tests); the strict
number parsers the flags use."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line naming the flag and what to do; no usage block (--help has it)."""
        self.exit(2, f"error: {message}\n")


def finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def non_negative(text: str) -> float:
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def qps_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got '{text}'") from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def named(parse: Any, name: str) -> Any:
    """argparse prints the type's __name__ in 'invalid <name> value'; keep it readable."""
    parse.__name__ = name
    return parse


# ----------------------------------------------------------------------------- options dataclasses -> flags
# A field is a flag when its metadata has "help". Optional metadata: "flag" (the option string,
# default --field-name), "choices", "type" (parses the text), "metavar", "repeat" (a repeatable
# flag collected into a tuple), "default_help" (how --help states the default).

_PARSE: dict[type, Any] = {int: integer, float: finite, str: str, Path: Path}
_UNSET: Any = type("Unset", (), {"__repr__": lambda self: "unset"})()  # a parsed value may be None


def option_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _dest(f: dataclasses.Field) -> str:
    return "opt_" + f.name  # never the dest of a core flag


def _base(hint: Any) -> type:
    """int for `int | None`, etc."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else object
    return typing.get_origin(hint) or hint


def _help(f: dataclasses.Field) -> str:
    shown = f.metadata.get("default_help")
    if shown is None:
        default = f.default
        if default is None or default == ():
            return f.metadata["help"]
        shown = {True: "on", False: "off"}.get(default, default) if isinstance(default, bool) else default
    return f"{f.metadata['help']} (default: {shown})".replace("%", "%%")


def _checked(parse: Any, name: str) -> Any:
    """A field's parser that also refuses non-finite numbers (inf, nan, 1e400) whatever it returns."""

    def run(text: str) -> Any:
        value = parse(text)
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        return value

    return named(run, name)


def add_options(
    parser: argparse.ArgumentParser, cls: type, title: str, description: str | None = None
) -> None:
    """The flag fields of the dataclass `cls` as a group of flags (an unset one keeps the field default)."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(title, description)
    for f in option_fields(cls):
        base = _base(hints[f.name])
        kw: dict[str, Any] = {"dest": _dest(f), "default": _UNSET, "help": _help(f)}
        if base is bool and "type" not in f.metadata:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            parse = f.metadata.get("type") or _PARSE.get(base)
            if parse is None:
                raise TypeError(f"{cls.__name__}.{f.name}: give a 'type' in its metadata to parse {base}")
            kw["type"] = _checked(parse, getattr(base, "__name__", "value"))
            if "choices" in f.metadata:
                kw["choices"] = f.metadata["choices"]
            else:
                kw["metavar"] = (
                    f.metadata.get("metavar") or flag_of(f).removeprefix("--").replace("-", "_").upper()
                )
            if f.metadata.get("repeat"):
                kw["action"], kw["default"] = "append", None
        group.add_argument(flag_of(f), **kw)


class OptionsError(ValueError):
    """Options that parse but do not fit together; the message names the flags."""


def options_from(ns: argparse.Namespace, cls: type, **given: Any) -> Any:
    """The dataclass from the parsed flags: a flag left unset keeps the field's default."""
    values = dict(given)
    for f in option_fields(cls):
        value = getattr(ns, _dest(f), _UNSET)
        if f.metadata.get("repeat"):
            if value:  # None when never given
                values[f.name] = tuple(value)
        elif value is not _UNSET:
            values[f.name] = value
    try:
        return cls(**values)
    except ValueError as e:  # the dataclass's own check, in field names: say the flags instead
        message = str(e)
        for f in option_fields(cls):  # whole words: the field device must not rename devices
            message = re.sub(rf"\b{f.name}\b", flag_of(f), message)
        raise OptionsError(message) from None


def parse_options(cls: type, argv: list[str], prog: str = "options") -> Any:
    """`cls` from a list of its flags alone (bench scripts, tests)."""
    parser = Parser(prog=prog, allow_abbrev=False)
    add_options(parser, cls, cls.__name__)
    try:
        return options_from(parser.parse_args(argv), cls)
    except OptionsError as e:
        parser.error(str(e))
