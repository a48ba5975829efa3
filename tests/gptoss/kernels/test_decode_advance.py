"""greedy_advance (gptoss.kernels.decode_advance): the greedy multi-step decode's tail in one launch
gives what the torch ops it replaces gave (kernel_runner._greedy, then the clamp, the position and the
two slot lookups), leaves every column past N and every input row past 3 alone, and with advance off
writes only the output. Interpreter on CPU, compiled with CUDA."""

from __future__ import annotations

import pytest
import torch

from gptoss.kernel_runner import _greedy
from gptoss.kernels.decode_advance import greedy_advance
from tests.gptoss.kernels.conftest import DEVICE

BS = 16


def _state(n: int, bmax: int, ring_len: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 300, generator=g).to(torch.bfloat16)
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
