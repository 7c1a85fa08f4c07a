"""The one place that holds Numba's options for every kernel in ``refimpl``.

* ``cache=True``: compiles take seconds; the cache makes the second process start fast.
  A cached kernel is stamped with the sources of the whole package, every ``.py`` under
  ``refimpl/`` and its subpackages, not only its own file (``_PackageLocator``): kernels inline
  helpers from other files (``_tiles.py``, ``_pack.py``, ``bits.popcount``), and Numba's own
  stamp kept serving the old machine code after such a helper changed (a ``git pull`` that
  touches only ``_pack.py`` packed with the old code). The generated epilogues carry the same
  stamp in their text (``refimpl/codegen/epilogue_template.py``).
* Every cache entry carries a SHA-256 of its content (``_CheckedCacheFile``): a damaged entry is
  compiled again, with a warning, never handed to LLVM (which aborts the process on bad bitcode).
* ``error_model="numpy"``: IEEE semantics (``1/0 = inf``, ``0/0 = nan``), never an exception
  (docs/design.md section 2). No ``fastmath``: the golden path keeps NaN and inf honest.
* SLP vectorizer on, loop vectorizer off, per kernel: with Numba's defaults the loop vectorizer
  split the popcount panel (when it was 128 named scalar accumulators) into reduction
  accumulators that spilled, and the kernel ran ~50x slower; SLP packs the unrolled scalar
  code that is left (``_pack.py``'s step for images under 16 pixels) into vectors
  (docs/performance.md). Elementwise kernels ask for ``loop_vectorize=True`` (the epilogue says
  why it is safe). Numba keeps SLP off by default because of a past miscompile (numba#8705):
  every kernel compiled here has a bit-exact test against a naive reference. Numba has no
  per-function option for either, so ``_Compiler`` sets them in ``numba.config`` for the length
  of one kernel's compile and restores them: other Numba code in the process keeps Numba's
  defaults. A user's ``NUMBA_SLP_VECTORIZE`` / ``NUMBA_LOOP_VECTORIZE`` wins.

Every kernel of the package goes through ``jit`` (tests/test_jit_factory.py checks the sources).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
from pathlib import Path

import numba
from numba.core import caching, compiler

from . import isa

# The instruction set (REFIMPL_ISA, else the host's best; refimpl/isa.py), set before anything
# compiles: the one global Numba setting left (docs/design.md section 11 says why). On AVX-512 it
# also asks for full-width vectors: LLVM tunes some AVX-512 CPUs (the host here reports
# 'rocketlake') to prefer 256-bit ones, and the popcount tile then spills.
isa.configure()

OPTIONS = dict(cache=True, error_model="numpy", fastmath=False)

PACKAGE = Path(__file__).resolve().parent


@contextlib.contextmanager
def vectorizers(loop: bool, slp: bool = True):
    """The SLP vectorizer ``slp`` and the loop vectorizer ``loop`` in ``numba.config`` inside,
    restored after; a setting the user made through the environment is left as it is."""
    saved = numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE
    if "NUMBA_SLP_VECTORIZE" not in os.environ:
        numba.config.SLP_VECTORIZE = int(slp)
    if "NUMBA_LOOP_VECTORIZE" not in os.environ:
        numba.config.LOOP_VECTORIZE = int(loop)
    try:
        yield
    finally:
        numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE = saved


class _Compiler(compiler.Compiler):
    """Numba's compiler with this package's vectorizer settings around each compile (a kernel
    compiled inside another, as a callee, gets its own settings too)."""

    loop_vectorize = False
    slp_vectorize = True

    def compile_extra(self, func):
        with vectorizers(self.loop_vectorize, self.slp_vectorize):
            return super().compile_extra(func)

    def compile_ir(self, func_ir, lifted=(), lifted_from=None):
        with vectorizers(self.loop_vectorize, self.slp_vectorize):
            return super().compile_ir(func_ir, lifted, lifted_from)


class _LoopVectorizedCompiler(_Compiler):
    loop_vectorize = True


class _ScalarCompiler(_Compiler):
    """No SLP: for kernels whose vectors are written by hand (``kernels/byte_dot.py``), which SLP
    re-packs into a tile that spills (docs/performance.md), and for their callers, whose final
    optimization inlines them."""

    slp_vectorize = False


class _LoopOnlyCompiler(_LoopVectorizedCompiler):
    slp_vectorize = False


_PIPELINES = {(False, True): _Compiler, (True, True): _LoopVectorizedCompiler,
              (False, False): _ScalarCompiler, (True, False): _LoopOnlyCompiler}


@functools.lru_cache(maxsize=None)
def _noalias(pipeline):
    class _NoAliasCompiler(pipeline):
        """``pipeline`` with every array argument's data marked ``noalias``: without it LLVM cannot
        vectorize a loop that stores to one array and loads from another at computed indices
        (the epilogue's table lookups), as it cannot prove the two apart."""

        def compile_extra(self, func):
            self.state.flags.noalias = True
            return super().compile_extra(func)

        def compile_ir(self, func_ir, lifted=(), lifted_from=None):
            self.state.flags.noalias = True
            return super().compile_ir(func_ir, lifted, lifted_from)

    return _NoAliasCompiler


def compiled_here(dispatcher) -> bool:
    """Whether a Numba dispatcher was made by ``jit`` (its compiler is this module's)."""
    pipeline = getattr(getattr(dispatcher, "_compiler", None), "pipeline_class", None)
    return isinstance(pipeline, type) and issubclass(pipeline, _Compiler)


def _sources(root: Path) -> list[Path]:
    return sorted((p for p in root.rglob("*.py") if "__pycache__" not in p.relative_to(root).parts),
                  key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4)
def _stamp_of(root: Path, files: tuple) -> bytes:
    digest = hashlib.sha256()
    for name, _, _ in files:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return digest.digest()


def package_stamp(root: Path = PACKAGE) -> bytes:
    """sha256 of every ``.py`` under ``root`` (``refimpl`` and its subpackages, by relative path):
    the freshness stamp of the package's cached kernels and generated epilogues."""
    files = []
    for path in _sources(root):
        st = path.stat()
        files.append((path.relative_to(root).as_posix(), st.st_mtime_ns, st.st_size))
    return _stamp_of(root, tuple(files))  # re-hashed only when a file's time or size changes


def _package_locator(base):
    class _PackageLocator(base):
        """Numba's ``base`` locator for the kernels of this package, stamped by package_stamp."""

        @classmethod
        def from_function(cls, py_func, py_file):
            if PACKAGE not in Path(py_file).resolve().parents:
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


class _CheckedCacheFile(caching.IndexDataCacheFile):
    """Numba's cache files with a SHA-256 over each entry: a damaged entry (random bytes in a
    ``.nbc``) made LLVM abort the process (exit 134) when its bitcode was parsed, and other damage
    was a traceback. An entry whose digest does not match is a cache miss, said once on stderr,
    and the kernel is compiled and stored again; an unreadable index is an empty one."""

    MAGIC = b"refimpl-nbc-sha256\0"

    def _save_data(self, name, data):
        payload = self._dump(data)
        with self._open_for_write(self._data_path(name)) as f:
            f.write(self.MAGIC + hashlib.sha256(payload).digest() + payload)

    def _load_data(self, name):
        path = self._data_path(name)
        with open(path, "rb") as f:
            raw = f.read()
        head, digest, payload = raw[:len(self.MAGIC)], raw[len(self.MAGIC):len(self.MAGIC) + 32], raw[len(self.MAGIC) + 32:]
        if head != self.MAGIC:
            return None  # an earlier version's entry: compiled again, silently
        if hashlib.sha256(payload).digest() != digest:
            _warn_damaged(path)
            return None
        return _unpickle(payload)

    def _load_index(self):
        try:
            return super()._load_index()
        except Exception:  # noqa: BLE001 - any damage: Numba then rewrites the index
            _warn_damaged(self._index_path)
            return {}


def _unpickle(payload: bytes):
    import pickle

    return pickle.loads(payload)  # noqa: S301 - our own entry, its digest checked; the folder is this user's


_WARNED: set = set()


def _warn_damaged(path: str) -> None:
    if path not in _WARNED:
        _WARNED.add(path)
        print(f"refimpl: warning: the kernel cache entry {path} is damaged; ignored, the kernel is compiled "
              "again and the entry rewritten", file=sys.stderr)


def _checked_cache(dispatcher):
    """``dispatcher`` with its cache entries checked (``_CheckedCacheFile``); as is without a cache."""
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if type(cache_file) is caching.IndexDataCacheFile:
        cache_file.__class__ = _CheckedCacheFile
    return dispatcher


def jit(fn=None, *, loop_vectorize: bool = False, slp_vectorize: bool = True, noalias: bool = False, **extra):
    """``numba.njit`` with the project's options; ``jit(parallel=True)`` for drivers,
    ``jit("signature")`` to compile eagerly, at import (no kernel of the package does: a cold
    cache then costs every process seconds); ``loop_vectorize=True`` for elementwise
    loops (refimpl/codegen/epilogue_template.py says when that is safe); ``slp_vectorize=False``
    for kernels vectorized by hand; ``noalias=True`` promises that no array the kernel writes
    shares memory with another argument (``_noalias`` says what it buys)."""
    pipeline = _PIPELINES[loop_vectorize, slp_vectorize]
    pipeline = _noalias(pipeline) if noalias else pipeline
    options = {**OPTIONS, **extra, "pipeline_class": pipeline}
    if fn is None:
        return lambda f: _checked_cache(numba.njit(**options)(f))
    if isinstance(fn, str):
        return lambda f: _checked_cache(numba.njit(fn, **options)(f))
    return _checked_cache(numba.njit(**options)(fn))
