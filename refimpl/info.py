"""``python -m refimpl.info``: what the CPU kernels run on here, for bug reports and benchmarks.

Prints the CPU (model, cores, architecture), the kernel path in use (``refimpl/isa.py``) and how
it was chosen (the host's best, ``REFIMPL_ISA``, or Numba's own ``NUMBA_CPU_NAME``/
``NUMBA_CPU_FEATURES``), every path this CPU can execute, Numba's target CPU name, the versions of
NumPy, Numba and llvmlite, Numba's thread count and the folder of the cached kernels. With
``--json`` the output is one JSON object (the keys of ``collect()``). Nothing is compiled and
PyTorch is never imported.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
import numba
import numpy as np

from . import _jit, isa  # noqa: F401  (_jit sets Numba's target from REFIMPL_ISA before it is read)
from .cli import OneLineParser


def cpu_model() -> str:
    """The CPU's marketing name, as the OS reports it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() in ("model name", "Model", "Hardware"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5, check=False)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or "unknown CPU"


def isa_choice() -> str:
    """Who chose the kernel path: ``REFIMPL_ISA``, ``NUMBA_CPU_NAME/NUMBA_CPU_FEATURES`` or ``host``."""
    if os.environ.get(isa.ENV, "").strip().lower() not in ("", "host"):
        return isa.ENV
    if os.environ.get(isa.ENV, "").strip() == "" and any(os.environ.get(v) for v in ("NUMBA_CPU_NAME",
                                                                                    "NUMBA_CPU_FEATURES")):
        return "NUMBA_CPU_NAME/NUMBA_CPU_FEATURES"
    return "host"


def _how(choice: str) -> str:
    if choice == isa.ENV:
        return f"forced by {isa.ENV}={os.environ.get(isa.ENV, '').strip()}"
    return "the host's best" if choice == "host" else "set by NUMBA_CPU_NAME/NUMBA_CPU_FEATURES"


def path_line() -> str:
    """One line for benchmarks: the path in use and how it was chosen."""
    return f"kernel path {isa.current_path()} ({_how(isa_choice())})"


def _cache_folder() -> str:
    # the folder Numba's cache locator picked for one of the package's kernels
    from .kernels import _tiles

    return str(_tiles.panel_16x8_nchw._cache.cache_path)


def project_version() -> str:
    """The installed project's version, and the git commit of the checkout it runs from, if any."""
    from importlib import metadata

    try:
        text = metadata.version("bnn-measure-search")
    except metadata.PackageNotFoundError:
        text = "not installed"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isdir(os.path.join(root, ".git")):
        try:
            out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                text += f" (commit {out.stdout.strip()})"
        except (OSError, subprocess.SubprocessError):
            pass
    return text


def collect() -> dict:
    """Everything this command prints, as a dict of JSON types."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "architecture": platform.machine(),
        "isa_path": isa.current_path(),
        "isa_host_path": isa.host_path(),
        "isa_executable_paths": list(isa.executable_paths()),
        "isa_forced": isa_choice() == isa.ENV,
        "isa_chosen_by": isa_choice(),
        "numba_cpu_name": numba.config.CPU_NAME or llvm.get_host_cpu_name(),
        "project": project_version(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "llvmlite": llvmlite.__version__,
        "numba_threads": numba.config.NUMBA_NUM_THREADS,
        "numba_threading_layer": numba.config.THREADING_LAYER,
        "kernel_cache": _cache_folder(),
    }


def render(info: dict) -> str:
    """The human-readable form of ``collect()``."""
    how = _how(info["isa_chosen_by"]) + ("; REFIMPL_ISA=<path> forces another" if info["isa_chosen_by"] == "host" else "")
    rows = [
        ("CPU", f"{info['cpu_model']}, {info['cores']} cores ({info['usable_cores']} usable), {info['architecture']}"),
        ("kernel path", f"{info['isa_path']} ({how})"),
        ("paths this CPU runs", ", ".join(info["isa_executable_paths"]) + f" (best: {info['isa_host_path']})"),
        ("Numba target CPU", info["numba_cpu_name"]),
        ("versions", (f"bnn-measure-search {info['project']}, python {info['python']}, numpy {info['numpy']}, "
                      f"numba {info['numba']}, "
                      f"llvmlite {info['llvmlite']}")),
        ("Numba threads", f"{info['numba_threads']} (threading layer: {info['numba_threading_layer']})"),
        ("kernel cache", info["kernel_cache"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv=None) -> int:
    """``python -m refimpl.info``: print the table (or ``--json``) and return 0."""
    p = OneLineParser(prog="python -m refimpl.info",
                description="Show the CPU, the kernel path (instruction set) the CPU kernels are compiled for, "
                            "the paths this CPU can execute, versions, threads and the kernel cache folder. "
                            f"{isa.ENV}=<path> forces a path ({', '.join(isa.PATHS)}).")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    info = collect()
    print(json.dumps(info) if args.json else render(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
