"""bench/compile_watch.py counts the Triton specializations made inside a timed block, chains and restores
the hooks it borrows, and bench/gpu_table.py's table flags a row timed with them inside."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("triton")
from triton import knobs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import gpu_table  # noqa: E402
from compile_watch import CompileWatch  # noqa: E402


def _specialize(name: str, compile_s: float = 0.0) -> bool | None:
    """What Triton's JIT does on a cache miss: the pre-hook, the compile, the post-hook."""
    kw = dict(key="k", repr=name, fn=SimpleNamespace(name=name), compile={}, is_manual_warmup=False)
    skip = (
        knobs.runtime.jit_cache_hook(**kw, already_compiled=False) if knobs.runtime.jit_cache_hook else None
    )
    if skip:
        return skip
    time.sleep(compile_s)
    if knobs.runtime.jit_post_compile_hook:
        knobs.runtime.jit_post_compile_hook(**kw, already_compiled=False)
    return skip


def test_it_counts_and_times_what_is_specialized_inside_the_block(monkeypatch):
    seen: list[str] = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(kw["fn"].name))
    before = knobs.runtime.jit_post_compile_hook
    _specialize("outside")
    with CompileWatch() as w:
        assert w.note() == ""
        _specialize("gate_up", 0.02)
        _specialize("down", 0.01)
    _specialize("after")
    assert (w.count, w.names, w.specs) == (2, ["gate_up", "down"], ["gate_up", "down"])
    assert 0.03 <= w.seconds < 1.0
    assert w.note() == f"2 Triton specializations inside the timing ({w.seconds:.1f} s: a cold cache)"
    assert seen == ["outside", "gate_up", "down", "after"]  # the hook that was there still ran, inside too
    assert knobs.runtime.jit_post_compile_hook is before and knobs.runtime.jit_cache_hook is None


def test_a_hook_that_skips_the_compile_is_obeyed(monkeypatch):
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: True)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    with CompileWatch() as w:
        assert _specialize("k") is True
    assert (w.count, w.seconds) == (0, 0.0)


def test_the_table_flags_a_row_timed_with_specializations_inside(capsys):
    rows = [
        {"engine": "gptoss", "what": "offline_throughput", "num_prompts": 8, "input_len": 16, "output_len": 4}
        | {"output_tok_s": 100.0, "host_ms_per_step": 1.5, "jit_specializations": 37, "jit_s": 9.21},
        {"engine": "gptoss", "what": "batch1_decode", "input_len": 16, "output_len": 4}
        | {"tok_s_incl_prefill": 50.0, "host_ms_per_step": 0.2, "jit_specializations": 0, "jit_s": 0.0},
    ]
    gpu_table.table(rows)
    out = capsys.readouterr().out.splitlines()
    offline = next(x for x in out if x.startswith("offline 8x(16->4)"))
    b1 = next(x for x in out if x.startswith("batch-1 decode 16->4"))
    assert offline.endswith("tok/s host 1.5 ms/step, 37 JIT in timing (9.21 s)")
    assert b1.endswith("tok/s host 0.2 ms/step")


def test_the_start_up_row_says_how_long_the_kernel_warm_up_took(capsys):
    rows = [
        {
            "engine": "gptoss",
            "what": "startup",
            "first_token_s": 66.0,
            "warmup": {"seconds": 16.72, "steps": 30},
        },
        {"engine": "vllm", "what": "startup", "first_token_s": 198.0},
    ]
    gpu_table.table(rows)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("startup"))
    assert line.split() == ["startup", "66.0", "198.0", "3.00x", "s", "warm-up", "16.72", "s,", "30", "steps"]
    pre = {"specs": 140, "compiled": 139, "failed": 1, "seconds": 21.4, "waited": 3.05, "reason": None}
    gpu_table.table([{"engine": "gptoss", "what": "startup", "first_token_s": 41.0, "precompile": pre}])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("startup"))
    assert line.endswith("s precompile 139/140 (1 failed) in 21.4 s, waited 3.05 s")
    none = pre | {"specs": 0, "compiled": 0, "failed": 0, "reason": "no manifest cuda-80.json for this GPU"}
    gpu_table.table([{"engine": "gptoss", "what": "startup", "first_token_s": 41.0, "precompile": none}])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("startup"))
    assert line.endswith(
        "precompile 0/0 (0 failed) in 21.4 s, waited 3.05 s (no manifest cuda-80.json for this GPU)"
    )
    gpu_table.table([{"engine": "gptoss", "what": "startup", "first_token_s": 60.0, "warmup": None}])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("startup"))
    assert line.split() == ["startup", "60.0", "-", "s"]
    phases = {"weights": 21.04, "kv_cache": 0.31, "precompile_wait": 0.46, "graphs": 3.2, "warmup": 1.7}
    gpu_table.table(
        [{"engine": "gptoss", "what": "startup", "first_token_s": 44.0, "warmup": None, "startup_s": phases}]
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("startup"))
    assert line.endswith(
        "s phases (s): weights 21.0, kv_cache 0.3, precompile_wait 0.5, graphs 3.2, warmup 1.7"
    )


def test_a_row_names_the_kernels_specialized_in_its_timing(capsys):
    """The warning and the row say which kernels compiled inside a timed block, and the row keeps each
    specialization's repr: what start-up would have to warm for the figure to be a warm one."""
    with CompileWatch() as w:
        for name in ("attn", "gate_up", "attn"):
            kw = dict(key="k", repr=f"{name}[num_warps=4](BM: constexpr=64)", fn=SimpleNamespace(name=name))
            knobs.runtime.jit_post_compile_hook(
                **kw, compile={}, is_manual_warmup=False, already_compiled=False
            )
    fields = w.fields()
    assert fields["jit_specializations"] == 3 and fields["jit_kernels"] == {"attn": 2, "gate_up": 1}
    assert fields["jit_specs"][1] == "gate_up[num_warps=4](BM: constexpr=64)"
    err = capsys.readouterr().err
    assert err.startswith("warning: 3 Triton specializations inside the timing")
    assert err.rstrip().endswith("a warm process times without them: attn x2, gate_up x1")
    with CompileWatch() as quiet:
        pass
    assert quiet.fields() == {
        "jit_specializations": 0,
        "jit_s": 0.0,
        "jit_kernels": {},
        "jit_specs": [],
    }
    assert capsys.readouterr().err == ""


def test_a_specialization_is_described_by_its_constexprs_and_divisibility():
    """Triton 3.6's repr stops at the first argument; the row names every constexpr and which
    arguments were specialized as multiples of 16 (what a warm-up must reproduce)."""
    fn = SimpleNamespace(
        name="attn", jit_function=SimpleNamespace(arg_names=["q_ptr", "n", "BLOCK", "SPLIT"])
    )
    compile = {
        "constants": {(2,): 64, (3,): False},
        "num_warps": 2,
        "num_stages": 3,
    }
    with CompileWatch() as w:
        for div16 in (
            {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]},
            {(0,): [["tt.divisibility", 16]]},
        ):
            knobs.runtime.jit_post_compile_hook(
                key="k",
                repr="attn[num_warps=2](q_ptr: ()",
                fn=fn,
                compile=compile | {"configs": [div16]},
                is_manual_warmup=False,
                already_compiled=False,
            )
    assert w.specs == [
        "attn[warps=2, stages=3](BLOCK=64, SPLIT=False; div16: q_ptr, n)",
        "attn[warps=2, stages=3](BLOCK=64, SPLIT=False; div16: q_ptr)",
    ]
