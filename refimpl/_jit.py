"""The one place that holds Numba's options for every kernel in ``refimpl``.

* ``cache=True``: compiles take seconds; the cache makes the second process start fast.
* ``error_model="numpy"``: IEEE semantics (``1/0 = inf``, ``0/0 = nan``), never an exception
  (SPEC section 2). No ``fastmath``: the golden path keeps NaN and inf honest.
* SLP vectorizer on, loop vectorizer off (before anything compiles): with Numba's defaults the
  loop vectorizer splits the popcount panel into 128 reduction accumulators that spill, and the
  kernel runs ~50x slower; SLP packs the named scalar accumulators into AVX-512 registers
  (PERFORMANCE.md). Numba keeps SLP off by default because of a past miscompile (numba#8705):
  every kernel compiled here has a bit-exact test against a naive reference.
"""
from __future__ import annotations

import os

import numba

if "NUMBA_SLP_VECTORIZE" not in os.environ:
    numba.config.SLP_VECTORIZE = 1
if "NUMBA_LOOP_VECTORIZE" not in os.environ:
    numba.config.LOOP_VECTORIZE = 0

# LLVM tunes some AVX-512 CPUs (the host here reports itself as 'rocketlake') to prefer 256-bit
# vectors; the popcount tile then runs on ymm halves and spills. Ask for full-width vectors
# unless the user pinned the CPU features. Numba's cache key includes the features.
if "NUMBA_CPU_FEATURES" not in os.environ and numba.config.CPU_FEATURES is None:
    import llvmlite.binding as _llvm

    _host = _llvm.get_host_cpu_features()
    if _host.get("avx512f"):
        numba.config.CPU_FEATURES = _host.flatten() + ",-prefer-256-bit"

OPTIONS = dict(cache=True, error_model="numpy", fastmath=False)


def jit(fn=None, **extra):
    """``numba.njit`` with the project's options; ``jit(parallel=True)`` for drivers,
    ``jit("signature")`` to compile eagerly, at import."""
    options = {**OPTIONS, **extra}
    if fn is None:
        return lambda f: numba.njit(**options)(f)
    if isinstance(fn, str):
        return lambda f: numba.njit(fn, **options)(f)
    return numba.njit(**options)(fn)
