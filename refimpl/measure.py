"""Evaluate a genome's measure on counts, in float64 or float32 (docs/design.md section 2)."""
from __future__ import annotations

import numpy as np

from ._numba_ops import measure_f32, measure_f64
from .conventions import DEFAULT, check_counts, convert
from .genome import Genome
from .operators import UNARY

_DTYPES = (np.float64, np.float32)


def default_alpha(genome: Genome, channels: int, dtype=np.float64) -> np.ndarray:
    """Alpha of shape (4, channels) at the initial values of docs/design.md section 2 (0 in slots that ignore it)."""
    alpha = np.zeros((4, channels), dtype=dtype)
    for slot, code in enumerate(genome.unary):
        if UNARY[code].uses_alpha:
            alpha[slot] = UNARY[code].alpha_init
    return alpha


def measure(genome, a, b, c, d, alpha=None, dtype=np.float64, counts=DEFAULT) -> np.ndarray:
    """``B3(B1(U1(a'), U2(d')), B2(U3(b'), U4(c')))`` elementwise, every step rounded to ``dtype``.

    ``a, b, c, d``: counts of one shape ``(N, C, ...)``; ``alpha``: ``(4, C)`` (row i for slot
    U(i+1)) or None for the initial values. ``counts``: the count convention
    (``refimpl.conventions``): each count ``x`` enters as its formula of ``x`` and the window's
    ``n = a + b + c + d`` (summed exactly, before rounding to ``dtype``). IEEE semantics: NaN and
    inf pass through, nothing raises (docs/design.md section 2).
    """
    g = Genome.parse(genome)
    check_counts(counts)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(t) for t in _DTYPES):
        raise ValueError(f"measure dtype must be float64 or float32, got {dtype}")
    count_arrays = [np.asarray(v) for v in (a, b, c, d)]
    shape = count_arrays[0].shape
    for name, v in zip("abcd", count_arrays):
        if v.shape != shape:
            raise ValueError(f"count {name} has shape {v.shape}, but a has {shape}; all four must match")
        if not (np.issubdtype(v.dtype, np.integer) or np.issubdtype(v.dtype, np.floating)):
            raise ValueError(f"count {name} must be numeric, got dtype {v.dtype}")
    if len(shape) < 2:
        raise ValueError(f"counts need shape (N, C, ...), got {shape}")
    channels = shape[1]
    if alpha is None:
        alpha = default_alpha(g, channels, dtype)
    else:
        alpha = np.asarray(alpha)
        if alpha.shape != (4, channels):
            raise ValueError(f"alpha must have shape (4, {channels}) (one row per unary slot), got {alpha.shape}")
    alpha = np.ascontiguousarray(alpha, dtype=dtype)
    flat = [np.ascontiguousarray(v.reshape(shape[0], channels, -1), dtype=dtype) for v in count_arrays]
    if counts != "raw":
        # n summed exactly (int64, or float64 for float counts: integers), then rounded once to dtype.
        wide = [v.astype(np.int64 if np.issubdtype(v.dtype, np.integer) else np.float64) for v in count_arrays]
        n = (wide[0] + wide[1] + wide[2] + wide[3]).reshape(flat[0].shape).astype(dtype)
        flat = [np.ascontiguousarray(convert(counts, v, n)) for v in flat]
    out = np.empty_like(flat[0])
    kernel = measure_f64 if dtype == np.float64 else measure_f32
    kernel(np.array(g.codes, dtype=np.int64), *flat, alpha, out)
    return out.reshape(shape)
