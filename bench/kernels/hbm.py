"""The bandwidth a kernel bench divides by: what a device-to-device copy reaches on this GPU."""

from __future__ import annotations

import torch

# shared/DESIGN.md section 9, measured there; the first key in the device's name wins.
COPY_BYTES_PER_S = {"H200": 4.3e12, "H100": 3.0e12}


def share(nbytes: float, us: float, copy: float | None = None) -> float:
    """nbytes moved in us microseconds as a share of the copy bandwidth (bytes / s; default this
    device's, copy_bytes_per_s)."""
    return nbytes / (us * 1e-6) / (copy_bytes_per_s() if copy is None else copy)


def copy_bytes_per_s() -> float:
    """The current CUDA device's copy bandwidth (an H100's where the name matches none)."""
    name = torch.cuda.get_device_name()
    return next((bw for key, bw in COPY_BYTES_PER_S.items() if key in name), COPY_BYTES_PER_S["H100"])
