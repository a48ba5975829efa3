"""The start-up precompile (gptoss.precompile): the manifest's reading and writing, the recorder's hook,
and, compiled for sm_90a on this CPU (no GPU needed), that a recorded specialization lands in Triton's
disk cache under the key its launch computes, while stale entries fail alone and are counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import triton
from triton import knobs

from gptoss.precompile import (
    SPECS_DIR,
    Precompile,
    SpecRecorder,
    load_specs,
    model_tag,
    save_specs,
    spec_kernel,
)
from tests.gptoss.test_engine import make_engine

REPO = Path(__file__).resolve().parents[2]
KERNEL = "gptoss.kernels.l2_prefetch._prefetch_kernel"


def spec(name: str = KERNEL, nt: int = 128) -> dict:
    return {"name": name, "signature": {"ptr": "*u8"}, "constant_keys": [[2]], "constant_vals": [nt]}


def test_the_manifest_keeps_one_entry_a_specialization_with_the_union_of_its_tags(tmp_path):
    path = tmp_path / "specs" / "cuda-90.json"
    assert save_specs(path, "h2880-e32-l24", [spec(nt=128), spec(nt=256), spec(nt=128)]) == 2
    # the same specialization met by another model, with its fields in another order: one entry
    again = dict(reversed(list(spec(nt=256).items())))
    assert save_specs(path, "h2880-e128-l36", [again, spec(nt=512)]) == 1
    doc = json.loads(path.read_text())
    assert doc["triton"] == triton.__version__ == "3.6.0"
    assert [(e["tags"], e["spec"]["constant_vals"]) for e in doc["specs"]] == [
        (["h2880-e32-l24"], [128]),
        (["h2880-e128-l36", "h2880-e32-l24"], [256]),
        (["h2880-e128-l36"], [512]),
    ]
    assert len(path.read_text().splitlines()) == 5  # one entry a line: a manifest diffs well
    specs, why = load_specs(path, "h2880-e32-l24")
    assert ([s["constant_vals"] for s in specs], why) == ([[128], [256]], None)
    assert load_specs(path, "h64-e4-l2") == ([], "cuda-90.json has no entry for h64-e4-l2")
    assert load_specs(tmp_path / "cuda-80.json", "x") == ([], "no manifest cuda-80.json for this GPU")


def test_a_manifest_of_another_triton_is_not_compiled_and_is_replaced_on_record(tmp_path):
    path = tmp_path / "cuda-90.json"
    path.write_text(json.dumps({"triton": "3.5.1", "specs": [{"tags": ["t"], "spec": spec(nt=64)}]}))
    assert load_specs(path, "t") == ([], "cuda-90.json was recorded with Triton 3.5.1, this is 3.6.0")
    assert save_specs(path, "t", [spec(nt=128)]) == 1
    assert [e["spec"]["constant_vals"] for e in json.loads(path.read_text())["specs"]] == [[128]]


def test_the_recorder_keeps_our_kernels_only_and_chains_the_hook_before_it():
    seen = []
    before = knobs.runtime.jit_post_compile_hook

    def prev(**kw):
        seen.append(kw["fn"].name)

    def fire(name: str) -> None:
        data = {**spec(name), "options": {"num_warps": 4, "extern_libs": [["libdevice", "/x/libdevice.bc"]]}}
        knobs.runtime.jit_post_compile_hook(
            key="k",
            repr=name,
            fn=SimpleNamespace(name=name.rpartition(".")[2]),
            compile={"specialization_data": json.dumps({**data, "key": "long binder key"})},
            is_manual_warmup=False,
            already_compiled=False,
        )

    knobs.runtime.jit_post_compile_hook = prev
    try:
        with SpecRecorder() as rec:
            fire(KERNEL)
            fire("triton_kernels.matmul_ogs._matmul")  # vLLM's, say: not ours to record
        assert knobs.runtime.jit_post_compile_hook is prev
    finally:
        knobs.runtime.jit_post_compile_hook = before
    assert seen == ["_prefetch_kernel", "_matmul"]
    # no binder key, and no path of the recording machine's libdevice (the launch uses its own)
    assert rec.specs == [{**spec(), "options": {"num_warps": 4}}]


def test_model_tags_name_the_shapes(tiny_checkpoint):
    from gptoss.checkpoint import load_config

    cfg = load_config(tiny_checkpoint)
    assert model_tag(cfg) == f"h{cfg.hidden_size}-e{cfg.num_local_experts}-l{cfg.num_hidden_layers}"


def test_a_cpu_engine_precompiles_nothing(tiny_checkpoint):
    eng = make_engine(tiny_checkpoint)
    assert eng.config.precompile and eng.runner.precompile is None and eng.info()["precompile"] is None


# Compiled, not interpreted: a process without TRITON_INTERPRET (this session's is set by conftest)
COMPILE = textwrap.dedent(
    """
    import json, os, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import get_full_name, serialize_specialization_data
    from gptoss.kernels.l2_prefetch import _prefetch_kernel as k
    from pathlib import Path
    from triton.backends.nvidia.driver import make_launcher
    from gptoss.precompile import Precompile, compile_spec, load_specs, save_specs

    target = GPUTarget("cuda", 90, 32)
    sig = {"ptr": "*u8", "nbytes": "i32", "NT": "constexpr", "PDL": "constexpr"}
    consts, attrs = {(2,): 128, (3,): True}, {(0,): [["tt.divisibility", 16]]}
    opts = make_backend(target).parse_options({"num_warps": 4})
    good = json.loads(serialize_specialization_data(get_full_name(k), sig, consts, attrs, opts, "key"))
    del good["key"], good["options"]["extern_libs"]  # as SpecRecorder keeps it
    cache = os.environ["TRITON_CACHE_DIR"]
    manifest = Path(cache).parent / "m.json"
    save_specs(manifest, "t", [good])  # through a manifest, which sorts each entry's fields
    [good], _ = load_specs(manifest, "t")
    pre = compile_spec(good, target)
    out = {"hash": pre.hash, "entries": len(os.listdir(cache))}
    # what the kernel's launch compiles: the same source, target and options
    launch = triton.compile(ASTSource(k, sig, consts, attrs), target=target, options=opts.__dict__)
    out["launch_hash"] = launch.hash
    # and the launcher (C source, one .so in the cache) each builds: the same file
    src = [make_launcher(c.src.constants, c.src.signature, None) for c in (pre, launch)]
    out["same_launcher"] = src[0] == src[1]
    out["entries_after_launch"] = len(os.listdir(cache))
    stale = json.loads(json.dumps(good))
    stale["signature"] = {"base": "*u8", **{a: t for a, t in sig.items() if a != "ptr"}}
    gone = {**good, "name": "gptoss.kernels.l2_prefetch._gone_kernel"}
    short = json.loads(json.dumps(good))
    del short["signature"]["nbytes"]
    other = json.loads(json.dumps(good))
    other["constant_vals"] = [256, False]
    stats = Precompile([good, stale, gone, short, other], target, threads=2).wait()
    out["stats"] = [stats.specs, stats.compiled, stats.failed, sorted(stats.errors)]
    out["entries_at_end"] = len(os.listdir(cache))
    # the same entries compiled by spawned processes into another cache: the same files, one failure
    cache2 = Path(cache).parent / "cache2"
    os.environ["TRITON_CACHE_DIR"] = str(cache2)  # the workers' (spawned with this environment)
    stats = Precompile([good, stale, other], target, threads=2, processes=True).wait()
    out["procs"] = [stats.workers, stats.specs, stats.compiled, stats.failed, stats.errors]
    out["procs_same_entries"] = sorted(os.listdir(cache2)) == sorted(os.listdir(cache))
    print(json.dumps(out))
    """
)


def test_a_recorded_specialization_compiles_into_the_cache_entry_its_launch_reads(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["hash"] == out["launch_hash"]  # the launch finds the precompiled entry: no compile
    assert out["entries"] == out["entries_after_launch"] == 1
    assert out["same_launcher"]  # nor a launcher to build
    assert out["stats"] == [
        5,
        2,
        3,
        [
            "gptoss.kernels.l2_prefetch._gone_kernel: AttributeError: module "
            "'gptoss.kernels.l2_prefetch' has no attribute '_gone_kernel'",
            "gptoss.kernels.l2_prefetch._prefetch_kernel: ValueError: "
            "gptoss.kernels.l2_prefetch._prefetch_kernel has no parameter base",
            "gptoss.kernels.l2_prefetch._prefetch_kernel: ValueError: "
            "gptoss.kernels.l2_prefetch._prefetch_kernel's entry lacks its parameter nbytes",
        ],
    ]
    assert out["entries_at_end"] == 2  # the good one (already there) and the other constexprs
    # GPTOSS_PRECOMPILE_WORKERS=processes: the same cache entries (so the launch finds them), and the
    # stale entry counted with its reason as on threads
    assert out["procs"] == [
        "processes",
        3,
        2,
        1,
        [
            "gptoss.kernels.l2_prefetch._prefetch_kernel: ValueError: "
            "gptoss.kernels.l2_prefetch._prefetch_kernel has no parameter base"
        ],
    ]
    assert out["procs_same_entries"]
    # the failures are said on stderr, not only counted
    warned = [x for x in run.stderr.splitlines() if x.startswith("precompile:")]
    assert len(warned) == 2 and warned[0].startswith(
        "precompile: 3 of 5 recorded kernel specializations failed and compile at first use instead"
    )
    assert warned[1].startswith("precompile: 1 of 3 recorded kernel specializations failed")


def test_a_daemonic_process_precompiles_on_threads_as_it_may_not_start_children():
    """gptoss.dp_engine's replicas are daemonic processes: processes=True falls back to threads there
    (a pool would fail at its first submit: daemonic processes are not allowed to have children)."""
    import multiprocessing

    from triton.backends.compiler import GPUTarget

    gone = spec(name="gptoss.kernels.l2_prefetch._gone_kernel")  # fails at once, before any compile
    ctx = multiprocessing.get_context("fork")
    got = ctx.Queue()

    def start() -> None:
        st = Precompile([gone], GPUTarget("cuda", 90, 32), threads=1, processes=True).wait()
        got.put([st.workers, st.specs, st.compiled, st.failed])

    child = ctx.Process(target=start, daemon=True)
    child.start()
    child.join(120)
    assert child.exitcode == 0 and got.get(timeout=5) == ["threads", 1, 0, 1]


def test_the_precompile_workers_switch_takes_threads_or_processes_only():
    from gptoss.precompile import workers_from_env

    assert [workers_from_env(v) for v in (None, "", "threads", "processes")] == ["threads"] * 3 + [
        "processes"
    ]
    with pytest.raises(
        ValueError, match="GPTOSS_PRECOMPILE_WORKERS must be threads or processes, got 'procs'"
    ):
        workers_from_env("procs")


def test_record_specs_without_a_gpu_says_so_and_writes_nothing(tiny_checkpoint, tmp_path, capsys):
    from gptoss.tools import record_specs

    out = tmp_path / "m.json"
    assert record_specs.main(["--model-path", str(tiny_checkpoint), "--out", str(out)]) == 2
    assert capsys.readouterr().err == "record_specs: no CUDA device; the manifest lists what a GPU compiles\n"
    assert not out.exists()


def test_record_specs_passes_the_engines_default_sequence_count_to_each_recording():
    """Unset, --max-num-seqs is EngineConfig's default (256), which each recording's command line
    carries as a number (a recording once got the field's descriptor as text and failed to parse)."""
    from gptoss.engine_config import EngineConfig
    from gptoss.tools import record_specs

    args = record_specs.build_parser().parse_args(["--model-path", "ck"])
    assert args.max_num_seqs == EngineConfig().max_num_seqs == 256
    argv = record_specs.child_argv(args, 4096)
    assert argv[argv.index("--max-num-seqs") + 1] == "256"


def test_record_specs_samples_a_quarter_with_top_p_and_a_quarter_with_top_k():
    from gptoss.tools import record_specs

    got = record_specs.recording_params(8, 5)
    kinds = [(p.temperature, p.top_k, p.top_p) for p in got]
    assert kinds == [(0.0, 0, 1.0), (1.0, 0, 0.9), (0.0, 0, 1.0), (1.0, 20, 0.9)] * 2
    assert {p.max_new_tokens for p in got} == {5} and all(p.ignore_eos for p in got)
    assert [p.seed for p in got if p.temperature > 0] == [1, 3, 5, 7]


def test_record_specs_records_each_key_bound_in_its_own_process_and_says_which_failed(tmp_path, capsys):
    """The decode attention's split count follows --max-model-len, so the default records at two; a
    recording that fails is named with its exit status, and the tool exits with it."""
    import argparse
    import subprocess

    from gptoss.tools import record_specs

    args = argparse.Namespace(
        model_path=tmp_path / "ck", out=None, max_num_seqs=1024, prompts=256, max_tokens=32, max_model_len=[]
    )
    args.max_model_len = record_specs.LENGTHS
    ran = []

    def run(argv):  # the 8192 recording fails (its GPU went away, say)
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 3 if argv[-1] == "8192" else 0)

    assert record_specs.record_each(args, run=run) == 3
    assert [a[1:3] + a[4:] for a in ran] == [
        [
            "-m",
            "gptoss.tools.record_specs",
            str(tmp_path / "ck"),
            "--max-num-seqs",
            "1024",
            "--prompts",
            "256",
            "--max-tokens",
            "32",
            "--max-model-len",
            n,
        ]
        for n in ("4096", "8192")
    ]
    assert capsys.readouterr().err == "record_specs: the recording at --max-model-len 8192 failed (exit 3)\n"
    args.out = tmp_path / "m.json"
    assert record_specs.record_each(args, run=lambda a: subprocess.CompletedProcess(a, 0)) == 0
    assert record_specs.child_argv(args, 4096)[5:7] == ["--out", str(tmp_path / "m.json")]


def test_the_committed_manifests_match_the_kernels_and_the_pinned_triton():
    """A kernel whose parameters change, or a Triton bump, leaves the committed manifest stale: its
    entries would fail (or be skipped) at every start-up. Caught here, on CPU."""
    paths = sorted(SPECS_DIR.glob("*.json"))
    assert [p.name for p in paths] == ["cuda-90.json"]
    for path in paths:
        doc = json.loads(path.read_text())
        assert doc["triton"] == triton.__version__, f"{path.name}: record it again with this Triton"
        tags = set()
        for e in doc["specs"]:
            spec_kernel(e["spec"])  # raises, naming the kernel: record again, or --prune
            tags.update(e["tags"])
        assert tags == {"h2880-e32-l24", "h2880-e128-l36"}  # gpt-oss-20b's and 120b's shapes


def test_prune_drops_only_the_entries_that_no_longer_match_their_kernels(tmp_path, capsys):
    from gptoss.tools import record_specs

    good = spec() | {"signature": {"ptr": "*u8", "nbytes": "i32", "NT": "constexpr", "PDL": "constexpr"}}
    renamed = good | {"signature": {"base": "*u8", "nbytes": "i32", "NT": "constexpr", "PDL": "constexpr"}}
    path = tmp_path / "cuda-90.json"
    save_specs(path, "t", [good, renamed, spec(name="gptoss.kernels.l2_prefetch._gone_kernel"), spec()])
    assert record_specs.main(["--prune", "--out", str(path)]) == 0
    assert load_specs(path, "t") == ([good], None)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: 3 entries dropped"
    assert sorted(out[1:]) == [
        "  gptoss.kernels.l2_prefetch._gone_kernel: AttributeError: module 'gptoss.kernels.l2_prefetch' "
        "has no attribute '_gone_kernel'",
        f"  {KERNEL}: ValueError: {KERNEL} has no parameter base",
        f"  {KERNEL}: ValueError: {KERNEL}'s entry lacks its parameter nbytes, NT, PDL",
    ]
