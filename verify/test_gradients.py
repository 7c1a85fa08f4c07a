"""Gradients: one-convolution counts vs the four-convolution oracle, gradcheck of the measure,
and the layers' straight-through estimators vs hand-written ones (docs/design.md section 6)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import bnn
from bnn.nn.layers import sign
from refimpl import BINARY, UNARY, Genome
from verify.test_counts import conv_problems


def four_convolution_counts(x, w, stride, padding, dilation):
    """The naive formulation: one convolution per count over the 0/1 relaxations, each operand
    zero-padded after complementing, so a padded tap is 0 in every operand."""
    xb, wb = (x + 1) / 2, (w + 1) / 2
    pad = lambda t: F.pad(t, (padding, padding, padding, padding))  # noqa: E731
    conv = lambda u, v: F.conv2d(u, v, stride=stride, dilation=dilation)  # noqa: E731
    return conv(pad(xb), wb), conv(pad(1 - xb), wb), conv(pad(xb), 1 - wb), conv(pad(1 - xb), 1 - wb)


@settings(max_examples=40)
@given(problem=conv_problems(), used=st.lists(st.booleans(), min_size=4, max_size=4).filter(any))
def test_one_convolution_gradients_match_four_convolutions(problem, used):
    shape_x, shape_w, conv, seed = problem
    gen = torch.Generator().manual_seed(seed % 2**63)
    x = sign(torch.randn(shape_x, generator=gen, dtype=torch.float64)).requires_grad_()
    w = sign(torch.randn(shape_w, generator=gen, dtype=torch.float64)).requires_grad_()
    # Integer upstream gradients keep every sum exact, so the two formulations must agree
    # bit for bit; counts left out of the loss (used[i] False) get no gradient (None).
    ours = bnn.counts_conv2d(x, w, **conv)
    upstream = [torch.randint(-3, 4, ours[0].shape, generator=gen).double() for _ in range(4)]

    def grads(counts):
        loss = sum((t * g).sum() for t, g, u in zip(counts, upstream, used) if u)
        return torch.autograd.grad(loss, (x, w))

    oracle = four_convolution_counts(x, w, **conv)
    for t, o in zip(ours, oracle):
        assert torch.equal(t, o)
    for name, got, want in zip(("x", "w"), grads(ours), grads(oracle)):
        assert torch.equal(got, want), f"gradient wrt {name} differs: max {float((got - want).abs().max())}"


def test_dense_gradients_match_elementwise_formulation():
    gen = torch.Generator().manual_seed(3)
    x = sign(torch.randn(4, 130, generator=gen, dtype=torch.float64)).requires_grad_()
    w = sign(torch.randn(5, 130, generator=gen, dtype=torch.float64)).requires_grad_()
    xb, wb = (x[:, None, :] + 1) / 2, (w[None, :, :] + 1) / 2
    oracle = ((xb * wb).sum(-1), ((1 - xb) * wb).sum(-1), (xb * (1 - wb)).sum(-1), ((1 - xb) * (1 - wb)).sum(-1))
    ours = bnn.counts_dense(x, w)
    upstream = [torch.randint(-3, 4, (4, 5), generator=gen).double() for _ in range(4)]
    for counts in (ours, oracle):
        loss = sum((t * g).sum() for t, g in zip(counts, upstream))
        counts_grads = torch.autograd.grad(loss, (x, w))
        if counts is ours:
            got = counts_grads
        else:
            want = counts_grads
    for t, o in zip(ours, oracle):
        assert torch.equal(t, o)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# gradcheck needs a point where every genome is smooth: counts in [1.7, 3.0] keep log, sqrt
# and division away from 0, tan away from its poles (pi/2, 3pi/2), sin > 0 and cos < 0 (so
# sums of them do not vanish); alpha in [0.5, 1.5]. Only unary 'zero' under a division is
# 0/0 = NaN everywhere; those four pairs have no point to check and are listed, not skipped
# silently: any other pair that is not finite there fails.
NOWHERE_FINITE = {("zero", "div"), ("zero", "left_share"), ("zero", "rdiv"), ("zero", "right_share")}


@pytest.mark.parametrize(
    "unary,binary", [(u.code, b.code) for u in UNARY for b in BINARY], ids=[f"{u.name}-{b.name}" for u in UNARY for b in BINARY]
)
def test_measure_gradcheck(unary, binary):
    gen = torch.Generator().manual_seed(unary * 100 + binary)
    counts = [(1.7 + 1.3 * torch.rand(2, 3, 2, generator=gen, dtype=torch.float64)).requires_grad_() for _ in range(4)]
    alpha = (0.5 + torch.rand(4, 3, generator=gen, dtype=torch.float64)).requires_grad_()
    genome = Genome((unary,) * 4 + (binary,) * 3)
    with torch.no_grad():
        finite = bool(torch.isfinite(bnn.measure(genome, *counts, alpha)).all())
    if (UNARY[unary].name, BINARY[binary].name) in NOWHERE_FINITE:
        assert not finite
        return
    assert finite
    assert torch.autograd.gradcheck(lambda a, b, c, d, al: bnn.measure(genome, a, b, c, d, al), (*counts, alpha))


def test_paper_measures_gradcheck():
    gen = torch.Generator().manual_seed(11)
    for name in ["baseline"] + [f"M{i}" for i in range(1, 11)]:
        counts = [(1.0 + 9 * torch.rand(2, 3, 2, generator=gen, dtype=torch.float64)).requires_grad_() for _ in range(4)]
        alpha = (0.5 + torch.rand(4, 3, generator=gen, dtype=torch.float64)).requires_grad_()
        assert torch.autograd.gradcheck(lambda a, b, c, d, al, name=name: bnn.measure(name, a, b, c, d, al),
                                        (*counts, alpha)), name


def test_ste_sign_forward_and_gradients():
    x = torch.tensor([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.0001, 3.0], requires_grad=True)
    y = bnn.ste_sign(x, 1.0)
    assert y.tolist() == [-1, -1, -1, 1, 1, 1, 1, 1]  # sign(0) = +1
    (g,) = torch.autograd.grad((y * torch.arange(1.0, 9.0)).sum(), x)
    assert g.tolist() == [0, 2, 3, 4, 5, 6, 0, 0]  # clipped identity: |x| <= 1 passes
    (g,) = torch.autograd.grad((bnn.ste_sign(x, None) * torch.arange(1.0, 9.0)).sum(), x)
    assert g.tolist() == list(range(1, 9))  # identity STE for weights
    with pytest.raises(ValueError, match="clip_value"):
        bnn.ste_sign(x, -1.0)


@pytest.mark.parametrize("conv", [dict(stride=1, padding=1), dict(stride=2, padding=0, dilation=2)])
def test_binary_conv2d_baseline_equals_hand_written_ste(conv):
    torch.manual_seed(0)
    layer = bnn.BinaryConv2d(5, 4, 3, **conv).double()
    x = (2 * torch.randn(2, 5, 9, 9, dtype=torch.float64))
    x[0, 0, 0, :3] = 0.0
    x.requires_grad_()
    y = layer(x)
    upstream = torch.randint(-3, 4, y.shape).double()
    gx, gw = torch.autograd.grad((y * upstream).sum(), (x, layer.weight))

    # Hand-written: forward on signs, activation gradient masked to |x| <= 1, weight gradient
    # passed straight through.
    xs, ws = sign(x.detach()).requires_grad_(), sign(layer.weight.detach()).requires_grad_()
    y_ref = F.conv2d(xs, ws, **conv)
    assert torch.equal(y, y_ref)
    hx, hw = torch.autograd.grad((y_ref * upstream).sum(), (xs, ws))
    assert torch.equal(gx, hx * (x.detach().abs() <= 1))
    assert torch.equal(gw, hw)


def test_binary_linear_baseline_equals_hand_written_ste():
    torch.manual_seed(1)
    layer = bnn.BinaryLinear(70, 6).double()
    x = (2 * torch.randn(3, 70, dtype=torch.float64)).requires_grad_()
    y = layer(x)
    upstream = torch.randint(-3, 4, y.shape).double()
    gx, gw = torch.autograd.grad((y * upstream).sum(), (x, layer.weight))
    xs, ws = sign(x.detach()).requires_grad_(), sign(layer.weight.detach()).requires_grad_()
    y_ref = F.linear(xs, ws)
    assert torch.equal(y, y_ref)
    hx, hw = torch.autograd.grad((y_ref * upstream).sum(), (xs, ws))
    assert torch.equal(gx, hx * (x.detach().abs() <= 1))
    assert torch.equal(gw, hw)


def test_alpha_gets_gradient_only_in_alpha_slots():
    layer = bnn.BinaryConv2d(3, 4, 3, padding=1, measure="M7")  # U2 = alpha
    assert layer.alpha.shape == (4, 4)
    assert torch.equal(layer.alpha.detach()[1], torch.ones(4))
    layer(torch.randn(2, 3, 5, 5)).sum().backward()
    g = layer.alpha.grad
    assert torch.count_nonzero(g[[0, 2, 3]]) == 0 and torch.count_nonzero(g[1]) == 4
    assert str(layer.genome) == "3-15-3-0-0-0-4"
