"""Harness overhead: our SUT with an instant backend in Server mode at rising QPS, against a bare
SUT that completes every query inside LoadGen's issue callback (the LoadGen + pybind floor), and
our SUT with its per-query records (queries.parquet) switched off.

    python bench/harness_overhead.py [--qps 1000,2000,5000,10000,20000,50000,100000] [--duration 2]
        [--kinds ours,norec,bare]

Each level is a real LoadGen Server run under gpt-oss-120b's rules (TTFT 3 s, TPOT 80 ms). The
backend yields 8 tokens in two chunks at once, so every millisecond of latency is harness (or
LoadGen) overhead. "keeps up" = the completed rate is >= 99% of the scheduled rate and p99
latency <= 50 ms: VALID alone is lenient for a short run, since backlog only has to stay under 3 s.
"""

from __future__ import annotations

import argparse
import array
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mlperf_loadgen as lg  # noqa: E402

from harness.config import RunConfig, SamplingParams  # noqa: E402
from harness.dataset import load_dataset  # noqa: E402
from harness.loop import shared_loop  # noqa: E402
from harness.report import read_detail  # noqa: E402
from harness.settings import build_log_settings, build_test_settings  # noqa: E402
from harness.sut import SUT  # noqa: E402

TOKENS = list(range(1000, 1008))


class InstantBackend:
    name = "instant"

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        pass

    async def stream(self, prompt, params):
        yield TOKENS[:1]
        yield TOKENS[1:]

    def describe(self):
        return {"name": self.name}


class BareSUT:
    """The floor: complete each query synchronously in the issue callback."""

    def __init__(self) -> None:
        self._first = array.array("i", TOKENS[:1])
        self._all = array.array("i", TOKENS)
        self.handle = lg.ConstructSUT(self._issue, lambda: None)

    def _issue(self, samples) -> None:
        fp, ap = self._first.buffer_info()[0], self._all.buffer_info()[0]
        lg.FirstTokenComplete([lg.QuerySampleResponse(s.id, fp, 4, 1) for s in samples])
        lg.QuerySamplesComplete(
            [lg.QuerySampleResponse(s.id, ap, 4 * len(TOKENS), len(TOKENS)) for s in samples]
        )

    def destroy(self) -> None:
        lg.DestroySUT(self.handle)


@dataclass(frozen=True, slots=True)
class Level:
    qps: float
    valid: bool
    completed_qps: float
    p50_ms: float
    p99_ms: float
    ttft_p99_ms: float
    wall_s: float
    records: int = 0  # rows the SUT recorded
    write_ms: float = 0.0  # writing them as queries.parquet, after the run

    @property
    def keeps_up(self) -> bool:
        return self.valid and self.completed_qps >= 0.99 * self.qps and self.p99_ms <= 50


KINDS = {
    "ours": "our SUT, per-query records on (the default)",
    "norec": "our SUT, per-query records off",
    "bare": "bare callback SUT",
}


def run_level(kind: str, qps: float, duration_s: float, dataset, out: Path) -> Level:
    cfg = RunConfig(
        backend="instant",
        scenario="server",
        input_file=dataset.path,
        output_dir=out,
        sampling=SamplingParams(max_new_tokens=8),
        target_qps=qps,
        min_duration_s=duration_s,
        min_query_count=1,
    )
    settings = build_test_settings(cfg, len(dataset))
    log_dir = out / f"{kind}_{int(qps)}"
    log_dir.mkdir(parents=True, exist_ok=True)
    loop = shared_loop()
    if kind in ("ours", "norec"):
        backend = loop.run(InstantBackend().__aenter__())
        sut = SUT(
            backend,
            dataset,
            [cfg.sampling] * len(dataset),
            first_token=True,
            loop=loop.loop,
            records=kind == "ours",
        )
    else:
        sut = BareSUT()
    qsl = lg.ConstructQSL(len(dataset), len(dataset), lambda _: None, lambda _: None)
    t0 = time.monotonic()
    lg.StartTestWithLogSettings(sut.handle, qsl, settings, build_log_settings(log_dir), "")
    wall = time.monotonic() - t0
    lg.DestroyQSL(qsl)
    sut.destroy()
    records, write_ms = 0, 0.0
    if getattr(sut, "records", None) is not None:
        t1 = time.perf_counter()
        sut.records.write(log_dir)
        records, write_ms = len(sut.records), (time.perf_counter() - t1) * 1e3
    v = read_detail(log_dir).values
    return Level(
        qps=qps,
        valid=v["result_validity"] == "VALID",
        completed_qps=v["result_completed_samples_per_sec"],
        p50_ms=v["result_50.00_percentile_latency_ns"] / 1e6,
        p99_ms=v["result_99.00_percentile_latency_ns"] / 1e6,
        ttft_p99_ms=v["result_first_token_99.00_percentile_latency_ns"] / 1e6,
        wall_s=wall,
        records=records,
        write_ms=write_ms,
    )


def sweep(kinds: list[str], levels: list[float], duration_s: float, repeats: int, dataset, out: Path):
    """{kind: [Level]}. At each level the kinds take turns, repeat by repeat, so that the load other
    processes put on a shared machine falls on all of them alike."""
    results: dict[str, list[Level]] = {kind: [] for kind in kinds}
    live = list(kinds)
    for qps in levels:
        runs: dict[str, list[Level]] = {kind: [] for kind in live}
        for r in range(repeats):
            for kind in live:
                runs[kind].append(run_level(kind, qps, duration_s, dataset, out / f"r{r}"))
        for kind in list(live):
            # Best of `repeats` (lowest p99): on a shared machine the other processes only add latency.
            level = min(runs[kind], key=lambda lv: lv.p99_ms)
            results[kind].append(level)
            print(
                f"  {kind:5s} {qps:>9,.0f} QPS: {'VALID' if level.valid else 'INVALID':7s} completed"
                f" {level.completed_qps:>9,.0f}/s "
                f"p99 {level.p99_ms:8.2f} ms ({level.wall_s:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            done = results[kind]
            if not level.valid and len(done) >= 2 and not done[-2].valid:
                live.remove(kind)  # two INVALID levels in a row: higher QPS only takes longer to fail
    return results


def best(results: list[Level], keep_up: bool) -> float:
    ok = [r.qps for r in results if (r.keeps_up if keep_up else r.valid)]
    return max(ok, default=0.0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--qps", default="1000,2000,5000,10000,20000,30000,50000,100000")
    p.add_argument("--duration", type=float, default=2.0, help="LoadGen min_duration per level, seconds")
    p.add_argument("--kinds", default="ours,norec,bare", help=f"SUTs to sweep, from {', '.join(KINDS)}")
    p.add_argument(
        "--repeats", type=int, default=2, help="runs per level; the one with the lowest p99 counts"
    )
    args = p.parse_args()
    levels = [float(x) for x in args.qps.split(",")]
    dataset = load_dataset(ROOT / "data" / "sample.parquet")
    kinds = args.kinds.split(",")
    for kind in kinds:
        if kind not in KINDS:
            p.error(f"--kinds: unknown {kind!r}; choose from {', '.join(KINDS)}")
    with tempfile.TemporaryDirectory() as tmp:
        results = sweep(kinds, levels, args.duration, args.repeats, dataset, Path(tmp))
    by_qps: dict[float, dict[str, Level]] = {}
    for kind, levels_run in results.items():
        for r in levels_run:
            by_qps.setdefault(r.qps, {})[kind] = r
    print(
        "\n| target QPS | "
        + " | ".join(f"{k}: result | {k}: completed/s | {k}: p99 ms" for k in kinds)
        + " |"
    )
    print("|---:|" + "---|---:|---:|" * len(kinds))
    for qps, row in sorted(by_qps.items()):
        cells = []
        for kind in kinds:
            r = row.get(kind)
            if r is None:
                cells += ["-", "-", "-"]
                continue
            verdict = f"{'VALID' if r.valid else 'INVALID'}{' (keeps up)' if r.keeps_up else ''}"
            cells += [verdict, f"{r.completed_qps:,.0f}", f"{r.p99_ms:.2f}"]
        print(f"| {qps:,.0f} | " + " | ".join(cells) + " |")
    print("\n| SUT | highest VALID QPS | highest QPS that keeps up (>= 99% completed, p99 <= 50 ms) |")
    print("|---|---:|---:|")
    for kind in kinds:
        print(f"| {KINDS[kind]} | {best(results[kind], False):,.0f} | {best(results[kind], True):,.0f} |")
    if "ours" in results and "norec" in results:
        on, off = best(results["ours"], True), best(results["norec"], True)
        print(
            f"\nper-query records on / off, highest QPS that keeps up: {on:,.0f} / {off:,.0f}"
            f" (ratio {on / off if off else float('nan'):.2f})"
        )
        written = max(results["ours"], key=lambda r: r.records)
        print(f"writing queries.parquet after the run: {written.records:,} rows in {written.write_ms:.1f} ms")
    if "ours" in results and "bare" in results:
        same = [
            (row["ours"], row["bare"])
            for row in by_qps.values()
            if "ours" in row and "bare" in row and row["ours"].keeps_up and row["bare"].keeps_up
        ]
        if same:
            o, b = max(same, key=lambda ob: ob[0].qps)
            print(
                f"added p99 latency at {o.qps:,.0f} QPS: {o.p99_ms - b.p99_ms:+.2f}"
                f" ms (ours {o.p99_ms:.2f}, bare {b.p99_ms:.2f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
