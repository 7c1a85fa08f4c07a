"""The fast count kernel: a register-blocked popcount GEMM with the count identities fused in.

Shape of the computation (what made Numba reach the popcount peak, docs/performance.md):

* Outputs are computed in tiles of P pixels x Q output channels, each output a ``uint64``
  count. For one channel word ``k`` of one tap, a tile loads Q weight words (one contiguous
  panel row) and P input words, and ANDs every input word against every weight word: an outer
  product, written as LLVM vectors (``outer_product.py``): one operand a vector, the other
  broadcast, so the inner loop is broadcast-AND, ``vpopcntq``, add: three vector ops per 512
  binary MACs, no horizontal reductions. The tile functions are generated (``_tiles.py``, from
  ``refimpl/codegen/tiles_template.py``), one per shape and layout.
* Weights are pre-packed into column panels ``(O/Q, taps, K, Q)`` so that the Q words of a panel
  row are contiguous; channels past O are zero words and their outputs are dropped.
* The input is zero-padded spatially (a 0 word adds nothing to ``popcount(x & w)``), so every
  pixel reads every tap without bounds checks. A tile is P neighbouring output pixels in NCHW
  order; its input words (an im2col of P pixels, a few KB) are gathered once into a per-thread
  buffer and reused by every panel of output channels.
* Two store layouts. ``nchw`` (the counts API): ``a`` is (N, O, Ho*Wo) int64, stored channel
  by channel in contiguous runs of P positions. Its tile is two serial functions, a gather and
  one panel's GEMM, so that ``fused.py`` can run the count identities between panels.
  ``nhwc`` (the inference engine): ``a`` is (N, Ho*Wo, O) int32. Its accumulators run over
  channels, not pixels: each pixel's Q channels are one vector register, and a full tile is P
  plain vector stores, no transposes; the
  engine's epilogue then runs along contiguous channels, which keeps it vectorized on the 4x4
  and 8x8 layers where a pixel row is too short to.
"""
from __future__ import annotations

import functools

import numba
import numpy as np

from .._jit import jit
from . import _tiles
from .byte_dot import NIBBLES, store_weight_word
from .geometry import conv_output_size
from .scratch import thread_blocks, thread_rows
from .tiling import LAYOUTS, TILE_CHANNELS, TILE_PIXELS, kernel_name


def weight_panels(wp: np.ndarray, channels: int = TILE_CHANNELS) -> np.ndarray:
    """(O, KH, KW, K) words -> flat panels (ceil(O/Q), KH*KW, K, NIBBLES, Q), zero words past O
    (``NIBBLES`` = 2 on AVX2: each step's Q words, then the same shifted down by 4; byte_dot.py)."""
    n_out, kh, kw, k_words = wp.shape
    n_panels = -(-n_out // channels)
    panels = np.empty(n_panels * kh * kw * k_words * NIBBLES * channels, dtype=np.uint64)
    _fill_weight_panels(np.ascontiguousarray(wp, dtype=np.uint64).reshape(n_out, kh * kw * k_words), channels, panels)
    return panels


@jit
def _fill_weight_panels(rows, channels, panels):
    # rows (O, taps*K) -> panels[((panel*taps*K) + step)*NIBBLES*Q + j] = rows[panel*Q + j, step],
    # 0 past O. A loop: the counts API builds the panels on every call, and NumPy's
    # pad-transpose-copy took 60 us for 512 channels.
    n_out, steps = rows.shape
    for panel in range(panels.shape[0] // (steps * NIBBLES * channels)):
        for step in range(steps):
            base = (panel * steps + step) * NIBBLES * channels
            for j in range(channels):
                o = panel * channels + j
                store_weight_word(panels, base + j, channels, rows[o, step] if o < n_out else np.uint64(0))


def pixel_bases(n_img, h, w, stride, padding, out_h, out_w, k_words, pixels=TILE_PIXELS):
    """Offset of each output pixel's window origin in the zero-padded, flattened input.

    Pixels are in NCHW order (image, row, column), so a tile's outputs are neighbouring
    positions. The list is padded by repeating the last pixel (dropped on store) to whole tiles
    plus one spare tile, so that a tile may start at any pixel (fused.py starts one at each
    image's first position).
    """
    n_pixels = n_img * out_h * out_w
    bases = np.empty((-(-n_pixels // pixels) + 1) * pixels, dtype=np.int64)
    _fill_pixel_bases(h + 2 * padding[0], w + 2 * padding[1], stride[0], stride[1], out_h, out_w, k_words,
                      n_pixels, bases)
    return bases


@jit
def _fill_pixel_bases(hp, wp, stride_y, stride_x, out_h, out_w, k_words, n_pixels, bases):
    # A loop, not NumPy divmods over arrays: the counts API builds this on every call.
    positions = out_h * out_w
    for p in range(bases.shape[0]):
        pix = min(p, n_pixels - 1)
        img = pix // positions
        pos = pix - img * positions
        oy = pos // out_w
        ox = pos - oy * out_w
        bases[p] = ((img * hp + oy * stride_y) * wp + ox * stride_x) * k_words


def tap_offsets(kh, kw, dilation, w, padding, k_words):
    """Offset of each filter tap from the window origin in the padded input."""
    ty, tx = np.divmod(np.arange(kh * kw), kw)
    return ((ty * dilation[0]) * (w + 2 * padding[1]) + tx * dilation[1]) * k_words


def pad_input(xp: np.ndarray, padding) -> np.ndarray:
    """Zero words around the packed (N, H, W, K) input, flattened."""
    if padding == (0, 0):
        return np.ascontiguousarray(xp).reshape(-1)
    ph, pw_ = padding
    n_img, h, w, k_words = xp.shape
    out = np.zeros((n_img, h + 2 * ph, w + 2 * pw_, k_words), dtype=np.uint64)
    out[:, ph : ph + h, pw_ : pw_ + w] = xp
    return out.reshape(-1)


def _ints(pair) -> tuple[int, ...]:
    # a hashable key of plain ints, whatever integer type the caller's pair holds
    return tuple(int(v) for v in pair)


@functools.lru_cache(maxsize=16)
def _window_layout(n_img, h, w, kh, kw, stride, padding, dilation, buffer_padding, k_words):
    # (bases, taps_off) of ConvPlan: geometry only, so cached. The counts API builds a plan on
    # every call, and at batch 64 the window origins took ~17 us of a ~2 ms call. Shared by
    # every plan of this geometry: nothing may write to them.
    bh, bw = buffer_padding
    out_h = conv_output_size(h, kh, stride[0], padding[0], dilation[0])
    out_w = conv_output_size(w, kw, stride[1], padding[1], dilation[1])
    shift = ((bh - padding[0]) * (w + 2 * bw) + (bw - padding[1])) * k_words
    bases = pixel_bases(n_img, h, w, stride, buffer_padding, out_h, out_w, k_words)
    if shift:
        bases += shift
    taps_off = np.ascontiguousarray(tap_offsets(kh, kw, dilation, w, buffer_padding, k_words), dtype=np.int64)
    return bases, taps_off


class ConvPlan:
    """The popcount GEMM of one convolution geometry, prepared once, run many times.

    Holds the weight panels, the window origins, the tap offsets and the per-thread scratch, so
    a call runs only the tile kernel: at batch 1 the preparation costs more than the arithmetic
    of a small layer. The plan reads a zero-padded packed input buffer (``pad``). Its border,
    ``buffer_padding``, may be wider than the convolution's own padding, so that a 1x1 shortcut
    can read the buffer of the 3x3 convolution beside it: the window origins then shift inwards
    by the difference.
    """

    def __init__(self, wp, n_img, h, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), buffer_padding=None,
                 layout="nchw"):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.layout = layout
        wp = np.ascontiguousarray(wp, dtype=np.uint64)
        self.n_out, kh, kw, self.k_words = wp.shape
        self.n_img, self.h, self.w = n_img, h, w
        self.buffer_padding = tuple(padding if buffer_padding is None else buffer_padding)
        if self.buffer_padding[0] < padding[0] or self.buffer_padding[1] < padding[1]:
            raise ValueError(f"buffer padding {self.buffer_padding} is narrower than the convolution's {tuple(padding)}")
        self.out_h = conv_output_size(h, kh, stride[0], padding[0], dilation[0])
        self.out_w = conv_output_size(w, kw, stride[1], padding[1], dilation[1])
        P, Q = TILE_PIXELS, TILE_CHANNELS
        self.panels = weight_panels(wp, Q)
        self.bases, self.taps_off = _window_layout(int(n_img), int(h), int(w), kh, kw, _ints(stride), _ints(padding),
                                                   _ints(dilation), _ints(self.buffer_padding), self.k_words)
        threads = numba.config.NUMBA_NUM_THREADS
        # the tile's im2col: NIBBLES words per input word (byte_dot.store_input_word)
        self.xscratch = thread_rows(threads, kh * kw * self.k_words * P * NIBBLES, np.uint64)
        # The edge tiles' block: P*Q counts for nhwc (stored pixel-major, flat), a flat int64
        # panel for nchw.
        self.bscratch = (thread_blocks(threads, Q, P, np.uint64) if layout == "nhwc"
                         else thread_rows(threads, Q * P, np.int64))
        self.n_tiles = -(-(n_img * self.out_h * self.out_w) // P)
        self.n_panels = -(-self.n_out // Q)

    def pad(self, xp) -> np.ndarray:
        """The packed (N, H, W, K) input in this plan's zero-bordered, flat buffer layout."""
        return pad_input(xp, self.buffer_padding)

    def __call__(self, xflat: np.ndarray, a: np.ndarray, threads: int | None = None, px=None) -> np.ndarray:
        """Fill ``a`` from the flat padded input buffer: C-contiguous, (N, O, Ho*Wo) int64 for the
        ``nchw`` layout, (N, Ho*Wo, O) int32 for ``nhwc``.

        ``threads``: the caller's Numba thread count, if it knows it (asking Numba takes a lock).
        ``px`` (``nhwc`` only): a C-contiguous float32 array of N*Ho*Wo values, filled with each
        output pixel's window popcount (docs/design.md section 1's px; the padded taps read the buffer's
        zero border), taken while the tiles gather their input.
        """
        # Work items are (tile, group of panels). Small layers (batch 1, 4x4 maps) have fewer
        # tiles than threads, so their panels are split into groups to give every thread work;
        # each group gathers its tile's input again, which is cheap next to its panels.
        threads = numba.get_num_threads() if threads is None else threads
        groups = min(self.n_panels, max(1, -(-4 * threads // self.n_tiles)))
        group_panels = -(-self.n_panels // groups)
        kernel = getattr(_tiles, kernel_name(TILE_PIXELS, TILE_CHANNELS, self.layout))
        args = (xflat, self.panels, self.k_words, self.taps_off, self.bases, self.n_out,
                self.out_h * self.out_w, group_panels, self.xscratch, self.bscratch, a.reshape(-1))
        if self.layout == "nhwc":
            if px is None:
                px = np.empty(self.n_img * self.out_h * self.out_w, dtype=np.float32)
            kernel(*args, px.reshape(-1))
        elif px is not None:
            raise ValueError("px is filled by the nhwc layout only; window_sums.py sums it for nchw")
        else:
            kernel(*args)
        return a


def popcount_conv(xp, wp, stride, padding, dilation, out_h, out_w, a):
    """Fill ``a`` (N, O, Ho*Wo), C-contiguous int64, with the popcount GEMM of packed operands."""
    n_img, h, w, _ = xp.shape
    plan = ConvPlan(wp, n_img, h, w, stride, padding, dilation)
    if (plan.out_h, plan.out_w) != (out_h, out_w):
        raise ValueError(f"output is {plan.out_h}x{plan.out_w}, not {out_h}x{out_w}")
    return plan(plan.pad(xp), a)
