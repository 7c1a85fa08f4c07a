"""Parallel Numba kernels agree exactly with serial runs (STYLE: serial == parallel)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

import refimpl
from refimpl import gemm
from refimpl.bits import pack_bits, pack_nchw


def _with_threads(n, fn, *args, **kwargs):
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        return fn(*args, **kwargs)
    finally:
        numba.set_num_threads(before)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")
@pytest.mark.parametrize("kernel", ["simple", "blocked"])
@pytest.mark.parametrize(
    "shape_x,shape_w,conv",
    [
        ((3, 65, 9, 7), (19, 65, 3, 3), dict(stride=1, padding=1)),
        ((2, 130, 6, 6), (9, 130, 1, 1), dict(stride=2, padding=0)),
        ((4, 64, 8, 8), (33, 64, 3, 3), dict(stride=1, padding=2, dilation=2)),
    ],
)
def test_counts_serial_equals_parallel(kernel, shape_x, shape_w, conv):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(shape_x), rng.standard_normal(shape_w)
    serial = _with_threads(1, refimpl.counts_conv2d, x, w, **conv, kernel=kernel)
    parallel = _with_threads(2, refimpl.counts_conv2d, x, w, **conv, kernel=kernel)
    for name, s, p in zip("abcd", serial, parallel):
        assert np.array_equal(s, p), f"{kernel}: {name} differs between 1 and 2 threads"


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")
def test_measure_serial_equals_parallel():
    rng = np.random.default_rng(1)
    counts = [rng.integers(0, 300, (4, 17, 25)).astype(np.float64) for _ in range(4)]
    for name in ("M5", "M7", "M9"):
        for dtype in (np.float64, np.float32):
            serial = _with_threads(1, refimpl.measure, name, *counts, dtype=dtype)
            parallel = _with_threads(2, refimpl.measure, name, *counts, dtype=dtype)
            assert np.array_equal(serial, parallel, equal_nan=True), (name, dtype)


def test_simple_kernel_equals_its_python_source():
    # The jitted prange loop against the same function run as plain Python (truly serial).
    rng = np.random.default_rng(2)
    xp = pack_nchw(rng.standard_normal((2, 70, 5, 4)))
    wp = pack_bits(np.moveaxis(rng.standard_normal((3, 70, 3, 3)), 1, -1))
    args = ((1, 1), (1, 1), (1, 1), 5, 4)
    jitted, plain = (np.empty((2, 3, 5, 4), dtype=np.int64) for _ in range(2))
    gemm._conv_simple(xp, wp, *args, jitted)
    gemm._conv_simple.py_func(xp, wp, *args, plain)
    assert np.array_equal(jitted, plain)
