"""The fast count kernel: a register-blocked popcount GEMM with the count identities fused in.

Shape of the computation (what made Numba reach the popcount peak, docs/performance.md):

* Outputs are computed in tiles of P pixels x Q output channels, each output a named scalar
  ``uint64`` accumulator (``acc_p_j``). For one channel word ``k`` of one tap, a tile loads Q
  weight words (one contiguous panel row), and for each pixel one input word that it ANDs
  against all Q weight words. LLVM's SLP vectorizer packs the Q accumulators of a pixel into
  one AVX-512 register, so the inner loop is broadcast-AND, ``vpopcntq``, add: three vector ops
  per 512 binary MACs, no horizontal reductions. The source is generated (``_tiles.py``)
  because it spells out P*Q accumulators.
* Weights are pre-packed into column panels ``(O/Q, taps, K, Q)`` so that the Q words of a panel
  row are contiguous; channels past O are zero words and their outputs are dropped.
* The input is zero-padded spatially (a 0 word adds nothing to ``popcount(x & w)``), so every
  pixel reads every tap without bounds checks. A tile is P neighbouring output pixels in NCHW
  order; its input words (an im2col of P pixels, a few KB) are gathered once into a per-thread
  buffer and reused by every panel of output channels.
* Two store layouts. ``nchw`` (the counts API): ``a`` is (N, O, Ho*Wo) int64, stored channel
  by channel in contiguous runs of P positions. Its tile is two serial functions, a gather and
  one panel's GEMM, so that ``counts.py`` can run the count identities between panels.
  ``nhwc`` (the inference engine): ``a`` is (N, Ho*Wo, O) int32. Its im2col is pixel-major so
  that SLP packs the accumulators over channels, not pixels: each pixel's Q channels are then
  one vector register, and a full tile is P plain vector stores, no transposes; the
  engine's epilogue then runs along contiguous channels, which keeps it vectorized on the 4x4
  and 8x8 layers where a pixel row is too short to.
"""
from __future__ import annotations

import functools

import numba
import numpy as np

from ._jit import jit

# (pixels, channels) per tile. 16 x 8: 16 zmm accumulators, one zmm of weights, room to spare
# in the 32 AVX-512 registers.
TILE_SHAPES = ((16, 8),)
TILE_PIXELS, TILE_CHANNELS = TILE_SHAPES[0]


LAYOUTS = ("nchw", "nhwc")


def kernel_name(pixels: int, channels: int, layout: str) -> str:
    return f"tiles_{pixels}x{channels}" + ("" if layout == "nchw" else f"_{layout}")


def gather_function_name(pixels: int) -> str:
    """The serial nchw im2col of one tile of P pixels (``panel_function_name`` reads it)."""
    return f"gather_{pixels}_nchw"


def panel_function_name(pixels: int, channels: int) -> str:
    """The serial nchw tile: P pixels x Q channels of one panel, stored channel-major."""
    return f"panel_{pixels}x{channels}_nchw"


def tile_function_name(pixels: int, channels: int) -> str:
    """The serial nhwc tile: one tile of P pixels over a range of panels (the engine's fused
    epilogue kernels call it, as does the parallel ``kernel_name(P, Q, "nhwc")``)."""
    return f"tile_{pixels}x{channels}_nhwc"


# The types each tile function is compiled for, on first call (the tests compile them uncached
# with these to read their instructions). A tile first called from an epilogue that compiles
# with the loop vectorizer on still compiles with its own settings (refimpl/_jit.py).
TILE_FUNCTION_SIGNATURE = (
    "void(u8[::1], u8[::1], i8, i8[::1], i8[::1], i8, i8, i8, i8, i8, u8[::1], u8[:, ::1], i4[::1], i8, f4[::1])"
)
# gather(xflat, k_words, taps_off, bases, first, xt); panel(xt, wflat, steps, panel, out, row0, ld, col)
GATHER_SIGNATURE = "void(u8[::1], i8, i8[::1], i8[::1], i8, u8[::1])"
PANEL_SIGNATURE = "void(u8[::1], u8[::1], i8, i8, i8[::1], i8, i8, i8)"


def _panel_loop(P: int, Q: int, pixel_major: bool, indent: str, panels: str) -> list[str]:
    """The register-blocked loop over panels, up to (not including) the store."""
    i3, i4 = indent, indent + "    "
    lines = [
        f"{i3[:-4]}for panel in range({panels}):",
        f"{i3}wo = panel * steps * {Q}",
    ]
    lines += [f"{i3}acc_{p}_{j} = np.uint64(0)" for p in range(P) for j in range(Q)]
    # (tap, word) pairs are laid out in the same order in xt and in the weight panel, so one
    # flat loop walks both. Unsigned indices: Numba skips its negative-index wraparound for them.
    lines += [
        f"{i3}for step in range(steps):",
        f"{i4}xk = np.uint64(step)" if pixel_major else f"{i4}xk = np.uint64(step * {P})",
        f"{i4}wk = np.uint64(wo + step * {Q})",
    ]
    lines += [f"{i4}w_{j} = wflat[wk + np.uint64({j})]" for j in range(Q)]
    for p in range(P):
        offset = f"np.uint64({p} * steps)" if pixel_major else f"np.uint64({p})"
        lines.append(f"{i4}x_{p} = xt[xk + {offset}]")
        lines += [f"{i4}acc_{p}_{j} += popcount(x_{p} & w_{j})" for j in range(Q)]
    return lines


def _nhwc_sources(P: int, Q: int) -> list[str]:
    i1, i2, i3, i4 = (" " * (4 * k) for k in range(1, 5))
    tile = tile_function_name(P, Q)
    lines = [
        "@jit",
        f"def {tile}(xflat, wflat, k_words, taps_off, bases, n_out, n_pixels, first, panel0, panel1, xt, block, a, a_first, px):",
        f"{i1}# Pixels first .. first+{P - 1} (of n_pixels), panels [panel0, panel1); pixel r's",
        f"{i1}# channels go to a[(r - a_first) * n_out:], so ``a`` is the whole (N*Ho*Wo, O)",
        f"{i1}# array (a_first = 0) or a per-thread block of this tile's rows (a_first = first).",
        f"{i1}# px[p]: popcount of pixel p's window, taken while gathering it (the padded taps",
        f"{i1}# read the zero border: the in-bounds window sum of docs/design.md section 1).",
        f"{i1}n_taps = taps_off.shape[0]",
        f"{i1}steps = n_taps * k_words",
        # im2col pixel-major, xt[p*steps + t*K + k]: a step's P input words are then not
        # adjacent, so SLP cannot pack them into one vector and packs the Q weight words
        # instead. Each accumulator vector is then one pixel's Q channels, which is the store
        # layout; packed over pixels (as for nchw) the store was a 16x8 transpose of ~180
        # shuffles per tile and panel, as much as the popcounts of a 64-channel layer.
        # One word per tap (64 channels) gets its own loop: the generic one ran at ~4 cycles a
        # word there, a quarter of a 64-channel layer's GEMM time (measured at batch 64).
        f"{i1}if k_words == 1:",
        f"{i2}for p in range({P}):",
        f"{i3}src = np.uint64(bases[first + p])",
        f"{i3}dst = np.uint64(p * n_taps)",
        f"{i3}total = 0",
        f"{i3}for t in range(n_taps):",
        f"{i3}    word = xflat[src + np.uint64(taps_off[t])]",
        f"{i3}    xt[dst + np.uint64(t)] = word",
        f"{i3}    total += popcount(word)",
        f"{i3}px[p] = np.float32(total)",
        f"{i1}else:",
        f"{i2}for p in range({P}):",
        f"{i3}total = 0",
        f"{i3}base = np.uint64(bases[first + p])",
        f"{i3}for t in range(n_taps):",
        f"{i3}    src = base + np.uint64(taps_off[t])",
        f"{i3}    dst = np.uint64((p * n_taps + t) * k_words)",
        f"{i3}    for k in range(np.uint64(k_words)):",
        f"{i3}        word = xflat[src + k]",
        f"{i3}        xt[dst + k] = word",
        f"{i3}        total += popcount(word)",
        f"{i3}px[p] = np.float32(total)",
    ]
    lines += _panel_loop(P, Q, True, i2, "panel0, panel1")
    # Store, pixel-major: a pixel's Q accumulators are one vector register (the SLP pack
    # above), stored as Q consecutive int32. The tile's P pixels are consecutive rows of ``a``
    # unless it runs past the last pixel; padding channels are dropped.
    lines += [f"{i2}if first + {P} <= n_pixels and panel * {Q} + {Q} <= n_out:"]
    for p in range(P):
        lines.append(f"{i3}row = np.uint64((first - a_first + {p}) * n_out + panel * {Q})")
        lines += [f"{i3}a[row + np.uint64({j})] = np.int32(acc_{p}_{j})" for j in range(Q)]
    lines.append(f"{i2}else:")
    lines += [f"{i3}block[{j}, {p}] = acc_{p}_{j}" for j in range(Q) for p in range(P)]
    lines += [
        f"{i3}for p in range(min({P}, n_pixels - first)):",
        f"{i3}    for j in range(min({Q}, n_out - panel * {Q})):",
        f"{i3}        a[(first - a_first + p) * n_out + panel * {Q} + j] = np.int32(block[j, p])",
        "",
        "",
        "@jit(parallel=True)",
        f"def {kernel_name(P, Q, 'nhwc')}(xflat, wflat, k_words, taps_off, bases, n_out, positions, group_panels, xscratch, bscratch, a,",
        f"{i1}{' ' * len(kernel_name(P, Q, 'nhwc'))}px):",
        f"{i1}# px (N*Ho*Wo,) float32: each pixel's window popcount, from the tile's gather.",
        f"{i1}pxt = np.empty((xscratch.shape[0], {P}), dtype=np.float32)",
        f"{i1}n_pixels = a.shape[0] // n_out",
        f"{i1}n_panels = (n_out + {Q - 1}) // {Q}",
        f"{i1}n_groups = (n_panels + group_panels - 1) // group_panels",
        f"{i1}for item in prange(((n_pixels + {P - 1}) // {P}) * n_groups):",
        f"{i2}tile = item // n_groups",
        f"{i2}group = item - tile * n_groups",
        f"{i2}tid = numba.get_thread_id()",
        f"{i2}{tile}(xflat, wflat, k_words, taps_off, bases, n_out, n_pixels, tile * {P}, group * group_panels,",
        f"{i2}     min(n_panels, (group + 1) * group_panels), xscratch[tid], bscratch[tid], a, 0, pxt[tid])",
        f"{i2}if group == 0:",
        f"{i3}for q in range(min({P}, n_pixels - tile * {P})):",
        f"{i3}    px[tile * {P} + q] = pxt[tid, q]",
    ]
    return lines


def tile_kernel_source(pixels: int, channels: int, layout: str = "nchw") -> list[str]:
    """Source lines of the Numba tile kernel ``kernel_name(P, Q, layout)`` (``ConvPlan`` calls it);
    for ``nhwc`` also of the serial tile function it calls."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    P, Q = pixels, channels
    if layout == "nhwc":
        return _nhwc_sources(P, Q)
    return _nchw_sources(P, Q)


def _nchw_sources(P: int, Q: int) -> list[str]:
    """The gather and panel functions of the nchw layout, and the parallel kernel that fills
    ``a`` with them; counts.py's fused counts kernel calls the same two functions."""
    i1, i2, i3, i4 = (" " * (4 * k) for k in range(1, 5))
    gather, panel = gather_function_name(P), panel_function_name(P, Q)
    lines = [
        "@jit",
        f"def {gather}(xflat, k_words, taps_off, bases, first, xt):",
        f"{i1}# im2col of pixels first .. first+{P - 1}: xt[(t*K + k)*{P} + p], tap-major, so that a",
        f"{i1}# step's {P} input words are adjacent and SLP packs the accumulators over pixels: each",
        f"{i1}# vector holds 8 positions of one channel, the nchw store layout.",
        f"{i1}# One word per tap (64 channels) without the word loop, as in the nhwc tile.",
        f"{i1}n_taps = taps_off.shape[0]",
        f"{i1}if k_words == 1:",
        f"{i2}for t in range(n_taps):",
        f"{i3}off = np.uint64(taps_off[t])",
        f"{i3}dst = np.uint64(t * {P})",
        f"{i3}for p in range({P}):",
        f"{i3}    xt[dst + np.uint64(p)] = xflat[np.uint64(bases[first + p]) + off]",
        f"{i1}else:",
        f"{i2}# word k of the {P} pixels, one destination run at a time; unsigned indices (no",
        f"{i2}# negative-index wraparound): 3x faster than pixel by pixel with signed ones",
        f"{i2}for t in range(n_taps):",
        f"{i3}off = np.uint64(taps_off[t])",
        f"{i3}for k in range(np.uint64(k_words)):",
        f"{i3}    dst = np.uint64(t * k_words * {P}) + k * np.uint64({P})",
        f"{i3}    for p in range({P}):",
        f"{i3}        xt[dst + np.uint64(p)] = xflat[np.uint64(bases[first + p]) + off + k]",
        "",
        "",
        "@jit",
        f"def {panel}(xt, wflat, steps, panel, out, row0, ld, col):",
        f"{i1}# The {P}x{Q} tile of one panel: channel j of the panel goes to",
        f"{i1}# out[(row0 + j)*ld + col :][:{P}], {P} consecutive positions (SLP: vector stores).",
    ]
    body = _panel_loop(P, Q, False, i2, "panel, panel + 1")
    # _panel_loop opens its own loop over panels; here there is exactly one.
    lines += [line[4:] if line.startswith(i2) else line for line in body[1:]]
    for j in range(Q):
        lines.append(f"{i1}row = np.uint64((row0 + {j}) * ld + col)")
        lines += [f"{i1}out[row + np.uint64({p})] = np.int64(acc_{p}_{j})" for p in range(P)]
    lines += [
        "",
        "",
        "@jit(parallel=True)",
        f"def {kernel_name(P, Q, 'nchw')}(xflat, wflat, k_words, taps_off, bases, n_out, positions, group_panels, xscratch, bscratch, a):",
        f"{i1}# a (N*O*Ho*Wo,) int64; bscratch (T, {Q * P}) int64: the edge tiles' block.",
        f"{i1}n_pixels = a.shape[0] // n_out",
        f"{i1}n_panels = (n_out + {Q - 1}) // {Q}",
        f"{i1}steps = taps_off.shape[0] * k_words",
        f"{i1}n_groups = (n_panels + group_panels - 1) // group_panels",
        f"{i1}for item in prange(((n_pixels + {P - 1}) // {P}) * n_groups):",
        f"{i2}tile = item // n_groups",
        f"{i2}group = item - tile * n_groups",
        f"{i2}tid = numba.get_thread_id()",
        f"{i2}xt = xscratch[tid]",
        f"{i2}block = bscratch[tid]",
        f"{i2}first = tile * {P}",
        f"{i2}img0 = first // positions",
        f"{i2}pos0 = first - img0 * positions",
        f"{i2}full = first + {P} <= n_pixels and pos0 + {P} <= positions",
        f"{i2}{gather}(xflat, k_words, taps_off, bases, first, xt)",
        f"{i2}for panel in range(group * group_panels, min(n_panels, (group + 1) * group_panels)):",
        # A full tile (P positions of one image, Q real channels) stores straight into
        # ``a``; tiles at the edges go through the small per-thread block.
        f"{i3}if full and panel * {Q} + {Q} <= n_out:",
        f"{i4}{panel}(xt, wflat, steps, panel, a, img0 * n_out + panel * {Q}, positions, pos0)",
        f"{i3}else:",
        f"{i4}{panel}(xt, wflat, steps, panel, block, 0, {P}, 0)",
        f"{i4}for j in range(min({Q}, n_out - panel * {Q})):",
        f"{i4}    o = panel * {Q} + j",
        f"{i4}    for p in range(min({P}, n_pixels - first)):",
        f"{i4}        pix = first + p",
        f"{i4}        i = pix // positions",
        f"{i4}        a[(i * n_out + o) * positions + pix - i * positions] = block[j * {P} + p]",
    ]
    return lines


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def weight_panels(wp: np.ndarray, channels: int = TILE_CHANNELS) -> np.ndarray:
    """(O, KH, KW, K) words -> flat panels (ceil(O/Q), KH*KW, K, Q), zero words past O."""
    n_out, kh, kw, k_words = wp.shape
    n_panels = -(-n_out // channels)
    panels = np.empty(n_panels * kh * kw * k_words * channels, dtype=np.uint64)
    _fill_weight_panels(np.ascontiguousarray(wp, dtype=np.uint64).reshape(n_out, kh * kw * k_words), channels, panels)
    return panels


@jit
def _fill_weight_panels(rows, channels, panels):
    # rows (O, taps*K) -> panels[((panel*taps*K) + step)*Q + j] = rows[panel*Q + j, step], 0 past O.
    # A loop: the counts API builds the panels on every call, and NumPy's pad-transpose-copy
    # took 60 us for 512 channels.
    n_out, steps = rows.shape
    for panel in range(panels.shape[0] // (steps * channels)):
        for step in range(steps):
            base = (panel * steps + step) * channels
            for j in range(channels):
                o = panel * channels + j
                panels[base + j] = rows[o, step] if o < n_out else np.uint64(0)


def pixel_bases(n_img, h, w, stride, padding, out_h, out_w, k_words, pixels=TILE_PIXELS):
    """Offset of each output pixel's window origin in the zero-padded, flattened input.

    Pixels are in NCHW order (image, row, column), so a tile's outputs are neighbouring
    positions. The list is padded by repeating the last pixel (dropped on store) to whole tiles
    plus one spare tile, so that a tile may start at any pixel (counts.py starts one at each
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
        self.xscratch = np.empty((threads, kh * kw * self.k_words * P), dtype=np.uint64)
        # The edge tiles' block: (Q, P) accumulators for nhwc, a flat int64 panel for nchw.
        self.bscratch = (np.empty((threads, Q, P), dtype=np.uint64) if layout == "nhwc"
                         else np.empty((threads, Q * P), dtype=np.int64))
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
        from . import _tiles

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
            raise ValueError("px is filled by the nhwc layout only; counts.py sums it for nchw")
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
