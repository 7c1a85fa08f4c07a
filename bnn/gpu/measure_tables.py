"""Per-layer unary tables for the Triton measure kernels (bnn/gpu/measure_kernels.py).

A count is an integer in ``[0, n]`` and a unary operator reads one count, converted by the count
convention with the window's size ``n`` (refimpl/conventions.py), so in a layer it takes at most
``n + 1`` values per window size: the kernels look them up instead of evaluating ``powf``,
``erff``... per output, as the CPU engine does (refimpl/codegen/measure_tables.py).

* Values: computed by ``refimpl.measure`` itself, float32, on the genome ``k-1-1-1-1-0-1``, which
  is ``(U_k(a') - 0) - (0 + 0)``: exactly ``U_k(a')``, signed zeros, NaN and inf included, with
  ``a`` the count and ``b = n - a`` so that refimpl's own ``n = a + b + c + d`` converts it. So a
  table entry has refimpl's bits by construction, whatever the libm.
* Derivatives by the converted count: torch's autograd of ``bnn.measure.unary`` at the converted
  counts (what the eager measure's backward multiplies by; the eager chain of a composite such as
  ``1/(1+exp(-x))`` rounds in other places, so gradients agree with eager to float32 rounding).
* Alpha codes 15-17 take the converted count itself (the kernel applies alpha) and derivative 1;
  code 1 (zero) is 0 with derivative 0, and the kernel gives it no gradient at all, as eager.

Rows: under ``raw`` one row (a raw count does not depend on n), of ``max(n) + 1`` entries; under
``freq`` and ``laplace`` one row per distinct window size of the layer (border pixels have
smaller windows), each pixel pointing at its row by the offset ``r * L``.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

import refimpl
from refimpl.conventions import DEFAULT as DEFAULT_COUNTS
from refimpl.conventions import check_counts, convert
from refimpl.operators import UNARY

from ..nn.measure import unary

ZERO_CODE = 1


def rows_of(window_sizes, counts: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(distinct sizes ``ns`` (R,), each pixel's row offset ``r * L`` (P,) int32, L) for window sizes (P,)."""
    sizes = np.rint(np.asarray(window_sizes, dtype=np.float64).reshape(-1)).astype(np.int64)
    length = int(sizes.max()) + 1
    if check_counts(counts) == DEFAULT_COUNTS:
        return np.array([length - 1]), np.zeros(sizes.shape, dtype=np.int32), length
    ns, inverse = np.unique(sizes, return_inverse=True)
    return ns, (inverse.reshape(-1) * length).astype(np.int32), length


def _table_code(code: int) -> int:
    # An alpha operator's table is its converted count: identity's table.
    return 0 if UNARY[code].uses_alpha else code


@functools.lru_cache(maxsize=256)
def unary_table(code: int, counts: str, ns: tuple[int, ...], length: int) -> np.ndarray:
    """(R, L) float32: operator ``code`` (alpha ones: the converted count) at counts 0..L-1 in windows of sizes ``ns``."""
    x = np.broadcast_to(np.arange(length, dtype=np.int64), (len(ns), length))
    n = np.asarray(ns, dtype=np.int64).reshape(-1, 1)
    a = np.ascontiguousarray(x).reshape(1, 1, -1)
    b = np.ascontiguousarray(n - x).reshape(1, 1, -1)
    zero = np.zeros_like(a)
    genome = refimpl.Genome((_table_code(code), 1, 1, 1, 1, 0, 1))
    out = refimpl.measure(genome, a, b, zero, zero, dtype=np.float32, counts=counts)
    out.setflags(write=False)
    return out.reshape(len(ns), length)


@functools.lru_cache(maxsize=256)
def derivative_table(code: int, counts: str, ns: tuple[int, ...], length: int) -> np.ndarray:
    """(R, L) float32: d(operator ``code``)/d(converted count) by torch's autograd (alpha codes: 1, zero: 0)."""
    if UNARY[code].uses_alpha:
        return np.ones((len(ns), length), dtype=np.float32)
    x = torch.arange(length, dtype=torch.float32).expand(len(ns), length)
    n = torch.tensor(ns, dtype=torch.float32).reshape(-1, 1)
    xc = (x if counts == DEFAULT_COUNTS else convert(counts, x, n)).clone().requires_grad_()
    with torch.enable_grad():
        u = unary(code, xc, None)
        if code == ZERO_CODE or not u.requires_grad:
            return np.zeros((len(ns), length), dtype=np.float32)
        (grad,) = torch.autograd.grad(u, xc, torch.ones_like(u))
    out = grad.numpy().astype(np.float32)
    out.setflags(write=False)
    return out


def unary_tables(codes, counts: str, ns, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, derivatives) (4, R, L) float32 of the genome's unary slots U1..U4 (``codes``: their four codes)."""
    ns = tuple(int(v) for v in np.asarray(ns).reshape(-1))
    values = np.stack([unary_table(int(k), counts, ns, length) for k in codes])
    derivatives = np.stack([derivative_table(int(k), counts, ns, length) for k in codes])
    return values, derivatives
