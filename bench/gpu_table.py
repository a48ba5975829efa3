"""The table bench/gptoss_gpu.py prints last: a row a workload, our engine beside vLLM and the ratio,
from the RESULT rows of both (its own run, or results.jsonl files the detached GPU scripts merge)."""

from __future__ import annotations


def table(rows: list[dict]) -> None:
    def key(r: dict) -> str:
        if r["what"] == "batch1_decode":
            return f"batch-1 decode {r['input_len']}->{r['output_len']}"
        if r["what"] == "offline_throughput":
            return f"offline {r['num_prompts']}x({r['input_len']}->{r['output_len']})"
        return r["what"]

    def value(r: dict) -> float | None:
        return {
            "startup": r.get("first_token_s"),
            "batch1_decode": r.get("tok_s_incl_prefill"),
            "offline_throughput": r.get("output_tok_s"),
        }.get(r["what"])

    by: dict[str, dict[str, dict]] = {}
    for r in rows:
        by.setdefault(key(r), {})[r["engine"]] = r
    print(f"\n{'workload':34} {'gptoss':>10} {'vllm':>10} {'ratio':>7}  notes")
    for k, e in by.items():
        ours, theirs = e.get("gptoss"), e.get("vllm")
        if k == "greedy_agreement" and ours:
            print(
                f"{k:34} triton=torch {ours['triton_vs_torch']:.1%}, alone=batched"
                f" {ours['batch_invariance']:.1%}, --batch-invariant {ours['batch_invariance_bi_mode']:.1%}"
                + "".join(
                    f", {f.removesuffix('_vs_torch')} {v:.1%}"
                    for f, v in ours.items()
                    if f.startswith("fault:")
                )
            )
            continue
        a = value(ours) if ours else None
        b = value(theirs) if theirs else None
        ratio = ""
        if a and b:  # start-up: lower is better, so the ratio is theirs / ours
            ratio = f"{(b / a if k == 'startup' else a / b):.2f}x"
        note = f"host {ours['host_ms_per_step']} ms/step" if ours and "host_ms_per_step" in ours else ""
        if ours and ours.get("jit_specializations"):  # a cold Triton cache: compile time inside the figure
            note += f", {ours['jit_specializations']} JIT in timing ({ours['jit_s']} s)"
        if ours and ours.get("warmup"):  # start-up includes the kernel warm-up (gptoss.warmup): its share
            note = f"warm-up {ours['warmup']['seconds']} s, {ours['warmup']['steps']} steps"
        if ours and ours.get("precompile"):  # and the wait for the kernels compiling while it loaded
            pre = ours["precompile"]
            note += (
                f"{', ' if note else ''}precompile {pre['compiled']}/{pre['specs']} "
                f"({pre['failed']} failed) in {pre['seconds']} s, waited {pre['waited']} s"
                + (f" ({pre['reason']})" if pre["reason"] else "")
            )
        if ours and ours.get("startup_s"):  # where the start-up went, phase by phase
            phases = ", ".join(f"{name} {s:.1f}" for name, s in ours["startup_s"].items())
            note += f"{'; ' if note else ''}phases (s): {phases}"
        unit = "s" if k == "startup" else "tok/s"
        print(
            f"{k:34} {a if a is not None else '-':>10} {b if b is not None else '-':>10} {ratio:>7}"
            f"  {unit} {note}"
        )
