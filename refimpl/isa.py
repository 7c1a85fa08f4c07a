"""Which instruction set the kernels are compiled for: chosen once, before anything compiles.

Every kernel of ``refimpl`` is one Numba source; LLVM lowers its popcounts and float loops for
the target it is given. Four paths exist, from fastest to most portable:

* ``avx512-vpopcntdq``: 512-bit vectors with a vector popcount (Ice Lake and later, Zen 4/5);
* ``avx512bw``: 512-bit vectors, popcount by the byte-lookup (vpshufb) method (Skylake-SP,
  Cascade Lake);
* ``avx2``: 256-bit vectors, byte-lookup popcount (Haswell and later, Zen 1-3);
* ``portable``: whatever LLVM's generic target of the machine gives (x86-64 baseline with SSE2;
  on ARM64 the ``cnt`` instruction): correct everywhere, slowest.

The host's best path is the default. ``REFIMPL_ISA=<path>`` (or ``host``) forces one, for
measurements and for testing a lower path on a higher host; a path this CPU cannot execute is
refused with ``IsaError`` when ``refimpl`` is imported; left uncaught (any command line: the import
comes first), it is one ``error: ...`` line and exit status 2, not a traceback. Numba's own
``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` are honoured when REFIMPL_ISA is unset. Numba's cache
key holds the CPU name and features, so one cache serves every path.
``python -m refimpl.info`` prints the path in use.
"""
from __future__ import annotations

import os
import platform

import llvmlite.binding as llvm
import numba

PATHS = ("avx512-vpopcntdq", "avx512bw", "avx2", "portable")
ENV = "REFIMPL_ISA"

# LLVM CPU name and the features a forced path compiles with. The AVX-512 paths also say
# -prefer-256-bit: LLVM tunes some AVX-512 CPUs to 256-bit vectors, and the popcount tile then
# runs on ymm halves and spills.
_HASWELL = ("+64bit,+cmov,+cx8,+cx16,+fxsr,+mmx,+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,"
            "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+movbe,+xsave,+pclmul,+fsgsbase")
_AVX512 = _HASWELL + ",+avx512f,+avx512bw,+avx512cd,+avx512dq,+avx512vl,-prefer-256-bit"
_OFF_512 = ",-avx512f,-avx512bw,-avx512cd,-avx512dq,-avx512vl,-avx512vpopcntdq,-avx512bitalg"
_TARGETS = {
    "avx512-vpopcntdq": ("icelake-server", _AVX512 + ",+avx512vpopcntdq,+avx512bitalg"),
    "avx512bw": ("skylake-avx512", _AVX512 + ",-avx512vpopcntdq,-avx512bitalg"),
    "avx2": ("haswell", _HASWELL + _OFF_512),
    "portable": ("x86-64", "+64bit,+cmov,+cx8,+fxsr,+mmx,+sse,+sse2,-avx,-avx2" + _OFF_512),
}
# What each path needs the CPU to have.
_REQUIRES = {
    "avx512-vpopcntdq": ("avx512f", "avx512bw", "avx512vl", "avx512vpopcntdq"),
    "avx512bw": ("avx512f", "avx512bw", "avx512vl"),
    "avx2": ("avx2", "fma", "popcnt"),
    "portable": (),
}


class IsaError(ValueError):
    """``REFIMPL_ISA`` names no kernel path, or one this CPU cannot execute."""


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def host_features() -> set[str]:
    """The features this CPU reports to LLVM (names without the '+')."""
    return {name for name, on in llvm.get_host_cpu_features().items() if on}


def _parse(features: str) -> set[str]:
    return {f[1:] for f in features.split(",") if f.startswith("+")}


def target_features() -> set[str]:
    """The features kernels are compiled with now: Numba's configured ones, else the host's."""
    configured = numba.config.CPU_FEATURES
    return _parse(configured) if configured else host_features()


def path_of(features: set[str]) -> str:
    """The kernel path a feature set selects."""
    for path in PATHS[:-1]:
        if all(f in features for f in _REQUIRES[path]):
            return path
    return "portable"


def current_path() -> str:
    """The path the kernels of this process are compiled for."""
    return path_of(target_features()) if _is_x86() else "portable"


def host_path() -> str:
    """The fastest path this CPU can execute."""
    return path_of(host_features()) if _is_x86() else "portable"


def executable_paths() -> tuple[str, ...]:
    """Every path this CPU can execute, fastest first (a test runs each of them)."""
    if not _is_x86():
        return ("portable",)
    have = host_features()
    return tuple(p for p in PATHS if all(f in have for f in _REQUIRES[p]))


def forced_environment(path: str) -> dict[str, str]:
    """Environment variables that make a new process compile for ``path``."""
    return {ENV: path}


def configure() -> None:
    """Set Numba's target once, at import, before anything compiles (``refimpl/_jit.py``)."""
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted in ("", "host"):
        if wanted == "" and ("NUMBA_CPU_FEATURES" in os.environ or numba.config.CPU_FEATURES is not None):
            return  # the user pinned Numba's target: keep it
        if _is_x86() and "avx512f" in host_features():
            numba.config.CPU_FEATURES = llvm.get_host_cpu_features().flatten() + ",-prefer-256-bit"
        return
    error = None
    if wanted not in PATHS:
        error = IsaError(f"{ENV}={wanted!r} is not a kernel path; choose one of {', '.join(PATHS)} or host")
    elif wanted not in executable_paths():
        error = IsaError(f"{ENV}={wanted}: this CPU cannot execute that path (it can: {', '.join(executable_paths())})")
    if error is not None:
        from ._environment import one_line_if_uncaught  # here: tests/conftest.py loads this file alone

        one_line_if_uncaught(error)
        raise error
    if not _is_x86():
        return  # the host target is the portable path there
    numba.config.CPU_NAME, numba.config.CPU_FEATURES = _TARGETS[wanted]
