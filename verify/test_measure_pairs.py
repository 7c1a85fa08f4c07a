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

BY_CODE = {b.code: b.name for b in BINARY}
ROWS = [
    pytest.param(u.code, dtype, id=f"{u.name}-{np.dtype(dtype).name}")
    for dtype in (np.float64, np.float32)
    for u in UNARY
]


# One drawn example serves every binary operator of the row and every count convention, and
# holds 4 window sizes n: a check's cost is mostly per call (hypothesis's draw, the two paths'
# dispatch on 48-element arrays), not per element. So each (unary, dtype) row draws 3 examples of
# 4 sizes and checks all 14 pairs on each under raw, freq and laplace: 12 sizes per pair, dtype
# and convention, where one test per pair drew 8 (docs/performance.md, the suite's time).
# The conventions change only the operands' range (counts in [0, 1]); the conversion itself is
# checked exactly, on many more examples, in test_conventions.py.
@pytest.mark.parametrize(("unary", "dtype"), ROWS)
@settings(max_examples=3)
@given(counts=count_arrays(shape=(2, 3, 8), windows=4), alpha=alphas(3))
def test_torch_matches_refimpl_on_every_pair_of_the_row_under_every_convention(unary, dtype, counts, alpha):
    failures = [f"{BY_CODE[binary]} counts={convention}: {line}" for binary in sorted(BY_CODE)
                for convention in CONVENTIONS
                for line in check_genome((unary,) * 4 + (binary,) * 3, *counts, alpha, dtype, counts=convention)]
    assert not failures, "\n".join(failures)


def test_the_rows_cover_every_pair_of_the_table():
    # The table is iterated, not listed: a new operator is covered; this pins the count the paper's grid has.
    assert len(UNARY) * len(BY_CODE) == 18 * 14 and len(ROWS) == 2 * 18
