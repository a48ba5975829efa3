"""Facts about a CUDA device that launchers read on every step, asked of the driver once a device."""

from __future__ import annotations

import functools

import torch
import triton
from torch import Tensor


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _index(t: Tensor) -> int:
    """The index of the CUDA device t lives on (a bare "cuda" device: the current one)."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def sm_count(t: Tensor) -> int:
    """The SM count of the CUDA device t lives on."""
    return _sm_count(_index(t))


@functools.cache
def _max_shared_mem(index: int) -> int:
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def max_shared_mem(t: Tensor) -> int:
    """The shared memory (bytes) a program may take on t's CUDA device: the limit Triton checks a
    compiled kernel's against at launch (232,448 on an H100 or H200)."""
    return _max_shared_mem(_index(t))


@functools.cache
def _gpu_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def gpu_name(t: Tensor) -> str:
    """The name of the CUDA device t lives on ("NVIDIA H100 80GB HBM3"); "" for a tensor off CUDA."""
    return _gpu_name(_index(t)) if t.is_cuda else ""
