"""The blocked kernel's inner loop is what docs/performance.md says reaches the popcount peak.

Cached Numba functions cannot be inspected, so each test compiles an uncached copy of the
kernel with the project's jit factory (its options and vectorizer settings) and reads its assembly.
"""
import re

import numba
import numpy as np
import pytest

import refimpl  # noqa: F401  (sets the project's Numba options before anything compiles)
from refimpl import isa
from refimpl._jit import jit
from refimpl.kernels import _tiles, blocked, tiling

# The path this process compiles for (REFIMPL_ISA or the host's best), not the host's features:
# a suite run with a lower path forced must check that path's code.
HAS_VPOPCNTDQ = isa.current_path() == "avx512-vpopcntdq"


def _tile_asm(layout: str = "nchw") -> str:
    if layout == "nchw":  # the GEMM of one panel, which every nchw kernel calls
        panel = getattr(_tiles, tiling.panel_function_name(16, 8))
        kernel = jit(tiling.PANEL_SIGNATURE, cache=False)(panel.py_func)
        return kernel.inspect_asm(kernel.signatures[0])
    kernel = jit(parallel=True, cache=False)(getattr(_tiles, tiling.kernel_name(16, 8, layout)).py_func)
    rng = np.random.default_rng(0)
    x = rng.choice([-1.0, 1.0], size=(2, 64, 4, 4)).astype(np.float32)
    w = rng.choice([-1.0, 1.0], size=(8, 64, 3, 3)).astype(np.float32)
    from refimpl.kernels.bits import pack_nchw

    xp, wp = pack_nchw(x), pack_nchw(w)
    k_words = xp.shape[-1]
    a = np.empty(2 * 8 * 16, dtype=np.int32)
    kernel(
        blocked.pad_input(xp, (1, 1)), blocked.weight_panels(wp), k_words,
        blocked.tap_offsets(3, 3, (1, 1), 4, (1, 1), k_words),
        blocked.pixel_bases(2, 4, 4, (1, 1), (1, 1), 4, 4, k_words), 8, 16, 1,
        np.empty((numba.config.NUMBA_NUM_THREADS, 9 * k_words * 16), np.uint64),
        np.empty((numba.config.NUMBA_NUM_THREADS, 8, 16), np.uint64), a,
        np.empty(2 * 16, np.float32),  # px
    )
    return kernel.inspect_asm(kernel.signatures[0])


@pytest.mark.skipif(not HAS_VPOPCNTDQ, reason="kernels are not compiled for AVX-512 VPOPCNTDQ here: no vector popcount to find (tests/test_isa_paths.py checks each path)")
def test_tile_inner_loop_uses_512_bit_vpopcntq():
    asm = _tile_asm()
    # One vpopcntq per 8 output channels of each of the 16 pixels' two 8-lane vectors.
    assert len(re.findall(r"vpopcntq\s+%zmm", asm)) >= 16
    assert not re.findall(r"\bpopcntq\b", asm), "a scalar popcnt is left in the tile kernel"


@pytest.mark.skipif(not HAS_VPOPCNTDQ, reason="kernels are not compiled for AVX-512 VPOPCNTDQ here: no vector popcount to find (tests/test_isa_paths.py checks each path)")
def test_nhwc_tile_keeps_a_pixels_channels_in_one_vector():
    asm = _tile_asm("nhwc")
    assert len(re.findall(r"vpopcntq\s+%zmm", asm)) >= 16
    # A full tile stores 16 pixels, each one vpmovqd of its 8 channels. When SLP packed the
    # accumulators over pixels instead, the store became a 16x8 transpose: 64 vpmovqd.
    assert len(re.findall(r"\bvpmovqd\b", asm)) <= 16


def test_popcount_intrinsic_lowers_to_ctpop():
    from refimpl.kernels.bits import popcount

    f = numba.njit(lambda v: popcount(v))
    assert f(np.uint64(0xFFFF_FFFF_FFFF_FFFF)) == 64
    assert f(np.uint64(0b1011)) == 3
    assert "llvm.ctpop.i64" in f.inspect_llvm(f.signatures[0])


@pytest.mark.parametrize("width", ["zmm", "ymm"])
def test_stem_tile_computes_the_strided_pixels_matmul(width):
    from refimpl.kernels.tiling import STEM_TILES

    P, Q = STEM_TILES[width]  # every shape of the generated module, whichever path runs here
    tile = getattr(_tiles, f"stem_tile_{P}x{Q}")
    rng = np.random.default_rng(1)
    positions = 3 + 5 * P
    col = rng.standard_normal((27, positions)).astype(np.float32)
    wk = rng.standard_normal((27, 2 * Q)).astype(np.float32)
    y = np.zeros((positions, 2 * Q), dtype=np.float32)
    tile(col, wk, 3, 5, Q, y)  # pixels 3, 8, ...; the second Q channels
    pixels = 3 + 5 * np.arange(P)
    expected = col[:, pixels].T.astype(np.float64) @ wk[:, Q:].astype(np.float64)
    np.testing.assert_allclose(y[pixels, Q:], expected, rtol=1e-5, atol=1e-5)
    untouched = np.ones(positions, dtype=bool)
    untouched[pixels] = False
    assert not y[untouched].any() and not y[:, :Q].any()
