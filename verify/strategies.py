"""Hypothesis strategies shared by the verify tests."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

SMALL_N = 600  # a 3x3 layer with 64 channels has n = 576
MAX_N = 4608  # ... and with 512 channels, the widest of ResNet-18, 4608


def _window_counts(draw, size: int) -> np.ndarray:
    """(size, 4) counts a, b, c, d of one window size n: the first 12 rows pin each count at 0, 1
    and n (the rest to one other count), the others are random partitions of n."""
    n = draw(st.one_of(st.integers(1, SMALL_N), st.integers(SMALL_N, MAX_N)))
    cuts = draw(hnp.arrays(np.int64, (size, 3), elements=st.integers(0, n)))
    cuts.sort(axis=1)
    edges = np.concatenate([np.zeros((size, 1), np.int64), cuts, np.full((size, 1), n)], axis=1)
    counts = np.diff(edges, axis=1).astype(np.float64)
    edge_rows = []
    for which in range(4):
        for value in (0, 1, n):
            if value > n:
                continue
            row = np.zeros(4)
            row[which] = value
            row[(which + 1) % 4] = n - value  # the rest goes to one other count
            edge_rows.append(row)
    k = min(len(edge_rows), size)
    counts[:k] = np.array(edge_rows[:k])
    return counts


@st.composite
def count_arrays(draw, shape=(2, 3, 8), windows=1):
    """Float64 counts a, b, c, d of shape ``(windows * shape[0],) + shape[1:]``: ``windows``
    blocks along the first axis, each of ``shape`` with its own n = a + b + c + d.

    n is mostly small (where the measures' values are moderate), sometimes up to the widest
    layer's n (where cubes are large and exp(-x) underflows to subnormals and 0). Several windows
    in one example check as many sizes in fewer calls (each check's cost is mostly per call);
    every convention takes n element by element.
    """
    size = int(np.prod(shape))
    blocks = [_window_counts(draw, size) for _ in range(windows)]
    full = (windows * shape[0],) + tuple(shape[1:])
    return tuple(np.concatenate([b[:, i].reshape(shape) for b in blocks]).reshape(full) for i in range(4))


@st.composite
def alphas(draw, channels):
    """(4, channels) alpha values exactly representable in float32, so both dtypes see the same."""
    values = draw(
        hnp.arrays(np.float64, (4, channels), elements=st.floats(-4, 4, width=32, allow_subnormal=False))
    )
    return values
