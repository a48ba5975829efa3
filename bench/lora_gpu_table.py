"""bench/gptoss_lora_gpu.py's table, from its results.jsonl rows: the throughput ratios against their
targets, the run_mlperf --backend vllm --lora-modules agreement with ours and its controls, and the
teacher-forced scorings (issue 13)."""

from __future__ import annotations

from bench.agreement import prefix_rate


def table(rows: list[dict]) -> None:
    def get(engine: str, what: str, lora: bool | None = None) -> dict | None:
        hits = [
            r
            for r in rows
            if r["engine"] == engine and r["what"] == what and (lora is None or r.get("lora") == lora)
        ]
        return hits[-1] if hits else None

    def tps(r: dict | None) -> str:
        return f"{r['output_tok_s']:.0f}" if r else "-"

    def ratio(a: dict | None, b: dict | None, target: float) -> str:
        if not (a and b):
            return "-"
        x = a["output_tok_s"] / b["output_tok_s"]
        return f"{x:.2f}x ({'meets' if x >= target else 'misses'} >= {target}x)"

    base, lora = get("gptoss", "offline", False), get("gptoss", "offline", True)
    ours16, vllm16 = get("gptoss", "c16"), get("vllm", "c16")
    g_ours, g_vllm, g_base = get("gptoss", "greedy"), get("vllm", "greedy"), get("gptoss", "greedy_base")
    print(f"\n{'comparison':56} {'a tok/s':>9} {'b tok/s':>9}  a/b")
    for label, a, b, target in (
        ("ours +LoRA (a) vs ours (b), offline", lora, base, 0.8),
        ("ours +LoRA (a) vs vLLM +LoRA (b), concurrency 16", ours16, vllm16, 1.3),
    ):
        label += " " + (a or b or {}).get("spec", "")
        print(f"{label:56} {tps(a):>9} {tps(b):>9}  {ratio(a, b, target)}")
    if vllm16:
        v = vllm16
        print(f"  vLLM {v.get('vllm')}, moe_backend {v.get('moe_backend')}, start {v.get('init_s')} s")
    if g_vllm:
        runs = "runs" if g_vllm.get("tokens") else f"FAILED (exit {g_vllm['exit']}, see mlperf_vllm_lora.log)"
        if g_ours and g_vllm.get("tokens"):
            rate = prefix_rate(g_ours["tokens"], g_vllm["tokens"])
            runs += f", greedy agreement with ours {rate:.1%} (target >= 90%)"
        print(f"run_mlperf --backend vllm --lora-modules: {runs}")
    # The control: an adapter that moves no token would make any two engines "agree", applied or not.
    # So the agreement counts again on the sequences where the adapter changed our tokens.
    for label, a in (("ours +LoRA", g_ours), ("vLLM +LoRA", g_vllm)):
        if a and a.get("tokens") and g_base:
            rate = prefix_rate(a["tokens"], g_base["tokens"])
            print(
                f"control: {label} against ours without the adapter {rate:.1%} (the adapter must move tokens)"
            )
    if g_ours and g_base and g_vllm and g_vllm.get("tokens"):
        pairs = zip(g_ours["tokens"], g_base["tokens"], g_vllm["tokens"], strict=True)
        moved = [(o, v) for o, b, v in pairs if o != b]
        if moved:
            rate = prefix_rate([o for o, _ in moved], [v for _, v in moved])
            n = f"{len(moved)} of {len(g_ours['tokens'])}"
            print(f"control: on the {n} sequences the adapter changed, vLLM +LoRA = ours {rate:.1%}")
        else:
            print("control: the adapter changed none of our sequences, so the agreement says nothing of it")
    for what, label in (
        ("greedy", "our +LoRA tokens, vLLM +LoRA"),
        ("greedy_base", "our base tokens, vLLM +LoRA (control)"),
        ("base_base", "our base tokens, vLLM base (calibration)"),
    ):
        tf = [r for r in rows if r["what"] == "teacher_forced" and r.get("of") == what]
        if tf and "error" in tf[-1]:
            print(f"teacher-forced, {label}: vLLM failed: {tf[-1]['error'][:200]}")
        elif tf:
            t = tf[-1]
            print(
                f"teacher-forced, {label}: vLLM's top-1 at {t['top1']:.1%} of {t['positions']} "
                f"positions, gap to its top-1 median {t['median_gap']:.3f} / p90 {t['p90_gap']:.3f} nats"
            )
