"""Per-thread scratch rows that share no cache line.

Each thread of a parallel kernel writes its own row of a (threads, n) scratch array on every
tile. Rows of a plain array meet inside one 64-byte line wherever a row's size is not a whole
number of lines or the array does not start on a line (NumPy aligns to 16 bytes): both threads
then write that line on every tile and it moves between their caches each time. A 16-float row
of window sums written once a tile made the AVX2 GEMM of a 64-channel layer take as long on two
threads as on one (docs/performance.md, "Per-thread scratch").
"""
from __future__ import annotations

import numpy as np

from .tiling import TILE_PIXELS

CACHE_LINE = 64  # bytes: x86-64 and the common ARM64 cores (Apple's M-series: 128, see below)
# One line of gap between rows beyond the rounding covers a misaligned start; two keep the
# adjacent-line prefetcher's pairs (and 128-byte lines) apart as well.
GAP_LINES = 2


def row_length(n: int, itemsize: int) -> int:
    """Elements per row of ``thread_rows``: n rounded up to whole cache lines, plus GAP_LINES."""
    line = max(1, CACHE_LINE // itemsize)
    return -(-n // line) * line + GAP_LINES * line


def thread_rows(threads: int, n: int, dtype) -> np.ndarray:
    """An uninitialized (threads, row_length(n)) C-contiguous array whose rows' first n elements
    share no cache line with another row's. Kernels use ``rows[tid, :n]``, or the whole row as
    space they may leave unused."""
    return np.empty((threads, row_length(n, np.dtype(dtype).itemsize)), dtype=dtype)


def thread_blocks(threads: int, rows: int, cols: int, dtype) -> np.ndarray:
    """An uninitialized (threads, rows + k, cols) C-contiguous array whose blocks' first ``rows``
    rows share no cache line with another block's: k spare rows make each block at least
    ``row_length(rows * cols)`` elements."""
    n = rows * cols
    spare = -(-(row_length(n, np.dtype(dtype).itemsize) - n) // cols)
    return np.empty((threads, rows + spare, cols), dtype=dtype)


def y_scratch_size(channels: int) -> int:
    """Floats of a thread's row of the engine's y scratch (refimpl/engine/plan.py): a fused tile's
    rows of outputs, and in the two-pass epilogue at least 2048 outputs per call of a genome's
    ``measure_rows`` (a call costs about 50 ns)."""
    return max(2048, TILE_PIXELS * channels)


def y_scratch(channels: int, threads: int | None = None) -> np.ndarray:
    """The engine's y scratch for layers of ``channels`` outputs: one row per thread (Numba's
    thread count by default), as the epilogue kernels take it."""
    if threads is None:
        import numba

        threads = numba.config.NUMBA_NUM_THREADS
    return thread_rows(threads, y_scratch_size(channels), np.float32)
