"""Empty shapes in the counts API: both paths give the same correct result, or the same error.

A zero among N, O (M) gives an empty result; a zero among the channels K or the input's H, W
leaves every window without a tap, so n = 0 and all four counts are 0 (docs/design.md section
1). The expected shapes are written by hand from the output-size formula. A 0-wide kernel, or
an output map that would be empty, is one ValueError with the same text in both paths.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import refimpl
from bnn.nn import counts as torch_counts
from refimpl.kernels import counts as ref_counts

# (x shape, w shape, padding) -> the output shape, by hand: Ho = H + 2p - (KH - 1) at stride 1.
CONV_CASES = {
    "N = 0": ((0, 2, 4, 4), (3, 2, 3, 3), 1, (0, 3, 4, 4)),
    "O = 0": ((2, 2, 4, 4), (0, 2, 3, 3), 1, (2, 0, 4, 4)),
    "C = 0": ((2, 0, 4, 4), (3, 0, 3, 3), 1, (2, 3, 4, 4)),
    "C = 0, 70 outputs a row": ((1, 0, 1, 70), (2, 0, 1, 1), 0, (1, 2, 1, 70)),
    "H = 0, padded": ((2, 2, 0, 4), (3, 2, 1, 1), 1, (2, 3, 2, 6)),
    "W = 0, padded": ((1, 2, 5, 0), (3, 2, 3, 3), 2, (1, 3, 7, 2)),
}
DENSE_CASES = {
    "K = 0": ((3, 0), (5, 0), (3, 5)),
    "N = 0": ((0, 4), (5, 4), (0, 5)),
    "M = 0": ((3, 4), (0, 4), (3, 0)),
    "all 0": ((0, 0), (0, 0), (0, 0)),
}


def _signs(shape, seed):
    return np.where(np.random.default_rng(seed).random(shape) < 0.5, -1.0, 1.0).astype(np.float32)


def _assert_zeros(counts, shape):
    assert len(counts) == 4
    for t in counts:
        t = t.detach().numpy() if isinstance(t, torch.Tensor) else t
        assert t.shape == shape
        assert not t.any(), f"nonzero counts {t[t != 0][:5]} for an empty window"


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_with_an_empty_dimension_gives_zero_counts_of_the_right_shape_in_both_paths(case):
    xs, ws, pad, expected = CONV_CASES[case]
    x, w = _signs(xs, 0), _signs(ws, 1)
    for kernel in ("blocked", "simple"):
        _assert_zeros(refimpl.counts_conv2d(x, w, padding=pad, kernel=kernel), expected)
    _assert_zeros(torch_counts.counts_conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad), expected)


@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_dense_with_an_empty_dimension_gives_zero_counts_of_the_right_shape_in_both_paths(case):
    xs, ws, expected = DENSE_CASES[case]
    x, w = _signs(xs, 2), _signs(ws, 3)
    for _ in range(3):  # leftover memory differed from call to call
        _assert_zeros(refimpl.counts_dense(x, w), expected)
    _assert_zeros(torch_counts.counts_dense(torch.from_numpy(x), torch.from_numpy(w)), expected)


def test_the_issue_example_gives_zeros_not_leftover_memory():
    a, b, c, d = refimpl.counts_dense(np.ones((3, 0)), np.ones((5, 0)))
    for t in (a, b, c, d):
        np.testing.assert_array_equal(t, np.zeros((3, 5), np.int64))


def test_out_arrays_are_zeroed_for_an_empty_window():
    x, w = _signs((2, 0, 4, 4), 4), _signs((3, 0, 3, 3), 5)
    out = tuple(np.full((2, 3, 4, 4), 7, np.int64) for _ in range(4))
    got = refimpl.counts_conv2d(x, w, padding=1, out=out)
    assert all(g is o for g, o in zip(got, out))
    _assert_zeros(out, (2, 3, 4, 4))


def test_packed_counts_with_no_channels_are_zero():
    xp = np.zeros((2, 4, 4, 0), np.uint64)
    wp = np.zeros((3, 3, 3, 0), np.uint64)
    _assert_zeros(ref_counts.counts_conv2d_packed(xp, wp, 0, padding=1), (2, 3, 4, 4))


def test_torch_gradients_through_empty_counts_are_zeros_of_the_input_shapes():
    x = torch.from_numpy(_signs((2, 2, 0, 4), 6)).requires_grad_()
    w = torch.from_numpy(_signs((3, 2, 1, 1), 7)).requires_grad_()
    a, b, c, d = torch_counts.counts_conv2d(x, w, padding=1)
    (a + b - c + d).sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    assert not x.grad.any() and not w.grad.any()


# The shapes that allow no result: (x shape, w shape, padding) and a fragment of the message.
ERRORS = {
    "0x0 kernel": ((1, 2, 4, 4), (3, 2, 0, 0), 0, "kernel is 0x0"),
    "0x3 kernel": ((1, 2, 4, 4), (3, 2, 0, 3), 1, "kernel is 0x3"),
    "kernel larger than the map": ((1, 2, 2, 2), (3, 2, 3, 3), 0, "output would be 0x0"),
    "H = 0 unpadded": ((1, 2, 0, 4), (3, 2, 1, 1), 0, "output would be 0x4"),
    "N = 0, kernel too large": ((0, 2, 2, 2), (3, 2, 5, 5), 1, "output would be 0x0"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_shapes_without_a_result_are_the_same_value_error_in_both_paths(case):
    xs, ws, pad, needle = ERRORS[case]
    x, w = _signs(xs, 8), _signs(ws, 9)
    with pytest.raises(ValueError) as ref:
        refimpl.counts_conv2d(x, w, padding=pad)
    with pytest.raises(ValueError) as tch:
        torch_counts.counts_conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad)
    assert needle in str(ref.value) and str(ref.value) == str(tch.value), (str(ref.value), str(tch.value))


def test_an_unknown_kernel_name_is_refused_for_empty_shapes_too():
    with pytest.raises(ValueError, match="unknown kernel"):
        refimpl.counts_dense(np.ones((0, 4)), np.ones((5, 4)), kernel="fast")
    with pytest.raises(ValueError, match="unknown kernel"):
        refimpl.counts_conv2d(np.ones((1, 0, 4, 4)), np.ones((3, 0, 3, 3)), kernel="fast")
