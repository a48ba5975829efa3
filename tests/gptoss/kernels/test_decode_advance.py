"""greedy_advance (gptoss.kernels.decode_advance): the greedy multi-step decode's tail in one launch
gives what the torch ops it replaces gave (kernel_runner._greedy, then the clamp, the position and the
two slot lookups), leaves every column past N and every input row past 3 alone, and with advance off
writes only the output. With no argmax given it takes the argmax too, and gives the same over
vocabularies of several chunks: ties across chunks, NaN in a late chunk, a row of -inf, and its
tickets left zeroed for the next launch. Interpreter on CPU, compiled with CUDA."""

from __future__ import annotations

import pytest
import torch

from gptoss.kernel_runner import _greedy
from gptoss.kernels import decode_advance as da
from gptoss.kernels.decode_advance import greedy_advance, tail_argmax
from tests.gptoss.kernels.conftest import DEVICE

BS = 16


def _state(n: int, bmax: int, ring_len: int, seed: int, vocab: int = 300):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g).to(torch.bfloat16)
    logits[1, 17] = float("nan")  # a row holding NaN fails (-1), and its next input id is 0
    logits[2, 40] = logits[2, 250] = logits[2].max() + 1  # a tie: the first
    rows = torch.randperm(bmax, generator=g)[:n]
    full_tab = torch.randint(0, 5000, (bmax + 1, 64), generator=g, dtype=torch.int32)
    ring_tab = torch.randint(0, 5000, (bmax + 1, ring_len), generator=g, dtype=torch.int32)
    inputs = torch.randint(0, 1000, (6, bmax), generator=g)
    inputs[1, :n] = torch.tensor([0, 15, 16, 500, 1007][:n])  # block edges: 15 -> 16 changes block
    inputs[4, :n] = rows
    return [t.to(DEVICE) for t in (logits, full_tab, ring_tab, inputs)]


def _torch_tail(logits, inputs, full_tab, ring_tab, n: int, ring_len: int):
    """What KernelRunner.launch_multi did between replays before greedy_advance."""
    ids = _greedy(logits.float())
    want = inputs.clone()
    ids_in, pos, full, ring, row_idx, _ = want[:, :n]
    ids_in.copy_(ids.clamp(min=0))
    pos += 1
    blk = pos // BS
    full.copy_(full_tab[row_idx, blk] * BS + pos % BS)
    if ring_len:
        ring.copy_(ring_tab[row_idx, blk % ring_len] * BS + pos % BS)
    return ids, want


@pytest.mark.parametrize("ring_len", [0, 8])
def test_greedy_advance_equals_the_torch_tail(ring_len):
    n, bmax = 5, 8
    logits, full_tab, ring_tab, inputs = _state(n, bmax, ring_len, seed=ring_len)
    want_ids, want_inputs = _torch_tail(logits, inputs, full_tab, ring_tab, n, ring_len)
    assert want_ids[1].item() == -1 and want_ids[2].item() == 40
    out = torch.full((n,), 12345, dtype=torch.int64, device=DEVICE)
    greedy_advance(logits, logits.argmax(-1), out, inputs, full_tab, ring_tab, BS, ring_len, advance=True)
    assert out.tolist() == want_ids.tolist()
    assert torch.equal(inputs, want_inputs)  # rows 4-5 and columns n.. untouched too
    assert inputs[0, 1].item() == 0 and inputs[1, :n].tolist() == [1, 16, 17, 501, 1008]


def test_greedy_advance_without_advance_writes_the_output_only():
    n, bmax = 3, 4
    logits, full_tab, ring_tab, inputs = _state(n, bmax, 8, seed=3)
    before = inputs.clone()
    out = torch.empty(n, dtype=torch.int64, device=DEVICE)
    greedy_advance(logits, logits.argmax(-1), out, inputs, full_tab, ring_tab, BS, 8, advance=False)
    assert out.tolist() == _greedy(logits.float()).tolist()
    assert torch.equal(inputs, before)


def test_greedy_advance_refuses_mismatched_operands():
    logits, full_tab, ring_tab, inputs = _state(3, 4, 8, seed=4)
    out = torch.empty(3, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match=r"shapes disagree: logits \(3, 300\), argmax \(2,\)"):
        greedy_advance(logits, logits.argmax(-1)[:2], out, inputs, full_tab, ring_tab, BS, 8, advance=True)
    with pytest.raises(ValueError, match="argmax, out and inputs must be int64"):
        greedy_advance(logits, logits.argmax(-1).int(), out, inputs, full_tab, ring_tab, BS, 8, advance=True)


def _chunked_state(ring_len: int, seed: int):
    """Five rows over three chunks of CHUNK logits: row 0 plain, 1 NaN in the last chunk, 2 a tie
    between chunks 0 and 2 (the first wins), 3 all -inf (index 0, as torch), 4 its max in chunk 1."""
    vocab = 2 * da.CHUNK + 300
    logits, full_tab, ring_tab, inputs = _state(5, 8, ring_len, seed, vocab)
    logits[1, 17] = 0.0
    logits[1, vocab - 3] = float("nan")
    logits[2, 40] = 0.0
    logits[2, 40] = logits[2, 2 * da.CHUNK + 7] = logits[2].max() + 1
    logits[3] = float("-inf")
    logits[4, da.CHUNK + 5] = logits[4].max() + 2
    return logits, full_tab, ring_tab, inputs


@pytest.mark.parametrize("ring_len", [0, 8])
def test_greedy_advance_taking_the_argmax_equals_the_torch_tail_over_chunks(ring_len):
    logits, full_tab, ring_tab, inputs = _chunked_state(ring_len, seed=10 + ring_len)
    want_ids, want_inputs = _torch_tail(logits, inputs, full_tab, ring_tab, 5, ring_len)
    assert want_ids.tolist()[1:] == [-1, 40, 0, da.CHUNK + 5]
    out = torch.full((5,), 12345, dtype=torch.int64, device=DEVICE)
    greedy_advance(logits, None, out, inputs, full_tab, ring_tab, BS, ring_len, advance=True)
    assert out.tolist() == want_ids.tolist()
    assert torch.equal(inputs, want_inputs)
    scratch = da._scratch[logits.device]
    assert not scratch[2].any()  # every row's ticket back at zero
    # a second launch on the same tickets and partials (made once, not every step) gives the same ids
    out2 = torch.empty(5, dtype=torch.int64, device=DEVICE)
    greedy_advance(logits, None, out2, inputs.clone(), full_tab, ring_tab, BS, ring_len, advance=False)
    assert out2.tolist() == want_ids.tolist()
    assert all(a is b for a, b in zip(da._scratch[logits.device], scratch, strict=True))


@pytest.mark.parametrize("argmax", ["fused", "torch"])
def test_the_runners_argmax_choice_gives_the_same_ids_either_way(argmax, monkeypatch):
    monkeypatch.setattr(da, "ARGMAX", argmax)
    logits, full_tab, ring_tab, inputs = _chunked_state(8, seed=20)
    want_ids, want_inputs = _torch_tail(logits, inputs, full_tab, ring_tab, 5, 8)
    out = torch.empty(5, dtype=torch.int64, device=DEVICE)
    taken = tail_argmax(logits)
    assert (taken is None) == (argmax == "fused")
    greedy_advance(logits, taken, out, inputs, full_tab, ring_tab, BS, 8, advance=True)
    assert out.tolist() == want_ids.tolist()
    assert torch.equal(inputs, want_inputs)


def test_greedy_advance_taking_the_argmax_refuses_mismatched_operands():
    logits, full_tab, ring_tab, inputs = _state(3, 4, 8, seed=4)
    with pytest.raises(ValueError, match=r"shapes disagree: logits \(3, 300\), out \(2,\)"):
        out = torch.empty(2, dtype=torch.int64, device=DEVICE)
        greedy_advance(logits, None, out, inputs, full_tab, ring_tab, BS, 8, advance=True)
    with pytest.raises(ValueError, match="argmax, out and inputs must be int64"):
        out = torch.empty(3, dtype=torch.int32, device=DEVICE)
        greedy_advance(logits, None, out, inputs, full_tab, ring_tab, BS, 8, advance=True)
