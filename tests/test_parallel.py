"""Parallel Numba kernels agree exactly with serial runs (STYLE: serial == parallel)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

import refimpl


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
