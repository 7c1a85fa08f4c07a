"""Cached kernels are fresh: a change to any file of the package recompiles them.

Numba stamps a cached function with its own source file only, but the kernels inline helpers
from other files; ``refimpl._jit`` stamps them with the whole package instead. The check runs
a copy of the package in fresh processes, so it never touches this checkout's caches.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import refimpl

PACKAGE = Path(refimpl.__file__).resolve().parent

# window_sums.word_popcounts calls bits.popcount, an intrinsic defined in another file.
SCRIPT = """
import numpy as np
import refimpl
from refimpl.kernels import window_sums
out = np.zeros(1, dtype=np.int64)
window_sums.word_popcounts(np.array([[0b1011]], dtype=np.uint64), out)
print(refimpl.__file__)
print(out[0])
"""


def _run(root: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_a_kernel_recompiles_when_a_helper_in_another_file_changes(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "refimpl", ignore=shutil.ignore_patterns("__pycache__"))
    where, count = _run(tmp_path)
    assert Path(where).resolve().parent == (tmp_path / "refimpl").resolve()
    assert count == "3"
    assert any((tmp_path / "refimpl" / "kernels" / "__pycache__").glob("window_sums.word_popcounts*.nbi")), "nothing was cached"

    bits = tmp_path / "refimpl" / "kernels" / "bits.py"
    text = bits.read_text()
    assert "return builder.ctpop(args[0])" in text
    # window_sums.py is untouched: with Numba's own stamp the cached kernel would still print 3
    bits.write_text(text.replace("return builder.ctpop(args[0])",
                                 "return builder.add(builder.ctpop(args[0]), args[0].type(1))"))
    assert _run(tmp_path)[1] == "4"


# Every script below records the kernels its process compiles (cache loads are not compiles)
# and prints their names, or "-".
LISTENER = """
import numpy as np
import numba.core.event as ev
compiled = []
class Listener(ev.Listener):
    def on_start(self, event):
        compiled.append(event.data["dispatcher"].py_func.__qualname__)
    def on_end(self, event):
        pass
ev.register("numba:compile", Listener())
"""
PRINT_COMPILED = """
print(",".join(sorted(set(compiled))) or "-")
"""

# Evaluates a measure in both dtypes.
MEASURE_SCRIPT = """
import refimpl
counts = np.ones((2, 3, 4))
for dtype in (np.float64, np.float32):
    assert refimpl.measure("baseline", counts, counts, counts, counts, dtype=dtype)[0, 0, 0] == 0
"""

# Runs the baseline's two-pass epilogue kernel (its serial task under the generic parallel
# driver, refimpl/engine/task_call.py).
EPILOGUE_SCRIPT = """
import numba
from refimpl.engine import epilogue
a = np.full((1, 1, 1), 3, np.int32)
px, pw, npw = (np.full((1, 1), v, np.float32) for v in (5, 4, 6))
out = np.zeros((1, 1, 1), np.float32)
epilogue.kernel(epilogue.load("baseline"), "epilogue_none")(
    a, px, pw, npw, np.ones((4, 1), np.float32), np.ones(1, np.float32), np.zeros(1, np.float32),
    np.zeros((1, 1), np.float32), np.zeros(1, np.int64), np.zeros(1, np.int64),  # the baseline has no lookup tables
    np.zeros((numba.config.NUMBA_NUM_THREADS, 2048), np.float32), out, np.zeros((1, 1, 1, 1), np.uint64), False, 1, 0, 0, 1)
assert out[0, 0, 0] == 4  # XNOR of a, b, c, d = 3, 1, 2, 4
"""


def _compiles_in_a_fresh_copy(tmp_path, script: str, **env_extra):
    """A function that runs ``script`` in a new process over a copy of the package (its own Numba
    cache, empty at first) and returns the names of the kernels that process compiled."""
    shutil.copytree(PACKAGE, tmp_path / "refimpl", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env.update(env_extra)

    def compiled() -> str:
        result = subprocess.run([sys.executable, "-c", LISTENER + script + PRINT_COMPILED], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    return compiled


def test_a_second_process_loads_the_measure_kernels_from_the_cache(tmp_path):
    # A kernel made by a closure over jitted functions missed Numba's cache in every process: its
    # cache key held the pickled dispatchers, whose ids differ per process.
    compiled = _compiles_in_a_fresh_copy(tmp_path, MEASURE_SCRIPT)
    assert "measure_f64" in compiled(), "the first process compiles the kernels"
    assert compiled() == "-"


def test_a_second_process_loads_the_epilogue_driver_and_task_from_the_cache(tmp_path):
    # The driver is compiled once for every genome only if Numba can cache it: a kernel that
    # asks Numba for its thread count, or holds a dynamic address, is never cached.
    compiled = _compiles_in_a_fresh_copy(tmp_path, EPILOGUE_SCRIPT, BNN_MEASURE_CACHE=str(tmp_path / "epilogues"))
    first = compiled().split(",")
    assert "epilogue_none" in first and "epilogue_none_task" in first and "measure_rows" in first, first
    assert compiled() == "-"
