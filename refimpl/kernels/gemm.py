"""The simple popcount GEMM ``a = sum popcount(x & w)`` of a convolution over packed words.

One popcount per word pair, padded taps skipped by loop bounds: obviously right, slow, and kept
in the product (``kernel="simple"``) as the oracle the blocked kernel is tested against.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import jit
from .bits import popcount


@jit(parallel=True)
def conv_simple(xp, wp, stride, padding, dilation, out_h, out_w, a):
    """Fill ``a`` (N, O, Ho, Wo) int64 with popcount(x & w) summed over each window's in-bounds
    taps: xp (N, H, W, K) and wp (O, KH, KW, K) packed words."""
    n_img, h, w, k_words = xp.shape
    n_out, kh, kw, _ = wp.shape
    for r in prange(n_img * out_h):
        i = r // out_h
        oy = r - i * out_h
        for ox in range(out_w):
            for o in range(n_out):
                total = np.int64(0)
                for ty in range(kh):
                    y = oy * stride[0] - padding[0] + ty * dilation[0]
                    if y < 0 or y >= h:
                        continue
                    for tx in range(kw):
                        x = ox * stride[1] - padding[1] + tx * dilation[1]
                        if x < 0 or x >= w:
                            continue
                        for k in range(k_words):
                            total += popcount(xp[i, y, x, k] & wp[o, ty, tx, k])
                a[i, o, oy, ox] = total
