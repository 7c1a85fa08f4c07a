"""Whole genomes: random ones torch vs refimpl (docs/design.md section 5), and the paper's M1..M10 against a
hand transcription of its table (docs/design.md section 4), in both paths."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import bnn
import refimpl
from refimpl.conventions import NAMES as CONVENTIONS
from refimpl.operators import N_BINARY, N_UNARY
from verify import naive
from verify.strategies import alphas, count_arrays
from verify.tolerance import check_genome

genomes = st.tuples(*[st.integers(0, N_UNARY - 1)] * 4, *[st.integers(0, N_BINARY - 1)] * 3)


@settings(max_examples=300)
@given(
    codes=genomes,
    counts=count_arrays(shape=(2, 3, 8)),
    alpha=alphas(3),
    dtype=st.sampled_from([np.float64, np.float32]),
    convention=st.sampled_from(CONVENTIONS),
)
def test_random_genomes_torch_matches_refimpl(codes, counts, alpha, dtype, convention):
    failures = check_genome(codes, *counts, alpha, dtype, counts=convention)
    assert not failures, "\n".join(failures)


# The transcription orders its arithmetic as the paper writes it (M9 is b'/(c'(a'+d')), the
# genome computes (b'/c')/(a'+d')), and uses NumPy's and SciPy's libm, so finite values agree
# to a relative 1e-9 in float64: each of the at most ~8 roundings is 1.1e-16 relative, and the
# only amplification is cancellation in b'**3 - sin(c) (M4), whose worst case over the drawn
# integer counts (up to 4608) is 1 - sin(4249) ~ 8e-6, i.e. 1.2e5 x: about 3e-11, and 1e-9
# leaves 30x headroom.
RTOL = 1e-9


@pytest.mark.parametrize("name", naive.PAPER_NAMES)
@settings(max_examples=40)
@given(counts=count_arrays(shape=(2, 3, 8)), alpha=alphas(3))
def test_paper_measures_match_transcription(name, counts, alpha):
    a, b, c, d = counts
    expected = naive.paper_measure(name, a, b, c, d, alpha=alpha[1][None, :, None])
    ref = refimpl.measure(name, a, b, c, d, alpha=alpha)
    ours = bnn.measure(name, *(torch.as_tensor(v) for v in counts), torch.as_tensor(alpha)).numpy()
    for path, got in (("refimpl", ref), ("torch", ours)):
        assert np.array_equal(np.isnan(got), np.isnan(expected)), f"{path}: NaN positions differ"
        assert np.array_equal(np.isposinf(got), np.isposinf(expected)), f"{path}: +inf positions differ"
        assert np.array_equal(np.isneginf(got), np.isneginf(expected)), f"{path}: -inf positions differ"
        finite = np.isfinite(expected)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=RTOL, atol=0, err_msg=path)


def test_paper_table_is_fully_transcribed():
    assert set(naive.PAPER_NAMES) == set(refimpl.PAPER_MEASURES)
