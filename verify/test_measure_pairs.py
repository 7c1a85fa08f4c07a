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


# One drawn example serves every count convention: drawing it (hypothesis's choices for 48
# partitions and 12 alphas) cost about 70% of an example, checking it under one convention the
# rest. So each pair and dtype gets 8 examples under each of raw, freq and laplace: 24 checks,
# where one test per convention gave 12 + 5 + 5 = 22 and drew 22 examples (twice the time).
# The conventions change only the operands' range (counts in [0, 1]); the conversion itself is
# checked exactly, on many more examples, in test_conventions.py.
@pytest.mark.parametrize(("unary", "binary", "dtype"), PAIRS)
@settings(max_examples=8)
@given(counts=count_arrays(shape=(2, 3, 8)), alpha=alphas(3))
def test_torch_matches_refimpl_on_pair_under_every_convention(unary, binary, dtype, counts, alpha):
    codes = (unary,) * 4 + (binary,) * 3
    failures = [f"counts={convention}: {line}" for convention in CONVENTIONS
                for line in check_genome(codes, *counts, alpha, dtype, counts=convention)]
    assert not failures, "\n".join(failures)
