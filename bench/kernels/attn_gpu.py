"""GPU timings of our paged attention (decode, prefill) next to vLLM's FA3 with sinks, gpt-oss shapes.

    python bench/kernels/attn_gpu.py            (CUDA only; Hq 64, Hkv 8, D 64, bf16, block size 16)

Each row: kernel ("attn-decode" | "attn-prefill"), case, ours_us, vllm_us (FA3 through
vllm.vllm_flash_attn as vLLM's FlashAttention backend calls it for gpt-oss; None when it is
missing or fails, with the reason printed), ratio = ours_us / vllm_us (< 1: ours is faster),
hbm_frac (decode: (K + V bytes read + q and out bytes) / ours_us / a copy's bandwidth, hbm.py;
None for prefill) and
tflops (prefill: causal QK^T + PV FLOPs / ours_us). Times are the median of CUDA-graph replays of 20
back-to-back calls (GPU time, no host launch cost, as the engine runs them; L2 stays warm across the 20
calls, so hbm_frac can pass 1 where a case's K and V fit in L2; a case whose capture fails falls back to
do_bench, flagged on stderr), in microseconds per call.

Decode: every sequence at the same context; ours reads a sliding layer's ring (min(ctx + 1, 128)
keys) and a full layer's block table (ctx + 1 keys), the new token from k_new. FA3 has no ring
and reads the new token from its cache, so it gets a block table over ctx + 1 positions (the new
token written there) and window_size (127, 0) for sliding. Prefill: one sequence, no context.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hbm import share  # noqa: E402
from timing import peer_failed, timed_us  # noqa: E402

from gptoss.kernels.attention import paged_attention  # noqa: E402
from gptoss.kernels.kv_write import write_kv  # noqa: E402
from gptoss.kv_dtype import quantize  # noqa: E402

HQ, HKV, D, BS, WINDOW = 64, 8, 64, 16, 128
RING = triton.cdiv(WINDOW, BS)
SCALE = D**-0.5
BF16 = torch.bfloat16


def _fa3() -> Callable | None:
    try:
        from vllm.vllm_flash_attn import fa_version_unsupported_reason, flash_attn_varlen_func
    except ImportError as e:  # the peer is optional: our numbers still print
        peer_failed("FA3 peer unavailable", e)
        return None
    reason = fa_version_unsupported_reason(3)
    if reason:
        peer_failed("FA3 peer unavailable", reason)
        return None
    return flash_attn_varlen_func


def _peer_us(fn: Callable[[], object] | None, what: str) -> float | None:
    if fn is None:
        return None
    try:
        return timed_us(fn, f"{what} FA3")
    except Exception as e:  # noqa: BLE001 - whatever the peer raises is counted, ours still timed
        peer_failed(f"{what} FA3", e)
        return None


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=BF16)


def _row(
    kernel: str, case: str, ours: float, peer: float | None, nbytes: int | None, flops: float | None
) -> dict:
    return {
        "kernel": kernel,
        "case": case,
        "ours_us": round(ours, 2),
        "vllm_us": None if peer is None else round(peer, 2),
        "ratio": None if not peer else round(ours / peer, 3),
        "hbm_frac": None if nbytes is None else round(share(nbytes, ours), 3),
        "tflops": None if flops is None else round(flops / (ours * 1e-6) / 1e12, 1),
    }


SINK_DTYPE: list[torch.dtype] = []  # the s_aux dtype FA3 took in _fa3_sink_probe


def _fa3_call(
    fa: Callable,
    q,
    kc,
    vc,
    table,
    qs,
    seqused,
    max_q: int,
    max_k: int,
    sinks,
    sliding: bool,
    out: torch.Tensor,
) -> Callable[[], object]:
    s_aux = sinks.to(SINK_DTYPE[0] if SINK_DTYPE else torch.float32)
    return lambda: fa(
        q=q,
        k=kc,
        v=vc,
        out=out,
        cu_seqlens_q=qs,
        max_seqlen_q=max_q,
        seqused_k=seqused,
        max_seqlen_k=max_k,
        softmax_scale=SCALE,
        causal=True,
        window_size=(WINDOW - 1, 0) if sliding else (-1, -1),
        block_table=table,
        fa_version=3,
        s_aux=s_aux,
    )


def _fa3_sink_probe(fa: Callable) -> Callable | None:
    """Our sinks are float32; vLLM builds its sinks in the model dtype. Keep the one FA3 takes."""
    q, kc = _rand(1, HQ, D), _rand(1, BS, HKV, D)
    one = torch.ones(1, device="cuda", dtype=torch.int32)
    qs = torch.tensor([0, 1], device="cuda", dtype=torch.int32)
    for dtype in (torch.float32, BF16):
        SINK_DTYPE[:] = [dtype]
        try:
            _fa3_call(
                fa,
                q,
                kc,
                kc,
                one.view(1, 1) * 0,
                qs,
                one,
                1,
                1,
                torch.zeros(HQ, device="cuda"),
                False,
                torch.empty_like(q),
            )()
            return fa
        except Exception as e:  # noqa: BLE001 - reported; the next dtype, or no peer (counted below)
            print(f"FA3 with {dtype} sinks failed: {type(e).__name__}: {e}", file=sys.stderr)
    peer_failed("FA3 peer unavailable", "no sink dtype it takes")
    return None


def _check(
    what: str, ours: Callable[[], torch.Tensor], peer: Callable[[], object] | None, peer_out: torch.Tensor
) -> None:
    if peer is None:
        return
    try:
        peer()
    except Exception as e:  # noqa: BLE001 - counted: this case has no check against the peer
        peer_failed(f"check {what} FA3", e)
        return
    a, b = ours().double(), peer_out.double()
    rows = (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)  # [T, Hq]
    print(
        f"check {what}: ours vs FA3 rel error {float((a - b).norm() / b.norm()):.2e}, "
        f"max row {float(rows.max()):.2e}"
    )


def decode_case(
    b: int,
    ctx: int,
    sliding: bool,
    fa: Callable | None,
    check: bool = False,
    hint: int | None = None,
    kv_fp8: bool = False,
) -> dict:
    """B sequences at context ctx decode one token each. hint: the key bound the splits follow (the
    engine passes its max_model_len; default ctx). kv_fp8: our caches in float8 e4m3
    (--kv-cache-dtype fp8), a byte a K or V element; no peer then."""
    nblk = ctx // BS + 1  # positions [0, ctx]: FA3 keeps the new token at ctx in its cache
    table = torch.randperm(b * nblk, device="cuda").view(b, nblk).int()  # [B, nblk]
    kc, vc = _rand(b * nblk, BS, HKV, D), _rand(b * nblk, BS, HKV, D)
    q, kn, vn = _rand(b, HQ, D), _rand(b, HKV, D), _rand(b, HKV, D)
    sinks = torch.randn(HQ, device="cuda")
    qs = torch.arange(b + 1, device="cuda", dtype=torch.int32)
    ctx_t = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    write_kv(kn, vn, kc, vc, table[:, ctx // BS].long() * BS + ctx % BS)
    out, peer_out = torch.empty_like(q), torch.empty_like(q)
    if sliding:  # our ring holds the same last R*bs context positions as FA3's table
        rtable = torch.randperm(b * RING, device="cuda").view(b, RING).int()
        rk, rv = torch.zeros_like(kc[: b * RING]), torch.zeros_like(vc[: b * RING])
        p = torch.arange(max(0, ctx - RING * BS), ctx, device="cuda")
        src, dst = table[:, p // BS].long(), rtable[:, p // BS % RING].long()  # [B, P]
        rk[dst, p % BS], rv[dst, p % BS] = kc[src, p % BS], vc[src, p % BS]
        args = (rk, rv, rtable, qs, ctx_t, sinks, SCALE, WINDOW, RING)
        keys = min(ctx + 1, WINDOW)
    else:
        args = (kc, vc, table, qs, ctx_t, sinks, SCALE, None, None)
        keys = ctx + 1
    if kv_fp8:
        args = (quantize(args[0]), quantize(args[1]), *args[2:])
        fa = None

    def ours() -> torch.Tensor:
        return paged_attention(q, kn, vn, *args, 1, out=out, max_context_hint=hint or ctx)

    peer = (
        None
        if fa is None
        else _fa3_call(fa, q, kc, vc, table, qs, ctx_t + 1, 1, ctx + 1, sinks, sliding, peer_out)
    )
    case = f"B={b} ctx={ctx} {'sliding' if sliding else 'full'}"
    if check:
        _check(f"decode {case}", ours, peer, peer_out)
    kv_bytes = 1 if kv_fp8 else 2
    nbytes = b * HKV * keys * D * 2 * kv_bytes + 2 * b * HQ * D * 2  # K + V read, q read, out written
    return _row(
        "attn-decode", case, timed_us(ours, f"decode {case} ours"), _peer_us(peer, case), nbytes, None
    )


def prefill_case(t: int, sliding: bool, fa: Callable | None, check: bool = False) -> dict:
    """One sequence prefills t tokens from position 0 (its K/V come from k_new, not the cache)."""
    nblk = triton.cdiv(t, BS)
    table = torch.randperm(nblk, device="cuda").view(1, nblk).int()
    kc, vc = _rand(nblk, BS, HKV, D), _rand(nblk, BS, HKV, D)
    q, kn, vn = _rand(t, HQ, D), _rand(t, HKV, D), _rand(t, HKV, D)
    sinks = torch.randn(HQ, device="cuda")
    qs = torch.tensor([0, t], device="cuda", dtype=torch.int32)
    ctx_t = torch.zeros(1, device="cuda", dtype=torch.int32)
    pos = torch.arange(t, device="cuda")
    write_kv(kn, vn, kc, vc, table[0, pos // BS].long() * BS + pos % BS)  # FA3 reads the cache
    out, peer_out = torch.empty_like(q), torch.empty_like(q)
    ring = (table[:, :RING], RING) if sliding else (table, None)

    def ours() -> torch.Tensor:
        return paged_attention(
            q,
            kn,
            vn,
            kc,
            vc,
            ring[0],
            qs,
            ctx_t,
            sinks,
            SCALE,
            WINDOW if sliding else None,
            ring[1],
            t,
            out=out,
        )

    peer = None if fa is None else _fa3_call(fa, q, kc, vc, table, qs, qs[1:], t, t, sinks, sliding, peer_out)
    case = f"T={t} {'sliding' if sliding else 'full'}"
    if check:
        _check(f"prefill {case}", ours, peer, peer_out)
    seen = pos.clamp(max=WINDOW - 1) + 1 if sliding else pos + 1  # keys each query sees
    flops = 4.0 * HQ * D * float(seen.sum())
    return _row(
        "attn-prefill", case, timed_us(ours, f"prefill {case} ours"), _peer_us(peer, case), None, flops
    )


def fa3_peer() -> Callable | None:
    """vLLM's FA3 with the sink dtype it takes (_fa3_sink_probe), or None where it does not import or
    takes no sink dtype (each reason printed)."""
    fa = _fa3()
    return None if fa is None else _fa3_sink_probe(fa)


def run(rows: list) -> None:
    """Append every case's row to `rows` (decode B x ctx x window kind, then prefill)."""
    fa = fa3_peer()
    for sliding in (True, False):
        for b in (1, 64, 256):
            for ctx in (1024, 8192):
                rows.append(decode_case(b, ctx, sliding, fa, check=(b, ctx) == (64, 8192)))
                torch.cuda.empty_cache()
    for sliding in (True, False):
        for t in (1024, 4096, 16384):
            rows.append(prefill_case(t, sliding, fa, check=t == 4096))
            torch.cuda.empty_cache()


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("attn_gpu.py needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    rows: list[dict] = []
    run(rows)
    cols = ["kernel", "case", "ours_us", "vllm_us", "ratio", "hbm_frac", "tflops"]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=False)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=False)))


if __name__ == "__main__":
    main()
