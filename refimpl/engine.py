"""The CPU inference engine: runs a ``.bnn`` file (``bnn/export.py``) with NumPy and Numba only.

    model = refimpl.engine.load("MODEL.bnn")
    logits = model.run(model.preprocess(images))        # or model.predict(images)

Execution follows the file's layer list:

* ``stem``: full-precision convolution (per image: im2col + a register-blocked float32 fma
  tile, ``_tiles.stem_tile_*``), folded BatchNorm, the sign bits of the first binary unit.
* ``binary_unit``: the input activation arrives already binarized and packed into this unit's
  zero-padded word buffer (the stem or the previous epilogue wrote it, or ``_pack_padded``
  after a pool); one popcount GEMM per convolution (``a``, and the window sums ``px``, taken
  while its tiles gather their input), ``pw`` and ``n`` precomputed per input shape, then one
  fused epilogue (``refimpl/epilogue.py``): b, c, d, the measure, BatchNorm, the residual, and
  the sign bits for the next binary unit. With enough pixels to share out
  (``FUSED_MIN_TILES_PER_THREAD``), GEMM and epilogue run together, tile by tile, in one
  parallel loop (``fused_*``), and ``a`` stays in L1. Otherwise (batch 1 on small maps, and
  debug runs, which record ``a``) they are two passes, the GEMM split over channels too.
  A ``real`` (Bi-Real) shortcut is computed first, in float32 from the unit's float input
  (``_real_shortcut``: average pool, 1x1 convolution, folded BatchNorm), into the unit's output
  buffer; the epilogue then adds it as it adds an identity residual.
* ``maxpool2d`` / ``avgpool2d`` / ``global_avgpool`` / ``linear``: NumPy, float32.

Activations are channels last, (N, H, W, C), from the stem on: the GEMM stores each pixel's
channels as one vector, and the epilogue, the sign packing and the residual all run along
contiguous channels, which stays vectorized on the 4x4 and 8x8 layers where a row of pixels is
too short (measured at batch 1: the epilogue of a 256-channel 8x8 layer went from 21 to 6 us).
``run`` still takes NCHW input, and debug records are NCHW, as torch has them.

Everything is float32 (counts are int32 until they enter the measure, exact in float32 below
2**24). Per input shape the engine keeps a plan: buffers, GEMM indexing and window sums, so a
batch-1 call does no allocation beyond the outputs it returns. A ``Model`` is therefore not
safe to run from two threads at once; Numba parallelizes inside each call instead
(``numba.set_num_threads``).

Semantics are the PyTorch model's in eval mode: docs/design.md section 1 counts (padded taps count in
none of a, b, c, d), the measure as ``refimpl.measure(dtype=float32)`` computes it, BatchNorm as
torch's CPU kernel computes it (``bnn/export.py`` derives the folding).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numba
import numpy as np
from numba import prange

from . import _tiles, blocked, epilogue
from ._fma import fma32
from ._jit import jit
from .bits import n_words, sign_word
from .codegen import STEM_TILE as STEM_SHAPE
from .counts import _in_bounds_taps, _weight_window_sums, conv_output_size

# The file format's names, re-exported: engine.load raises engine.ModelFileError.
from .model_file import FORMAT, SUPPORTED_VERSIONS, Conv, ModelFileError, describe, read  # noqa: F401

STEM_PIXELS, STEM_CHANNELS = STEM_SHAPE
STEM_TILE = getattr(_tiles, f"stem_tile_{STEM_PIXELS}x{STEM_CHANNELS}")


# ----------------------------------------------------------------------------------------------
# The model (the file is read and checked by refimpl/model_file.py)
# ----------------------------------------------------------------------------------------------
class Model:
    """A loaded ``.bnn`` model. ``run`` takes normalized NCHW float32; ``predict`` raw images."""

    def __init__(self, meta: dict, tensors: dict, path: str = "<memory>"):
        self.path = path
        self.meta = meta
        d = describe(meta, tensors, path)
        self.genome, self.input_shape, self.downsample, self.layers = d.genome, d.input_shape, d.downsample, d.layers
        self.num_classes, self.class_names = d.num_classes, d.class_names
        self.mean, self.std, self.pixel_max = d.mean, d.std, d.pixel_max
        self._epilogue = epilogue.load(self.genome)
        self._plans: dict = {}
        self.last_timings: list[tuple[str, float]] = []

    # -- plans ---------------------------------------------------------------------------------
    def _plan(self, n_img: int):
        key = (n_img, numba.config.NUMBA_NUM_THREADS)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _build_plan(self, n_img)
        return plan

    # -- running -------------------------------------------------------------------------------
    def check_input(self, x) -> np.ndarray:
        """Validate a normalized NCHW float32 batch (ValueError naming the problem)."""
        if not isinstance(x, np.ndarray):
            raise ValueError(f"input must be a NumPy array, got {type(x).__name__}")
        if x.dtype != np.float32:
            raise ValueError(f"normalized input must be float32, got {x.dtype}")
        if x.ndim != 4 or tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"input has shape {x.shape}; this model takes (N, {', '.join(map(str, self.input_shape))})")
        if x.shape[0] == 0:
            raise ValueError("input has no images")
        # A read-only array (np.load with mmap, a frombuffer view) is copied: the kernels'
        # signatures take writable arrays, and Numba refuses a read-only one with a traceback.
        return np.require(x, requirements=("C", "A", "W"))

    def preprocess(self, images, layout: str | None = None) -> np.ndarray:
        """Raw images -> normalized float32 NCHW.

        Accepted: uint8 ``(N, H, W, C)`` (HWC, as images are stored), or float32 ``(N, C, H, W)``
        in the same raw pixel units (0..pixel_max, e.g. 0..255 for CIFAR, 0..16 for digits).
        Both get ``(pixel - mean[c]) / std[c]``, the normalization the model was trained with.
        """
        images = np.asarray(images)
        c, h, w = self.input_shape
        if images.dtype == np.uint8:
            if images.ndim != 4 or tuple(images.shape[1:]) != (h, w, c):
                raise ValueError(f"uint8 images must be (N, H, W, C) = (N, {h}, {w}, {c}), got {images.shape}")
            x = np.ascontiguousarray(images.transpose(0, 3, 1, 2)).astype(np.float32)
        elif images.dtype == np.float32:
            if images.ndim != 4 or tuple(images.shape[1:]) != (c, h, w):
                raise ValueError(f"float32 images must be NCHW (N, {c}, {h}, {w}), got {images.shape}")
            x = images
        else:
            raise ValueError(f"images must be uint8 (N, H, W, C) or float32 (N, C, H, W), got dtype {images.dtype}")
        if images.shape[0] == 0:
            raise ValueError("input has no images")
        # Same float32 operations as bnn.data.Dataset.normalize: (x - mean) / std.
        return ((x - self.mean.reshape(1, c, 1, 1)) / self.std.reshape(1, c, 1, 1)).astype(np.float32)

    def predict(self, images) -> np.ndarray:
        return self.run(self.preprocess(images))

    def run(self, x, debug: bool = False, timings: bool = False):
        """Logits (N, classes) float32 for normalized NCHW float32 ``x``.

        ``debug=True`` also returns, per binary convolution, ``{"name", "a", "b", "c", "d"}`` int64
        (N, O, Ho, Wo) counts and the unit's float output ``"y"``, for parity tests.
        ``timings=True`` records per-layer seconds in ``self.last_timings``.
        """
        x = self.check_input(x)
        _RUN_THREADS[0] = numba.get_num_threads()
        plan = self._plan(x.shape[0])
        record = [] if debug else None
        clock = []
        for step in plan.steps:
            t0 = time.perf_counter() if timings else 0.0
            x = step(x, record)
            if timings:
                clock.append((step.label, time.perf_counter() - t0))
        if timings:
            self.last_timings = clock
        return (x, record) if debug else x


_NO_BITS = np.zeros((1, 1, 1, 1), dtype=np.uint64)


def load(path: str) -> Model:
    """Load and validate a ``.bnn`` file; ``ModelFileError`` (a ValueError) names any problem."""
    meta, tensors = read(path)
    return Model(meta, tensors, path)


# ----------------------------------------------------------------------------------------------
# Kernels (small, generic; the measure-specific epilogue is generated in refimpl/epilogue.py)
# ----------------------------------------------------------------------------------------------
# Elementwise kernels, compiled with LLVM's loop vectorizer on (refimpl/epilogue.py says why
# that is safe), on first call: compiled at import they cost every process that never runs a
# model (counts, info, the CLIs' argument errors) seconds with a cold cache.
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
def _affine_sign_word(row, scale, shift, c0, c1):
    # Channels c0..c1 (at most 64) of one pixel, in place: fma(row[c], scale[c], shift[c]),
    # the folded BatchNorm as torch computes it (refimpl/_fma.py); returns their sign word
    # (bit c - c0 set where the result is >= 0). Unsigned indices: no negative-index
    # wraparound, so the loop vectorizes (epilogue.py), 16 lanes wide because the sign bits
    # are taken afterwards, by _sign_word.
    for c in range(np.uint64(c0), np.uint64(c1)):
        row[c] = fma32(row[c], scale[c], shift[c])
    return _sign_word(row, c0, c1)


@jit(parallel=True, loop_vectorize=True)
def _stem(x, wmat, scale, shift, kh, kw, sh, sw, ph, pw, dh, dw, out_w, cols, y, pack, pad_h, pad_w, bits):
    # The full-precision stem, one image per task, all in one parallel region: im2col of the
    # image into this thread's cols (C*KH*KW, P), then the float32 tile (_tiles.stem_tile_*:
    # fma over the C*KH*KW inputs) into y[i] (P, O) channels last, then folded BatchNorm
    # (torch's fma, refimpl/_fma.py) and, when pack is True, the sign bits for the first
    # binary unit, while y[i] is still in this core's cache.
    # (Python threads' matmuls shared the cores with Numba's spinning pool threads, and a BLAS
    # sgemm per image was slower than the tile: docs/performance.md.)
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
                STEM_TILE(col, wmat, p0, ps, o0, yi)
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
                acc = _affine_sign_word(yrow, scale, shift, word * 64, min(n_out, word * 64 + 64))
                if pack:
                    bits[i, yy + pad_h, p - yy * out_w + pad_w, word] = acc


@jit(parallel=True, loop_vectorize=True)
def _pack_padded(x, width, pad_h, pad_w, bits):
    # x (N, P, C) float32 (channels last) -> bits (N, Hp, Wp, K) (zero borders kept): bit 1
    # where x >= 0. A pixel's 64 channels are contiguous: one or-reduction per word.
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
def _real_shortcut(x, kh, kw, wt, scale, shift, out_w, cols, out):
    # The Bi-Real shortcut as torch's CPU kernels compute it (measured on torch 2.13: every
    # output bit-identical): x (N, H, W, C) -> out (N, P, O), one image per task.
    # 1. Average pool of kernel and stride (kh, kw) in ceil mode, each window summed from 0 in
    #    (row, column) order and divided by its in-bounds pixel count, into this thread's
    #    cols (C, P), the layout of the stem's im2col.
    # 2. The 1x1 convolution by the stem's register tile (_tiles.stem_tile_*): each output
    #    summed from 0 by fma in input-channel order, as torch's is, and one fixed order for
    #    any batch split and thread count (no BLAS). A loop over one pixel's outputs per weight
    #    row ran at 11 GFLOP/s on one core (here 25-28), 50 ms of ResNet-18's 130 at batch 64.
    # 3. The folded BatchNorm, fma(y, scale, shift).
    n_img, h, w, channels = x.shape
    positions, n_out = out.shape[1], out.shape[2]
    out_h = positions // out_w
    tp, tq = STEM_PIXELS, STEM_CHANNELS
    ps = positions // tp  # a tile takes pixels p0, p0 + ps, ... (as in _stem)
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
                STEM_TILE(pooled, wt, p0, ps, o0, yi)
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
def _linear(x, wt, bias, out):
    # out (N, O) = x (N, K) @ wt (K, O) + bias, each output summed by fma in k order, then the
    # bias: one fixed order for every batch split, thread count and ISA (a BLAS sgemm picks its
    # micro-kernel, and so its summation order, by matrix size and CPU: logits then changed by
    # a few ulps between a batch of 40 and batches of 7). Vectorized over the outputs o.
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
def _global_mean(x, out):
    # x (N, P, C) channels last -> out (N, C): the mean over positions, summed in float32 in
    # position order, each channel a vector lane (NumPy's mean over the middle axis took
    # 0.4 ms at batch 64 for 0.5 M values). Like torch's adaptive average pool, not bit for
    # bit: the logits only need 1e-4 (its summation order is its own).
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
_RUN_THREADS = [1]


def _call(kernel, tasks, *args):
    """Run a parallel kernel, on the calling thread alone when it has too few tasks to share.

    A parallel region costs a fork and a barrier; for one or two tasks (batch 1) that is all
    cost, and on a busy machine the barrier waits for a descheduled thread (measured: 10 ms).
    (Not a second, serial compilation of the same function: Numba's cache index does not
    tell parallel=True from False, so the two would overwrite each other's cache entries.)
    """
    threads = _RUN_THREADS[0]
    if threads > 1 and tasks < 2 * threads:
        numba.set_num_threads(1)
        try:
            kernel(*args)
        finally:
            numba.set_num_threads(threads)
    else:
        kernel(*args)


class _Gemm:
    """``a`` (N, Ho*Wo, O) int32, channels last, of one binary convolution over a padded word buffer."""

    def __init__(self, conv: Conv, n_img, h, w, buf_pad, out_h, out_w):
        # Prepared once per plan: at batch 1 the preparation costs more than the arithmetic.
        self.plan = blocked.ConvPlan(conv.bits, n_img, h, w, conv.stride, conv.padding, conv.dilation,
                                     buffer_padding=buf_pad, layout="nhwc")
        self.a = np.empty((n_img, out_h * out_w, conv.out_channels), dtype=np.int32)

    def __call__(self, bits: np.ndarray, px: np.ndarray | None = None) -> np.ndarray:
        return self.plan(bits.reshape(-1), self.a, threads=_RUN_THREADS[0], px=px)


class _ConvCounts:
    """Everything per (binary convolution, group of images): GEMM, window sums, buffers."""

    def __init__(self, conv: Conv, n_img, h, w, buf_pad):
        kh, kw = conv.kernel
        out_h = conv_output_size(h, kh, conv.stride[0], conv.padding[0], conv.dilation[0])
        out_w = conv_output_size(w, kw, conv.stride[1], conv.padding[1], conv.dilation[1])
        if out_h <= 0 or out_w <= 0:
            raise ValueError(f"{conv.name}: a {kh}x{kw} kernel does not fit a {h}x{w} input")
        self.conv, self.out_h, self.out_w = conv, out_h, out_w
        self.gemm = _Gemm(conv, n_img, h, w, buf_pad, out_h, out_w)
        ys, xs, taps = _in_bounds_taps(h, w, kh, kw, conv.stride, conv.padding, conv.dilation)
        pw = np.empty((conv.out_channels, out_h, out_w), dtype=np.int64)
        _weight_window_sums(conv.taps, ys, xs, pw)
        self.pw = pw.reshape(conv.out_channels, -1)
        self.n = taps * conv.in_channels
        # The epilogue's float32 forms (exact: integers below 2**24), channels last (P, O).
        self.pw_f = np.ascontiguousarray(self.pw.T, dtype=np.float32)
        self.npw_f = np.ascontiguousarray((self.n[None, :] - self.pw).T, dtype=np.float32)

    def __call__(self, bits, px):
        """``a`` of the images in ``bits``, and their window popcounts into ``px`` (N, Ho*Wo)."""
        return self.gemm(bits, px)

    def counts(self, a, px):
        """a, b, c, d (N, O, Ho, Wo) int64 (NCHW, as torch has them) from the identities, for debug mode."""
        a = a.transpose(0, 2, 1).astype(np.int64)
        px, pw, n = px.astype(np.int64)[:, None, :], self.pw[None], self.n[None, None]
        shape = (a.shape[0], a.shape[1], self.out_h, self.out_w)
        return tuple(v.reshape(shape) for v in (a, pw - a, px - a, n - px - pw + a))


# Images per GEMM + epilogue round: the int32 ``a`` of a group (and pw) stays in L2 between the
# GEMM that writes it and the epilogue that reads it. With the whole batch at once, ``a`` of a
# 64-channel 32x32 layer at batch 64 is 16 MB, and both passes ran at DRAM speed (measured with
# int64 counts: the epilogue at 2.7 ns per output instead of 1.4).
GROUP_BYTES = 1 << 19


# A unit runs fused (GEMM + epilogue per tile) when it has at least this many tiles of
# TILE_PIXELS pixels per thread; below that (batch 1 on 8x8 and 4x4 maps) every thread needs a
# share of the output channels of a tile too, which only the two-pass path splits.
FUSED_MIN_TILES_PER_THREAD = 8


def _group_size(n_img, out_channels, positions):
    return max(1, min(n_img, GROUP_BYTES // (4 * out_channels * positions)))


def _epilogue_chunk(n_img, positions, channels):
    """Pixels per task of the epilogue: about four tasks per thread, each of at least 2048
    outputs (below that the parallel loop's setup shows), never past one image."""
    per_task = -(-n_img * positions // (4 * _RUN_THREADS[0]))
    return max(1, min(positions, max(per_task, -(-2048 // channels))))


# ----------------------------------------------------------------------------------------------
# Plans: one callable step per layer, with its buffers
# ----------------------------------------------------------------------------------------------
@dataclass
class _Plan:
    steps: list


def _needs_bits(layers, idx):
    """The padding of the binary unit right after layer idx, or None if the next layer is not one."""
    if idx + 1 < len(layers) and layers[idx + 1]["op"] == "binary_unit":
        nxt = layers[idx + 1]
        convs = [nxt["conv"]] + ([nxt["down"]] if nxt["down"] is not None else [])
        return (max(c.padding[0] for c in convs), max(c.padding[1] for c in convs))
    return None


def _bits_buffer(n_img, c, h, w, pad):
    return np.zeros((n_img, h + 2 * pad[0], w + 2 * pad[1], n_words(c)), dtype=np.uint64)


class _Step:
    label = "?"
    bits_out = None  # the packed activation this step leaves for the next binary unit


class _Activations:
    """Two float32 buffers that the steps' outputs alternate between.

    A step reads only the output of the step before it (its input and identity residual), so
    two buffers suffice. One buffer per step made a batch-64 ResNet-18 stream 136 MB of
    activations per run, past what the caches hold; there the epilogues ran at DRAM speed
    (measured with a copy loop on this host: 50 GB/s over 16 MB, 22 GB/s cycling 256 MB).
    """

    def __init__(self):
        self.buffers = [np.empty(0, dtype=np.float32), np.empty(0, dtype=np.float32)]
        self.turn = 0

    def take(self, shape) -> np.ndarray:
        size = int(np.prod(shape))
        slot, self.turn = self.turn, 1 - self.turn
        if self.buffers[slot].size < size:
            # Steps that took views of the old buffer keep it alive; only later steps move.
            self.buffers[slot] = np.empty(size, dtype=np.float32)
        return self.buffers[slot][:size].reshape(shape)


def _build_plan(model: Model, n_img: int) -> _Plan:
    steps = []
    arena = _Activations()
    c, h, w = model.input_shape
    prev_bits = None
    for idx, layer in enumerate(model.layers):
        op = layer["op"]
        nxt_pad = _needs_bits(model.layers, idx)
        if op == "stem":
            step = _StemStep(layer, n_img, c, h, w, nxt_pad, arena)
        elif op == "binary_unit":
            step = _UnitStep(model, layer, n_img, c, h, w, prev_bits, nxt_pad, arena)
        elif op in ("maxpool2d", "avgpool2d"):
            step = _PoolStep(layer, n_img, c, h, w, nxt_pad)
        elif op == "global_avgpool":
            step = _GlobalPoolStep()
        else:
            step = _LinearStep(layer)
        c, h, w = getattr(step, "out_chw", (c, h, w))
        prev_bits = step.bits_out
        steps.append(step)
    return _Plan(steps)


class _StemStep(_Step):
    def __init__(self, layer, n_img, c, h, w, nxt_pad, arena):
        self.label = "stem"
        self.layer = layer
        kh, kw = layer["kernel"]
        (sh, sw), (ph, pw_), (dh, dw) = layer["stride"], layer["padding"], layer["dilation"]
        self.out_h = conv_output_size(h, kh, sh, ph, dh)
        self.out_w = conv_output_size(w, kw, sw, pw_, dw)
        o = layer["out"]
        self.out_chw = (o, self.out_h, self.out_w)
        # (C*KH*KW, O) weight matrix, rows in the order of the im2col columns below.
        self.wmat = np.ascontiguousarray(layer["weight"].reshape(o, -1).T)
        self.pad = nxt_pad
        self.bits_out = _bits_buffer(n_img, o, self.out_h, self.out_w, nxt_pad) if nxt_pad else None
        # Buffers reused by every run (fresh ones cost a page fault per 4 KB at batch 64); the
        # im2col columns are per thread.
        # Rows of 1024 floats are 4 KB apart and all fall in one L1 set: the stem tile reads 27
        # of them at once. A few floats of padding per row spread them (measured: 2.2 -> 1.1 ms).
        self.cols = np.empty((numba.config.NUMBA_NUM_THREADS, c * kh * kw, self.out_h * self.out_w + 16),
                             dtype=np.float32)
        self.y = arena.take((n_img, self.out_h * self.out_w, o))

    def __call__(self, x, record):
        L = self.layer
        pack = self.bits_out is not None
        pad = self.pad if pack else (0, 0)
        _call(_stem, x.shape[0], x, self.wmat, L["scale"], L["shift"], *L["kernel"], *L["stride"], *L["padding"],
              *L["dilation"], self.out_w, self.cols, self.y, pack, pad[0], pad[1], self.bits_out if pack else _NO_BITS)
        return self.y.reshape(x.shape[0], self.out_h, self.out_w, -1)


class _UnitStep(_Step):
    def __init__(self, model, layer, n_img, c, h, w, prev_bits, nxt_pad, arena):
        self.label = layer["name"]
        self.layer = layer
        self.ep = model._epilogue
        conv, down = layer["conv"], layer["down"]
        pad = _needs_bits([None, layer], 0)
        self.bits_in = prev_bits  # written by the previous step
        if prev_bits is None or prev_bits.shape[1:3] != (h + 2 * pad[0], w + 2 * pad[1]):
            raise AssertionError("plan: the previous step did not pack for this unit")
        main = _ConvCounts(conv, 1, h, w, pad)
        oh, ow = main.out_h, main.out_w
        self.group = _group_size(n_img, conv.out_channels, oh * ow)
        # One set of counts/buffers per group size: full groups, and the remainder if any.
        self.counts = {}
        for g in {self.group, n_img % self.group} - {0}:
            m = _ConvCounts(conv, g, h, w, pad)
            d = _ConvCounts(down, g, h, w, pad) if down is not None else None
            if d is not None and (d.out_h, d.out_w) != (oh, ow):
                raise ValueError(f"{layer['name']}: shortcut output {d.out_h}x{d.out_w} != conv output {oh}x{ow}")
            self.counts[g] = (m, d)
        # The fused path (refimpl/epilogue.py ``fused_*``): GEMM and epilogue per tile in one
        # parallel loop over the whole batch, so ``a`` never leaves L1 and a layer is one
        # parallel region instead of two per group.
        if n_img in self.counts:
            self.whole = self.counts[n_img]
        else:
            m = _ConvCounts(conv, n_img, h, w, pad)
            self.whole = (m, _ConvCounts(down, n_img, h, w, pad) if down is not None else None)
        self.n_tiles = -(-n_img * oh * ow // blocked.TILE_PIXELS)
        threads = numba.config.NUMBA_NUM_THREADS
        self.ascratch = [np.empty((threads, blocked.TILE_PIXELS * conv.out_channels), dtype=np.int32)
                         for _ in range(2 if down is not None else 1)]
        self.pxscratch = np.empty((threads, 2 * blocked.TILE_PIXELS), dtype=np.float32)
        self.out_chw = (conv.out_channels, oh, ow)
        self.out_shape = (n_img, oh * ow, conv.out_channels)
        # A real shortcut fills the output buffer first; the epilogue adds into it as for identity.
        self.mode = "identity" if layer["residual"] == "real" else layer["residual"]
        self.shortcut = layer["shortcut"]
        if self.shortcut is not None:
            kh, kw = self.shortcut["pool"]
            if (-(-h // kh), -(-w // kw)) != (oh, ow):
                raise ValueError(f"{layer['name']}: shortcut output {-(-h // kh)}x{-(-w // kw)} != conv output {oh}x{ow}")
            # The pooled image per thread, (C, P) as the stem's im2col; 16 floats of row padding
            # spread rows that would be 4 KB apart over L1 sets (see _StemStep).
            # One spare row holds a window's sums while they are formed.
            self.cols = np.empty((numba.config.NUMBA_NUM_THREADS, c + 1, max(oh * ow + 16, c)), dtype=np.float32)
        # An identity unit adds its output into its input's buffer, in place (epilogue.py says
        # why); the others write a buffer of their own.
        self.out = None if layer["residual"] == "identity" else arena.take(self.out_shape)
        self.px = np.empty((n_img, oh * ow), dtype=np.float32)
        self.px2 = np.empty((n_img, oh * ow), dtype=np.float32) if down is not None else None
        self.pack = nxt_pad is not None
        self.pad = nxt_pad or (0, 0)
        self.bits_out = _bits_buffer(n_img, conv.out_channels, oh, ow, nxt_pad) if self.pack else None

    def __call__(self, x, record):
        L, conv = self.layer, self.layer["conv"]
        n_img = x.shape[0]
        # The residual: the input itself, which the epilogue then overwrites with the output.
        out = x.reshape(self.out_shape) if L["residual"] == "identity" else self.out
        if self.shortcut is not None:
            s = self.shortcut
            _call(_real_shortcut, n_img, np.ascontiguousarray(x), *s["pool"], s["wt"], s["scale"], s["shift"],
                  self.out_chw[2], self.cols, out)
        debug = [] if record is not None else None
        if record is None and self.n_tiles >= FUSED_MIN_TILES_PER_THREAD * _RUN_THREADS[0]:
            self._run_fused(out)
            oc, oh, ow = self.out_chw
            return out.reshape(n_img, oh, ow, oc)
        for g0 in range(0, n_img, self.group):
            g1 = min(n_img, g0 + self.group)
            main, down = self.counts[g1 - g0]
            bits_in = self.bits_in[g0:g1]  # contiguous: a slice of whole images
            px = self.px[g0:g1]
            a = main(bits_in, px)
            bits = self.bits_out[g0:g1] if self.pack else _NO_BITS
            chunk = _epilogue_chunk(g1 - g0, a.shape[1], a.shape[2])
            tail = (out[g0:g1], bits, self.pack, main.out_w, self.pad[0], self.pad[1], chunk)
            head = (a, px, main.pw_f, main.npw_f, conv.alpha, conv.scale, conv.shift)
            a2 = None
            tasks = (g1 - g0) * -(-a.shape[1] // chunk)
            if L["residual"] == "none":
                _call(self.ep.epilogue_none, tasks, *head, *tail)
            elif self.mode == "identity":
                _call(self.ep.epilogue_identity, tasks, *head, *tail)
            else:
                d = L["down"]
                px2 = self.px2[g0:g1]
                a2 = down(bits_in, px2)
                _call(self.ep.epilogue_down, tasks,
                      *head, a2, px2, down.pw_f, down.npw_f, d.alpha, d.scale, d.shift, *tail)
            if debug is not None:
                debug.append((main.counts(a, px), down.counts(a2, px2) if a2 is not None else None))
        oc, oh, ow = self.out_chw
        y = out.reshape(n_img, oh, ow, oc)
        if record is not None:
            joined = [np.concatenate([grp[0][k] for grp in debug]) for k in range(4)]
            record.append({"name": conv.name, **dict(zip("abcd", joined)), "y": y.transpose(0, 3, 1, 2).copy()})
            if L["down"] is not None:
                joined = [np.concatenate([grp[1][k] for grp in debug]) for k in range(4)]
                record.append({"name": L["down"].name, **dict(zip("abcd", joined))})
        # ``y`` is a plan buffer, overwritten later in this run (an identity unit adds into it in
        # place) and by the next run; the next layer consumes it before that, debug records
        # copy it, and run() returns only the classifier's fresh array.
        return y

    def _run_fused(self, out):
        L, conv = self.layer, self.layer["conv"]
        main, down = self.whole
        mp = main.gemm.plan
        gemm = (self.bits_in.reshape(-1), mp.panels, mp.k_words, mp.taps_off, mp.bases)
        epi = (main.pw_f, main.npw_f, conv.alpha, conv.scale, conv.shift)
        tail = (out, self.bits_out if self.pack else _NO_BITS, self.pack, main.out_w, self.pad[0], self.pad[1])
        scratch = (mp.xscratch, mp.bscratch, self.ascratch[0])
        kernel = epilogue.fused_kernel(self.ep, self.mode)
        if self.mode in ("none", "identity"):
            kernel(*gemm, *scratch, self.pxscratch, *epi, *tail)
        else:
            d, dp = L["down"], down.gemm.plan
            kernel(*gemm, dp.panels, dp.taps_off, dp.bases, *scratch, self.ascratch[1], self.pxscratch,
                   *epi, down.pw_f, down.npw_f, d.alpha, d.scale, d.shift, *tail)

    def convs(self):
        """(Conv, out_h, out_w) of the unit's convolutions, for benchmarks."""
        main, down = next(iter(self.counts.values()))
        return [(cc.conv, cc.out_h, cc.out_w) for cc in (main, down) if cc is not None]

    def run_gemm(self, which: int):
        """The popcount GEMMs alone of convolution ``which`` (0 conv, 1 down) over the batch."""
        n_img = self.out_shape[0]
        for g0 in range(0, n_img, self.group):
            g1 = min(n_img, g0 + self.group)
            self.counts[g1 - g0][which].gemm(self.bits_in[g0:g1])


class _PoolStep(_Step):
    def __init__(self, layer, n_img, c, h, w, nxt_pad):
        self.label = layer["op"]
        self.layer = layer
        (kh, kw), (sh, sw), (ph, pw_) = layer["kernel"], layer["stride"], layer["padding"]
        self.out_h = (h + 2 * ph - kh) // sh + 1
        self.out_w = (w + 2 * pw_ - kw) // sw + 1
        self.out_chw = (c, self.out_h, self.out_w)
        self.pad = nxt_pad
        self.bits_out = _bits_buffer(n_img, c, self.out_h, self.out_w, nxt_pad) if nxt_pad else None

    def __call__(self, x, record):
        # x (N, H, W, C), channels last like every activation of the engine.
        L = self.layer
        (kh, kw), (sh, sw), (ph, pw_) = L["kernel"], L["stride"], L["padding"]
        is_max = L["op"] == "maxpool2d"
        if ph or pw_:
            # Max-pool pads with -inf (never chosen); avg-pool with zeros (counted in the divisor
            # when count_include_pad, torch's default).
            fill = -np.inf if is_max else 0.0
            x = np.pad(x, ((0, 0), (ph, ph), (pw_, pw_), (0, 0)), constant_values=fill)
        oh, ow = self.out_h, self.out_w
        acc = None
        # Taps in (ty, tx) order, as torch's CPU pooling loops accumulate them.
        for ty in range(kh):
            for tx in range(kw):
                v = x[:, ty:ty + sh * (oh - 1) + 1:sh, tx:tx + sw * (ow - 1) + 1:sw]
                if acc is None:
                    acc = v.astype(np.float32, copy=True)
                elif is_max:
                    np.maximum(acc, v, out=acc)  # NaN propagates, as in torch
                else:
                    acc += v
        if not is_max:
            if L["count_include_pad"] or not (ph or pw_):
                acc = acc / np.float32(kh * kw)
            else:
                hh, ww = x.shape[1] - 2 * ph, x.shape[2] - 2 * pw_
                ys = np.arange(oh) * sh - ph
                xs = np.arange(ow) * sw - pw_
                cy = np.minimum(ys + kh, hh) - np.maximum(ys, 0)
                cx = np.minimum(xs + kw, ww) - np.maximum(xs, 0)
                acc = acc / (cy[:, None] * cx[None, :]).astype(np.float32)[:, :, None]
        acc = np.ascontiguousarray(acc, dtype=np.float32)
        if self.bits_out is not None:
            n_img, c = acc.shape[0], acc.shape[3]
            _call(_pack_padded, n_img * oh * ow // 16, acc.reshape(n_img, oh * ow, c), ow, self.pad[0], self.pad[1],
                  self.bits_out)
        return acc


class _GlobalPoolStep(_Step):
    label = "global_avgpool"

    def __call__(self, x, record):
        n_img, c = x.shape[0], x.shape[-1]
        out = np.empty((n_img, c), dtype=np.float32)
        _call(_global_mean, n_img, np.ascontiguousarray(x).reshape(n_img, -1, c), out)
        return out


class _LinearStep(_Step):
    label = "classifier"

    def __init__(self, layer):
        self.wt = np.ascontiguousarray(layer["weight"].T, dtype=np.float32)
        self.bias = np.ascontiguousarray(layer["bias"], dtype=np.float32)

    def __call__(self, x, record):
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape[0], -1)
        out = np.empty((x.shape[0], self.wt.shape[1]), dtype=np.float32)
        _call(_linear, x.shape[0], x, self.wt, self.bias, out)
        return out
