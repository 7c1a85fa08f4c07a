"""Per-thread scratch rows share no cache line (refimpl/kernels/scratch.py): two threads writing
one line on every tile made a parallel GEMM no faster on two threads than on one."""
import numpy as np
import pytest

from refimpl.kernels import blocked
from refimpl.kernels.bits import pack_nchw
from refimpl.kernels.byte_dot import NIBBLES
from refimpl.kernels.scratch import CACHE_LINE, thread_blocks, thread_rows
from refimpl.kernels.tiling import TILE_CHANNELS, TILE_PIXELS


def _lines(rows: np.ndarray, n: int) -> list[set]:
    """The cache lines (address // CACHE_LINE) holding each row's first n elements."""
    size = n * rows.itemsize
    return [set(range(row.ctypes.data // CACHE_LINE, (row.ctypes.data + size - 1) // CACHE_LINE + 1)) for row in rows]


def _assert_no_shared_line(rows: np.ndarray, n: int):
    lines = _lines(rows, n)
    for i in range(len(lines)):
        for j in range(i + 1, len(lines)):
            assert not lines[i] & lines[j], (i, j, n, rows.dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint64, np.uint8])
@pytest.mark.parametrize("n", [1, 5, 16, 17, 100, 288])
def test_rows_share_no_cache_line_and_hold_n_elements(n, dtype):
    for threads in (1, 2, 3, 8):
        rows = thread_rows(threads, n, dtype)
        assert rows.shape[0] == threads and rows.shape[1] >= n and rows.flags.c_contiguous and rows.dtype == dtype
        _assert_no_shared_line(rows, n)
    # and the naive layout this replaces would have shared lines (so the check above can fail)
    naive = np.empty((4, 5), dtype=np.float32)
    with pytest.raises(AssertionError):
        _assert_no_shared_line(naive, 5)


@pytest.mark.parametrize("rows,cols", [(8, 16), (1, 1), (3, 5), (16, 3)])
def test_blocks_share_no_cache_line_and_hold_rows_by_cols(rows, cols):
    for threads in (1, 2, 5):
        blocks = thread_blocks(threads, rows, cols, np.uint64)
        assert blocks.shape[0] == threads and blocks.shape[1] >= rows and blocks.shape[2] == cols
        assert blocks.flags.c_contiguous
        _assert_no_shared_line(blocks.reshape(threads, -1), rows * cols)


def test_conv_plan_and_unit_scratch_rows_share_no_cache_line():
    w = np.ones((8, 64, 3, 3), np.float32)
    for layout in ("nhwc", "nchw"):
        plan = blocked.ConvPlan(pack_nchw(w), 1, 5, 5, (1, 1), (1, 1), layout=layout)
        _assert_no_shared_line(plan.xscratch, 9 * plan.k_words * TILE_PIXELS * NIBBLES)  # the tile's im2col
        if layout == "nhwc":  # the edge block, (Q, P) a thread
            _assert_no_shared_line(plan.bscratch.reshape(plan.bscratch.shape[0], -1), TILE_PIXELS * TILE_CHANNELS)
    _assert_no_shared_line(plan.bscratch, TILE_PIXELS * TILE_CHANNELS)  # nchw: the edge block, flat
