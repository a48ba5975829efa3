"""A copy of a checkpoint with a known fault, to calibrate the greedy-agreement rows: the rate that a
known-wrong model scores against the right one on the same prompts says what a rate can detect.

    python bench/fault_checkpoint.py SRC DST --edit 'self_attn\\.sinks$' set=-inf
    python bench/fault_checkpoint.py SRC DST --edit 'layers\\.12\\.mlp\\.experts\\.down_proj_scales$' add=1

Each --edit PATTERN OP=VALUE changes every tensor whose name matches the regex PATTERN (re.search):
set (every value), add or mul (elementwise), in the tensor's own dtype (uint8 e8m0 scales: add 1
doubles an expert block's weights). Shards with no edited tensor are hard-linked (copied across
file systems); the json files are copied. A pattern that matches nothing, or a DST that already
holds a checkpoint, is an error.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's gptoss

from gptoss.checkpoint import weight_files  # noqa: E402

OPS = ("set", "add", "mul")


def _apply(t: torch.Tensor, op: str, value: float) -> torch.Tensor:
    if op == "set":
        return torch.full_like(t, value)
    if t.dtype == torch.uint8:  # e8m0 exponents: integer steps, kept inside the byte
        v = t.int() + int(value) if op == "add" else (t.int() * int(value))
        if v.min() < 0 or v.max() > 255:
            raise ValueError(f"{op} {value} takes a uint8 tensor outside 0..255")
        return v.to(torch.uint8)
    return (t.float() + value if op == "add" else t.float() * value).to(t.dtype)


def write_faulty(src: Path, dst: Path, edits: list[tuple[str, str, float]]) -> dict[str, int]:
    """Copy src to dst with edits applied; returns how many tensors each pattern changed."""
    if (dst / "config.json").exists():
        raise FileExistsError(f"{dst} already holds a checkpoint (config.json exists)")
    dst.mkdir(parents=True, exist_ok=True)
    hits = {pattern: 0 for pattern, _, _ in edits}
    for file in sorted(set(weight_files(src).values())):  # each shard once
        fname = file.name
        tensors = load_file(str(file))
        changed = False
        for name in tensors:
            for pattern, op, value in edits:
                if re.search(pattern, name):
                    tensors[name] = _apply(tensors[name], op, value)
                    hits[pattern] += 1
                    changed = True
        if changed:
            save_file(tensors, str(dst / fname), metadata={"format": "pt"})
        else:
            try:
                os.link(src / fname, dst / fname)
            except OSError:  # another file system
                shutil.copy2(src / fname, dst / fname)
    missing = [p for p, n in hits.items() if n == 0]
    if missing:
        shutil.rmtree(dst)
        raise ValueError(f"no tensor matches {', '.join(map(repr, missing))}")
    for meta in sorted(src.glob("*.json")):
        if meta.name != "config.json":
            shutil.copy2(meta, dst / meta.name)
    shutil.copy2(src / "config.json", dst / "config.json")  # last: it marks a complete checkpoint
    return hits


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument(
        "--edit",
        nargs=2,
        action="append",
        required=True,
        metavar=("PATTERN", "OP=VALUE"),
        help=f"OP: {OPS}",
    )
    args = ap.parse_args(argv)
    edits = []
    for pattern, change in args.edit:
        op, _, value = change.partition("=")
        if op not in OPS:
            ap.error(f"--edit {pattern!r}: OP must be one of {OPS}, got {op!r}")
        try:
            edits.append((pattern, op, float(value)))
        except ValueError:
            ap.error(f"--edit {pattern!r}: {change!r} is not OP=NUMBER")
    hits = write_faulty(args.src, args.dst, edits)
    for pattern, n in hits.items():
        print(f"{pattern!r}: {n} tensors changed")
    print(f"wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
