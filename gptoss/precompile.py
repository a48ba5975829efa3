"""The engine's Triton kernels compiled in background threads while the checkpoint loads, from a
manifest of the specializations earlier runs of the same kernels met.

Why. On a fresh machine (or a container without a kept cache) the engine compiles each kernel
specialization when a step first needs it, one at a time on the main thread: 20b started in 69.7 s
without the warm-up and 100.4 s with it on an H200 with an empty Triton cache (bench/results v50),
against ~40 s with a warm one. Which specializations a start-up and a run need is known beforehand,
so gptoss/kernels/specs/<backend>-<arch>.json lists them: Triton's own serialized specialization (as
JITFunction.preload reads it), each tagged with the model shapes it was met at. Compiling one writes
Triton's disk cache, and so does its launcher (a small C module Triton builds with the system's C
compiler for each kernel signature, at the kernel's first launch), so the kernel's first launch only
loads both, in milliseconds. Threads by default (GPTOSS_PRECOMPILE_WORKERS=processes: a spawned pool):
Triton's MLIR passes, LLVM and ptxas run outside the GIL (two threads compiled four MoE tiles for
sm_90a in 1.48 s against 3.13 s one after another, on a 2-core CPU), and the main thread meanwhile
reads safetensors. Measured (v52, H200, empty cache): 20b started in 42.7 s against 101.0 s without
it, 120b in 55.8 s against 129.3 s, the engine waiting 0.5 s and 0 s for the threads.

Best effort, never a change in what runs: an entry that no longer matches its kernel (renamed,
removed, other parameters) fails alone and is counted; a specialization the manifest lacks compiles
at its first launch, as without a manifest. The threads are daemons: a start-up that fails leaves
no compile to wait for (Triton writes each cache entry by rename, so none is left half written).

Record or extend a manifest on the GPU: python -m gptoss.tools.record_specs --model-path CKPT
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from triton.backends.compiler import GPUTarget

    from gptoss.config import ModelConfig

log = logging.getLogger("gptoss.precompile")
SPECS_DIR = Path(__file__).parent / "kernels" / "specs"
PACKAGE = "gptoss."  # only our kernels are recorded
# Options that hold this machine's paths (libdevice's, under the recording's site-packages): left to
# this backend's defaults, which the launch uses too (and the cache key hashes the file, not its path)
LOCAL = ("extern_libs",)
MAX_ERRORS = 5  # kept in the stats, each the first line of its exception
# GPTOSS_PRECOMPILE_WORKERS: "threads" (the default) or "processes". Triton's Python code generation
# holds the GIL, so threads compiled 3.56x faster than one at 15 threads (v51), and they compete with
# the checkpoint's loading on the main thread: a cold 20b start-up took 44-54 s against 18 s on a
# kept cache (v53) with the precompile's own wait ~0.5 s. Processes (spawned, as the parent holds a
# CUDA context) hold no GIL of the parent's; each imports Triton and the kernels' modules first.
# Not yet timed on a GPU: engine.info()["startup_s"] says which phase it shortens.
WORKER_KINDS = ("threads", "processes")


def workers_from_env(v: str | None) -> str:
    if v in (None, ""):
        return "threads"
    if v not in WORKER_KINDS:
        raise ValueError(f"GPTOSS_PRECOMPILE_WORKERS must be threads or processes, got {v!r}")
    return v


WORKERS = workers_from_env(os.environ.get("GPTOSS_PRECOMPILE_WORKERS"))


def model_tag(cfg: ModelConfig) -> str:
    """The model shapes a specialization was met at: what its constexprs and dtypes follow."""
    return f"h{cfg.hidden_size}-e{cfg.num_local_experts}-l{cfg.num_hidden_layers}"


def manifest_path(target: GPUTarget, folder: Path = SPECS_DIR) -> Path:
    return folder / f"{target.backend}-{target.arch}.json"


def spec_id(spec: dict) -> str:
    """One specialization, independent of the order of its fields (two runs give equal ids)."""
    return json.dumps(spec, sort_keys=True)


def load_specs(path: Path, tag: str) -> tuple[list[dict], str | None]:
    """The entries of the manifest at path met at tag, and why there are none (None: there are)."""
    import triton

    if not path.is_file():
        return [], f"no manifest {path.name} for this GPU"
    doc = json.loads(path.read_text())
    if doc.get("triton") != triton.__version__:
        return [], f"{path.name} was recorded with Triton {doc.get('triton')}, this is {triton.__version__}"
    specs = [e["spec"] for e in doc["specs"] if tag in e["tags"]]
    return specs, None if specs else f"{path.name} has no entry for {tag}"


def save_specs(path: Path, tag: str, specs: list[dict]) -> int:
    """Adds specs (met at tag) to the manifest at path, one entry a specialization with the union of
    its tags; returns how many were new. One entry a line, sorted, so a manifest diffs well."""
    import triton

    entries: dict[str, set[str]] = {}
    if path.is_file():
        doc = json.loads(path.read_text())
        if doc.get("triton") == triton.__version__:  # another version's entries would not compile alike
            entries = {spec_id(e["spec"]): set(e["tags"]) for e in doc["specs"]}
    new = 0
    for s in specs:
        tags = entries.setdefault(spec_id(s), set())
        new += not tags
        tags.add(tag)
    write_manifest(
        path,
        triton.__version__,
        [{"tags": sorted(t), "spec": json.loads(k)} for k, t in sorted(entries.items())],
    )
    return new


def write_manifest(path: Path, version: str, entries: list[dict]) -> None:
    lines = [json.dumps(e, sort_keys=True) for e in entries]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'{{"triton": "{version}", "specs": [\n' + ",\n".join(lines) + "\n]}\n")


def spec_kernel(spec: dict):
    """The kernel a recorded specialization is of; a ValueError (or the import's error) when the
    entry no longer matches it: a manifest older than the kernels, which compiling would get wrong."""
    module, _, name = spec["name"].rpartition(".")
    fn = getattr(importlib.import_module(module), name)
    recorded = spec["signature"]
    unknown = set(recorded) - set(fn.arg_names)
    if unknown:
        raise ValueError(f"{spec['name']} has no parameter {', '.join(sorted(unknown))}")
    missing = [a for a in fn.arg_names if a not in recorded]
    if missing:
        raise ValueError(f"{spec['name']}'s entry lacks its parameter {', '.join(missing)}")
    return fn


def prune_specs(path: Path) -> list[str]:
    """Drops the entries of the manifest at path that no longer match their kernels (no GPU needed);
    returns why each went. Those specializations then compile at first use until recorded again."""
    doc = json.loads(path.read_text())
    kept, gone = [], []
    for e in doc["specs"]:
        try:
            spec_kernel(e["spec"])
        except (ImportError, AttributeError, ValueError) as err:
            gone.append(f"{e['spec']['name']}: {type(err).__name__}: {err}")
            continue
        kept.append(e)
    write_manifest(path, doc["triton"], kept)
    return gone


def compile_spec(spec: dict, target: GPUTarget):
    """Compiles one recorded specialization for target into Triton's disk cache, as the kernel's own
    launch would (JITFunction.preload's reading of the fields, then triton.compile with the same
    source, target and options, so the cache key is the one the launch computes). Needs no GPU."""
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import convert_to_tuple_if_list

    fn = spec_kernel(spec)
    constexprs = {
        tuple(k): tl.dtype(v)
        if tl.dtype.is_dtype(v)
        else tl.constexpr(v["constexpr"])
        if isinstance(v, dict) and "constexpr" in v
        else v
        for k, v in zip(spec["constant_keys"], spec["constant_vals"], strict=True)
    }
    attrs = {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"], strict=True)}
    # In the parameters' order, not the manifest's (sorted) one: the cache key sorts the signature,
    # but the launcher's C source takes the arguments in the signature's order, so a launcher built
    # from sorted names would be another file, never the one the launch loads (2026-12-03, H200: 27
    # launchers built again at the first launches of a precompiled tiny model)
    signature = {a: convert_to_tuple_if_list(spec["signature"][a]) for a in fn.arg_names}
    options = {
        k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items() if k not in LOCAL
    }
    options = make_backend(target).parse_options(options)
    return triton.compile(
        ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__
    )


def compile_one(spec: dict, target: GPUTarget, launcher: bool) -> str | None:
    """Compiles one entry (and builds its launcher, which links against the CUDA driver) into the disk
    cache: None, or why it failed, in one line. A stale or broken entry's kernel compiles at launch."""
    try:
        kernel = compile_spec(spec, target)
        if launcher:
            from triton.runtime import driver

            driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception as e:  # noqa: BLE001
        # any compile failure: counted, kept and warned of in Precompile.wait()
        return _failure(spec, e)
    return None


def _failure(spec: dict, e: BaseException) -> str:
    """A failed entry in one line: its kernel, the exception's type and its first line."""
    first = str(e).splitlines()[0] if str(e) else ""
    return f"{spec.get('name')}: {type(e).__name__}: {first}"


@dataclass
class PrecompileStats:
    specs: int  # entries for this model
    compiled: int = 0  # compiled, or found in the disk cache already
    failed: int = 0
    seconds: float = 0.0  # from the start to the wait's end
    waited: float = 0.0  # of those, seconds the engine's start-up waited for the threads
    reason: str | None = None  # why nothing was compiled
    errors: list[str] = field(default_factory=list)
    workers: str = "threads"  # WORKER_KINDS

    def info(self) -> dict[str, object]:
        return asdict(self) | {"seconds": round(self.seconds, 2), "waited": round(self.waited, 2)}


class Precompile:
    """Compiles specs from construction, on daemon threads or (processes=True) a pool of spawned
    processes; wait() returns the stats."""

    def __init__(
        self,
        specs: list[dict],
        target: GPUTarget,
        threads: int | None = None,  # workers (threads or processes): default, one a core but one
        reason: str | None = None,
        launchers: bool = False,  # also build each kernel's launcher (links against the CUDA driver)
        processes: bool = False,
    ):
        import multiprocessing

        # a daemonic process (a gptoss.dp_engine replica) may not start children: threads there
        processes = processes and not multiprocessing.current_process().daemon
        self.stats = PrecompileStats(len(specs), reason=reason, workers=WORKER_KINDS[processes])
        self._launchers = launchers
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        n = min(len(specs), threads or max(1, len(os.sched_getaffinity(0)) - 1))
        self._pool = None
        self._futures = []
        self._threads = []
        if processes and n:
            import weakref
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
            self._futures = [(s, self._pool.submit(compile_one, s, target, launchers)) for s in specs]
            # a start-up that fails before wait() drops the entries not begun (each running compile
            # ends in seconds; Triton writes each cache entry by rename, so none is left half written)
            weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)
            return
        self._todo: queue.SimpleQueue[dict] = queue.SimpleQueue()
        for s in specs:
            self._todo.put(s)
        self._threads = [
            threading.Thread(target=self._work, args=(target,), name=f"precompile-{i}", daemon=True)
            for i in range(n)
        ]
        for t in self._threads:
            t.start()

    @classmethod
    def for_model(cls, cfg: ModelConfig, folder: Path = SPECS_DIR, threads: int | None = None) -> Precompile:
        """The manifest's entries for this GPU (the current CUDA device) and cfg's shapes."""
        from triton.runtime import driver

        target = driver.active.get_current_target()
        specs, reason = load_specs(manifest_path(target, folder), model_tag(cfg))
        return cls(specs, target, threads, reason, launchers=True, processes=WORKERS == "processes")

    def _work(self, target: GPUTarget) -> None:
        while True:
            try:
                spec = self._todo.get_nowait()
            except queue.Empty:
                return
            self._count(compile_one(spec, target, self._launchers))

    def _count(self, error: str | None) -> None:
        with self._lock:
            if error is None:
                self.stats.compiled += 1
                return
            self.stats.failed += 1
            if len(self.stats.errors) < MAX_ERRORS:
                self.stats.errors.append(error)

    def wait(self) -> PrecompileStats:
        w0 = time.perf_counter()
        for t in self._threads:
            t.join()
        if self._pool is not None:
            from concurrent.futures.process import BrokenProcessPool

            for spec, f in self._futures:
                try:
                    self._count(f.result())  # compile_one returns each compile's failure itself
                except BrokenProcessPool as e:  # a worker died (killed, out of memory): its entries
                    self._count(_failure(spec, e))  # counted and warned of as failures
            self._pool.shutdown()
        now = time.perf_counter()
        self.stats.waited, self.stats.seconds = now - w0, now - self._t0
        if self.stats.failed:  # counted in engine.info() too; said here, where a run's log shows it
            log.warning(
                "precompile: %d of %d recorded kernel specializations failed and compile at first use "
                "instead (a manifest older than the kernels: record it again with "
                "python -m gptoss.tools.record_specs); first: %s",
                self.stats.failed,
                self.stats.specs,
                self.stats.errors[0],
            )
        return self.stats


class SpecRecorder:
    """Keeps the serialized specialization of each of our kernels that Triton specializes inside the
    block (compiled or loaded from its disk cache: in a new process both pass its post-compile hook).
    Chains the hook that was there, and puts it back on exit."""

    def __init__(self) -> None:
        self.specs: list[dict] = []
        self._prev = None

    def __enter__(self) -> SpecRecorder:
        from triton import knobs

        self._prev = knobs.runtime.jit_post_compile_hook
        knobs.runtime.jit_post_compile_hook = self._after
        return self

    def __exit__(self, *exc: object) -> None:
        from triton import knobs

        knobs.runtime.jit_post_compile_hook = self._prev

    def _after(self, **kw):
        data = kw.get("compile", {}).get("specialization_data")
        if data is not None:
            spec = json.loads(data)
            spec.pop("key", None)  # the launch's binder key: not needed to compile, and long
            for k in LOCAL:
                spec["options"].pop(k, None)
            if spec["name"].startswith(PACKAGE):
                self.specs.append(spec)
        if self._prev:
            return self._prev(**kw)
        return None
