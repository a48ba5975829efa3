"""One run, start to end: dataset, settings, backend, LoadGen, summary, evaluation, run.json,
queries.parquet (and the report with --report)."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import mlperf_loadgen as lg
from rich.console import Console

import backends
from backends.base import Backend
from data.checksums import sha256
from harness.config import VOCAB_SIZE, RunConfig, SamplingParams
from harness.dataset import Dataset, check_model_limits, load_dataset, model_limits
from harness.interrupt import InterruptWatcher
from harness.loop import LoopThread, shared_loop
from harness.progress import Progress
from harness.queries import FILE_NAME as QUERIES_FILE
from harness.record import config_dict, environment, write_json
from harness.report import print_failures, print_summary, read_detail, summarize
from harness.settings import build_log_settings, build_test_settings, describe
from harness.sut import SUT
from harness.warmup import warm_up

EXIT_OK = 0
EXIT_FAILED_QUERIES = 1  # some queries failed (backend error, timeout): see the failure report
EXIT_ACCURACY_FAILED = 1  # accuracy FAIL: the exit code of `python -m evaluation` for the same log
EXIT_USAGE = 2  # bad flags, conf file, dataset or backend setup; nothing was run
EXIT_INVALID = 3  # the run completed but LoadGen's result is INVALID
EXIT_COMPLIANCE = 4  # the compliance test's verification failed


class RunError(RuntimeError):
    """A run that cannot start (an unusable output directory ...) or be scored; exit code 2."""


def sample_params(base: SamplingParams, dataset: Dataset) -> list[SamplingParams]:
    """Per-sample SamplingParams: a row's max_output_len (capped at max_new_tokens) is generated
    in full with ignore_eos, so random-weight models give MLPerf-like output lengths."""
    if dataset.output_lens is None:
        return [base] * len(dataset)
    cache: dict[int, SamplingParams] = {}
    out = []
    for n in dataset.output_lens:
        n = min(n, base.max_new_tokens)
        if n not in cache:
            cache[n] = replace(base, max_new_tokens=n, ignore_eos=True)
        out.append(cache[n])
    return out


def _resolve_model_path(cfg: RunConfig, backend: type[Backend]) -> RunConfig:
    if cfg.model_path is not None:
        return cfg
    try:
        path = backend.default_model_path()
    except OSError as e:
        raise RunError(f"no --model-path, and the {backend.name} backend's default checkpoint: {e}") from None
    if path is None:
        return cfg
    note = f"--model-path not given: using the {backend.name} backend's default checkpoint at {path}"
    return replace(cfg, model_path=path, notes=(*cfg.notes, note))


# What a run writes into its log directory (LoadGen's logs, ours, evaluation's, compliance's); a
# previous run's copies are deleted before a run starts, so no file mixes two runs.
OWNED_FILES = (
    "mlperf_log_summary.txt",
    "mlperf_log_detail.txt",
    "mlperf_log_accuracy.json",
    "mlperf_log_trace.json",
    "run.json",
    "accuracy.json",
    "audit.config",
    "verify_accuracy.txt",
    "verify_output_len.txt",
    "accuracy_result.json",
    "vllm_server.log",  # --backend vllm --vllm-process server (backends/vllm_server.py)
    QUERIES_FILE,
)
OWNED_DIRS = ("report",)  # --report
OWNED_COMPLIANCE_DIRS = ("accuracy", "performance")  # evaluation.compliance.copy_logs


def _check_output_dir(cfg: RunConfig) -> None:
    """The log directory can be made and written, or one line says why (before anything runs, and
    without making it: a run that fails its checks leaves nothing behind)."""
    import tempfile

    existing = cfg.log_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RunError(
            f"--output-dir {cfg.output_dir}: {existing} is a file, not a directory; choose another "
            "--output-dir"
        )
    try:
        with tempfile.TemporaryFile(dir=existing):  # the real test of writable (root, read-only mounts)
            pass
    except OSError as e:
        raise RunError(
            f"--output-dir {cfg.output_dir}: cannot write to {existing} ({e.strerror or e}); "
            "choose another --output-dir"
        ) from None


def _clear_previous_run(cfg: RunConfig) -> list[str]:
    """Delete what an earlier run left in this run's log directory; return the names deleted."""
    import shutil

    try:
        cfg.log_dir.mkdir(parents=True, exist_ok=True)
        gone = []
        for name in OWNED_FILES:
            if (cfg.log_dir / name).is_file():
                (cfg.log_dir / name).unlink()
                gone.append(name)
        for name in (*OWNED_DIRS, *(OWNED_COMPLIANCE_DIRS if cfg.compliance else ())):
            if (cfg.log_dir / name).is_dir():
                shutil.rmtree(cfg.log_dir / name)
                gone.append(name + "/")
    except OSError as e:
        raise RunError(f"--output-dir {cfg.output_dir}: {e}; choose another --output-dir") from None
    return gone


def _evaluate(dataset: Dataset, log_dir: Path, console: Console) -> dict[str, Any] | None:
    from evaluation import evaluate_run
    from evaluation.accuracy_log import AccuracyLogError
    from evaluation.graders import GroundTruthError
    from evaluation.lcb_tests import LcbTestsError
    from evaluation.reference import DatasetError as ReferenceError

    if not dataset.has_ground_truth:
        console.print("[yellow]accuracy not scored:[/] the dataset has no 'ground_truth' column")
        return None
    out = log_dir / "accuracy.json"
    try:
        result = evaluate_run(log_dir / "mlperf_log_accuracy.json", dataset.path, out)
    except (AccuracyLogError, ReferenceError, GroundTruthError, LcbTestsError) as e:
        raise RunError(f"accuracy not scored: {e}") from None
    console.print(f"accuracy results: {out}")
    return result


@dataclass(slots=True)
class Run:
    """What one run carries from its checks to its end; run.json is `record`, rewritten as it goes."""

    cfg: RunConfig
    console: Console
    dataset: Dataset
    settings: lg.TestSettings
    params: list[SamplingParams]
    compliance: Any  # evaluation.compliance, for --compliance runs
    audit: str  # the audit.config LoadGen reads ("" for none)
    record: dict[str, Any]

    @property
    def run_json(self) -> Path:
        return self.cfg.log_dir / "run.json"

    def save(self, **fields: Any) -> None:
        self.record.update(fields)
        write_json(self.run_json, self.record)


def run(cfg: RunConfig, console: Console | None = None) -> int:
    """Run one LoadGen test for `cfg`; returns the process exit code (EXIT_*)."""
    r = prepare(cfg, console or Console(highlight=False))
    try:
        sut, signum = _with_backend(r)
    except BaseException as e:
        r.save(status="error", error=f"{type(e).__name__}: {e}")
        raise
    return finish(r, sut, signum)


def prepare(cfg: RunConfig, console: Console) -> Run:
    """Every check that needs no backend, so a bad flag, conf or dataset fails in seconds."""
    for text in cfg.notes:
        console.print(f"[cyan]note:[/] {text}", soft_wrap=True)
    _check_output_dir(cfg)
    dataset = load_dataset(cfg.input_file, max_samples=cfg.max_samples)
    settings = build_test_settings(cfg, len(dataset))
    if cfg.compliance:
        from evaluation import compliance
    else:
        compliance = None
    backends.check_installed(cfg.backend)
    resolved = _resolve_model_path(cfg, backends.backend_class(cfg.backend))
    for text in resolved.notes[len(cfg.notes) :]:
        console.print(f"[cyan]note:[/] {text}", soft_wrap=True)
    cfg = resolved
    # What the checkpoint says, before a slow start; the started backend's own limits are checked again.
    max_len, vocab = model_limits(cfg.model_path)
    if max_len or vocab:
        check_model_limits(dataset, max_model_len=max_len or sys.maxsize, vocab_size=vocab or VOCAB_SIZE)

    if cleared := _clear_previous_run(cfg):
        console.print(
            f"[cyan]note:[/] {cfg.log_dir} held a previous run's files; deleted them: {', '.join(cleared)}",
            soft_wrap=True,
        )
    audit = str(compliance.write_audit_config(cfg.compliance, cfg.log_dir)) if compliance else ""
    record: dict[str, Any] = {
        "status": "starting",
        **environment(cfg),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": config_dict(cfg),
        "dataset": {"path": str(dataset.path), "rows": len(dataset), "sha256": sha256(dataset.path)},
        "loadgen_settings": describe(settings),
        "audit_config": audit or None,
        "cleared_previous_run": cleared,
    }
    r = Run(
        cfg,
        console,
        dataset,
        settings,
        sample_params(cfg.sampling, dataset),
        compliance,
        audit,
        record,
    )
    r.save()
    return r


def _with_backend(r: Run) -> tuple[SUT, int | None]:
    loop = shared_loop()
    r.console.print(f"starting backend '{r.cfg.backend}' ...")
    backend: Backend = loop.run(backends.module(r.cfg.backend).create(r.cfg).__aenter__())
    try:
        attach(r, backend)
        warm_up(r, backend, loop)
        return run_loadgen(r, backend, loop)
    finally:
        loop.run(backend.__aexit__(None, None, None))


def attach(r: Run, backend: Backend) -> None:
    """The started backend's own limits against the dataset, and its description in run.json."""
    r.record["backend"] = backend.describe()
    if backend.max_model_len is not None or backend.vocab_size is not None:
        check_model_limits(
            r.dataset,
            max_model_len=backend.max_model_len or sys.maxsize,
            vocab_size=backend.vocab_size or VOCAB_SIZE,
        )
    r.save(status="running")


def run_loadgen(r: Run, backend: Backend, loop: LoopThread) -> tuple[SUT, int | None]:
    cfg = r.cfg
    sut = SUT(
        backend,
        r.dataset,
        r.params,
        first_token=cfg.scenario != "offline",
        loop=loop.loop,
        timeout_s=cfg.timeout_s,
    )
    qsl = lg.ConstructQSL(len(r.dataset), len(r.dataset), _noop, _noop)
    progress = Progress(loop, sut, f"{cfg.scenario}{' accuracy' if cfg.accuracy else ''}")

    def on_interrupt(signum: int) -> None:
        name = signal.Signals(signum).name
        r.console.print(
            f"\n[bold yellow]{name}:[/] cancelling {sut.outstanding} outstanding queries; waiting up to "
            f"{cfg.interrupt_grace_s:g} s for LoadGen to finish its logs (press Ctrl-C again to quit now)",
            soft_wrap=True,
        )
        sut.interrupt(f"interrupted by {name}")

    def on_give_up(signum: int) -> None:
        # Loop thread, while StartTest still blocks the main thread: LoadGen cannot be aborted,
        # so write our own outputs and leave without it.
        progress.close()
        print_failures(r.console, sut.failures, sut.failed_examples, sut.completed)
        _write_queries(r, sut)
        r.save(
            status="interrupted",
            exit_code=128 + signum,
            note="LoadGen was still running its schedule: its logs for this run are incomplete",
            **_counts(sut),
        )
        r.console.print(f"[bold red]exiting without LoadGen's final logs[/]; our record: {r.run_json}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)

    watcher = InterruptWatcher(loop, on_interrupt, on_give_up, cfg.interrupt_grace_s)
    try:
        with watcher, progress:
            lg.StartTestWithLogSettings(sut.handle, qsl, r.settings, build_log_settings(cfg.log_dir), r.audit)
    finally:
        lg.DestroyQSL(qsl)
        sut.destroy()
    return sut, watcher.signum


def finish(r: Run, sut: SUT, signum: int | None) -> int:
    """Summary, failure report, evaluation / compliance verification, run.json; the exit code."""
    cfg, console = r.cfg, r.console
    result = summarize(
        read_detail(cfg.log_dir),
        scenario=cfg.loadgen_scenario,
        accuracy=cfg.accuracy,
        ttft_limit_ns=r.settings.ttft_latency,
        tpot_limit_ns=r.settings.tpot_latency,
    )
    print_summary(
        console,
        result,
        completed=sut.completed,
        output_tokens=sut.output_tokens,
        failed=sut.failed,
        log_dir=cfg.log_dir,
    )
    print_failures(console, sut.failures, sut.failed_examples, sut.completed)
    _write_queries(r, sut)
    r.record.update(result=result.to_dict(), **_counts(sut))

    code = EXIT_OK
    if signum is not None:
        code = 128 + signum
        console.print(
            f"[bold red]interrupted[/] ({signal.Signals(signum).name}): the results above are partial"
        )
    else:
        accuracy_failed = not_scored = False
        if cfg.accuracy:
            try:
                evaluation = _evaluate(r.dataset, cfg.log_dir, console)
            except RunError as e:
                console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
                evaluation, not_scored = {"error": str(e)}, True
            r.record["evaluation"] = evaluation
            accuracy_failed = evaluation is not None and not evaluation.get("passed", False)
        if r.compliance is not None:
            # TEST07 grades the outputs against the run's own dataset (the GPQA compliance file)
            passed = bool(r.compliance.verify(cfg.compliance, cfg.log_dir, dataset=r.dataset.path))
            r.record["compliance"] = {"test": cfg.compliance, "passed": passed}
            console.print(f"{cfg.compliance}: " + ("[bold green]PASS[/]" if passed else "[bold red]FAIL[/]"))
            code = code if passed else EXIT_COMPLIANCE
        if result.validity == "INVALID":
            code = EXIT_INVALID
        if sut.failed:
            code = EXIT_FAILED_QUERIES
        elif accuracy_failed:
            code = EXIT_ACCURACY_FAILED
        if not_scored:
            code = EXIT_USAGE  # as `python -m evaluation` for inputs it cannot score
    r.save(
        status="interrupted" if signum is not None else "finished",
        exit_code=code,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    if cfg.report:
        _make_report(r)
    return code


def _write_queries(r: Run, sut: SUT) -> None:
    if sut.records is not None:
        r.record["queries_file"] = str(sut.records.write(r.cfg.log_dir))


def _make_report(r: Run) -> None:
    from harness.report.build import make_report

    path = make_report([r.cfg.log_dir], r.cfg.log_dir / "report")
    r.console.print(f"report: {path}")


def _counts(sut: SUT) -> dict[str, Any]:
    return {
        "queries": {"issued": sut.issued, "completed": sut.completed, "output_tokens": sut.output_tokens},
        "failures": {
            "count": sut.failed,
            "reasons": dict(sut.failures),
            "examples_qsl_idx": sut.failed_examples,
        },
    }


def _noop(_: list[int]) -> None:
    pass  # samples live in memory for the whole run: nothing to load or unload
