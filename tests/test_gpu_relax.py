"""bnn/gpu/relax.py: the activations' sign, 0/1 relaxation and channel sum in one pass, and the straight-through
backward in one, against NumPy and against the unfused path (ste_sign, then bnn/gpu/counts.py on +-1 inputs) bit
for bit: values, window sums and both gradients, NCHW and channels_last, NaN and infinities, several blocks.

Runs under Triton's interpreter without a GPU, as tests/test_gpu_measure_op.py.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:  # TF32 would round the convolutions' operands differently in the two paths' small convolutions: off
    torch.backends.cudnn.allow_tf32 = False
pytest.importorskip("triton")

import triton  # noqa: E402

from bnn.gpu import relax as R  # noqa: E402
from bnn.gpu.counts import count_sums  # noqa: E402
from bnn.nn.layers import ste_sign  # noqa: E402

if DEVICE == "cpu" and not R.INTERPRETED:
    pytest.skip("TRITON_INTERPRET was 0 before this module set it, and there is no GPU", allow_module_level=True)


def _x(shape, seed, channels_last=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 1.5  # about half the entries inside the straight-through window
    flat = x.view(-1)
    flat[:: 7] = 0.0  # zero binarizes to +1
    flat[3:: 11] = 1.0  # the window's edges are inside it
    flat[5:: 13] = -1.0
    flat[1] = float("nan")
    flat[2] = float("inf")
    flat[4] = -float("inf")
    x = x.to(DEVICE)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _want_forward(x):
    v = x.cpu().numpy()
    xb = np.where(v >= 0, np.float32(1), np.float32(0))  # NaN >= 0 is false: -1, so 0
    return xb, xb.sum(axis=1, keepdims=True, dtype=np.float32)


SHAPES = [(2, 5, 3, 4), (2, 3, 1, 1), (3, 33, 2, 5)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_forward_is_the_sign_relaxation_and_its_channel_sum(shape, channels_last):
    x = _x(shape, 1, channels_last)
    xb, xsum = R.relax(x)
    want_xb, want_sum = _want_forward(x)
    assert xb.stride() == x.stride() and xsum.shape == (shape[0], 1, *shape[2:])
    np.testing.assert_array_equal(xb.cpu().numpy(), want_xb)
    np.testing.assert_array_equal(xsum.cpu().numpy(), want_sum)


@pytest.mark.parametrize("x_last, g_last", [(False, True), (True, False), (True, True)])
def test_backward_is_the_straight_through_half_sum(x_last, g_last):
    shape = (2, 6, 3, 5)
    x = _x(shape, 2, x_last)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    g = g.contiguous(memory_format=torch.channels_last) if g_last else g
    gs = torch.randn((2, 1, 3, 5), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    dx = R.relax_backward(g, gs, x)
    v, gv, sv = x.cpu().numpy(), g.cpu().numpy(), gs.cpu().numpy()
    with np.errstate(invalid="ignore"):
        inside = np.abs(v) <= np.float32(1)  # NaN: outside
    want = np.where(inside, (gv + sv) * np.float32(0.5), np.float32(0))
    assert dx.stride() == x.stride()
    np.testing.assert_array_equal(dx.cpu().numpy(), want)


def test_several_blocks_of_channels_and_pixels():
    # The interpreter's launcher takes the whole tensor in one program; a GPU's walks channel blocks and
    # pixel blocks with masked tails. Launched here with small blocks so that both tails are exercised.
    x = _x((2, 11, 3, 7), 5, channels_last=True)
    xb, xsum = torch.empty_like(x), torch.empty((2, 1, 3, 7), device=DEVICE)
    R.relax_forward_kernel[(triton.cdiv(21, 8), 2)](x, xb, xsum, 11, 21, 7, *x.stride(), *xb.stride(),
                                                     BC=4, BP=8, I64=False)
    want_xb, want_sum = _want_forward(x)
    np.testing.assert_array_equal(xb.cpu().numpy(), want_xb)
    np.testing.assert_array_equal(xsum.cpu().numpy(), want_sum)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    gs, dx = torch.randn((2, 1, 3, 7), generator=torch.Generator().manual_seed(7)).to(DEVICE), torch.empty_like(x)
    R.relax_backward_kernel[(triton.cdiv(21, 8), 2)](g, gs, x, dx, 11, 21, 7, *g.stride(), *x.stride(), 1.0,
                                                      BC=4, BP=8, I64=False)
    np.testing.assert_array_equal(dx.cpu().numpy(), R.relax_backward(g, gs, x).cpu().numpy())


@pytest.mark.parametrize("geometry, w_shape", [(((1, 1), (1, 1), (1, 1)), (4, 5, 3, 3)),
                                               (((2, 2), (0, 0), (1, 1)), (3, 5, 1, 1)),
                                               (((1, 1), (2, 2), (2, 2)), (4, 5, 3, 3))])
@pytest.mark.parametrize("channels_last", [False, True])
def test_counts_and_gradients_are_the_unfused_paths_bits(geometry, w_shape, channels_last):
    torch.manual_seed(8)
    x0 = _x((2, 5, 6, 7), 9, channels_last).nan_to_num(0.0, 2.0, -2.0)  # a NaN gradient would hide the rest
    w0 = torch.randn(w_shape).to(DEVICE)
    results = []
    for fused in (False, True):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        if fused:
            xb, xsum = R.relax(x)
            a, px, pw, _ = count_sums(xb, ste_sign(w, None), *geometry, xsum=xsum)
        else:
            a, px, pw, _ = count_sums(ste_sign(x, 1.0), ste_sign(w, None), *geometry)
        gen = torch.Generator().manual_seed(10)
        loss = sum((t * torch.randn(t.shape, generator=gen).to(DEVICE)).sum() for t in (a, px, pw))
        loss.backward()
        results.append((a.detach(), px.detach(), pw.detach(), x.grad, w.grad))
    for what, old, new in zip(("a", "px", "pw", "dL/dx", "dL/dw"), *results):
        assert torch.equal(old, new), what
    assert results[1][3].abs().sum() > 0  # the gradient reached x


def test_a_routed_network_has_the_same_bits_either_way(monkeypatch):
    from torch import nn

    from bnn.gpu import measure_op
    from bnn.nn.layers import BinaryConv2d

    results, calls = [], []
    monkeypatch.setattr(measure_op, "relax", lambda x: calls.append(x.shape) or R.relax(x))
    for one_pass in (False, True):
        torch.manual_seed(12)
        net = nn.Sequential(BinaryConv2d(3, 6, 3, padding=1, measure="M6", counts="laplace"), nn.BatchNorm2d(6),
                            BinaryConv2d(6, 4, 3, stride=2, measure="M6", counts="laplace")).to(DEVICE)
        measure_op.use_triton_measure(net, relax_in_one_pass=one_pass)
        x = _x((2, 3, 6, 6), 13).nan_to_num(0.0, 2.0, -2.0).requires_grad_()
        out = net(x)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(14)).to(DEVICE))
        results.append([out.detach(), x.grad] + [q.grad for q in net.parameters()])
    assert len(results[0]) == 8 and all(torch.equal(u, v) for u, v in zip(*results)), "the two paths differ"
    assert results[1][1].abs().sum() > 0
    assert calls == [(2, 3, 6, 6), (2, 6, 6, 6)]  # each layer of the one-pass network, none of the other


def test_opcheck_passes():
    x = _x((2, 3, 4, 5), 11, channels_last=True)
    torch.library.opcheck(R.relax, (x.nan_to_num(0.0, 2.0, -2.0),))
    g = torch.randn((2, 3, 4, 5)).to(DEVICE)
    torch.library.opcheck(R.relax_backward, (g, torch.randn((2, 1, 4, 5)).to(DEVICE), x))


@pytest.mark.parametrize("bad", [torch.zeros((2, 3, 4), dtype=torch.float32), torch.zeros((1, 2, 3, 3), dtype=torch.float64)])
def test_other_inputs_are_refused_in_one_line(bad):
    with pytest.raises(ValueError, match=r"bnn_gpu::relax takes a float32 \(N, C, H, W\) tensor"):
        R.relax(bad.to(DEVICE))
