"""The template of ``refimpl/kernels/_tiles.py``: the register-blocked popcount tiles
(``refimpl/kernels/blocked.py`` explains their shape) and the engine stem's float32 tile.

Sizes and function names come from ``refimpl/kernels/tiling.py``, which the runtime reads too.
"""
from __future__ import annotations

from ..kernels.scratch import row_length
from ..kernels.tiling import (
    LAYOUTS,
    STEM_TILES,
    TILE_SHAPES,
    fused_tile_function_name,
    gather_function_name,
    kernel_name,
    panel_function_name,
    stem_tile_name,
    tile_function_name,
)

_I1, _I2, _I3, _I4 = (" " * (4 * k) for k in range(1, 5))


def outer_name(P: int, Q: int, orientation: str) -> str:
    """The module-level name of refimpl/kernels/outer_product.py's intrinsic in ``_tiles.py``."""
    return f"_OUTER_{P}x{Q}_{orientation.upper()}"


def _nhwc_gather(P: int) -> list[str]:
    """The nhwc tile's im2col of its P pixels, with each pixel's window popcount."""
    i1, i2, i3 = _I1, _I2, _I3
    return [
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


def _edge_copy(P: int, Q: int, indent: str) -> list[str]:
    """An edge tile's counts from the per-thread block, pixel-major (``flat[p*Q + j]``), into
    ``a``: only real pixels and channels."""
    return [
        f"{indent}for p in range(min({P}, n_pixels - first)):",
        f"{indent}    for j in range(min({Q}, n_out - panel * {Q})):",
        f"{indent}        a[(first - a_first + p) * n_out + panel * {Q} + j] = np.int32(flat[p * {Q} + j])",
    ]


def _nhwc_panels(P: int, Q: int) -> list[str]:
    """The panels, pixel-major: each pixel's Q counts are one vector (``outer_product``'s
    "channels" orientation), stored as Q consecutive int32. The tile's P pixels are consecutive
    rows of ``a`` unless it runs past the last pixel; padding channels are dropped."""
    i1, i2, i3 = _I1, _I2, _I3
    tile = outer_name(P, Q, "channels")
    return [
        f"{i1}for panel in range(panel0, panel1):",
        f"{i2}wo = panel * steps * {Q}",
        f"{i2}if first + {P} <= n_pixels and panel * {Q} + {Q} <= n_out:",
        f"{i3}{tile}(xt, np.int64(0), steps, wflat, wo, steps, a, (first - a_first) * n_out + panel * {Q}, n_out)",
        f"{i2}else:",
        f"{i3}flat = block.reshape(-1)",
        f"{i3}{tile}(xt, np.int64(0), steps, wflat, wo, steps, flat, np.int64(0), np.int64({Q}))",
        *_edge_copy(P, Q, i3),
    ]


def _nhwc_kernel(P: int, Q: int) -> list[str]:
    """The parallel nhwc kernel: every tile of pixels over groups of panels."""
    i1, i2, i3 = _I1, _I2, _I3
    tile = tile_function_name(P, Q)
    return [
        "@jit(parallel=True, slp_vectorize=not BYTE_LOOKUP)",
        f"def {kernel_name(P, Q, 'nhwc')}(xflat, wflat, k_words, taps_off, bases, n_out, positions, group_panels, xscratch, bscratch, a,",
        f"{i1}{' ' * len(kernel_name(P, Q, 'nhwc'))}px):",
        f"{i1}# px (N*Ho*Wo,) float32: each pixel's window popcount, from the tile's gather.",
        f"{i1}# {P} floats a thread, each row on cache lines of its own (kernels/scratch.py)",
        f"{i1}pxt = np.empty((xscratch.shape[0], {row_length(P, 4)}), dtype=np.float32)",
        f"{i1}n_pixels = a.shape[0] // n_out",
        f"{i1}n_panels = (n_out + {Q - 1}) // {Q}",
        f"{i1}n_groups = (n_panels + group_panels - 1) // group_panels",
        f"{i1}for item in prange(((n_pixels + {P - 1}) // {P}) * n_groups):",
        f"{i2}tile = item // n_groups",
        f"{i2}group = item - tile * n_groups",
        f"{i2}tid = numba.get_thread_id()",
        # np.int64(0): a literal 0 compiles the tile again, for Literal[int](0) (epilogue_template.py).
        f"{i2}{tile}(xflat, wflat, k_words, taps_off, bases, n_out, n_pixels, tile * {P}, group * group_panels,",
        f"{i2}     min(n_panels, (group + 1) * group_panels), xscratch[tid], bscratch[tid], a, np.int64(0), pxt[tid])",
        f"{i2}if group == 0:",
        f"{i3}for q in range(min({P}, n_pixels - tile * {P})):",
        f"{i3}    px[tile * {P} + q] = pxt[tid, q]",
    ]


def _nhwc_sources(P: int, Q: int) -> list[str]:
    tile = tile_function_name(P, Q)
    # SLP re-packs the byte-lookup branch's hand-written vectors into a tile that spills.
    lines = _nhwc_tile(P, Q, tile, "@jit(slp_vectorize=not BYTE_LOOKUP)")
    # The engine's fused epilogue tasks call this copy at its address, compiled once for every
    # genome (refimpl/codegen/epilogue_template.py, TILE_CALL_SIGNATURE), with the tasks' own
    # options: linked into each task, the tile was optimized again with them, and a copy compiled
    # with the tile's options ran 1-4% slower per layer in an interleaved comparison.
    fused = fused_tile_function_name(P, Q)
    lines += ["", ""] + _nhwc_tile(P, Q, fused, "@jit(loop_vectorize=True, slp_vectorize=not BYTE_LOOKUP)")
    return lines + ["", ""] + _nhwc_kernel(P, Q)


def _nhwc_tile(P: int, Q: int, tile: str, decorator: str) -> list[str]:
    """The serial nhwc tile function ``tile`` under ``decorator``."""
    i1 = _I1
    lines = [
        decorator,
        f"def {tile}(xflat, wflat, k_words, taps_off, bases, n_out, n_pixels, first, panel0, panel1, xt, block, a, a_first, px):",
        f"{i1}# Pixels first .. first+{P - 1} (of n_pixels), panels [panel0, panel1); pixel r's",
        f"{i1}# channels go to a[(r - a_first) * n_out:], so ``a`` is the whole (N*Ho*Wo, O)",
        f"{i1}# array (a_first = 0) or a per-thread block of this tile's rows (a_first = first).",
        f"{i1}# px[p]: popcount of pixel p's window, taken while gathering it (the padded taps",
        f"{i1}# read the zero border: the in-bounds window sum of docs/design.md section 1).",
        f"{i1}n_taps = taps_off.shape[0]",
        f"{i1}steps = n_taps * k_words",
        # im2col pixel-major, xt[p*steps + t*K + k], and each accumulator vector one pixel's Q
        # channels, which is the store layout; packed over pixels (as for nchw) the store was a
        # 16x8 transpose of ~180 shuffles per tile and panel, as much as the popcounts of a
        # 64-channel layer.
        # One word per tap (64 channels) gets its own loop: the generic one ran at ~4 cycles a
        # word there, a quarter of a 64-channel layer's GEMM time (measured at batch 64).
    ]
    lines += _byte_lookup_lanes(P, Q)
    lines += _nhwc_gather(P)
    return lines + _nhwc_panels(P, Q)


def _byte_lookup_panels(P: int, Q: int, call: str, pixels: str, channels: str) -> list[str]:
    """The panels of the nhwc tile on the paths without a vector popcount: ``call`` (a
    ``byte_dot`` block of ``pixels`` x ``channels``, with ``{out}``, ``{at}``, ``{ps}``, ``{qs}``
    left open) over the tile, straight into ``a`` or, at the edges, into ``block`` pixel-major
    as the outer-product branch stores it."""
    i2, i3, i4 = _I2, _I3, _I4
    loops = [f"for pp in range(0, {P}, {pixels}):", f"    for qq in range(0, {Q}, {channels}):"]
    return [
        f"{i2}for panel in range(panel0, panel1):",
        f"{i3}wo = panel * steps * {Q} * NIBBLES",
        f"{i3}if first + {P} <= n_pixels and panel * {Q} + {Q} <= n_out:",
        f"{i4}{loops[0]}",
        f"{i4}{loops[1]}",
        f"{i4}        " + call.replace("lanes_block(", "lanes_block_rows(").format(
            out="a", at=f"(first - a_first + pp) * n_out + panel * {Q} + qq", ps="n_out", qs="1"),
        f"{i3}else:",
        f"{i4}flat = block.reshape(-1)",
        f"{i4}{loops[0]}",
        f"{i4}{loops[1]}",
        f"{i4}        " + call.replace("lanes_block(", "lanes_block_rows(").format(
            out="flat", at=f"pp * {Q} + qq", ps=str(Q), qs="1"),
        *_edge_copy(P, Q, i4),
        f"{i2}return",
    ]


def _byte_lookup_lanes(P: int, Q: int) -> list[str]:
    """The nhwc tile on the paths without a vector popcount (a compile-time constant picks this
    branch): a tap-major gather, a step's pixels adjacent, and ``byte_dot.lanes_block``."""
    i1, i2, i3 = _I1, _I2, _I3
    call = f"lanes_block(xt, pp, {P} * NIBBLES, wflat, wo + qq, 1, {Q} * NIBBLES, steps, {{out}}, {{at}}, {{ps}}, {{qs}})"
    return [
        f"{i1}if BYTE_LOOKUP:",
        f"{i2}for p in range({P}):",
        f"{i3}src = np.uint64(bases[first + p])",
        f"{i3}total = 0",
        f"{i3}for t in range(n_taps):",
        f"{i3}    for k in range(np.uint64(k_words)):",
        f"{i3}        word = xflat[src + np.uint64(taps_off[t]) + k]",
        f"{i3}        store_input_word(xt, (np.uint64(t) * np.uint64(k_words) + k) * np.uint64({P} * NIBBLES) + np.uint64(p),",
        f"{i3}                         np.uint64({P}), word)",
        f"{i3}        total += popcount(word)",
        f"{i3}px[p] = np.float32(total)",
    ] + _byte_lookup_panels(P, Q, call, "LANES * LANE_GROUPS", "LANE_CHANNELS")


def tile_kernel_source(pixels: int, channels: int, layout: str = "nchw") -> list[str]:
    """Source lines of the Numba tile kernel ``kernel_name(P, Q, layout)`` (``ConvPlan`` calls it);
    for ``nhwc`` also of the serial tile function it calls."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    P, Q = pixels, channels
    if layout == "nhwc":
        return _nhwc_sources(P, Q)
    return _nchw_sources(P, Q)


def _nchw_gather(P: int) -> list[str]:
    """The serial nchw im2col of one tile (``gather_function_name``)."""
    i1, i2, i3 = _I1, _I2, _I3
    gather = gather_function_name(P)
    return [
        "@jit",
        f"def {gather}(xflat, k_words, taps_off, bases, first, xt):",
        f"{i1}# im2col of pixels first .. first+{P - 1}: xt[(t*K + k)*{P}*NIBBLES + p], tap-major, so",
        f"{i1}# that a step's {P} input words are one vector load and each accumulator holds positions",
        f"{i1}# of one channel, the nchw store layout (byte_dot.store_input_word: split into nibbles on AVX2).",
        f"{i1}# One word per tap (64 channels) without the word loop, as in the nhwc tile.",
        f"{i1}n_taps = taps_off.shape[0]",
        f"{i1}half = np.uint64({P})",
        f"{i1}if k_words == 1:",
        f"{i2}for t in range(n_taps):",
        f"{i3}off = np.uint64(taps_off[t])",
        f"{i3}dst = np.uint64(t * {P} * NIBBLES)",
        f"{i3}for p in range({P}):",
        f"{i3}    store_input_word(xt, dst + np.uint64(p), half, xflat[np.uint64(bases[first + p]) + off])",
        f"{i1}else:",
        f"{i2}# word k of the {P} pixels, one destination run at a time; unsigned indices (no",
        f"{i2}# negative-index wraparound): 3x faster than pixel by pixel with signed ones",
        f"{i2}for t in range(n_taps):",
        f"{i3}off = np.uint64(taps_off[t])",
        f"{i3}for k in range(np.uint64(k_words)):",
        f"{i3}    dst = (np.uint64(t * k_words) + k) * np.uint64({P} * NIBBLES)",
        f"{i3}    for p in range({P}):",
        f"{i3}        store_input_word(xt, dst + np.uint64(p), half, xflat[np.uint64(bases[first + p]) + off + k])",
    ]


def _nchw_panel(P: int, Q: int) -> list[str]:
    """The serial nchw tile of one panel (``panel_function_name``), stored channel-major."""
    i1, i2 = _I1, _I2
    panel = panel_function_name(P, Q)
    lines = [
        "@jit(slp_vectorize=not BYTE_LOOKUP)",
        f"def {panel}(xt, wflat, steps, panel, out, row0, ld, col):",
        f"{i1}# The {P}x{Q} tile of one panel: channel j of the panel goes to",
        f"{i1}# out[(row0 + j)*ld + col :][:{P}], {P} consecutive positions (vector stores).",
        # Without a vector popcount: byte_dot's blocks over the same tap-major xt.
        f"{i1}if BYTE_LOOKUP:",
        f"{i2}for pp in range(0, {P}, LANES * LANE_GROUPS):",
        f"{i2}    for qq in range(0, {Q}, LANE_CHANNELS):",
        f"{i2}        lanes_block(xt, pp, {P} * NIBBLES, wflat, panel * steps * {Q} * NIBBLES + qq, 1, {Q} * NIBBLES,",
        f"{i2}                    steps, out,",
        f"{i2}                    (row0 + qq) * ld + col + pp, 1, ld)",
        f"{i2}return",
    ]
    # Channel j's P counts are one vector (``outer_product``'s "pixels" orientation).
    lines.append(f"{i1}{outer_name(P, Q, 'pixels')}(xt, np.int64(0), np.int64({P}), wflat, panel * steps * {Q}, steps, out,")
    lines.append(f"{i1}{' ' * len(outer_name(P, Q, 'pixels'))} row0 * ld + col, ld)")
    return lines


def _nchw_kernel(P: int, Q: int) -> list[str]:
    """The parallel nchw kernel that fills ``a`` with the gather and panel functions."""
    i1, i2, i3, i4 = _I1, _I2, _I3, _I4
    gather, panel = gather_function_name(P), panel_function_name(P, Q)
    return [
        "@jit(parallel=True, slp_vectorize=not BYTE_LOOKUP)",
        f"def {kernel_name(P, Q, 'nchw')}(xflat, wflat, k_words, taps_off, bases, n_out, positions, group_panels, xscratch, bscratch, a):",
        f"{i1}# a (N*O*Ho*Wo,) int64; bscratch (T, >= {Q * P}) int64: the edge tiles' block.",
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
        f"{i4}{panel}(xt, wflat, steps, panel, block, np.int64(0), np.int64({P}), np.int64(0))",
        f"{i4}for j in range(min({Q}, n_out - panel * {Q})):",
        f"{i4}    o = panel * {Q} + j",
        f"{i4}    for p in range(min({P}, n_pixels - first)):",
        f"{i4}        pix = first + p",
        f"{i4}        i = pix // positions",
        f"{i4}        a[(i * n_out + o) * positions + pix - i * positions] = block[j * {P} + p]",
    ]


def _nchw_sources(P: int, Q: int) -> list[str]:
    """The gather and panel functions of the nchw layout, and the parallel kernel that fills
    ``a`` with them; refimpl/kernels/fused.py's counts kernel calls the same two functions."""
    return _nchw_gather(P) + ["", ""] + _nchw_panel(P, Q) + ["", ""] + _nchw_kernel(P, Q)


def stem_tile_source(pixels: int, channels: int) -> list[str]:
    """The engine stem's float32 micro-kernel: for the P pixels p0, p0 + ps, ..., p0 + (P-1)*ps,
    y[pixel, o0:o0+Q] = sum over k of col[k, pixel] * wk[k, o0:o0+Q], one fma per k in order.

    The body is refimpl/kernels/fma_tile.py's intrinsic: one vector of Q weights per k (the Q
    weights of a row of ``wk`` are contiguous) and a broadcast fma per pixel. The tile's pixels
    are ``ps`` apart, as its callers lay them out: chosen when the tile was scalar code for SLP to
    vectorize (adjacent pixels, SLP packed pixels instead of channels). BLAS ran this shape
    (K = 27 inputs per output) at a third of the FMA peak.
    """
    P, Q = pixels, channels
    return [
        f"_STEM_FMA_{P}x{Q} = fma_tile({P}, {Q})",
        "",
        "",
        "@jit",
        f"def {stem_tile_name(P, Q)}(col, wk, p0, ps, o0, y):",
        "    # col (K, positions) im2col, wk (K, O), y (positions, O); the caller keeps the",
        f"    # pixels p0 + q*ps (q < {P}) and the channels o0 .. o0+{Q - 1} in range.",
        f"    _STEM_FMA_{P}x{Q}(col, wk, p0, ps, o0, y)",
    ]


def generate_tiles() -> str:
    """The text of ``refimpl/kernels/_tiles.py``: a GEMM tile kernel per shape and layout, and the stem's float tile."""
    out = [
        '"""GENERATED by ``python -m refimpl.codegen`` from ``refimpl/codegen/tiles_template.py``: do not edit."""',
        "import numba",
        "import numpy as np",
        "from numba import prange",
        "",
        "from .._jit import jit",
        "from .bits import popcount",
        "from .byte_dot import BYTE_LOOKUP, LANE_CHANNELS, LANE_GROUPS, LANES, NIBBLES, lanes_block, lanes_block_rows, store_input_word",
        "from .fma_tile import fma_tile",
        "from .outer_product import outer_product",
    ]
    for pixels, channels in TILE_SHAPES:
        out += [""] + [f"{outer_name(pixels, channels, o)} = outer_product({pixels}, {channels}, {o!r})"
                       for o in ("channels", "pixels")]
        for layout in LAYOUTS:
            out += ["", ""] + tile_kernel_source(pixels, channels, layout)
    for shape in STEM_TILES.values():
        out += ["", ""] + stem_tile_source(*shape)
    return "\n".join(out) + "\n"
