"""All 252 operator pairs, float64 and float32, under every count convention: the torch path agrees
with refimpl (docs/design.md section 5).

For unary U and binary B (iterated from the table, so a new row is covered automatically), the
genome U-U-U-U-B-B-B is checked node by node with the rule in verify/tolerance.py: the U nodes
and B(U(p), U(q)) on identical operands within ULPS, the composed nodes within their
forward-error bound.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from refimpl.conventions import NAMES as CONVENTIONS
from refimpl.operators import BINARY, UNARY
from verify.strategies import alphas, count_arrays
from verify.tolerance import check_genome

PAIRS = [
    pytest.param(u.code, b.code, dtype, id=f"{u.name}-{b.name}-{np.dtype(dtype).name}")
    for dtype in (np.float64, np.float32)
    for u in UNARY
    for b in BINARY
]


@pytest.mark.parametrize(("unary", "binary", "dtype"), PAIRS)
@settings(max_examples=12)
@given(counts=count_arrays(shape=(2, 3, 8)), alpha=alphas(3))
def test_torch_matches_refimpl_on_pair(unary, binary, dtype, counts, alpha):
    codes = (unary,) * 4 + (binary,) * 3
    failures = check_genome(codes, *counts, alpha, dtype)
    assert not failures, "\n".join(failures)


# The other conventions change only the operands' range (counts in [0, 1]), so fewer examples
# a pair: the conversion itself is checked exactly, on many more, in test_conventions.py. One test
# function per convention, each over the pairs alone: hypothesis 6.170 nests a settings object
# once per parametrized call, and 1,008 calls of one function overflowed the recursion limit.
def _pair_test_under(convention: str):
    @pytest.mark.parametrize(("unary", "binary", "dtype"), PAIRS)
    @settings(max_examples=5)
    @given(counts=count_arrays(shape=(2, 3, 8)), alpha=alphas(3))
    def test(unary, binary, dtype, counts, alpha):
        codes = (unary,) * 4 + (binary,) * 3
        failures = check_genome(codes, *counts, alpha, dtype, counts=convention)
        assert not failures, "\n".join(failures)

    test.__name__ = f"test_torch_matches_refimpl_on_pair_under_{convention}"
    return test


test_torch_matches_refimpl_on_pair_under_freq = _pair_test_under("freq")
test_torch_matches_refimpl_on_pair_under_laplace = _pair_test_under("laplace")


def test_every_convention_has_its_pair_test():
    assert {c for c in CONVENTIONS if c != "raw"} == {
        name.rsplit("_", 1)[1] for name in globals() if name.startswith("test_torch_matches_refimpl_on_pair_under_")}
