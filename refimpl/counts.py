"""Contingency counts a, b, c, d of binary dense and convolution layers (SPEC section 1).

Only ``a = popcount(x & w)`` needs the popcount GEMM. With ``px = popcount(x)`` and
``pw = popcount(w)``, both taken over the same in-bounds elements as ``a``:

    b = pw - a        c = px - a        d = n - px - pw + a

For a convolution, "in-bounds" is per output position: a padded tap belongs to none of a, b, c,
d. The GEMM runs over a zero-padded input (a 0 word adds nothing to ``popcount(x & w)``), while
``px``, ``pw`` and ``n`` are window sums over real taps only:

    px[i, y, x] = sum over in-bounds taps t of popcount(input pixel under t)
    pw[o, y, x] = sum over in-bounds taps t of popcount(w[o, t])        (same for every image)
    n[y, x]     = C * (number of in-bounds taps)
"""
from __future__ import annotations

import numpy as np
from numba import prange

from . import blocked, gemm
from .blocked import conv_output_size
from ._jit import jit
from .bits import pack_nchw, popcount


def _pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
        pair = tuple(value)
    else:
        pair = (value, value)
    try:
        pair = tuple(int(v) for v in pair)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}") from None
    return pair


# --------------------------------------------------------------------------------------------
# Window sums over in-bounds taps (px, pw, n)
# --------------------------------------------------------------------------------------------
@jit(parallel=True)
def _popcount_words(words, out):
    # words (R, K) -> out (R,): popcount of each row.
    rows, k_words = words.shape
    for r in prange(rows):
        total = 0
        for k in range(k_words):
            total += popcount(words[r, k])
        out[r] = total


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


@jit(parallel=True)
def _window_sums(pix, kh, kw, stride, padding, dilation, out_h, out_w, out):
    # pix (I, H, W) per-pixel values -> out (I, Ho, Wo): sums over the in-bounds taps.
    n_img, h, w = pix.shape
    for i in prange(n_img):
        for oy in range(out_h):
            ty0, ty1 = tap_range(oy, stride[0], padding[0], dilation[0], kh, h)
            for ox in range(out_w):
                tx0, tx1 = tap_range(ox, stride[1], padding[1], dilation[1], kw, w)
                total = 0
                for ty in range(ty0, ty1):
                    y = oy * stride[0] - padding[0] + ty * dilation[0]
                    for tx in range(tx0, tx1):
                        total += pix[i, y, ox * stride[1] - padding[1] + tx * dilation[1]]
                out[i, oy, ox] = total


@jit(parallel=True)
def _weight_window_sums(wtaps, h, w, stride, padding, dilation, out_h, out_w, out):
    # wtaps (O, KH, KW): popcount of each filter tap; out (O, Ho, Wo): sum over in-bounds taps.
    n_out, kh, kw = wtaps.shape
    for o in prange(n_out):
        for oy in range(out_h):
            ty0, ty1 = tap_range(oy, stride[0], padding[0], dilation[0], kh, h)
            for ox in range(out_w):
                tx0, tx1 = tap_range(ox, stride[1], padding[1], dilation[1], kw, w)
                out[o, oy, ox] = wtaps[o, ty0:ty1, tx0:tx1].sum()


@jit(parallel=True)
def _finish_counts(a, px, pw, n, b, c, d):
    # a (I, O, P) in; px (I, P), pw (O, P), n (P,); writes b, c, d (I, O, P).
    n_img, n_out, pixels = a.shape
    for r in prange(n_img * n_out):
        i = r // n_out
        o = r - i * n_out
        for p in range(pixels):
            av = a[i, o, p]
            b[i, o, p] = pw[o, p] - av
            c[i, o, p] = px[i, p] - av
            d[i, o, p] = n[p] - px[i, p] - pw[o, p] + av


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------
def _outputs(out, shape):
    """Four int64 arrays of ``shape``: fresh, or the caller's ``out`` after checking it."""
    if out is None:
        return tuple(np.empty(shape, dtype=np.int64) for _ in range(4))
    if len(out) != 4:
        raise ValueError(f"out must be four arrays (a, b, c, d), got {len(out)}")
    for name, t in zip("abcd", out):
        if not isinstance(t, np.ndarray) or t.shape != shape or t.dtype != np.int64 or not t.flags.c_contiguous:
            got = f"{t.dtype} {t.shape}" if isinstance(t, np.ndarray) else type(t).__name__
            raise ValueError(f"out array {name} must be C-contiguous int64 of shape {shape}, got {got}")
    return tuple(out)


def counts_conv2d_packed(xp, wp, in_channels: int, stride=1, padding=0, dilation=1, kernel=None, out=None):
    """Counts from packed operands: ``xp`` (N, H, W, K) words, ``wp`` (O, KH, KW, K) words.

    ``kernel``: ``"blocked"`` (default, the fast GEMM) or ``"simple"`` (one popcount per word
    pair, the readable reference). Returns int64 a, b, c, d of shape (N, O, Ho, Wo).
    """
    stride, padding, dilation = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    n_img, h, w, k_words = xp.shape
    n_out, kh, kw, k_words_w = wp.shape
    if k_words != k_words_w:
        raise ValueError(f"input has {k_words} channel words, weights {k_words_w}")
    out_h = conv_output_size(h, kh, stride[0], padding[0], dilation[0])
    out_w = conv_output_size(w, kw, stride[1], padding[1], dilation[1])
    if out_h <= 0 or out_w <= 0:
        raise ValueError(
            f"output would be {out_h}x{out_w}: a {kh}x{kw} kernel (dilation {dilation}) does not fit "
            f"a {h}x{w} input with padding {padding}"
        )
    xp = np.ascontiguousarray(xp, dtype=np.uint64)
    wp = np.ascontiguousarray(wp, dtype=np.uint64)

    # px, pw, n over in-bounds taps only (see the module docstring).
    px_pix = np.empty(n_img * h * w, dtype=np.int64)
    _popcount_words(xp.reshape(-1, k_words), px_pix)
    px = np.empty((n_img, out_h, out_w), dtype=np.int64)
    _window_sums(px_pix.reshape(n_img, h, w), kh, kw, stride, padding, dilation, out_h, out_w, px)
    wtaps = np.empty(n_out * kh * kw, dtype=np.int64)
    _popcount_words(wp.reshape(-1, k_words), wtaps)
    pw = np.empty((n_out, out_h, out_w), dtype=np.int64)
    _weight_window_sums(wtaps.reshape(n_out, kh, kw), h, w, stride, padding, dilation, out_h, out_w, pw)
    taps = np.empty((1, out_h, out_w), dtype=np.int64)
    _window_sums(np.ones((1, h, w), dtype=np.int64), kh, kw, stride, padding, dilation, out_h, out_w, taps)
    n = taps.reshape(-1) * in_channels

    a, b, c, d = _outputs(out, (n_img, n_out, out_h, out_w))
    flat = [t.reshape(n_img, n_out, out_h * out_w) for t in (a, b, c, d)]
    px, pw = px.reshape(n_img, -1), pw.reshape(n_out, -1)
    kernel = kernel or "blocked"
    if kernel == "blocked":
        blocked.popcount_conv(xp, wp, stride, padding, dilation, out_h, out_w, flat[0])
    elif kernel == "simple":
        gemm._conv_simple(xp, wp, stride, padding, dilation, out_h, out_w, a)
    else:
        raise ValueError(f"unknown kernel {kernel!r}; valid kernels are 'blocked' and 'simple'")
    _finish_counts(flat[0], px, pw, n, *flat[1:])
    return a, b, c, d


def counts_conv2d(x, w, stride=1, padding=0, dilation=1, *, kernel=None, out=None):
    """a, b, c, d of a binary 2-D convolution (cross-correlation), NCHW input, OIHW weights.

    ``x`` and ``w`` hold +-1 values (any number is binarized by ``v >= 0``) or booleans.
    Padded taps count in none of a, b, c, d. Returns four int64 arrays (N, O, Ho, Wo), written
    into ``out`` when given (four such arrays): a loop that reuses them skips the page faults of
    fresh memory, which cost more than the popcounts for large outputs.
    """
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 4:
        raise ValueError(f"x must be NCHW (4-D), got shape {x.shape}")
    if w.ndim != 4:
        raise ValueError(f"w must be OIHW (4-D), got shape {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[1]} channels but w expects {w.shape[1]} (groups=1 only)")
    for name, v in (("stride", stride), ("dilation", dilation)):
        if min(_pair(v, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")
    if min(_pair(padding, "padding")) < 0:
        raise ValueError(f"padding must be >= 0, got {padding!r}")
    xp = pack_nchw(x)
    wp = pack_nchw(w)  # OIHW packs like NCHW: (O, KH, KW, K) words along input channels
    return counts_conv2d_packed(xp, wp, x.shape[1], stride, padding, dilation, kernel, out)


def counts_dense(x, w, *, kernel=None):
    """a, b, c, d of a binary dense layer: ``x`` (N, K), ``w`` (M, K) -> four int64 (N, M)."""
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"x must be (N, K) and w (M, K); got shapes {x.shape} and {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x rows have {x.shape[1]} elements but w rows have {w.shape[1]}")
    # A dense layer is a 1x1 convolution over a 1x1 image.
    xp = pack_nchw(x[:, :, None, None])
    wp = pack_nchw(w[:, :, None, None])
    a, b, c, d = counts_conv2d_packed(xp, wp, x.shape[1], kernel=kernel)
    return tuple(t.reshape(x.shape[0], w.shape[0]) for t in (a, b, c, d))
