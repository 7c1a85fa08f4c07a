"""The engine's fused epilogue of a genome: generated (``refimpl/codegen/epilogue_template.py``
says what it computes and why it is generated), compiled, and cached per genome.

The source goes to a file in a cache directory and the module is executed from the generated
text with that file's name (never imported, so no ``.pyc`` is consulted): Numba's
``cache=True`` only works for functions that live in a real file, and a file per genome keeps
the compiled epilogue across processes (the second run of ``refimpl.infer`` does not compile).
The text carries the stamp of every refimpl source, so a change to any code the kernels inline
gives a new file name and a fresh compile, never stale code.

Cache directory: ``$BNN_MEASURE_CACHE``, else ``$XDG_CACHE_HOME/bnn-measure``, else
``~/.cache/bnn-measure``; created with mode 700, and used only while it is this user's and not
writable by group or others (Numba's cache entries there are pickles): otherwise (or when it
cannot be created) a fresh private temp folder serves the process, with a one-line warning.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import tempfile
import threading
import types

import numpy as np

from ..codegen.arrays_template import generate_arrays
from ..codegen.epilogue_template import (
    FUSED_TILE,
    ROWS_SIGNATURE,
    TILE_CALL_SIGNATURE,
    driver_signature,
    generate,
    task_signature,
)
from ..conventions import DEFAULT as DEFAULT_COUNTS
from ..conventions import affine
from ..genome import Genome
from ..kernels import _tiles
from . import _drivers
from .float_kernels import RUN_THREADS
from .task_call import native_address

# Runs of a kernel's tasks per thread, one call of the task each. Numba hands each thread an
# equal share of the runs, so more runs than threads only add calls (64 runs instead of 4 a
# thread cost 2-8% of a 64-channel layer at batch 1).
PARTS_PER_THREAD = 4
# Held while a module is made or a kernel compiled: two threads compiling one dispatcher left the
# second with RuntimeError('compilation disabled') (issue 30 item 8). Reentrant: kernel -> _driver.
_COMPILE_LOCK = threading.RLock()


def cache_dir() -> str:
    """The folder of the generated epilogues (the module docstring says which)."""
    if os.environ.get("BNN_MEASURE_CACHE"):
        return os.environ["BNN_MEASURE_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bnn-measure")


@functools.lru_cache(maxsize=None)
def _compiled(name: str, signature: str) -> object:
    fn = getattr(_drivers, name)
    fn.compile(signature)
    fn.disable_compile()
    return fn


def _driver(name: str):
    """The parallel loop ``name`` of ``_drivers.py``, compiled (or loaded from Numba's cache) once
    for every genome, for its one signature, by one thread at a time (``lru_cache`` alone lets two
    threads both compile it)."""
    with _COMPILE_LOCK:
        return _compiled(name, driver_signature(name))


def _task_address(name: str) -> int:
    """The address of ``_drivers.py``'s serial task of the kernel ``name``, compiled (or loaded
    from Numba's cache) once for every genome: a genome enters it as its ``measure_rows``."""
    with _COMPILE_LOCK:
        return native_address(_compiled(f"{name}_task", task_signature(name)))


@functools.lru_cache(maxsize=None)
def _compiled_tile() -> int:
    fn = getattr(_tiles, FUSED_TILE)
    fn.compile(TILE_CALL_SIGNATURE)
    fn.disable_compile()
    return native_address(fn)


def tile_address() -> int:
    """The address of ``_tiles.py``'s fused tile, the popcount tile that every genome's fused task
    calls (``epilogue_template.py``'s ``FUSED_TILE`` says why), compiled (or loaded from Numba's
    cache) once for every genome, for its one signature."""
    with _COMPILE_LOCK:
        return _compiled_tile()


def kernel(module, name: str):
    """The kernel ``name`` (``epilogue_<mode>`` or ``fused_<mode>``) for a genome's module: the
    parallel loop of ``_drivers.py`` over its serial task (refimpl/engine/task_call.py says why),
    both the same for every genome, with the address of the module's ``measure_rows`` (and for a
    fused kernel the popcount tile's) before the kernel's arguments. ``measure_rows`` is compiled
    (or loaded from Numba's cache) on first use, the one kernel a genome adds (``ROWS_SIGNATURE``
    in epilogue_template.py says why). Task, driver and ``measure_rows`` each have one signature
    and further compiles disabled: arguments of other types raise instead of reaching them with a
    layout they were not compiled for."""
    kernels = module.__dict__.setdefault("_KERNELS", {})
    if name in kernels:
        return kernels[name]
    with _COMPILE_LOCK:
        if name not in kernels:  # another thread may have made it while this one waited
            rows = module.measure_rows
            if not rows.signatures:
                rows.compile(ROWS_SIGNATURE)
                rows.disable_compile()
            lead = (native_address(rows),)
            if name.startswith("fused_"):
                lead = (tile_address(), *lead)
            kernels[name] = _Kernel(_driver(name), _task_address(name), lead)
    return kernels[name]


class _Kernel:
    """A genome's kernel: its driver with the task's address, the run's thread count, then the
    addresses of the popcount tile (a fused kernel's, ``tile_address``) and of the genome's
    ``measure_rows`` before the caller's arguments."""

    __slots__ = ("driver", "task", "lead")

    def __init__(self, driver, task: int, lead: tuple = ()):
        self.driver, self.task, self.lead = driver, task, lead

    def __call__(self, *args):
        # RUN_THREADS: the engine reads Numba's thread count once a run (asking costs a lock);
        # the driver cannot ask, as a kernel that does is not cached.
        self.driver(self.task, PARTS_PER_THREAD * RUN_THREADS[0], *self.lead, *args)


_LOADED: dict[str, object] = {}
_FALLBACK: list[str] = []  # this process's private temp folder, once the cache folder was refused


def _unsafe(path: str) -> str | None:
    """Why ``path`` must not hold code this process runs, or None. Whoever can write there can
    plant a module or a Numba cache entry (pickles), so it must be ours and closed to others.
    POSIX only: Windows folders under the user's profile are private by their ACLs."""
    if not hasattr(os, "geteuid"):
        return None
    st = os.stat(path)
    if not os.path.isdir(path):
        return f"{path} is not a folder"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})"
    return None


def private_cache_dir() -> str:
    """``cache_dir()``, created with mode 700, if it (and its ``__pycache__``, where Numba keeps
    its cache) is private to this user; else a fresh private temp folder, with a one-line warning."""
    directory = cache_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        pycache = os.path.join(directory, "__pycache__")
        problem = _unsafe(directory) or (_unsafe(pycache) if os.path.lexists(pycache) else None)
        if problem is None and not os.access(directory, os.W_OK | os.X_OK):
            problem = f"{directory} is not writable"  # a read-only mount or folder: nothing could be cached
    except OSError as exc:  # HOME=/proc, a read-only home: no cache there, a private one instead
        problem = f"{directory} cannot be created ({exc.strerror or exc})"
    if problem is None:
        return directory
    if not _FALLBACK:
        print(f"refimpl: warning: not using the measure cache: {problem}; compiling into {_fallback_dir()} "
              "for this process (fix: chmod go-w the folder, or set BNN_MEASURE_CACHE to a private, writable one)",
              file=sys.stderr)
    return _fallback_dir()


def _fallback_dir() -> str:
    """The fresh private temp folder that serves this process when the cache cannot."""
    if not _FALLBACK:
        _FALLBACK.append(tempfile.mkdtemp(prefix="bnn-measure-"))  # mode 700
    return _FALLBACK[0]


def module_name(genome, counts: str = DEFAULT_COUNTS, tables: bool = True) -> tuple[str, str]:
    """(the module's name, which is also its file's stem, and its generated text)."""
    g = Genome.parse(genome)
    text = generate(g, counts, tables)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    # raw keeps the name it had before conventions existed (the text, hence the digest, is new).
    convention = "" if counts == DEFAULT_COUNTS else f"_{counts}"
    untabled = "" if tables else "_untabled"
    return f"bnn_measure_epilogue_{str(g).replace('-', '_')}{convention}{untabled}_{digest}", text


def load(genome, counts: str = DEFAULT_COUNTS, tables: bool = True):
    """The compiled epilogue module for ``genome`` under the count convention ``counts``
    (generated into the cache directory once); ``tables=False``: without the measure's lookup
    tables (refimpl/codegen/measure_tables.py), for tests and benchmarks that compare the two.

    The module runs from the text generated here, compiled with ``compile()``: never from what
    the folder holds, so a planted ``.py`` or ``__pycache__/*.pyc`` is never executed. The file
    is still written (and rewritten when it differs): Numba's cache is keyed by a real source
    file, and its line numbers point into it."""
    return _load(*module_name(genome, counts, tables))


def _load(key: str, text: str):
    # The module ``key`` of ``text``, made once per process.
    if key in _LOADED:
        return _LOADED[key]
    with _COMPILE_LOCK:  # two threads loading one genome make one module, not two
        if key not in _LOADED:
            _LOADED[key] = compile_module(key, text)
    return _LOADED[key]


def load_arrays(genome, tables: bool = True):
    """The compiled module of ``genome``'s measure over whole arrays under any count convention, for tests
    (``refimpl/codegen/arrays_template.py``): ``measure_array(a, b, c, d, cv, alpha, out)``, and
    ``measure_array_tabled`` with the convention's tables; ``cv`` is ``convention_vector(counts)``."""
    g = Genome.parse(genome)
    text = generate_arrays(g, tables)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return _load(f"bnn_measure_arrays_{str(g).replace('-', '_')}{'' if tables else '_untabled'}_{digest}", text)


def convention_vector(counts: str) -> np.ndarray:
    """The count convention ``counts`` as the float32 ``(p, q, r)`` that ``load_arrays``' kernels take
    (float32: a float64 vector would turn their arithmetic, and so their bits, into float64)."""
    return np.array(affine(counts), dtype=np.float32)


def _write_source(directory: str, key: str, text: str) -> str:
    """``directory/key.py`` holding ``text`` (rewritten when it differs); its path."""
    path = os.path.join(directory, f"{key}.py")
    current = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            current = f.read()
    if current != text:
        # Atomic, so a concurrent process never reads a half-written file.
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    return path


def compile_module(key: str, text: str):
    """The module ``key`` executed from the generated source ``text``, whose file is written to
    the private cache folder as ``key.py`` (Numba's ``cache=True`` needs a real file) but never
    executed from there (``load`` says why): the public entry for any generated Numba module (``bnn/nn/measure_fused.py``'s
    training kernels too). ``key`` must name the text (a digest of it in the name), since a
    module of that name already in ``sys.modules`` is replaced."""
    directory = private_cache_dir()
    try:
        path = _write_source(directory, key, text)
    except OSError as exc:  # a folder in the entry's place, a full disk: bypassed, as other cache damage is
        fallback = _fallback_dir()
        print(f"refimpl: warning: the measure cache entry {os.path.join(directory, key)}.py cannot be written "
              f"({exc.strerror or exc}); ignored, compiling into {fallback} for this process (fix: remove it)",
              file=sys.stderr)
        path = _write_source(fallback, key, text)
    code = compile(text, path, "exec", dont_inherit=True)
    module = types.ModuleType(key)
    module.__file__ = path  # Numba's cache locates and stamps the kernels by this file
    sys.modules[key] = module  # Numba's cache and pickling find functions by module name
    try:
        exec(code, module.__dict__)  # noqa: S102 - our generated text; its kernels compile on first use
    except BaseException:
        sys.modules.pop(key, None)
        raise
    return module
