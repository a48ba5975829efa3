"""The fastest v3 tiles in a moe_gpu.py table, as a GPTOSS_MOE_V3_TILES value for the engine.

    python bench/kernels/moe_pick.py KERNELS_TXT [--experts 128]   (prints the value; the choice on stderr)

For each v3 bucket (rows an expert: 128 is M 513-4088 at 20b's 32 experts, 512 M >= 4096; dec
(M <= 16), 16, 32 and 64 where the table has rows there) and each GEMM, the variant with the
least summed time of that GEMM alone (moe_gpu's gate_up / down columns) over the table's M of that
bucket, among the variants timed at all of them; the tiles it ran (its override, else the table's).
Prints nothing where the table's own tiles win, so an empty value means "the defaults".
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_variants import VARIANTS  # noqa: E402

from gptoss.kernels.moe_tiles import (  # noqa: E402
    _DOWN_TILES_V3,
    _GATE_UP_TILES_V3,
    DECODE_BUCKET,
    Tiles,
    bucket_v3,
    tiles_spec,
)

TOP_K = 4
ROW = re.compile(r"^\s*(\d+) (\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


_spec = tiles_spec  # the spelling GPTOSS_MOE_V3_TILES reads back


def _tiles(name: str, bucket: int, gate_up: bool) -> Tiles:
    table = _GATE_UP_TILES_V3 if gate_up else _DOWN_TILES_V3
    return (VARIANTS[name].tiles or {}).get((bucket, gate_up)) or table[bucket]


def pick(text: str, experts: int = 32) -> tuple[str, list[str]]:
    """(the GPTOSS_MOE_V3_TILES value, one line a choice); experts: the table's (moe_gpu --experts)."""
    times: dict[tuple[int, str], dict[int, tuple[float, float]]] = {}
    untimed = []  # rows whose GEMM moe_gpu could not time ("-": its graph capture failed)
    wrong = []
    for line in text.splitlines():
        m = ROW.match(line)
        # a variant that also flips a switch (unmasked rows) times more than its tiles: no candidate
        if not m or m[2] not in VARIANTS or VARIANTS[m[2]].kernels != "v3" or VARIANTS[m[2]].unmasked:
            continue
        if line.rstrip().endswith("WRONG"):  # moe_gpu's output check failed: its time is no result
            wrong.append(f"{m[2]} at M {m[1]}")
            continue
        if "-" in (m[4], m[5]):
            untimed.append(f"{m[2]} at M {m[1]}")
            continue
        bucket = bucket_v3(triton.cdiv(int(m[1]) * TOP_K, experts), int(m[1]))
        times.setdefault((bucket, m[2]), {})[int(m[1])] = (float(m[4]), float(m[5]))
    values = []
    notes = [f"{len(untimed)} rows untimed, not candidates: {', '.join(untimed)}"] if untimed else []
    if wrong:
        notes.append(f"{len(wrong)} rows WRONG (output check), not candidates: {', '.join(wrong)}")
    small = sorted({b for b, _ in times if b < 128})  # reported only where timed
    for bucket in (*small, 128, 512):
        ms = set().union(*(t.keys() for (b, _), t in times.items() if b == bucket))
        full = {v: t for (b, v), t in times.items() if b == bucket and t.keys() == ms}
        for col, gemm in enumerate(("gate_up", "down")):
            if not full:
                notes.append(f"{gemm}@{bucket or 'dec'}: no variant timed at every M of the bucket")
                continue
            best = min(full, key=lambda v: sum(t[col] for t in full[v].values()))
            tiles, default = _tiles(best, bucket, col == 0), _tiles("v3", bucket, col == 0)
            total = sum(t[col] for t in full[best].values())
            mark = " (the table's)" if tiles == default else ""  # a variant that changed the other GEMM
            name = "dec" if bucket == DECODE_BUCKET else bucket  # GPTOSS_MOE_V3_TILES' bucket names
            notes.append(f"{gemm}@{name}: {best} {_spec(tiles)}{mark} ({total:.1f} us over M {sorted(ms)})")
            if tiles != default:
                values.append(f"{gemm}@{name}={_spec(tiles)}")
    return ";".join(values), notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", type=Path, help="moe_gpu.py's output")
    ap.add_argument("--experts", type=int, default=32, help="the experts moe_gpu.py ran (--experts)")
    args = ap.parse_args()
    value, notes = pick(args.table.read_text(), args.experts)
    print("\n".join(notes), file=sys.stderr)
    print(value)


if __name__ == "__main__":
    main()
