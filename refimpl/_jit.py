"""The one place that holds Numba's options for every kernel in ``refimpl``.

* ``cache=True``: compiles take seconds; the cache makes the second process start fast.
  A cached kernel is stamped with the sources of the whole package, not only its own file
  (``_PackageLocator``): kernels inline helpers from other files (``_tiles.py``, ``_pack.py``,
  ``bits.popcount``), and Numba's own stamp kept serving the old machine code after such a
  helper changed (a ``git pull`` that touches only ``_pack.py`` packed with the old code).
* ``error_model="numpy"``: IEEE semantics (``1/0 = inf``, ``0/0 = nan``), never an exception
  (docs/design.md section 2). No ``fastmath``: the golden path keeps NaN and inf honest.
* SLP vectorizer on, loop vectorizer off (before anything compiles): with Numba's defaults the
  loop vectorizer splits the popcount panel into 128 reduction accumulators that spill, and the
  kernel runs ~50x slower; SLP packs the named scalar accumulators into AVX-512 registers
  (docs/performance.md). Numba keeps SLP off by default because of a past miscompile (numba#8705):
  every kernel compiled here has a bit-exact test against a naive reference.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numba
from numba.core import caching

from . import isa

if "NUMBA_SLP_VECTORIZE" not in os.environ:
    numba.config.SLP_VECTORIZE = 1
if "NUMBA_LOOP_VECTORIZE" not in os.environ:
    numba.config.LOOP_VECTORIZE = 0

# The instruction set (REFIMPL_ISA, else the host's best; refimpl/isa.py), set before anything
# compiles. On AVX-512 it also asks for full-width vectors: LLVM tunes some AVX-512 CPUs (the host
# here reports 'rocketlake') to prefer 256-bit ones, and the popcount tile then spills.
isa.configure()

OPTIONS = dict(cache=True, error_model="numpy", fastmath=False)

PACKAGE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=4)
def _stamp_of(files: tuple) -> bytes:
    digest = hashlib.sha256()
    for name, _, _ in files:
        digest.update(name.encode() + b"\0" + (PACKAGE / name).read_bytes() + b"\0")
    return digest.digest()


def package_stamp() -> bytes:
    """sha256 of every source file of ``refimpl``: the freshness stamp of its cached kernels."""
    files = []
    for path in sorted(PACKAGE.glob("*.py")):
        st = path.stat()
        files.append((path.name, st.st_mtime_ns, st.st_size))
    return _stamp_of(tuple(files))  # re-hashed only when a file's time or size changes


def _package_locator(base):
    class _PackageLocator(base):
        """Numba's ``base`` locator for the kernels of this package, stamped by package_stamp."""

        @classmethod
        def from_function(cls, py_func, py_file):
            if Path(py_file).resolve().parent != PACKAGE:
                return None  # not ours: Numba's own locators take it
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return package_stamp()

    return _PackageLocator


def _install_package_locators():
    # recent Numba names these without a leading underscore, older ones with it
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    if any(getattr(cls, "__qualname__", "").startswith("_package_locator") for cls in impl._locator_classes):
        return
    bases = [getattr(caching, name, None) or getattr(caching, "_" + name)
             for name in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]
    impl._locator_classes[0:0] = [_package_locator(base) for base in bases]


_install_package_locators()


def jit(fn=None, **extra):
    """``numba.njit`` with the project's options; ``jit(parallel=True)`` for drivers,
    ``jit("signature")`` to compile eagerly, at import."""
    options = {**OPTIONS, **extra}
    if fn is None:
        return lambda f: numba.njit(**options)(f)
    if isinstance(fn, str):
        return lambda f: numba.njit(fn, **options)(f)
    return numba.njit(**options)(fn)
