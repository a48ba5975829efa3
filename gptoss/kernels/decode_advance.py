"""The tail of a greedy multi-step decode step (KernelRunner.launch_multi), in one launch after the argmax.

Between two replays of the decode graph, each greedy row r needs: its id checked (argmax propagates
NaN, so a NaN at the argmax means the row holds one: -1, which the host fails), stored as this step's
output, and the next step's static inputs advanced in place: the id (a -1 as 0, never read back),
its position + 1, and that position's full and ring cache slots from the row's block tables. As
torch ops that was ~20 launches a step (gather, isnan, where, clamp, the copies, the slot
arithmetic), each a few µs of the GPU's time at batch 1, where a 120b step is ~2.7 ms; here it is
one program a row.

greedy_advance with no argmax given takes it in the same launch: torch's argmax over a row of gpt-oss's
201,088 logits is one block's reduction (8.5 us a token at 120b's batch 1 on an H200, v40's profile,
then 2.6 for this tail). Here CHUNK-wide programs each reduce a chunk to its (max, first index), and
the program that draws a row's last ticket (a split-K semaphore, as attention's in-kernel merge)
reduces the chunks' partials and runs the tail. The same ids as `logits.argmax(-1)`: the first index
of the maximum, chunks in index order; a row holding NaN gives -1 either way.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

# GPTOSS_GREEDY_ARGMAX: "fused" (greedy_advance takes the argmax) or "torch" (torch's argmax first);
# unset: fused, for steps of up to FUSED_MAX_ROWS rows (a larger batch reads its logits at bandwidth
# either way, and its grid would be rows x chunks).
ARGMAX = os.environ.get("GPTOSS_GREEDY_ARGMAX", "fused")
if ARGMAX not in ("fused", "torch"):
    raise ValueError(f"GPTOSS_GREEDY_ARGMAX={ARGMAX!r}: choose fused or torch")
FUSED_MAX_ROWS = 16
CHUNK = 2048  # logits a program: 99 programs a row at 201,088, 16 values a thread at 4 warps
# A device's scratch of the chunked argmax, made once: the chunks' (max, index) partials and a
# ticket a row (zeroed again by the kernel). Launches in a stream never overlap, so one set serves all.
_scratch: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}


@triton.jit
def _tail_kernel(
    logits_ptr,
    stride_l,
    V,
    argmax_ptr,
    pm_ptr,
    pi_ptr,
    lock_ptr,
    out_ptr,
    ids_ptr,
    pos_ptr,
    full_ptr,
    ring_ptr,
    rows_ptr,
    full_tab_ptr,
    stride_ft,
    ring_tab_ptr,
    stride_rt,
    BS: tl.constexpr,
    RING_LEN: tl.constexpr,
    ADVANCE: tl.constexpr,
    GIVEN: tl.constexpr,
    CHUNK: tl.constexpr,
    P_PAD: tl.constexpr,
):
    """Program (chunk c, row r). GIVEN: one chunk a row, the argmax at argmax_ptr[r], its logit
    checked for NaN. Else each chunk's (max, first index) goes to the partials [rows, P] (NaN for a
    chunk holding one) and the program with the row's last ticket reduces them, the first chunk among
    equal maxima, a NaN giving -1. Then the row's tail: the output, and with ADVANCE the next step's
    inputs."""
    c, r = tl.program_id(0), tl.program_id(1)
    row = logits_ptr + r.to(tl.int64) * stride_l
    last = True
    if GIVEN:
        idx = tl.load(argmax_ptr + r)
        # widened first: the interpreter holds bf16 as raw bits, where NaN would equal itself
        x = tl.load(row + idx).to(tl.float32)
        idx = tl.where(x != x, -1, idx)  # NaN: the only value unequal to itself
    else:
        n_chunks = tl.num_programs(0)
        cols = c * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        has_nan = tl.max((x != x).to(tl.int32), axis=0) > 0
        tl.store(pm_ptr + r * n_chunks + c, tl.where(has_nan, float("nan"), m))
        tl.store(pi_ptr + r * n_chunks + c, c * CHUNK + i)
        # The barrier orders every thread's stores before the ticket, whose release (gpu scope)
        # publishes them; the last ticket's acquire sees them all, and its program reads them past L1
        # and zeroes the ticket for the next launch (launches in a stream never overlap).
        tl.debug_barrier()
        last = tl.atomic_add(lock_ptr + r, 1, sem="acq_rel", scope="gpu") == n_chunks - 1
        idx = tl.zeros((), tl.int64)
        if last:
            k = tl.arange(0, P_PAD)
            ok = k < n_chunks
            pm = tl.load(pm_ptr + r * n_chunks + k, mask=ok, other=float("-inf"), cache_modifier=".cg")
            pi = tl.load(pi_ptr + r * n_chunks + k, mask=ok, other=0, cache_modifier=".cg")
            _, kb = tl.max(pm, axis=0, return_indices=True, return_indices_tie_break_left=True)
            idx = tl.sum(tl.where(k == kb, pi, 0), axis=0).to(tl.int64)
            idx = tl.where(tl.max((pm != pm).to(tl.int32), axis=0) > 0, -1, idx)
    if last:
        if not GIVEN:
            tl.store(lock_ptr + r, 0)
        tl.store(out_ptr + r, idx)
        if ADVANCE:
            tl.store(ids_ptr + r, tl.maximum(idx, 0))
            p = tl.load(pos_ptr + r) + 1
            tl.store(pos_ptr + r, p)
            t_row = tl.load(rows_ptr + r)
            blk = p // BS
            slot = tl.load(full_tab_ptr + t_row * stride_ft + blk).to(tl.int64) * BS + p % BS
            tl.store(full_ptr + r, slot)
            if RING_LEN > 0:
                slot = tl.load(ring_tab_ptr + t_row * stride_rt + blk % RING_LEN).to(tl.int64) * BS + p % BS
                tl.store(ring_ptr + r, slot)


def _launch(logits, argmax, out, inputs, full_tab, ring_tab, block_size, ring_len, advance) -> None:
    """_tail_kernel over logits [N, V]: argmax given ([N] int64) or None (the chunked argmax)."""
    n, v = logits.shape
    if argmax is None:  # the partials and tickets of the chunked argmax
        chunks = triton.cdiv(v, CHUNK)
        pm, pi, lock = _scratch_buffers(logits.device, n, chunks)
    else:  # one program a row, which reads none of them
        chunks, pm, pi, lock = 1, out, out, out
    ids, pos, full, ring, rows = inputs[0], inputs[1], inputs[2], inputs[3], inputs[4]
    _tail_kernel[(chunks, n)](
        logits,
        logits.stride(0),
        v,
        argmax if argmax is not None else out,
        pm,
        pi,
        lock,
        out,
        ids,
        pos,
        full,
        ring,
        rows,
        full_tab,
        full_tab.stride(0),
        ring_tab,
        ring_tab.stride(0),
        BS=block_size,
        RING_LEN=ring_len,
        ADVANCE=advance,
        GIVEN=argmax is not None,
        CHUNK=CHUNK,
        P_PAD=triton.next_power_of_2(chunks),
        num_warps=1 if argmax is not None else 4,
    )


def greedy_advance(
    logits: Tensor,
    argmax: Tensor | None,
    out: Tensor,
    inputs: Tensor,
    full_tab: Tensor,
    ring_tab: Tensor,
    block_size: int,
    ring_len: int,
    advance: bool,
) -> None:
    """logits [N, V] (any float dtype), argmax [N] int64 (logits.argmax(-1)), or None: the kernel
    takes it (the module's docstring); out [N] int64 gets the ids, -1 for a row whose argmax is NaN.
    advance: inputs [6, >= N] int64 (KernelRunner.g_in: ids, positions, full slots, ring slots, table
    rows, adapters) take the next step's values in rows 0-3 of columns [0, N): as
    `ids.clamp(min=0)`, `pos + 1`, and each new position's slot in full_tab / ring_tab (int32
    [rows, blocks]; ring_len 0: no ring slots)."""
    n = logits.shape[0]
    given = argmax is not None
    if (given and argmax.shape != (n,)) or out.shape != (n,) or inputs.shape[0] != 6 or inputs.shape[1] < n:
        got = f", argmax {tuple(argmax.shape)}" if given else ""
        raise ValueError(
            f"shapes disagree: logits {tuple(logits.shape)}{got}, out {tuple(out.shape)}, "
            f"inputs {tuple(inputs.shape)}"
        )
    if not out.dtype == inputs.dtype == torch.int64 or (given and argmax.dtype != torch.int64):
        raise ValueError("argmax, out and inputs must be int64")
    if logits.stride(-1) != 1 or inputs.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError("logits, out and inputs must be contiguous along their last dim")
    if n == 0:
        return
    _launch(logits, argmax, out, inputs, full_tab, ring_tab, block_size, ring_len, advance)


def _scratch_buffers(device: torch.device, n: int, chunks: int) -> tuple[Tensor, Tensor, Tensor]:
    """The chunked argmax's partials [n, chunks] (float32 maxima, int32 indices) and zeroed int32
    tickets [>= n] on `device`, made once (the tail runs outside CUDA graphs) instead of every step."""
    buf = _scratch.get(device)
    if buf is None or buf[0].numel() < n * chunks or buf[2].numel() < n:
        rows = max(n, FUSED_MAX_ROWS)
        buf = _scratch[device] = (
            torch.empty(rows * chunks, dtype=torch.float32, device=device),
            torch.empty(rows * chunks, dtype=torch.int32, device=device),
            torch.zeros(rows, dtype=torch.int32, device=device),
        )
    pm, pi, lock = buf
    return pm[: n * chunks].view(n, chunks), pi[: n * chunks].view(n, chunks), lock


def tail_argmax(logits: Tensor) -> Tensor | None:
    """greedy_advance's argmax for a greedy step's logits [N, V]: None (the tail's launch takes it)
    for up to FUSED_MAX_ROWS rows while ARGMAX is "fused", else torch's. The same ids either way."""
    return None if ARGMAX == "fused" and logits.shape[0] <= FUSED_MAX_ROWS else logits.argmax(-1)
