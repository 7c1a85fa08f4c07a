"""The machine a training ran on, as journals record it: the CPU, torch, refimpl's kernel path, the
GPU, and the kind of processor that did the arithmetic (what pairing two trainings needs)."""
from __future__ import annotations

import os
import platform


def host_info(device: str | None = None) -> dict:
    """This machine as the report records it: CPU, cores, torch and its CPU capability, refimpl's kernel path, the GPU."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    from refimpl import isa

    info = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "kernel_path": isa.current_path(),
            "python": platform.python_version(), "device": device}
    if device and device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info


def host_label(info: dict) -> str:
    """``host_info``'s record as one line for the report."""
    gpu = f", {info['gpu']}" if info.get("gpu") else ""
    return f"{info['cpu']}, {info['cores']} cores{gpu}, device {info.get('device')}, torch {info['torch']}"


def cpu_kind(info: dict) -> str:
    """The kind of processor a cell trained on, as pairing needs it: torch's CPU kernels round differently per
    instruction set, so a cell on another kind is like a fresh seed (the model, torch's vector
    capability, refimpl's kernel path). A cell trained on a GPU is of the GPU's kind (its name, torch
    and CUDA versions): its kernels, not the host CPU's, did the arithmetic."""
    if info.get("gpu"):
        return f"{info['gpu']}; torch {info.get('torch')}; cuda {info.get('cuda')}"
    return f"{info['cpu']}; torch {info.get('torch_cpu_capability')}; refimpl {info.get('kernel_path')}"
