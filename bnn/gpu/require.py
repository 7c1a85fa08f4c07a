"""Whether this process can run bnn/gpu's Triton kernels on a device, and if not, why in one line.

Imports neither triton nor torch: ``bnn.train``'s settings check calls it before anything is built, so
``--measure-impl triton`` without the package or without CUDA is one ``error:`` line and exit 2.
"""
from __future__ import annotations

import importlib.util
import os


def interpreted() -> bool:
    """Whether Triton's interpreter runs the kernels (``TRITON_INTERPRET=1``: CPU tensors, for tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_problem(device_type: str) -> str | None:
    """None when measure_impl 'triton' can run on a device of type ``device_type``, else the reason."""
    if importlib.util.find_spec("triton") is None:
        return ("measure_impl 'triton' needs the triton package, which this environment lacks: "
                'pip install -e ".[gpu]" (a CUDA build of torch usually brings it), or use --measure-impl eager')
    if device_type == "cuda" or (device_type == "cpu" and interpreted()):
        return None
    return (f"measure_impl 'triton' runs Triton kernels on a CUDA device, not on {device_type} (a CPU runs them "
            "only under TRITON_INTERPRET=1, for tests); use --device cuda or --measure-impl eager")
