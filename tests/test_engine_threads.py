"""A ``Model`` shared by threads, as a server shares one (issue 30 items 4 and 8): every call gives
the logits a serial run gives, bit for bit, and first runs on several threads compile each kernel
once. BNN_THREAD_CALLS sets the calls a thread (the issue's check: 200)."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
from _tiny_bnn import tiny_model

from refimpl.engine.model import Model

ROOT = Path(__file__).resolve().parents[1]
THREADS = 4
CALLS = int(os.environ.get("BNN_THREAD_CALLS", "50"))
SIZES = (1, 3, 8, 17)  # batch sizes: each has its plan, and a plan's buffers are what threads would share


def _batches(model: Model, n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 1.0, (SIZES[i % len(SIZES)], *model.input_shape)).astype(np.float32) for i in range(n)]


def test_a_model_shared_by_four_threads_gives_the_serial_logits_bit_for_bit():
    model = Model(*tiny_model(seed=3, channels=2, side=12, classes=5, real=True))
    work = [_batches(model, CALLS, seed) for seed in range(THREADS)]
    expected = [[model.run(x) for x in batches] for batches in work]
    got = [[None] * CALLS for _ in range(THREADS)]
    errors = []
    start = threading.Barrier(THREADS)

    def worker(t):
        try:
            start.wait()  # all four start together
            for i, x in enumerate(work[t]):
                got[t][i] = model.run(x)
        except BaseException as exc:  # noqa: BLE001 - reported below, with the thread's number
            errors.append((t, repr(exc)))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    wrong = sum(not np.array_equal(g, e) for gs, es in zip(got, expected) for g, e in zip(gs, es))
    assert wrong == 0, f"{wrong} of {THREADS * CALLS} calls differ from the serial run"


# Four separate Models of one genome whose first runs start together, in a fresh process: each
# kernel's driver is compiled or loaded once, never by two threads at a time.
FIRST_RUNS = """
import sys, threading
import numpy as np
sys.path.insert(0, sys.argv[1])
from _tiny_bnn import tiny_model
from refimpl.engine.model import Model
models = [Model(*tiny_model(seed=s, side=10)) for s in range(4)]
x = np.random.default_rng(0).normal(size=(5, 1, 10, 10)).astype(np.float32)
start, errors = threading.Barrier(4), []
def first(m):
    start.wait()
    try:
        m.run(x)
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=first, args=(m,)) for m in models]
[t.start() for t in threads]
[t.join() for t in threads]
print(errors)
"""


def test_first_runs_of_separate_models_on_four_threads_compile_once(tmp_path):
    env = {**os.environ, "BNN_MEASURE_CACHE": str(tmp_path / "cache")}  # an empty cache: every kernel is new
    r = subprocess.run([sys.executable, "-c", FIRST_RUNS, str(ROOT / "tests")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
