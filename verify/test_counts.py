"""Counts: the naive loop, refimpl's packed kernels (both) and the torch path agree exactly."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

import bnn
import refimpl
from verify import naive

WORD_BOUNDARIES = [63, 64, 65, 128, 129]
KERNELS = ("simple", "blocked")


def _values(rng, shape, zeros=0.1):
    """Normal values with a fraction set to exactly 0, which must binarize to +1 (docs/design.md section 1)."""
    v = rng.standard_normal(shape)
    v[rng.random(shape) < zeros] = 0.0
    return v


def _torch_counts_conv2d(x, w, dtype=torch.float32, **conv):
    xs, ws = (bnn.sign(torch.as_tensor(v, dtype=dtype)) for v in (x, w))
    return [t.numpy() for t in bnn.counts_conv2d(xs, ws, **conv)]


def _assert_all_equal(expected, **paths):
    for path, got in paths.items():
        for name, e, g in zip("abcd", expected, got):
            assert e.shape == g.shape, f"{path}: {name} has shape {g.shape}, expected {e.shape}"
            assert np.array_equal(e, g), f"{path}: {name} differs in {int((e != g).sum())} of {e.size} elements"


@st.composite
def conv_problems(draw, channels=None):
    channels = channels or draw(st.integers(1, 200))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    stride, padding, dilation = draw(st.integers(1, 3)), draw(st.integers(0, 3)), draw(st.integers(1, 2))
    # Smallest input the kernel fits, then odd sizes above it (constructive, no assume()).
    min_h = max(1, dilation * (kh - 1) + 1 - 2 * padding)
    min_w = max(1, dilation * (kw - 1) + 1 - 2 * padding)
    h = min_h + draw(st.integers(0, 5))
    w = min_w + draw(st.integers(0, 5))
    h, w = h | 1, w | 1
    shape_x = (draw(st.integers(1, 4)), channels, h, w)
    # Output channels past 8 and 16: refimpl's blocked kernel works in panels of 8 channels.
    shape_w = (draw(st.one_of(st.integers(1, 20), st.sampled_from([8, 9, 16, 17]))), channels, kh, kw)
    seed = draw(st.integers(0, 2**32 - 1))
    return shape_x, shape_w, dict(stride=stride, padding=padding, dilation=dilation), seed


def _conv_case(problem):
    shape_x, shape_w, conv, seed = problem
    rng = np.random.default_rng(seed)
    return _values(rng, shape_x), _values(rng, shape_w), conv


@pytest.mark.parametrize("channels", WORD_BOUNDARIES + [None], ids=lambda c: f"C{c}" if c else "C-drawn")
@settings(max_examples=15)
@given(data=st.data())
def test_conv2d_counts_naive_refimpl_torch_agree(channels, data):
    x, w, conv = _conv_case(data.draw(conv_problems(channels)))
    expected = naive.counts_conv2d(x, w, **conv)
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]))
    _assert_all_equal(
        expected,
        **{f"refimpl[{k}]": refimpl.counts_conv2d(x, w, **conv, kernel=k) for k in KERNELS},
        torch=_torch_counts_conv2d(x, w, dtype, **conv),
    )


@pytest.mark.parametrize("features", WORD_BOUNDARIES + [None], ids=lambda c: f"K{c}" if c else "K-drawn")
@settings(max_examples=15)
@given(data=st.data())
def test_dense_counts_naive_refimpl_torch_agree(features, data):
    k = features or data.draw(st.integers(1, 200))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    # Rows past 16 and units past 8: the blocked kernel's tiles are 16 pixels x 8 channels.
    x = _values(rng, (data.draw(st.integers(1, 20)), k))
    w = _values(rng, (data.draw(st.integers(1, 20)), k))
    expected = naive.counts_dense(x, w)
    xs, ws = (bnn.sign(torch.as_tensor(v, dtype=torch.float32)) for v in (x, w))
    _assert_all_equal(
        expected,
        **{f"refimpl[{kk}]": refimpl.counts_dense(x, w, kernel=kk) for kk in KERNELS},
        torch=[t.numpy() for t in bnn.counts_dense(xs, ws)],
    )


def _in_bounds_taps(h, w, kh, kw, stride, padding, dilation):
    out_h = naive.conv_output_size(h, kh, stride, padding, dilation)
    out_w = naive.conv_output_size(w, kw, stride, padding, dilation)
    taps = np.zeros((out_h, out_w), dtype=np.int64)
    for oy in range(out_h):
        for ox in range(out_w):
            for ty in range(kh):
                for tx in range(kw):
                    y, x = oy * stride - padding + ty * dilation, ox * stride - padding + tx * dilation
                    taps[oy, ox] += 0 <= y < h and 0 <= x < w
    return taps


@settings(max_examples=30)
@given(problem=conv_problems())
def test_counts_sum_to_n(problem):
    x, w, conv = _conv_case(problem)
    n = x.shape[1] * _in_bounds_taps(*x.shape[2:], *w.shape[2:], **conv)
    for path, counts in (
        ("refimpl", refimpl.counts_conv2d(x, w, **conv)),
        ("torch", _torch_counts_conv2d(x, w, **conv)),
    ):
        total = sum(counts)
        assert np.array_equal(total, np.broadcast_to(n, total.shape)), f"{path}: a+b+c+d != C * in-bounds taps"


@settings(max_examples=30)
@given(problem=conv_problems())
def test_complementing_x_swaps_a_with_b_and_c_with_d(problem):
    x, w, conv = _conv_case(problem)
    x = np.where(x >= 0, 1.0, -1.0)  # no zeros: -0 would binarize to +1 as well
    for path, count in (
        ("refimpl", lambda u: refimpl.counts_conv2d(u, w, **conv)),
        ("torch", lambda u: _torch_counts_conv2d(u, w, **conv)),
    ):
        a, b, c, d = count(x)
        a2, b2, c2, d2 = count(-x)
        for name, got, want in (("a", a2, b), ("b", b2, a), ("c", c2, d), ("d", d2, c)):
            assert np.array_equal(got, want), f"{path}: complemented x gives a wrong {name}"


@pytest.mark.parametrize("value", [1.0, -1.0, 0.0], ids=["plus", "minus", "zero"])
@pytest.mark.parametrize("padding", [1, 2, 3])
def test_padding_taps_are_not_counted(value, padding):
    # Constant input and weights: a real tap is all in one cell (a for +1/0, d for -1). A padded
    # tap counted as a 0 bit would show up in b or d; it must show up nowhere.
    x = np.full((2, 70, 5, 4), value)
    w = np.full((3, 70, 3, 3), value)
    taps = _in_bounds_taps(5, 4, 3, 3, 1, padding, 1)
    n = 70 * taps
    cell = 0 if value >= 0 else 3  # a or d
    for path, counts in (
        ("refimpl[simple]", refimpl.counts_conv2d(x, w, padding=padding, kernel="simple")),
        ("refimpl[blocked]", refimpl.counts_conv2d(x, w, padding=padding, kernel="blocked")),
        ("torch", _torch_counts_conv2d(x, w, padding=padding)),
    ):
        for i, name in enumerate("abcd"):
            want = n if i == cell else np.zeros_like(n)
            assert np.array_equal(counts[i], np.broadcast_to(want, counts[i].shape)), f"{path}: {name}"
    assert taps.min() < 9, "the test must reach the border"


def test_zero_binarizes_to_plus_one():
    rng = np.random.default_rng(7)
    w = _values(rng, (4, 65, 3, 3))
    zeros, ones = np.zeros((2, 65, 5, 5)), np.ones((2, 65, 5, 5))
    for path, count in (
        ("refimpl", lambda u: refimpl.counts_conv2d(u, w, padding=1)),
        ("torch", lambda u: _torch_counts_conv2d(u, w, padding=1)),
        ("naive", lambda u: naive.counts_conv2d(u, w, padding=1)),
    ):
        _assert_all_equal(count(ones), **{path: count(zeros)})
    assert bnn.sign(torch.zeros(3)).tolist() == [1.0, 1.0, 1.0]


@settings(max_examples=30)
@given(problem=conv_problems())
@example(problem=((2, 64, 7, 7), (3, 64, 3, 3), dict(stride=1, padding=1, dilation=1), 0))
def test_baseline_equals_conv2d_of_signs(problem):
    # (a + d) - (b + c) is sum(x * w) over real taps: zero padding, exactly (docs/design.md section 1).
    x, w, conv = _conv_case(problem)
    for dtype, np_dtype in ((torch.float64, np.float64), (torch.float32, np.float32)):
        xs, ws = (bnn.sign(torch.as_tensor(v, dtype=dtype)) for v in (x, w))
        expected = F.conv2d(xs, ws, **conv)
        got_torch = bnn.measure("baseline", *bnn.counts_conv2d(xs, ws, **conv))
        assert torch.equal(got_torch, expected), f"torch path, {dtype}"
        got_ref = refimpl.measure("baseline", *refimpl.counts_conv2d(x, w, **conv), dtype=np_dtype)
        assert np.array_equal(got_ref, expected.numpy()), f"refimpl, {np_dtype}"


def test_counts_are_float32_under_half_inputs():
    # docs/design.md section 1: fp16/bf16 outputs would round counts above 2048/256; the count path returns float32.
    x = bnn.sign(torch.randn(1, 300, 3, 3)).to(torch.bfloat16)
    w = bnn.sign(torch.randn(2, 300, 3, 3)).to(torch.bfloat16)
    counts = bnn.counts_conv2d(x, w, padding=1)
    assert all(t.dtype == torch.float32 for t in counts)
    expected = refimpl.counts_conv2d(x.float().numpy(), w.float().numpy(), padding=1)
    _assert_all_equal(expected, torch=[t.numpy() for t in counts])


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
@pytest.mark.parametrize("mkldnn", [True, False], ids=["onednn", "onednn-off"])
def test_counts_stay_exact_whatever_convolution_algorithm_torch_picks(mkldnn):
    # With oneDNN off, torch's CPU conv falls back to NNPACK's Winograd (batch >= 16), whose
    # raw outputs are not integers; the count path must round them (docs/design.md section 1).
    gen = torch.Generator().manual_seed(5)
    x = bnn.sign(torch.randn(16, 64, 8, 8, generator=gen))
    w = bnn.sign(torch.randn(32, 64, 3, 3, generator=gen))
    expected = refimpl.counts_conv2d(x.numpy(), w.numpy(), padding=1)
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        raw = F.conv2d((x + 1) / 2, (w + 1) / 2, padding=1)
        counts = bnn.counts_conv2d(x.requires_grad_(), w, padding=1)
        counts[0].sum().backward()  # the backward runs under the same algorithm choice
    _assert_all_equal(expected, torch=[t.detach().numpy() for t in counts])
    if not mkldnn and torch.equal(raw, raw.round()):
        pytest.skip("this build picked an exact algorithm with oneDNN off; nothing to round")


def test_boolean_inputs_count_like_pm1():
    # refimpl also takes booleans (True is the +1 bit); the naive oracle binarizes by v >= 0.
    rng = np.random.default_rng(9)
    x, w = rng.random((2, 65, 6, 5)) < 0.5, rng.random((3, 65, 3, 3)) < 0.5
    expected = naive.counts_conv2d(np.where(x, 1.0, -1.0), np.where(w, 1.0, -1.0), padding=1)
    for k in KERNELS:
        _assert_all_equal(expected, **{f"refimpl[{k}]": refimpl.counts_conv2d(x, w, padding=1, kernel=k)})
    _assert_all_equal(
        naive.counts_dense(np.where(x[:, :, 0, 0], 1.0, -1.0), np.where(w[:, :, 0, 0], 1.0, -1.0)),
        refimpl=refimpl.counts_dense(x[:, :, 0, 0], w[:, :, 0, 0]),
    )


def test_channels_last_inputs_give_the_same_counts_in_channels_last():
    # A channels_last model must not get NCHW counts back (every later op would convert).
    gen = torch.Generator().manual_seed(4)
    x = bnn.sign(torch.randn(3, 20, 7, 9, generator=gen))
    w = bnn.sign(torch.randn(11, 20, 3, 3, generator=gen))
    expected = refimpl.counts_conv2d(x.numpy(), w.numpy(), padding=1)
    counts = bnn.counts_conv2d(
        x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last), padding=1
    )
    _assert_all_equal(expected, torch=[t.numpy() for t in counts])
    assert all(t.is_contiguous(memory_format=torch.channels_last) for t in counts)
