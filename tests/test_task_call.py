"""A genome's epilogue kernels run as serial tasks under one generic parallel driver
(refimpl/engine/task_call.py): the call by address computes what the task computes, one driver
serves every genome, and arguments of other types are refused, never passed to the task."""
import numba
import numpy as np
import pytest

from refimpl.engine import _drivers, epilogue
from refimpl.engine.plan import measure_tables
from refimpl.engine.task_call import call_task, native_address, run_tasks, task_address
from refimpl.kernels.scratch import y_scratch

_SIGNATURE = "void(i8, i8, f4[::1], f4[::1])"


@numba.njit(_SIGNATURE)
def _double(first, last, x, y):
    for i in range(first, last):
        y[i] = x[i] * np.float32(2.0)


@numba.njit(parallel=True)
def _drive(task, x, y):
    for part in numba.prange(3):
        call_task(task, np.int64(part * 4), np.int64(part * 4 + 4), x, y)


def test_call_task_runs_the_compiled_code_at_the_address_on_every_part():
    x = np.arange(12, dtype=np.float32)
    y = np.full(12, -1, np.float32)
    _drive(native_address(_double), x, y)
    np.testing.assert_array_equal(y, 2 * x)


@numba.njit
def _count_visits(first, last, visits):
    for i in range(first, last):
        visits[i] += 1


@pytest.mark.parametrize("n_tasks, parts", [(1, 1), (7, 3), (12, 4), (5, 64), (1000, 8)])
def test_run_tasks_runs_every_task_once_in_any_number_of_parts(n_tasks, parts):
    # The training measure's kernels (bnn/nn/measure_fused.py) go through run_tasks: each task,
    # once, whatever the split (more parts than tasks included).
    address = task_address(_count_visits, "void(i8, i8, i8[::1])")
    visits = np.zeros(n_tasks, np.int64)
    run_tasks(address, parts, n_tasks, visits)
    np.testing.assert_array_equal(visits, np.ones(n_tasks, np.int64))


def test_task_address_disables_further_compiles():
    task_address(_count_visits, "void(i8, i8, i8[::1])")
    with pytest.raises(TypeError):
        _count_visits(0, 1, np.zeros(1, np.float32))


def _run_epilogue(genome, a, px, pw, n):
    # One output row of counts; BatchNorm scale 1 and shift 0, so out = fma(m, 1, 0) = m exactly.
    module = epilogue.load(genome)
    size = a.shape[-1]
    alpha = np.ones((4, size), np.float32)
    out = np.zeros((1, 1, size), np.float32)
    kernel = epilogue.kernel(module, "epilogue_none")
    tab, toff, tails = measure_tables(module, np.array([int(n.max())]))  # raw counts: one row serves every n up to it
    kernel(a, px, pw, n - pw, alpha, np.ones(size, np.float32), np.zeros(size, np.float32), tab, toff, tails,
           y_scratch(size), out, np.zeros((1, 1, 1, 1), np.uint64), False, 1, 0, 0, 1)
    return module, kernel, out[0, 0]


def test_one_driver_serves_two_genomes_each_with_its_own_measure():
    rng = np.random.default_rng(3)
    size = 37
    pw = rng.integers(5, 40, (1, size)).astype(np.float32)
    n = pw + rng.integers(5, 40, (1, size)).astype(np.float32)
    px = np.full((1, 1), 20, np.float32)
    a = np.minimum(pw, px).astype(np.int32)[None] // 2  # (1, 1, size), 0 <= a <= min(pw, px)
    results = {}
    for genome in ("baseline", "M3"):
        module, kernel, got = _run_epilogue(genome, a, px, pw, n)
        # the module's own measure, from the same counts (b = pw - a, c = px - a, d = n - pw - px + a)
        A = a[0, 0].astype(np.float32)
        want = np.empty(size, np.float32)
        epilogue.load_arrays(genome).measure_array(
            A.reshape(1, 1, -1), (pw[0] - A).reshape(1, 1, -1), (px[0, 0] - A).reshape(1, 1, -1),
            (n[0] - pw[0] - px[0, 0] + A).reshape(1, 1, -1), epilogue.convention_vector("raw"),
            np.ones((4, 1), np.float32), want.reshape(1, 1, -1))
        np.testing.assert_array_equal(got, want)
        results[genome] = (kernel, got)
    (k1, y1), (k2, y2) = results.values()
    # one driver and one task for every genome; each genome enters as its own measure_rows
    assert k1.driver is k2.driver and len(_drivers.epilogue_none.signatures) == 1
    assert k1.task == k2.task and len(_drivers.epilogue_none_task.signatures) == 1
    assert k1.lead != k2.lead and not np.array_equal(y1, y2)


def test_a_kernel_refuses_arguments_of_other_types():
    size = 4
    a = np.zeros((1, 1, size), np.float64)  # the task was compiled for int32 counts
    with pytest.raises(TypeError):
        _run_epilogue("baseline", a, np.zeros((1, 1), np.float32), np.zeros((1, size), np.float32),
                      np.zeros((1, size), np.float32))
