"""The blocked kernel's prepared plan against the simple kernel, edge geometry included."""
import numpy as np
import pytest

from refimpl.kernels import blocked, gemm, outputs, tiling
from refimpl.kernels.bits import pack_nchw
from refimpl.kernels.geometry import conv_output_size


def _simple_a(xp, wp, stride, padding, dilation):
    n_img, h, w, _ = xp.shape
    _, kh, kw, _ = wp.shape
    out_h = conv_output_size(h, kh, stride[0], padding[0], dilation[0])
    out_w = conv_output_size(w, kw, stride[1], padding[1], dilation[1])
    a = np.empty((n_img, wp.shape[0], out_h, out_w), dtype=np.int64)
    gemm.conv_simple(xp, wp, stride, padding, dilation, out_h, out_w, a)
    return a.reshape(n_img, wp.shape[0], -1)


@pytest.mark.parametrize(
    "n_img, channels, size, out_ch, kernel, stride, padding, buffer_padding",
    [
        (1, 64, 8, 8, 3, (1, 1), (1, 1), (1, 1)),  # batch 1: panels split across threads
        (3, 65, 7, 13, 1, (2, 2), (0, 0), (1, 1)),  # a 1x1 shortcut reading a 3x3 buffer
        (2, 129, 5, 9, 3, (1, 2), (1, 0), (2, 1)),  # uneven strides and borders
        (17, 3, 4, 20, 3, (1, 1), (1, 1), (1, 1)),  # tiles that straddle images
        (2, 960, 3, 9, 3, (1, 1), (1, 1), (1, 1)),  # 135 words a window: byte_dot's 31-vector blocks
        (1, 64, 9, 8, 7, (1, 1), (3, 3), (3, 3)),  # one word a tap, 49 taps: lanes_block's 31-step blocks
    ],
)
@pytest.mark.parametrize("layout", tiling.LAYOUTS)
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


def _offset_outputs(shape, word_offsets):
    """Four int64 arrays of ``shape`` whose data start ``word_offsets[k]`` words past a 64-byte line."""
    size = int(np.prod(shape))
    outs = []
    for offset in word_offsets:
        raw = np.full(size + 16, -7, dtype=np.int64)
        start = (-raw.ctypes.data % 64) // 8 + offset
        outs.append(raw[start:start + size].reshape(shape))
    return tuple(outs)


@pytest.mark.parametrize("word_offsets", [(0, 0, 0, 0), (2, 2, 2, 2), (0, 3, 5, 7)])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "n_img, channels, size, out_ch, stage_elements",
    [
        (3, 70, 7, 19, 16384),  # 49 positions: rows start anywhere in a line
        (2, 64, 9, 16, 256),  # stage for 16 positions: 81 positions in 6 chunks, the last partial
        (1, 130, 5, 40, 16384),  # batch 1: the panels split into groups
        (5, 3, 4, 8, 64),  # one panel, 16-position tiles = whole 4x4 images
        (2, 64, 9, 16, 16384),  # rows of 81 positions: at different offsets, one loop per output
        (6, 65, 2, 9, 16384),  # 2x2 maps: tiles across images, identities in a second pass
        (7, 64, 1, 8, 16384),  # 1x1 maps (a dense layer): the same
    ],
)
def test_fused_counts_kernel_matches_the_simple_kernel(monkeypatch, n_img, channels, size, out_ch, stage_elements,
                                                       stream, word_offsets):
    # The fused kernel's paths: streaming or plain stores, arrays that share a line offset or
    # not (streaming then falls back to plain), chunks of an image's positions, panel groups.
    import refimpl
    from refimpl.kernels import fused

    monkeypatch.setattr(fused, "STREAM_MIN_BYTES", 0 if stream else 1 << 62)
    monkeypatch.setattr(fused, "STAGE_ELEMENTS", stage_elements)
    rng = np.random.default_rng(n_img * 100 + channels)
    x = rng.choice([-1.0, 1.0], size=(n_img, channels, size, size)).astype(np.float32)
    w = rng.choice([-1.0, 1.0], size=(out_ch, channels, 3, 3)).astype(np.float32)
    expected = refimpl.counts_conv2d(x, w, padding=1, kernel="simple")
    out = _offset_outputs(expected[0].shape, word_offsets)
    got = refimpl.counts_conv2d(x, w, padding=1, kernel="blocked", out=out)
    for name, e, g in zip("abcd", expected, got):
        np.testing.assert_array_equal(g, e, err_msg=f"count {name}")
    fresh = refimpl.counts_conv2d(x, w, padding=1)
    for name, e, g in zip("abcd", expected, fresh):
        np.testing.assert_array_equal(g, e, err_msg=f"fresh count {name}")
        assert g.ctypes.data % 64 == 0, "fresh outputs start on a line (streaming stores need it)"


def test_output_memory_is_recycled_only_once_nothing_references_it(monkeypatch):
    import refimpl

    pool = outputs.OutputBlocks()
    monkeypatch.setattr(outputs, "_OUTPUT_BLOCKS", pool)
    monkeypatch.setattr(pool, "MIN_BYTES", 0)
    rng = np.random.default_rng(3)
    x = rng.choice([-1.0, 1.0], size=(2, 70, 6, 6))
    w = rng.choice([-1.0, 1.0], size=(9, 70, 3, 3))

    def address(t):
        return t.__array_interface__["data"][0]

    first = refimpl.counts_conv2d(x, w, padding=1)
    expected = [t.copy() for t in first]
    held = first[3][1:, 2].T  # a view of a view of d: it alone keeps the whole block in use
    used = address(first[0])
    del first
    second = refimpl.counts_conv2d(x, w, padding=1)
    assert address(second[0]) != used, "memory handed out again while a view of it is alive"
    np.testing.assert_array_equal(held, expected[3][1:, 2].T)
    del held
    reused = address(second[0])
    del second
    third = refimpl.counts_conv2d(x, w, padding=1)
    assert address(third[0]) in (used, reused), "dropped output memory was not recycled"
    for e, t in zip(expected, third):
        np.testing.assert_array_equal(t, e)
    monkeypatch.setattr(pool, "MAX_BYTES", 0)
    pool.clear()
    refimpl.counts_conv2d(x, w, padding=1)
    assert pool._blocks == [], "a block beyond MAX_BYTES was kept"


@pytest.mark.parametrize("channels, size", [(960, 3), (64, 7)])
@pytest.mark.parametrize("layout", tiling.LAYOUTS)
def test_all_ones_windows_count_every_bit_without_overflow(layout, channels, size):
    # 33 vectors of 256 ones, or 49 taps of one word, per window: a byte-lane accumulator summed
    # later than every 31 steps (refimpl/kernels/byte_dot.py) would wrap past 255 and lose counts.
    out_ch = 8
    xp = pack_nchw(np.ones((1, channels, size, size), dtype=np.float32))
    wp = pack_nchw(np.ones((out_ch, channels, size, size), dtype=np.float32))
    plan = blocked.ConvPlan(wp, 1, size, size, (1, 1), (0, 0), (1, 1), layout=layout)
    if layout == "nchw":
        a = np.zeros((1, out_ch, 1), dtype=np.int64)
        plan(plan.pad(xp), a)
    else:
        a = np.zeros((1, 1, out_ch), dtype=np.int32)
        plan(plan.pad(xp), a)
    assert (a == channels * size * size).all(), a.ravel()
