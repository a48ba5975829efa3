"""Programmatic dependent launch (Hopper and later): overlap a kernel's launch with its predecessor's tail.

A decode step at batch 1 is ~275 launches of a few µs each, so the gap between two kernels (the
next one's launch and block placement, after the previous one has drained) is a large share of
it. A kernel launched with the PDL attribute may be placed on the SMs while the kernel before it in
the stream still runs; its programs then wait (griddepcontrol.wait) until that kernel has finished
and its writes are visible, so what overlaps is only the launch, never a memory access. Each kernel
that takes `PDL` calls `wait_then_release` before its first load or store: without PDL the
instructions are skipped (the constexpr branch), so the interpreter and older GPUs run the same code.

`args(t)` gives the two launch keywords for a kernel whose tensors live with `t`. GPTOSS_PDL=0 turns
it off (for A/B timing and as an escape hatch); torch's and cuBLAS's kernels never carry the
attribute, so a Triton kernel after one of them simply starts after it, as without PDL.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ENABLED = os.environ.get("GPTOSS_PDL", "1") != "0"


@functools.cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def compiled_on_hopper(t: Tensor) -> bool:
    """Whether t's kernels run compiled (not in the interpreter) on a Hopper or later GPU."""
    return (
        t.is_cuda
        and not triton.knobs.runtime.interpret
        and _hopper_or_later(t.device.index if t.device.index is not None else torch.cuda.current_device())
    )


def on(t: Tensor) -> bool:
    """Whether kernels on t's device launch with PDL now."""
    return ENABLED and compiled_on_hopper(t)


def args(t: Tensor, launch: bool = True) -> dict[str, bool]:
    """Keywords for `kernel[grid](..., **pdl.args(t))`: the kernel's PDL constexpr and, when on, the
    launch attribute (a compile option of Triton's CUDA backend, unknown to the interpreter).
    launch=False: a kernel that launches plainly even where PDL is on (a per-kernel switch)."""
    return {"PDL": True, "launch_pdl": True} if launch and on(t) else {"PDL": False}


@triton.jit
def wait_then_release(PDL: tl.constexpr):
    """First thing in a PDL kernel: wait for the previous kernel's writes, then let the next kernel
    be placed (its programs in turn wait for all of ours before touching memory)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
