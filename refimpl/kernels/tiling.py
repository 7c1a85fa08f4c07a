"""Tile sizes and the names of the generated tile functions: what the generators write and the
runtime calls, in one place (``refimpl/codegen/tiles_template.py`` writes ``_tiles.py`` from
them; ``blocked.py``, ``fused.py`` and the engine look the functions up by these names).
"""
from __future__ import annotations

# (pixels, channels) per popcount tile. 16 x 8: 16 zmm accumulators, one zmm of weights, room to
# spare in the 32 AVX-512 registers.
TILE_SHAPES = ((16, 8),)
TILE_PIXELS, TILE_CHANNELS = TILE_SHAPES[0]

# Store layouts of ``a``: (N, O, Ho*Wo) int64 for the counts API, (N, Ho*Wo, O) int32 for the engine.
LAYOUTS = ("nchw", "nhwc")

# (pixels, output channels) of the engine stem's float32 tile, by vector width: on AVX-512 16 zmm
# accumulators (measured best of 8x16, 16x16, 12x16, 4x32, 6x32); on the 256-bit and narrower
# paths 8 ymm (8 x 32 needs 32 ymm and spilled: 4 x 16 ran the tile 1.5x faster with AVX2 forced,
# of 8x32, 8x16, 6x16, 4x16, 4x32, 3x32, 2x32, 12x8; 6 x 16 was as fast but leaves 4 of 1024
# pixels to the scalar loop).
STEM_TILES = {"zmm": (8, 32), "ymm": (4, 16)}


def stem_tile(path: str) -> tuple[int, int]:
    """The stem tile's (pixels, channels) for a kernel path of refimpl/isa.py."""
    return STEM_TILES["zmm" if path.startswith("avx512") else "ymm"]

# Pixels per packing step, widest first (bits._pack_nchw_kernel takes the widest that fits).
# Narrow steps read each channel row a few bytes at a time, 4 KB apart: 64 lanes were the
# fastest on the ResNet-18 layers (docs/performance.md).
PACK_LANES = (64, 32, 16)


def kernel_name(pixels: int, channels: int, layout: str) -> str:
    """The parallel tile kernel that fills all of ``a`` in ``layout``."""
    return f"tiles_{pixels}x{channels}" + ("" if layout == "nchw" else f"_{layout}")


def gather_function_name(pixels: int) -> str:
    """The serial nchw im2col of one tile of P pixels (``panel_function_name`` reads it)."""
    return f"gather_{pixels}_nchw"


def panel_function_name(pixels: int, channels: int) -> str:
    """The serial nchw tile: P pixels x Q channels of one panel, stored channel-major."""
    return f"panel_{pixels}x{channels}_nchw"


def tile_function_name(pixels: int, channels: int) -> str:
    """The serial nhwc tile: one tile of P pixels over a range of panels (the parallel
    ``kernel_name(P, Q, "nhwc")`` calls it)."""
    return f"tile_{pixels}x{channels}_nhwc"


def fused_tile_function_name(pixels: int, channels: int) -> str:
    """The same tile compiled with the options of the engine's fused epilogue tasks, which call
    it at its address (refimpl/codegen/epilogue_template.py, TILE_CALL_SIGNATURE)."""
    return f"fused_tile_{pixels}x{channels}_nhwc"


def stem_tile_name(pixels: int, channels: int) -> str:
    """The engine stem's float32 tile of P pixels x Q output channels."""
    return f"stem_tile_{pixels}x{channels}"


# The types each tile function is compiled for, on first call (the tests compile them uncached
# with these to read their instructions). A tile first called from an epilogue that compiles
# with the loop vectorizer on still compiles with its own settings (refimpl/_jit.py).
TILE_FUNCTION_SIGNATURE = (
    "void(u8[::1], u8[::1], i8, i8[::1], i8[::1], i8, i8, i8, i8, i8, u8[::1], u8[:, ::1], i4[::1], i8, f4[::1])"
)
# gather(xflat, k_words, taps_off, bases, first, xt); panel(xt, wflat, steps, panel, out, row0, ld, col)
GATHER_SIGNATURE = "void(u8[::1], i8, i8[::1], i8[::1], i8, u8[::1])"
PANEL_SIGNATURE = "void(u8[::1], u8[::1], i8, i8, i8[::1], i8, i8, i8)"
