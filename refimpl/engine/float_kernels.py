"""The engine's float32 kernels: the stem, the Bi-Real shortcut, pooling's sign packing, the
global mean and the classifier, each summed in one fixed order with fused multiply-adds (no
BLAS), so logits are bit-identical for any batch split and thread count.

Elementwise kernels, compiled with LLVM's loop vectorizer on (refimpl/codegen/epilogue_template.py
says why that is safe), on first call: compiled at import they cost every process that never runs a
model (counts, info, the CLIs' argument errors) seconds with a cold cache.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .. import isa
from .._jit import jit
from ..kernels import _tiles
from ..kernels.bits import sign_word
from ..kernels.fma import fma32
from ..kernels.tiling import stem_tile, stem_tile_name

# The tile for this path's vector width (kernels/tiling.py); any shape gives the same bits.
STEM_PIXELS, STEM_CHANNELS = stem_tile(isa.current_path())
_STEM_TILE = getattr(_tiles, stem_tile_name(STEM_PIXELS, STEM_CHANNELS))


@jit(loop_vectorize=True)
def _sign_word(row, c0, c1):
    # The sign word of channels c0..c1 (at most 64) of one pixel: a whole word by vector
    # compares (bits.sign_word), a partial last word bit by bit.
    if c1 - c0 == 64:
        return sign_word(row, c0)
    acc = np.uint64(0)
    for c in range(np.uint64(c0), np.uint64(c1)):
        acc |= np.uint64(row[c] >= 0) << (c - np.uint64(c0))
    return acc


@jit(loop_vectorize=True)
def affine_sign_word(row, scale, shift, c0, c1):
    """Channels c0..c1 (at most 64) of one pixel, in place: fma(row[c], scale[c], shift[c]),
    the folded BatchNorm as torch computes it (refimpl/kernels/fma.py); returns their sign word
    (bit c - c0 set where the result is >= 0). Unsigned indices: no negative-index
    wraparound, so the loop vectorizes (epilogue_template.py), 16 lanes wide because the sign bits
    are taken afterwards, by _sign_word.
    """
    for c in range(np.uint64(c0), np.uint64(c1)):
        row[c] = fma32(row[c], scale[c], shift[c])
    return _sign_word(row, c0, c1)


@jit(parallel=True, loop_vectorize=True)
def stem(x, wmat, scale, shift, kh, kw, sh, sw, ph, pw, dh, dw, out_w, cols, y, pack, pad_h, pad_w, bits):
    """The full-precision stem, one image per task, all in one parallel region: im2col of the
    image into this thread's cols (C*KH*KW, P), then the float32 tile (_tiles.stem_tile_*:
    fma over the C*KH*KW inputs) into y[i] (P, O) channels last, then folded BatchNorm
    (torch's fma, refimpl/kernels/fma.py) and, when pack is True, the sign bits for the first
    binary unit, while y[i] is still in this core's cache.
    (Python threads' matmuls shared the cores with Numba's spinning pool threads, and a BLAS
    sgemm per image was slower than the tile: docs/performance.md.)
    """
    n_img, channels, h, w = x.shape
    positions, n_out = y.shape[1], y.shape[2]
    out_h = positions // out_w
    n_k = (n_out + 63) // 64
    taps = kh * kw
    tp, tq = STEM_PIXELS, STEM_CHANNELS
    # A tile takes pixels p0, p0 + ps, ...: whole tiles cover positions - positions % tp.
    ps = positions // tp
    full_p = ps * tp
    full_o = n_out - n_out % tq
    for i in prange(n_img):
        col = cols[numba.get_thread_id()]
        for c in range(channels):
            for ty in range(kh):
                for tx in range(kw):
                    row = col[(c * kh + ty) * kw + tx]
                    for oy in range(out_h):
                        iy = oy * sh + ty * dh - ph
                        for ox in range(out_w):
                            ix = ox * sw + tx * dw - pw
                            inside = iy >= 0 and iy < h and ix >= 0 and ix < w
                            row[oy * out_w + ox] = x[i, c, iy, ix] if inside else np.float32(0.0)
        yi = y[i]
        for o0 in range(0, full_o, tq):
            for p0 in range(ps):
                _STEM_TILE(col, wmat, p0, ps, o0, yi)
        # Pixels and channels past the whole tiles (none for 32x32 maps and 64 channels).
        for p in range(positions):
            for o in range(full_o if p < full_p else 0, n_out):
                total = np.float32(0.0)
                for k in range(channels * taps):
                    total = fma32(col[k, p], wmat[k, o], total)
                yi[p, o] = total
        for p in range(positions):
            yrow = yi[p]
            yy = p // out_w
            for word in range(n_k):
                acc = affine_sign_word(yrow, scale, shift, word * 64, min(n_out, word * 64 + 64))
                if pack:
                    bits[i, yy + pad_h, p - yy * out_w + pad_w, word] = acc


@jit(parallel=True, loop_vectorize=True)
def pack_padded(x, width, pad_h, pad_w, bits):
    """x (N, P, C) float32 (channels last) -> bits (N, Hp, Wp, K) (zero borders kept): bit 1
    where x >= 0. A pixel's 64 channels are contiguous: one or-reduction per word."""
    n_img, positions, channels = x.shape
    n_k = (channels + 63) // 64
    for r in prange(n_img * positions):
        i = r // positions
        p = r - i * positions
        row = x[i, p]
        yy = p // width
        for word in range(n_k):
            bits[i, yy + pad_h, p - yy * width + pad_w, word] = _sign_word(row, word * 64, min(channels, word * 64 + 64))


@jit(parallel=True, loop_vectorize=True)
def real_shortcut(x, kh, kw, wt, scale, shift, out_w, cols, out):
    """The Bi-Real shortcut as torch's CPU kernels compute it (measured on torch 2.13: every
    output bit-identical): x (N, H, W, C) -> out (N, P, O), one image per task.
    1. Average pool of kernel and stride (kh, kw) in ceil mode, each window summed from 0 in
       (row, column) order and divided by its in-bounds pixel count, into this thread's
       cols (C, P), the layout of the stem's im2col.
    2. The 1x1 convolution by the stem's register tile (_tiles.stem_tile_*): each output
       summed from 0 by fma in input-channel order, as torch's is, and one fixed order for
       any batch split and thread count (no BLAS). A loop over one pixel's outputs per weight
       row ran at 11 GFLOP/s on one core (here 25-28), 50 ms of ResNet-18's 130 at batch 64.
    3. The folded BatchNorm, fma(y, scale, shift).
    """
    n_img, h, w, channels = x.shape
    positions, n_out = out.shape[1], out.shape[2]
    out_h = positions // out_w
    tp, tq = STEM_PIXELS, STEM_CHANNELS
    ps = positions // tp  # a tile takes pixels p0, p0 + ps, ... (as in stem)
    full_p = ps * tp
    full_o = n_out - n_out % tq
    for i in prange(n_img):
        col = cols[numba.get_thread_id()]
        window = col[channels]  # the scratch's spare row: one window's sums, channels contiguous
        for oy in range(out_h):
            y0 = oy * kh
            y1 = min(y0 + kh, h)
            for ox in range(out_w):
                x0 = ox * kw
                x1 = min(x0 + kw, w)
                count = np.float32((y1 - y0) * (x1 - x0))
                for c in range(np.uint64(channels)):
                    window[c] = np.float32(0.0)
                for yy in range(y0, y1):
                    for xx in range(x0, x1):
                        src = x[i, yy, xx]
                        for c in range(np.uint64(channels)):
                            window[c] += src[c]
                p = oy * out_w + ox
                for c in range(channels):
                    col[c, p] = window[c] / count
        yi = out[i]
        pooled = col[:channels]  # the tile sums over all rows of what it is given
        for o0 in range(0, full_o, tq):
            for p0 in range(ps):
                _STEM_TILE(pooled, wt, p0, ps, o0, yi)
        for p in range(positions):  # pixels and channels past the whole tiles
            for o in range(full_o if p < full_p else 0, n_out):
                total = np.float32(0.0)
                for c in range(channels):
                    total = fma32(pooled[c, p], wt[c, o], total)
                yi[p, o] = total
        for p in range(positions):
            row = yi[p]
            for o in range(np.uint64(n_out)):
                row[o] = fma32(row[o], scale[o], shift[o])


@jit(parallel=True, loop_vectorize=True)
def linear(x, wt, bias, out):
    """out (N, O) = x (N, K) @ wt (K, O) + bias, each output summed by fma in k order, then the
    bias: one fixed order for every batch split, thread count and ISA (a BLAS sgemm picks its
    micro-kernel, and so its summation order, by matrix size and CPU: logits then changed by
    a few ulps between a batch of 40 and batches of 7). Vectorized over the outputs o.
    """
    n_img, k_in = x.shape
    n_out = out.shape[1]
    for i in prange(n_img):
        row = out[i]
        for o in range(np.uint64(n_out)):
            row[o] = np.float32(0.0)
        for k in range(k_in):
            xv = x[i, k]
            src = wt[k]
            for o in range(np.uint64(n_out)):
                row[o] = fma32(xv, src[o], row[o])
        for o in range(np.uint64(n_out)):
            row[o] = row[o] + bias[o]


@jit(parallel=True, loop_vectorize=True)
def global_mean(x, out):
    """x (N, P, C) channels last -> out (N, C): the mean over positions, summed in float32 in
    position order, each channel a vector lane (NumPy's mean over the middle axis took
    0.4 ms at batch 64 for 0.5 M values). Like torch's adaptive average pool, not bit for
    bit: the logits only need 1e-4 (its summation order is its own).
    """
    n_img, positions, channels = x.shape
    scale = np.float32(1.0) / np.float32(positions)
    for i in prange(n_img):
        row = out[i]
        for c in range(np.uint64(channels)):
            row[c] = np.float32(0.0)
        for p in range(positions):
            src = x[i, p]
            for c in range(np.uint64(channels)):
                row[c] += src[c]
        for c in range(np.uint64(channels)):
            row[c] = row[c] * scale


# numba.get_num_threads() takes a lock and costs ~5 us; a batch-1 run asked it ~60 times. Model.run
# reads it once into this cell for the kernels of that run.
RUN_THREADS = [1]


def run_kernel(kernel, tasks, *args):
    """Run a parallel kernel, on the calling thread alone when it has too few tasks to share.

    A parallel region costs a fork and a barrier; for one or two tasks (batch 1) that is all
    cost, and on a busy machine the barrier waits for a descheduled thread (measured: 10 ms).
    (Not a second, serial compilation of the same function: Numba's cache index does not
    tell parallel=True from False, so the two would overwrite each other's cache entries.)
    """
    threads = RUN_THREADS[0]
    if threads > 1 and tasks < 2 * threads:
        numba.set_num_threads(1)
        try:
            kernel(*args)
        finally:
            numba.set_num_threads(threads)
    else:
        kernel(*args)
