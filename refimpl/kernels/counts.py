"""Contingency counts a, b, c, d of binary dense and convolution layers (docs/design.md section 1).

Only ``a = popcount(x & w)`` needs the popcount GEMM. With ``px = popcount(x)`` and
``pw = popcount(w)``, both taken over the same in-bounds elements as ``a``:

    b = pw - a        c = px - a        d = n - px - pw + a

For a convolution, "in-bounds" is per output position: a padded tap belongs to none of a, b, c,
d. The GEMM runs over a zero-padded input (a 0 word adds nothing to ``popcount(x & w)``), while
``px``, ``pw`` and ``n`` are window sums over real taps only:

    px[i, y, x] = sum over in-bounds taps t of popcount(input pixel under t)
    pw[o, y, x] = sum over in-bounds taps t of popcount(w[o, t])        (same for every image)
    n[y, x]     = C * (number of in-bounds taps)

The window sums are ``window_sums.py``'s. The blocked kernel runs the GEMM and the identities
in one pass (``fused.py``) where its tiles are used well, else the GEMM (``blocked.py``), then
the identities; ``kernel="simple"`` runs the reference GEMM (``gemm.py``), then the identities.
"""
from __future__ import annotations

import numba
import numpy as np

from . import blocked, fused, gemm
from .bits import pack_nchw
from .geometry import check_kernel, conv_arguments, int_pair, window_output_size
from .outputs import checked_outputs, zero_counts
from .tiling import TILE_PIXELS
from .window_sums import finish_counts, in_bounds_sums, in_bounds_taps

# The fused kernel's tiles stay inside one image, so an image's last tile computes 16 positions
# however few are left: a dense layer (one position) would do 16x the work, 2x2 maps 4x. Below
# this share of useful tile positions, the GEMM runs with tiles across images, then the
# identities as a second pass (a dense layer: 2.5x faster so; 7x7 maps, 77% used, are faster
# fused: docs/performance.md).
FUSED_MIN_TILE_USE = 0.5


def counts_conv2d_packed(xp, wp, in_channels: int, stride=1, padding=0, dilation=1, kernel=None, out=None):
    """Counts from packed operands: ``xp`` (N, H, W, K) words, ``wp`` (O, KH, KW, K) words.

    ``kernel``: ``"blocked"`` (default, the fast GEMM) or ``"simple"`` (one popcount per word
    pair, the readable reference). Returns int64 a, b, c, d of shape (N, O, Ho, Wo).
    """
    kernel = check_kernel(kernel)
    stride, padding, dilation = (int_pair(v, name) for v, name in ((stride, "stride"), (padding, "padding"),
                                                                   (dilation, "dilation")))
    n_img, h, w, k_words = xp.shape
    n_out, kh, kw, k_words_w = wp.shape
    if k_words != k_words_w:
        raise ValueError(f"input has {k_words} channel words, weights {k_words_w}")
    out_h, out_w = window_output_size(h, w, (kh, kw), stride, padding, dilation)
    if 0 in (n_img, n_out, h, w, in_channels):
        return zero_counts(out, (n_img, n_out, out_h, out_w))
    xp = np.ascontiguousarray(xp, dtype=np.uint64)
    wp = np.ascontiguousarray(wp, dtype=np.uint64)

    # px, pw, n over in-bounds taps only (see the module docstring).
    ys, xs, taps = in_bounds_taps(h, w, kh, kw, stride, padding, dilation)
    px = np.empty((n_img, out_h, out_w), dtype=np.int64)
    pw = np.empty((n_out, out_h, out_w), dtype=np.int64)
    in_bounds_sums(xp, wp, ys, xs, stride, padding, dilation, 4 * numba.get_num_threads(), px, pw)
    n = taps * in_channels

    a, b, c, d = checked_outputs(out, (n_img, n_out, out_h, out_w))
    px, pw = px.reshape(n_img, -1), pw.reshape(n_out, -1)
    flat = [t.reshape(n_img, n_out, out_h * out_w) for t in (a, b, c, d)]
    if kernel == "blocked":
        plan = blocked.ConvPlan(wp, n_img, h, w, stride, padding, dilation)
        positions = out_h * out_w
        if positions >= FUSED_MIN_TILE_USE * TILE_PIXELS * -(-positions // TILE_PIXELS):
            fused.run_fused(plan, plan.pad(xp), px, pw, n, (a, b, c, d))
            return a, b, c, d
        plan(plan.pad(xp), flat[0])  # tiles across images, then the identities
    else:
        gemm.conv_simple(xp, wp, stride, padding, dilation, out_h, out_w, a)
    finish_counts(flat[0], px, pw, n, *flat[1:])
    return a, b, c, d


def counts_conv2d(x, w, stride=1, padding=0, dilation=1, *, kernel=None, out=None):
    """a, b, c, d of a binary 2-D convolution (cross-correlation), NCHW input, OIHW weights.

    ``x`` and ``w`` hold +-1 values (any number is binarized by ``v >= 0``) or booleans.
    Padded taps count in none of a, b, c, d. Returns four int64 arrays (N, O, Ho, Wo), written
    into ``out`` when given (four such arrays; fastest when they start on 64-byte lines).
    Fresh outputs of 1 MB+ are views of one block that is recycled once the caller has dropped
    every view of it (``outputs.OutputBlocks``): fresh pages cost more than the popcounts.
    """
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 4:
        raise ValueError(f"x must be NCHW (4-D), got shape {x.shape}")
    if w.ndim != 4:
        raise ValueError(f"w must be OIHW (4-D), got shape {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[1]} channels but w expects {w.shape[1]} (groups=1 only)")
    pairs = conv_arguments(stride, padding, dilation)
    if 0 in x.shape or 0 in w.shape:  # nothing to pack: the packed path's empty case
        check_kernel(kernel)
        out_h, out_w = window_output_size(x.shape[2], x.shape[3], w.shape[2:], *pairs)
        return zero_counts(out, (x.shape[0], w.shape[0], out_h, out_w))
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
    if 0 in x.shape or 0 in w.shape:
        check_kernel(kernel)
        return zero_counts(None, (x.shape[0], w.shape[0]))
    # A dense layer is a 1x1 convolution over a 1x1 image.
    xp = pack_nchw(x[:, :, None, None])
    wp = pack_nchw(w[:, :, None, None])
    a, b, c, d = counts_conv2d_packed(xp, wp, x.shape[1], kernel=kernel)
    return tuple(t.reshape(x.shape[0], w.shape[0]) for t in (a, b, c, d))
