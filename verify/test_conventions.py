"""Count conventions (docs/design.md section 2): every path converts a count to the same bits, the
exact rational value of the convention correctly rounded to the dtype.

The oracle knows neither path: it writes each convention's value as a ``Fraction`` of the
integers x and n (by hand, not from the table's text) and rounds it to nearest, ties to even, by
looking at the float neighbours, so a double rounding through float64 cannot hide.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import bnn
import refimpl
from bnn.nn.measure import convert_counts
from refimpl.conventions import NAMES
from verify.strategies import count_arrays
from verify.tolerance import refimpl_nodes

EXACT = {
    "raw": lambda x, n: Fraction(x),
    "freq": lambda x, n: Fraction(x, n),
    "laplace": lambda x, n: Fraction(x + 1, n + 4),
}


def correctly_rounded(q: Fraction, dtype) -> float:
    """The ``dtype`` value nearest to ``q``, ties to the even significand."""
    guess = np.array(float(q), dtype=dtype)
    candidates = [guess, np.nextafter(guess, dtype(-np.inf)), np.nextafter(guess, dtype(np.inf))]
    best = min(candidates, key=lambda v: (abs(Fraction(float(v)) - q),
                                          int(np.frombuffer(np.asarray(v, dtype).tobytes(), np.uint8)[0]) & 1))
    return float(best)


def test_the_oracle_covers_every_convention():
    assert set(EXACT) == set(NAMES)


def test_the_oracle_rounds_to_nearest_even():
    # 1/3 in float32 is 0x3eaaaaab (round up); an exact float32 value is itself.
    assert np.float32(correctly_rounded(Fraction(1, 3), np.float32)).view(np.uint32) == 0x3EAAAAAB
    assert correctly_rounded(Fraction(3, 4), np.float32) == 0.75


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("counts", NAMES)
@settings(max_examples=40)
@given(drawn=count_arrays(shape=(2, 3, 5)))
def test_both_paths_convert_counts_to_the_correctly_rounded_value(counts, dtype, drawn):
    a, b, c, d = (v.astype(np.int64) for v in drawn)
    n = a + b + c + d
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    torch_converted = convert_counts(counts, *(torch.as_tensor(v, dtype=tdtype) for v in (a, b, c, d)))
    # refimpl's converted counts: the unary nodes of the identity genome, each isolated exactly.
    nodes = refimpl_nodes((0, 0, 0, 0, 0, 0, 0), a, b, c, d, None, dtype, counts)
    for k, (name, node) in enumerate(zip("abcd", ("U1", "U3", "U4", "U2"))):
        count = (a, b, c, d)[k]
        expected = np.array([correctly_rounded(EXACT[counts](int(x), int(m)), dtype)
                             for x, m in zip(count.ravel(), n.ravel())], dtype=dtype).reshape(count.shape)
        for path, got in (("torch", torch_converted[k].numpy()), ("refimpl", nodes[node])):
            assert got.dtype == expected.dtype
            assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), f"{path}: {name} under {counts}"


@pytest.mark.parametrize("name", ["baseline", "M1", "M9"])
def test_raw_is_the_measure_of_the_counts_themselves(name):
    rng = np.random.default_rng(3)
    a, b, c, d = (rng.integers(0, 300, (2, 4, 9)) for _ in range(4))
    for dtype in (np.float64, np.float32):
        with np.errstate(all="ignore"):
            plain = refimpl.measure(name, a, b, c, d, dtype=dtype)
            named = refimpl.measure(name, a, b, c, d, dtype=dtype, counts="raw")
        np.testing.assert_array_equal(plain, named)
    t = [torch.as_tensor(v, dtype=torch.float32) for v in (a, b, c, d)]
    np.testing.assert_array_equal(bnn.measure(name, *t).numpy(), bnn.measure(name, *t, counts="raw").numpy())


def test_an_unknown_convention_is_refused_with_the_valid_names():
    with pytest.raises(ValueError, match="raw, freq, laplace"):
        refimpl.measure("M1", np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)), np.ones((1, 1)), counts="fraq")
    with pytest.raises(ValueError, match="raw, freq, laplace"):
        bnn.measure("M1", *(torch.ones(1, 1) for _ in range(4)), counts="Freq")


@settings(max_examples=20)
@given(n=st.integers(1, 4608), x=st.integers(0, 4608))
def test_the_window_size_given_or_summed_gives_the_same_bits(n, x):
    x = min(x, n)
    a = torch.tensor([[float(x)]])
    rest = torch.tensor([[float(n - x)]])
    zero = torch.zeros(1, 1)
    for counts in NAMES:
        summed = convert_counts(counts, a, rest, zero, zero)
        given_n = convert_counts(counts, a, rest, zero, zero, n=n)
        assert all(torch.equal(s, g) for s, g in zip(summed, given_n))


@pytest.mark.parametrize("counts", NAMES)
@settings(max_examples=40)
@given(x=st.integers(0, 1 << 20), extra=st.integers(1, 1 << 20))
def test_the_affine_numbers_the_kernels_take_convert_to_the_correctly_rounded_value(counts, x, extra):
    # bnn/nn/measure_fused.py's kernels compute (x + p) / (n * q + r) in float32 with p, q, r from
    # refimpl.conventions.affine, for every convention in one compiled module.
    from refimpl.conventions import affine

    n = x + extra  # a window holds at least one tap
    p, q, r = (np.float32(v) for v in affine(counts))
    got = (np.float32(x) + p) / (np.float32(n) * q + r)
    assert got == np.float32(correctly_rounded(EXACT[counts](x, n), np.float32))


def test_a_convention_of_another_shape_has_no_affine_numbers(monkeypatch):
    from refimpl import conventions

    odd = conventions.CountConvention("odd", "x / (n * n)", "not (x + p) / (n + r)")
    monkeypatch.setitem(conventions.BY_NAME, "odd", odd)
    with pytest.raises(ValueError, match=r"'odd': 'x / \(n \* n\)' is not \(x \+ p\) / \(n \+ r\)"):
        conventions.affine("odd")
