"""The fastest large-M v3 tiles in a moe_gpu.py table, as a GPTOSS_MOE_V3_TILES value for the engine.

    python bench/kernels/moe_pick.py KERNELS_TXT      (prints the value; the choice on stderr)

For each v3 bucket (128: M 513-4088 at 20b, 512: M >= 4096) and each GEMM, the variant with the
least summed time of that GEMM alone (moe_gpu's gate_up / down columns) over the table's M of that
bucket, among the variants timed at all of them; the tiles it ran (its override, else the table's).
Prints nothing where the table's own tiles win, so an empty value means "the defaults".
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_variants import VARIANTS  # noqa: E402

from gptoss.kernels.moe_tiles import _DOWN_TILES_V3, _GATE_UP_TILES_V3, Tiles, bucket_v3  # noqa: E402

E, TOP_K = 32, 4
ROW = re.compile(r"^\s*(\d+) (\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


def _spec(t: Tiles) -> str:
    return f"{t.bm},{t.bn},{t.bk},{t.warps},{t.stages}" + (",half" if t.half else "")


def _tiles(name: str, bucket: int, gate_up: bool) -> Tiles:
    table = _GATE_UP_TILES_V3 if gate_up else _DOWN_TILES_V3
    return (VARIANTS[name].tiles or {}).get((bucket, gate_up)) or table[bucket]


def pick(text: str) -> tuple[str, list[str]]:
    """(the GPTOSS_MOE_V3_TILES value, one line a choice)."""
    times: dict[tuple[int, str], dict[int, tuple[float, float]]] = {}
    untimed = []  # rows whose GEMM moe_gpu could not time ("-": its graph capture failed)
    for line in text.splitlines():
        m = ROW.match(line)
        if not m or m[2] not in VARIANTS or VARIANTS[m[2]].kernels != "v3":
            continue
        if "-" in (m[4], m[5]):
            untimed.append(f"{m[2]} at M {m[1]}")
            continue
        bucket = bucket_v3(triton.cdiv(int(m[1]) * TOP_K, E))
        times.setdefault((bucket, m[2]), {})[int(m[1])] = (float(m[4]), float(m[5]))
    values = []
    notes = [f"{len(untimed)} rows untimed, not candidates: {', '.join(untimed)}"] if untimed else []
    for bucket in (128, 512):
        ms = set().union(*(t.keys() for (b, _), t in times.items() if b == bucket))
        full = {v: t for (b, v), t in times.items() if b == bucket and t.keys() == ms}
        for col, gemm in enumerate(("gate_up", "down")):
            if not full:
                notes.append(f"{gemm}@{bucket}: no variant timed at every M of the bucket")
                continue
            best = min(full, key=lambda v: sum(t[col] for t in full[v].values()))
            tiles, default = _tiles(best, bucket, col == 0), _tiles("v3", bucket, col == 0)
            total = sum(t[col] for t in full[best].values())
            mark = " (the table's)" if tiles == default else ""  # a variant that changed the other GEMM
            notes.append(f"{gemm}@{bucket}: {best} {_spec(tiles)}{mark} ({total:.1f} us over M {sorted(ms)})")
            if tiles != default:
                values.append(f"{gemm}@{bucket}={_spec(tiles)}")
    return ";".join(values), notes


def main() -> None:
    value, notes = pick(Path(sys.argv[1]).read_text())
    print("\n".join(notes), file=sys.stderr)
    print(value)


if __name__ == "__main__":
    main()
