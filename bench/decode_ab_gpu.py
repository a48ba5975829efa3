"""Decode (batch 1, or --batch N prompts together) under several kernel switches in one process: one
engine, its CUDA graphs captured again for each variant, the variants interleaved round by round.

    python bench/decode_ab_gpu.py --model-path CKPT --variant default= --variant rp=moe_v3.ROUTE_PDL=True \
        --variant gu=moe_v3_dec_gu.TOKENS=frozenset()+moe_v3_dec.WTMA=False \
        [--rounds 2] [--decode 128x512] [--batch 1 | --batch 2,3,5] [--profile-tokens 64] \
        [--sampling greedy | --sampling temperature=1,top_p=0.9[,top_k=..,seed=..]]

Why: a 120b engine takes ~40 s to start, so one process a variant (bench/gptoss_gpu.py) spends most of
a device call loading weights. The switches here are module attributes that the kernels' Python
wrappers read at call time (gptoss.kernels.MOD.ATTR, or an item of a dict there; gptoss.MOD.ATTR
for the engine's own modules), so a fresh capture
puts them in the decode graphs; weights and KV cache stay as built. A variant NAME= runs the defaults.

Per variant and round: output tok/s of --batch IN-token prompts decoding OUT tokens together, greedy
or as --sampling asks (best of 3, prefill included; at batch 1 gptoss_gpu.py's batch-1 row), then
with --profile-tokens N that many decode steps after the prefill under torch.profiler: each kernel's
µs a step as the stream runs it (profile_gpu.chain's "added": its cost in the chain with PDL on; a
step is a token at batch 1) and the idle time. Last, one table: a row a variant, its tok/s by round,
the best, and the five kernels that add the most a step.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gptoss_gpu import rand_prompts  # noqa: E402
from profile_gpu import _kernel_times  # noqa: E402

from gptoss.engine import EngineConfig, LLMEngine  # noqa: E402
from gptoss.kernels import moe_tiles  # noqa: E402
from gptoss.sampling import SamplingParams  # noqa: E402


def parse_variant(spec: str) -> tuple[str, list[tuple[str, str, object, object]]]:
    """NAME=MOD.ATTR[[KEY]]=VALUE[+...] -> (NAME, [(module, attribute, KEY or None, value)]); NAME=
    alone: the defaults. MOD is a module of gptoss.kernels, or a whole name from gptoss. on
    (gptoss.kernel_model.ROUTER="split"). VALUE is a Python literal (1, True, "split") or a tile
    shape (DecTiles(16, 32, 256, 2, 2, 4)); MOD.ATTR[KEY] sets one item of a dict (KEY a literal),
    e.g. moe_tiles.TILE_OVERRIDE[(0,True)]=Tiles(16,32,128,4,8)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise ValueError(f"--variant {spec!r}: expected NAME=[MOD.ATTR=VALUE[+...]]")
    sets = []
    for item in filter(None, rest.split("+")):
        key, eq, value = item.partition("=")
        m = re.fullmatch(r"([\w.]+)\.(\w+)(?:\[(.+)\])?", key)
        if not (eq and m):
            raise ValueError(f"--variant {spec!r}: {item!r} is not MOD.ATTR[[KEY]]=VALUE")
        dict_key = None if m[3] is None else parse_value(m[3], spec)
        mod = m[1] if m[1].startswith("gptoss.") else f"gptoss.kernels.{m[1]}"
        sets.append((mod, m[2], dict_key, parse_value(value, spec)))
    return name, sets


def parse_value(value: str, spec: str) -> object:
    """A Python literal, a tile shape (Tiles(...) / DecTiles(...) of literal arguments) or a set of
    decode batch sizes (frozenset({1, 2}), frozenset(): moe_v3_dec.TOKENS and its kin)."""
    call = re.fullmatch(r"(Tiles|DecTiles|frozenset)\((.*)\)", value)
    try:
        if call and call[1] == "frozenset":
            return frozenset(ast.literal_eval(call[2]) if call[2] else ())
        if call:
            return getattr(moe_tiles, call[1])(*ast.literal_eval(f"({call[2]},)"))
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError) as e:
        raise ValueError(
            f"--variant {spec!r}: {value!r} is neither a Python literal, a tile shape nor a frozenset"
        ) from e


class Switches:
    """Sets a variant's module attributes (or dict items, in place), each checked to exist, and
    restores the defaults first."""

    def __init__(self, variants: dict[str, list[tuple[str, str, object, object]]]):
        self.defaults: dict[tuple[str, str], object] = {}
        self.dicts: dict[tuple[str, str], dict] = {}
        for sets in variants.values():
            for mod, attr, key, _ in sets:
                m = importlib.import_module(mod)
                if not hasattr(m, attr):
                    raise AttributeError(f"{mod} has no attribute {attr!r}")
                if key is None:
                    self.defaults.setdefault((mod, attr), getattr(m, attr))
                elif not isinstance(getattr(m, attr), dict):
                    raise TypeError(f"{mod}.{attr} is not a dict: no [KEY] on it")
                else:
                    self.dicts.setdefault((mod, attr), dict(getattr(m, attr)))

    def apply(self, sets: list[tuple[str, str, object, object]]) -> None:
        for (mod, attr), v in self.defaults.items():
            setattr(importlib.import_module(mod), attr, v)
        for (mod, attr), snap in self.dicts.items():
            d = getattr(importlib.import_module(mod), attr)
            d.clear()
            d.update(snap)
        for mod, attr, key, v in sets:
            m = importlib.import_module(mod)
            if key is None:
                setattr(m, attr, v)
            else:
                getattr(m, attr)[key] = v


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True)


SAMPLING_FIELDS = {"temperature": float, "top_p": float, "top_k": int, "seed": int}


def parse_sampling(text: str) -> dict[str, float | int]:
    """--sampling: greedy (the default), or KEY=VALUE[,...] of temperature, top_p, top_k, seed: what
    the timed and profiled requests ask (a top-k / top-p decode times the engine's filtered draw)."""
    if text == "greedy":
        return {}
    out: dict[str, float | int] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq or key not in SAMPLING_FIELDS:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected greedy or KEY=VALUE[,...] of {', '.join(SAMPLING_FIELDS)}"
            )
        try:
            out[key] = SAMPLING_FIELDS[key](value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{item!r}: {e}") from None
    try:
        SamplingParams(max_new_tokens=1, **out)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return out


def requests(n: int, sampling: dict[str, float | int] | None) -> SamplingParams:
    """n tokens a prompt, ignoring EOS: greedy, or as --sampling says."""
    return SamplingParams(max_new_tokens=n, ignore_eos=True, **sampling) if sampling else greedy(n)


def sync() -> None:
    """Wait for the GPU, where there is one (the step accounting is tested on CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def decode_tok_s(
    eng: LLMEngine, prompts: list[list[int]], out_len: int, sampling: dict[str, float | int] | None = None
) -> float:
    """Output tokens a second of the prompts decoding together, best of 3, prefill included."""
    eng.generate(prompts, requests(8, sampling))
    best = None
    for _ in range(3):
        sync()
        t = time.perf_counter()
        outs = eng.generate(prompts, requests(out_len, sampling))
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return sum(map(len, outs)) / best


def profile_steps(
    eng: LLMEngine, prompts: list[list[int]], n: int, sampling: dict[str, float | int] | None = None
) -> tuple[dict[str, float], float]:
    """Kernel -> added µs a decode step of all the prompts together (a token a prompt), and idle µs a
    step, over n steps after their prefill."""
    seqs = []
    for i, p in enumerate(prompts):
        eng.add(f"profiled-{i}", p, requests(n + 16, sampling))
        seqs.append(eng.seqs[f"profiled-{i}"])
    while any(s.num_computed < s.num_prompt_tokens for s in seqs):
        eng.step()
    eng.step()
    sync()
    done = len(seqs[0].output_ids)
    act = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[act.CUDA if torch.cuda.is_available() else act.CPU]) as prof:
        while eng.has_work() and len(seqs[0].output_ids) - done < n:
            eng.step()
        sync()
    steps = len(seqs[0].output_ids) - done
    while eng.has_work():
        eng.step()
    per, idle = _kernel_times(prof)
    return {k: v[2] / steps for k, v in per.items()}, idle / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--variant", action="append", required=True, help="NAME=[MOD.ATTR=VALUE[+...]]")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--decode", default="128x512", help="IN x OUT tokens of each timed prompt")
    ap.add_argument(
        "--batch",
        type=parse_batches,
        default=[1],
        help="prompts decoding together (a decode batch); a list (2,3,5) times each size in turn",
    )
    ap.add_argument("--profile-tokens", type=int, default=64, help="0: no profile")
    ap.add_argument(
        "--sampling",
        type=parse_sampling,
        default={},
        help="greedy, or the timed requests' temperature=,top_p=,top_k=,seed= (e.g. temperature=1,top_p=0.9)",
    )
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument(
        "--show",
        action="append",
        default=[],
        help="a kernel (name prefix) whose µs added a step the table shows",
    )
    args = ap.parse_args()
    if max(args.batch) > args.max_num_seqs:
        ap.error(
            f"--batch {max(args.batch)} is more than --max-num-seqs {args.max_num_seqs}: "
            "it would not decode as one batch"
        )
    variants = dict(parse_variant(v) for v in args.variant)
    switches = Switches(variants)
    lin, lout = (int(x) for x in args.decode.split("x"))
    t = time.perf_counter()
    eng = LLMEngine(
        EngineConfig(
            model_path=Path(args.model_path),
            device="cuda",
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
        )
    )
    print(f"engine up in {time.perf_counter() - t:.1f} s", flush=True)
    runner = eng.runner.kernel_runner
    if runner is None or runner.device.type != "cuda":
        raise SystemExit("decode_ab_gpu.py re-captures the kernel runner's CUDA graphs: it needs a GPU")
    eng.generate(rand_prompts(4, 64, 123), greedy(16))
    tables = [time_batch(eng, runner, switches, variants, args, b, lin, lout) for b in args.batch]
    print("\n" + "\n\n".join(tables))


def time_batch(eng, runner, switches, variants, args, batch: int, lin: int, lout: int) -> str:
    """The variants' rounds at one decode batch size; returns its table."""
    prompts = rand_prompts(batch, lin, seed=99)
    tok_s: dict[str, list[float]] = {n: [] for n in variants}
    added: dict[str, dict[str, float]] = {}
    for rnd in range(args.rounds):
        for name, sets in variants.items():
            switches.apply(sets)
            runner.graphs.build()
            tok_s[name].append(decode_tok_s(eng, prompts, lout, args.sampling))
            print(f"batch {batch} round {rnd + 1} {name}: {tok_s[name][-1]:.1f} tok/s", flush=True)
            if rnd == 0 and args.profile_tokens:
                per, idle = profile_steps(eng, prompts, args.profile_tokens, args.sampling)
                added[name] = per
                print(f"  {name}: kernels added {sum(per.values()):.1f} us a step, idle {idle:.1f}")
                for k, us in sorted(per.items(), key=lambda kv: -kv[1])[:12]:
                    print(f"    {k:60} {us:8.1f}")
    switches.apply([])
    how = ",".join(f"{k}={v}" for k, v in args.sampling.items()) or "greedy"
    lines = [
        f"batch {batch}, {lin} -> {lout} tokens, {how}, tok/s (best of 3 a round); top kernels, µs a step"
    ]
    for name in variants:
        runs = " / ".join(f"{x:.1f}" for x in tok_s[name])
        top = sorted(added.get(name, {}).items(), key=lambda kv: -kv[1])[:5]
        tops = ", ".join(f"{k[:24]} {us:.1f}" for k, us in top)
        shown = "".join(f" | {k} {shown_us(added.get(name, {}), k):.1f}" for k in args.show)
        lines.append(f"{name:10} {runs:24} best {max(tok_s[name]):7.1f}{shown} | {tops}")
    return "\n".join(lines)


def parse_batches(text: str) -> list[int]:
    """--batch: one size (8) or a list (2,3,5), each at least 1."""
    if not re.fullmatch(r"\d+(,\d+)*", text) or min(sizes := [int(x) for x in text.split(",")]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected decode batch sizes such as 8 or 2,3,5")
    return sizes


def shown_us(per: dict[str, float], prefix: str) -> float:
    """µs added a step by the kernels whose names start with prefix (0.0: none ran)."""
    return sum(us for k, us in per.items() if k.startswith(prefix))


if __name__ == "__main__":
    main()
