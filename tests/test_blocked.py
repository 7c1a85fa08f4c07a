"""The blocked kernel's prepared plan against the simple kernel, edge geometry included."""
import numpy as np
import pytest

from refimpl import blocked, gemm
from refimpl.bits import pack_nchw


def _simple_a(xp, wp, stride, padding, dilation):
    n_img, h, w, _ = xp.shape
    _, kh, kw, _ = wp.shape
    out_h = blocked.conv_output_size(h, kh, stride[0], padding[0], dilation[0])
    out_w = blocked.conv_output_size(w, kw, stride[1], padding[1], dilation[1])
    a = np.empty((n_img, wp.shape[0], out_h, out_w), dtype=np.int64)
    gemm._conv_simple(xp, wp, stride, padding, dilation, out_h, out_w, a)
    return a.reshape(n_img, wp.shape[0], -1)


@pytest.mark.parametrize(
    "n_img, channels, size, out_ch, kernel, stride, padding, buffer_padding",
    [
        (1, 64, 8, 8, 3, (1, 1), (1, 1), (1, 1)),  # batch 1: panels split across threads
        (3, 65, 7, 13, 1, (2, 2), (0, 0), (1, 1)),  # a 1x1 shortcut reading a 3x3 buffer
        (2, 129, 5, 9, 3, (1, 2), (1, 0), (2, 1)),  # uneven strides and borders
        (17, 3, 4, 20, 3, (1, 1), (1, 1), (1, 1)),  # tiles that straddle images
    ],
)
@pytest.mark.parametrize("layout", blocked.LAYOUTS)
def test_plan_matches_the_simple_kernel(n_img, channels, size, out_ch, kernel, stride, padding, buffer_padding, layout):
    rng = np.random.default_rng(n_img * 1000 + channels)
    x = rng.choice([-1.0, 1.0], size=(n_img, channels, size, size)).astype(np.float32)
    w = rng.choice([-1.0, 1.0], size=(out_ch, channels, kernel, kernel)).astype(np.float32)
    xp, wp = pack_nchw(x), pack_nchw(w)
    plan = blocked.ConvPlan(wp, n_img, size, size, stride, padding, (1, 1), buffer_padding=buffer_padding,
                            layout=layout)
    positions = plan.out_h * plan.out_w
    if layout == "nchw":
        a = np.full((n_img, out_ch, positions), -1, dtype=np.int64)
        plan(plan.pad(xp), a)
    else:  # (N, Ho*Wo, O) int32, compared in NCHW order
        a_nhwc = np.full((n_img, positions, out_ch), -1, dtype=np.int32)
        px = np.full((n_img, positions), -1, dtype=np.float32)
        plan(plan.pad(xp), a_nhwc, px=px)
        a = a_nhwc.transpose(0, 2, 1).astype(np.int64)
        # px: the ones of x under each window's in-bounds taps, from the unpacked +-1 values
        # (an all-ones filter's a, computed by the simple kernel).
        ones = pack_nchw(np.ones((1, channels, kernel, kernel), dtype=np.float32))
        expected_px = _simple_a(xp, ones, stride, padding, (1, 1))[:, 0]
        np.testing.assert_array_equal(px, expected_px.astype(np.float32))
    np.testing.assert_array_equal(a, _simple_a(xp, wp, stride, padding, (1, 1)))


def test_plan_refuses_a_buffer_narrower_than_the_padding():
    wp = pack_nchw(np.ones((8, 64, 3, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="narrower"):
        blocked.ConvPlan(wp, 1, 8, 8, (1, 1), (1, 1), (1, 1), buffer_padding=(0, 0))


def test_counts_written_into_out_equal_fresh_counts_and_bad_out_is_refused():
    import refimpl

    rng = np.random.default_rng(7)
    x = rng.choice([-1.0, 1.0], size=(2, 70, 5, 5))
    w = rng.choice([-1.0, 1.0], size=(9, 70, 3, 3))
    fresh = refimpl.counts_conv2d(x, w, padding=1)
    out = tuple(np.full((2, 9, 5, 5), -7, dtype=np.int64) for _ in range(4))
    returned = refimpl.counts_conv2d(x, w, padding=1, out=out)
    for f, o, r in zip(fresh, out, returned):
        assert r is o
        np.testing.assert_array_equal(f, o)
    with pytest.raises(ValueError, match="int64 of shape"):
        refimpl.counts_conv2d(x, w, padding=1, out=out[:3] + (np.zeros((2, 9, 5, 5)),))
