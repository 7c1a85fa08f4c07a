"""Bit packing (docs/design.md section 1): round trips across word boundaries, zero tail bits."""
from __future__ import annotations

import numpy as np
import pytest

from refimpl.kernels.bits import WORD_BITS, n_words, pack_bits, pack_nchw, unpack_bits

WIDTHS = [1, 3, 32, 33, 63, 64, 65, 128, 129]


@pytest.mark.parametrize("width", WIDTHS)
def test_pack_unpack_round_trip(width):
    rng = np.random.default_rng(width)
    bits = rng.random((5, width)) < 0.5
    words = pack_bits(bits)
    assert words.dtype == np.uint64 and words.shape == (5, n_words(width))
    assert np.array_equal(unpack_bits(words, width), bits)


@pytest.mark.parametrize("width", WIDTHS)
def test_pm1_values_pack_like_booleans_and_zero_is_a_one_bit(width):
    rng = np.random.default_rng(width + 1)
    values = rng.choice([-1.0, 0.0, 1.0], size=(4, width))
    assert np.array_equal(pack_bits(values), pack_bits(values >= 0))


@pytest.mark.parametrize("width", WIDTHS)
def test_tail_bits_are_zero(width):
    words = pack_bits(np.ones((3, width), dtype=bool))
    tail = n_words(width) * WORD_BITS - width
    last = words[:, -1]
    if tail:
        assert np.all(last >> np.uint64(WORD_BITS - tail) == 0), "bits past the end must be 0"
    total = sum(bin(int(v)).count("1") for v in words.reshape(-1))
    assert total == 3 * width


def test_bit_order_is_least_significant_first():
    bits = np.zeros(130, dtype=bool)
    bits[[0, 63, 64, 129]] = True
    words = pack_bits(bits)
    assert words.tolist() == [1 | (1 << 63), 1, 1 << 1]


@pytest.mark.parametrize("channels", WIDTHS)
@pytest.mark.parametrize("size", [(3, 5), (8, 8), (5, 17)])  # P below 16 lanes, exactly 64, 64 + 21
def test_pack_nchw_equals_pack_bits_of_moved_axis(channels, size):
    rng = np.random.default_rng(channels)
    x = rng.choice([-1.0, 0.0, 1.0], size=(2, channels) + size).astype(np.float32)
    expected = pack_bits(np.moveaxis(x, 1, -1))
    assert np.array_equal(pack_nchw(x), expected)
    assert np.array_equal(pack_nchw(x >= 0), expected)


def test_unpack_refuses_more_bits_than_the_words_hold():
    with pytest.raises(ValueError, match="hold at most 64 bits"):
        unpack_bits(np.zeros((2, 1), dtype=np.uint64), 65)


def test_pack_refuses_non_numbers():
    with pytest.raises(ValueError, match="dtype"):
        pack_bits(np.array(["a", "b"]))


def test_sign_word_equals_pack_bits_of_the_row_including_zeros_nan_and_inf():
    import numba

    from refimpl.kernels.bits import sign_word

    word_at = numba.njit(lambda row, start: sign_word(row, start))
    rng = np.random.default_rng(5)
    for _ in range(50):
        row = rng.standard_normal(300).astype(np.float32)
        for value, count in ((0.0, 20), (-0.0, 20), (np.nan, 10), (-np.nan, 5), (np.inf, 5), (-np.inf, 5)):
            row[rng.integers(0, 300, count)] = value
        start = int(rng.integers(0, 300 - 64 + 1))
        # The project's bit convention (pack_bits): bit k is sign(row[start + k]) = +1, i.e. >= 0.
        expected = pack_bits(row[start:start + 64] >= 0)[0]
        assert word_at(row, start) == expected


@pytest.mark.parametrize("channels", [1, 63, 64, 65, 129])
@pytest.mark.parametrize("size", [(1, 1), (3, 3), (3, 5), (4, 4), (1, 17), (5, 7), (8, 8), (9, 9), (5, 17)])
def test_float32_pack_nchw_matches_numpy_with_zeros_nan_and_inf(channels, size):
    # The sizes take every packing step: one pixel (sign_word), rows shorter than 16 read 16
    # wide, 16, 32 and 64 pixels a step, and a last step that overlaps the one before. pack_bits
    # (NumPy) is the independent reference; float64, int and bool inputs (signs taken in their
    # own dtype, then packed as float32) must give the same words.
    rng = np.random.default_rng(channels * 100 + size[1])
    x = rng.standard_normal((3, channels) + size).astype(np.float32)
    specials = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf], dtype=np.float32)
    picks = rng.random(x.shape) < 0.3
    x[picks] = rng.choice(specials, size=int(picks.sum()))
    expected = pack_bits(np.moveaxis(x, 1, -1))
    assert np.array_equal(pack_nchw(x), expected)
    assert np.array_equal(pack_nchw(x.astype(np.float64)), expected)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int8, np.uint8, np.bool_])
def test_pack_nchw_takes_the_sign_in_the_inputs_own_dtype(dtype):
    # Every dtype is packed through float32 +-1 signs; the sign must be taken before that cast:
    # -1e-300 and -2**-140 round to -0.0 in float32, whose bit would be 1.
    values = {np.float64: [-1e-300, -2.0 ** -140, 1e-300, 0.0, -0.0, np.nan, -np.inf, 3.0],
              np.int64: [-1, 0, 1, -(2 ** 62), 2 ** 62, -5, 7, 0],
              np.int8: [-128, -1, 0, 1, 127, -3, 3, 0],
              np.uint8: [0, 1, 255, 128, 7, 0, 9, 2],
              np.bool_: [True, False, True, True, False, False, True, False]}[dtype]
    x = np.array(values, dtype=dtype).reshape(1, 8, 1, 1) * np.ones((1, 1, 3, 5), dtype=dtype)
    expected = pack_bits(np.moveaxis(x, 1, -1))  # NumPy's x >= 0 in the input's dtype
    assert np.array_equal(pack_nchw(x), expected)
    assert np.array_equal(pack_nchw(x[:, :, :1, :1]), expected[:, :1, :1])
    if dtype is np.float64:
        assert not expected[0, 0, 0, 0] & 1 and not expected[0, 0, 0, 0] & 2  # the two tiny negatives: bit 0
