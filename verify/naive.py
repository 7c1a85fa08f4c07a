"""Obviously-right oracles: loops over unpacked bits, and the paper's table written out by hand.

Nothing here imports the operator table or the packed kernels; these are the independent
computations the two paths are checked against.
"""
from __future__ import annotations

import numpy as np
from scipy.special import erf


def bits(v) -> np.ndarray:
    """The binarization of docs/design.md section 1: +1 (bit 1) where v >= 0, so 0 is a 1 bit."""
    return np.asarray(v) >= 0


def counts_dense(x, w):
    """a, b, c, d (N, M) of rows of x (N, K) against rows of w (M, K), one pair at a time."""
    xb, wb = bits(x), bits(w)
    shape = (xb.shape[0], wb.shape[0])
    a, b, c, d = (np.zeros(shape, dtype=np.int64) for _ in range(4))
    for i in range(shape[0]):
        for m in range(shape[1]):
            xi, wm = xb[i], wb[m]
            a[i, m] = np.sum(xi & wm)
            b[i, m] = np.sum(~xi & wm)
            c[i, m] = np.sum(xi & ~wm)
            d[i, m] = np.sum(~xi & ~wm)
    return a, b, c, d


def conv_output_size(size, kernel, stride, padding, dilation):
    """Output side of a convolution, as torch computes it (floor division)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def counts_conv2d(x, w, stride=1, padding=0, dilation=1):
    """a, b, c, d (N, O, Ho, Wo) of a cross-correlation, visiting every tap and skipping padded
    ones: a padded tap is in none of the four counts."""
    xb, wb = bits(x), bits(w)
    n_img, channels, h, wd = xb.shape
    n_out, _, kh, kw = wb.shape
    out_h = conv_output_size(h, kh, stride, padding, dilation)
    out_w = conv_output_size(wd, kw, stride, padding, dilation)
    counts = np.zeros((4, n_img, n_out, out_h, out_w), dtype=np.int64)
    for i in range(n_img):
        for oy in range(out_h):
            for ox in range(out_w):
                for ty in range(kh):
                    for tx in range(kw):
                        y = oy * stride - padding + ty * dilation
                        x_ = ox * stride - padding + tx * dilation
                        if not (0 <= y < h and 0 <= x_ < wd):
                            continue
                        xv = xb[i, :, y, x_][None, :]  # (1, C)
                        wv = wb[:, :, ty, tx]  # (O, C)
                        counts[0, i, :, oy, ox] += np.sum(xv & wv, axis=1)
                        counts[1, i, :, oy, ox] += np.sum(~xv & wv, axis=1)
                        counts[2, i, :, oy, ox] += np.sum(xv & ~wv, axis=1)
                        counts[3, i, :, oy, ox] += np.sum(~xv & ~wv, axis=1)
    return tuple(counts)


# ----------------------------------------------------------------------------------------------
# The paper's Table "Promising Similarity Measures" (docs/design.md section 4), transcribed formula by
# formula in float64. alpha is M7's learnable d' (its initial value 1.0 unless given).
# ----------------------------------------------------------------------------------------------
def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def paper_measure(name, a, b, c, d, alpha=1.0):
    """The paper's measure ``name`` (baseline, M1..M10) evaluated as the paper writes it, in float64.

    ValueError for a name it does not transcribe.
    """
    a, b, c, d = (np.asarray(v, dtype=np.float64) for v in (a, b, c, d))
    with np.errstate(all="ignore"):
        if name == "baseline":
            return (a + d) - (b + c)
        if name == "M1":
            return (b**3 - c) / (a**3 + d)
        if name == "M2":
            return (b**3 + _sigmoid(c)) / (a**3 + d)
        if name == "M3":
            return (b**3 + c) / (a**3 + d)
        if name == "M4":
            return (b**3 - np.sin(c)) / (a**3 + d)
        if name == "M5":
            return (b - erf(c)) / (a**3 + np.exp(-d * d))
        if name == "M6":
            return b**3 * _sigmoid(c) / (a**3 + d)
        if name == "M7":
            return (a**3 + alpha) / (b**3 + c)
        if name == "M8":
            return (b**3 + np.exp(-c)) / (a**3 + d)
        if name == "M9":
            return b**3 / (np.arctan(c) * (a**3 + d**2))
        if name == "M10":
            return (b**3 + _sigmoid(c)) / (a**3 + d**2)
    raise ValueError(f"no transcription of {name!r}; known: baseline, M1..M10")


PAPER_NAMES = ("baseline",) + tuple(f"M{i}" for i in range(1, 11))
