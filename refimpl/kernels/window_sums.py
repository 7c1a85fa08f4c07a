"""Window sums over in-bounds taps: the ``px``, ``pw`` and ``n`` of the count identities
(docs/design.md section 1), and the identities themselves for a GEMM's ``a``.

A padded tap belongs to none of a, b, c, d, so these sums run over the taps of each output
position that land inside the input: for one axis they are one contiguous run (``tap_range``).
The engine (refimpl/engine/) takes ``in_bounds_taps``, ``weight_window_sums`` and
``word_popcounts`` from here for its own plans.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import prange

from .._jit import jit
from .bits import popcount
from .geometry import conv_output_size


@jit
def tap_range(out_pos, stride, padding, dilation, kernel, size):
    """Taps [t0, t1) of one kernel axis that land inside the input at output position out_pos.

    The tap t reads input position ``out_pos*stride - padding + t*dilation``; the in-bounds taps
    are one contiguous run, so window sums need no per-tap bounds test.
    """
    start = out_pos * stride - padding
    t0 = 0 if start >= 0 else (-start + dilation - 1) // dilation
    t1 = min(kernel, (size - start + dilation - 1) // dilation)
    return t0, max(t0, t1)


@jit
def _tap_ranges(n_pos, stride, padding, dilation, kernel, size):
    # tap_range of every output position of one axis: (n_pos, 2). Hoisted out of the window
    # loops, whose cost it was (two integer divisions per output and filter).
    ranges = np.empty((n_pos, 2), dtype=np.int64)
    for pos in range(n_pos):
        ranges[pos, 0], ranges[pos, 1] = tap_range(pos, stride, padding, dilation, kernel, size)
    return ranges


@functools.lru_cache(maxsize=32)
def in_bounds_taps(h, w, kh, kw, stride, padding, dilation):
    """(ys, xs, taps) of a geometry: the in-bounds tap range of each output row and column,
    (Ho, 2) and (Wo, 2), and the number of in-bounds taps of each output position, (Ho*Wo,).
    Geometry only, so cached (shared arrays: nothing may write to them)."""
    out_h = conv_output_size(h, kh, stride[0], padding[0], dilation[0])
    out_w = conv_output_size(w, kw, stride[1], padding[1], dilation[1])
    ys = _tap_ranges(out_h, stride[0], padding[0], dilation[0], kh, h)
    xs = _tap_ranges(out_w, stride[1], padding[1], dilation[1], kw, w)
    taps = ((ys[:, 1] - ys[:, 0])[:, None] * (xs[:, 1] - xs[:, 0])[None, :]).reshape(-1)
    return ys, xs, taps


@jit
def _window_sum_image(pix, ys, xs, stride, padding, dilation, out):
    # pix (H, W) per-pixel values of one image -> out (Ho, Wo): sums over the in-bounds taps.
    out_h, out_w = out.shape
    for oy in range(out_h):
        for ox in range(out_w):
            total = 0
            for ty in range(ys[oy, 0], ys[oy, 1]):
                y = oy * stride[0] - padding[0] + ty * dilation[0]
                for tx in range(xs[ox, 0], xs[ox, 1]):
                    total += pix[y, ox * stride[1] - padding[1] + tx * dilation[1]]
            out[oy, ox] = total


@jit
def _window_sum_filter(taps, ys, xs, sums, out):
    # taps (KH, KW) per-tap values of one filter -> out (Ho, Wo): sums over the in-bounds taps,
    # from 2-D prefix sums (every window sum is then four lookups); sums: (KH+1, KW+1) scratch.
    kh, kw = taps.shape
    out_h, out_w = out.shape
    sums[0, :] = 0
    sums[:, 0] = 0
    for ty in range(kh):
        for tx in range(kw):
            sums[ty + 1, tx + 1] = taps[ty, tx] + sums[ty, tx + 1] + sums[ty + 1, tx] - sums[ty, tx]
    for oy in range(out_h):
        y0, y1 = ys[oy, 0], ys[oy, 1]
        for ox in range(out_w):
            x0, x1 = xs[ox, 0], xs[ox, 1]
            out[oy, ox] = sums[y1, x1] - sums[y0, x1] - sums[y1, x0] + sums[y0, x0]


@jit
def word_popcounts(words, out):
    """``out[...] = popcount of the row words[..., :]``: words (..., K) uint64, out (...) integers."""
    flat, k_words = words.reshape(-1, words.shape[-1]), words.shape[-1]
    dst = out.reshape(-1)
    for r in range(flat.shape[0]):
        total = 0
        for k in range(k_words):
            total += popcount(flat[r, k])
        dst[r] = total


@jit(parallel=True)
def weight_window_sums(wtaps, ys, xs, out):
    """``pw``: wtaps (O, KH, KW) the popcount of each filter tap -> out (O, Ho, Wo) int64, its sum
    over each output position's in-bounds taps (ys, xs: the tap ranges of ``in_bounds_taps``)."""
    n_out, kh, kw = wtaps.shape
    for o in prange(n_out):
        _window_sum_filter(wtaps[o], ys, xs, np.empty((kh + 1, kw + 1), dtype=np.int64), out[o])


@jit(parallel=True)
def in_bounds_sums(xwords, wwords, ys, xs, stride, padding, dilation, parts, px, pw):
    """``px`` and ``pw`` (docs/design.md section 1) from packed words: xwords (N, H, W, K) and
    wwords (O, KH, KW, K) -> px (N, Ho, Wo) and pw (O, Ho, Wo) int64, in ``parts`` runs of items."""
    # One parallel region (the counts API called four before: their start-ups were a visible
    # share of a 2 ms call); each run of items (images, then filters) allocates its scratch
    # once: an allocation per filter was most of the filters' cost (512 filters: 35 us).
    n_img, h, w, _ = xwords.shape
    n_out, kh, kw, _ = wwords.shape
    items = n_img + n_out
    for part in prange(parts):
        pix = np.empty((h, w), dtype=np.int64)
        taps = np.empty((kh, kw), dtype=np.int64)
        sums = np.empty((kh + 1, kw + 1), dtype=np.int64)
        for item in range(part * items // parts, (part + 1) * items // parts):
            if item < n_img:
                word_popcounts(xwords[item], pix)
                _window_sum_image(pix, ys, xs, stride, padding, dilation, px[item])
            else:
                word_popcounts(wwords[item - n_img], taps)
                _window_sum_filter(taps, ys, xs, sums, pw[item - n_img])


@jit(parallel=True)
def finish_counts(a, px, pw, n, b, c, d):
    """The identities as a pass of their own: from a (I, O, P), px (I, P), pw (O, P) and n (P,),
    write b = pw - a, c = px - a, d = n - px - pw + a, each (I, O, P)."""
    n_img, n_out, pixels = a.shape
    for r in prange(n_img * n_out):
        i = r // n_out
        o = r - i * n_out
        for p in range(pixels):
            av = a[i, o, p]
            b[i, o, p] = pw[o, p] - av
            c[i, o, p] = px[i, p] - av
            d[i, o, p] = n[p] - px[i, p] - pw[o, p] + av
