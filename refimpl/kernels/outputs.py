"""Where the four count outputs live: fresh blocks recycled once their caller drops them, or
the caller's own arrays after a check."""
from __future__ import annotations

import math
import sys
import threading

import numpy as np


def address(array: np.ndarray) -> int:
    """The address of ``array``'s first element (``array.ctypes.data`` builds a ctypes object:
    ~10 us, a visible share of a small call)."""
    return array.__array_interface__["data"][0]


class OutputBlocks:
    """Recycles the memory of large count outputs that their caller has dropped.

    Four int64 outputs are 32 bytes per output position: 32 MB for the 256-channel 8x8 layer
    of a CIFAR ResNet at batch 64. glibc maps such blocks fresh from the kernel and unmaps them when
    they are freed, so a loop that calls ``counts_conv2d`` and drops the result pays a page
    fault per 4 KB of output, every call: 5-25 ms here against 2 ms of counting. A block is
    handed out again once nothing references it any more (its reference count says so: every
    view of it, however derived, holds a reference). At most ``MAX_BYTES`` are kept: room for
    two calls' outputs of a 64-channel 32x32 layer at batch 64 (128 MB each), since
    ``r = counts_conv2d(...)`` in a loop holds the last result while the next is computed.
    Blocks of another size are dropped once idle; ``clear()`` drops all.
    """

    MIN_BYTES = 1 << 20
    MAX_BYTES = 512 << 20

    def __init__(self):
        self._blocks: list[np.ndarray] = []  # the owners of the memory, never views
        self._lock = threading.Lock()

    def take(self, words: int) -> np.ndarray:
        """A flat int64 array of ``words`` starting on a 64-byte line."""
        if words * 8 < self.MIN_BYTES:
            return self._on_a_line(np.empty(words + 8, dtype=np.int64), words)
        with self._lock:
            # Views of a view keep a reference to the owner itself (NumPy collapses bases), so
            # the owner's count is exactly: the list, the loop variable, getrefcount's argument.
            for raw in self._blocks:
                if raw.size == words + 8 and sys.getrefcount(raw) == 3:
                    return self._on_a_line(raw, words)
            raw = np.empty(words + 8, dtype=np.int64)
            # idle blocks of other sizes go (a new layer shape), blocks in use stay listed
            kept = [b for b in self._blocks if b.size == raw.size or sys.getrefcount(b) > 3]
            if sum(b.nbytes for b in kept) + raw.nbytes <= self.MAX_BYTES:
                kept.append(raw)
            self._blocks = kept
            return self._on_a_line(raw, words)

    @staticmethod
    def _on_a_line(raw: np.ndarray, words: int) -> np.ndarray:
        start = (-address(raw) % 64) // 8
        return raw[start:start + words]

    def clear(self):
        """Forget every block (memory in use stays with its users)."""
        with self._lock:
            self._blocks = []


_OUTPUT_BLOCKS = OutputBlocks()
# Each output starts this many words after the previous one's end: on its own 64-byte line,
# and not at the same offset in a 4 KB page (loads and stores to addresses 4 KB apart are
# mistaken for each other by the store-forwarding check, which stalls the identities).
_OUTPUT_STAGGER = 40


def fresh_outputs(shape) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Four fresh int64 arrays of ``shape``, each on its own 64-byte line, from one recycled block."""
    size = math.prod(shape)
    stride = -(-(size + _OUTPUT_STAGGER) // 8) * 8
    block = _OUTPUT_BLOCKS.take(4 * stride)
    return tuple(block[k * stride:k * stride + size].reshape(shape) for k in range(4))


def checked_outputs(out, shape):
    """Four int64 arrays of ``shape``: fresh, or the caller's ``out`` after checking it."""
    if out is None:
        return fresh_outputs(shape)
    if len(out) != 4:
        raise ValueError(f"out must be four arrays (a, b, c, d), got {len(out)}")
    for name, t in zip("abcd", out):
        if not isinstance(t, np.ndarray) or t.shape != shape or t.dtype != np.int64 or not t.flags.c_contiguous:
            got = f"{t.dtype} {t.shape}" if isinstance(t, np.ndarray) else type(t).__name__
            raise ValueError(f"out array {name} must be C-contiguous int64 of shape {shape}, got {got}")
    return tuple(out)


def zero_counts(out, shape):
    """a, b, c, d all 0: fresh, or written into the caller's ``out``."""
    # An empty dimension: no images or filters (an empty result), or no channels or no input
    # pixels (every window is without taps: n = 0, so every count is 0). Kernels never see it.
    if out is None:
        return tuple(np.zeros(shape, np.int64) for _ in range(4))
    for t in checked_outputs(out, shape):
        t.fill(0)
    return tuple(out)
