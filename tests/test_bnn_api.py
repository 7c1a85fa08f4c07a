"""The torch path's boundary: bad arguments raise ValueError naming the value."""
from __future__ import annotations

import pytest
import torch

import bnn


def _pm1(*shape):
    return bnn.sign(torch.randn(*shape))


@pytest.mark.parametrize(
    "x,w,kwargs,fragment",
    [
        (_pm1(2, 3, 5), _pm1(4, 3, 3, 3), {}, "NCHW"),
        (_pm1(2, 3, 5, 5), _pm1(4, 3, 3), {}, "OIHW"),
        (_pm1(2, 3, 5, 5), _pm1(4, 2, 3, 3), {}, "3 channels but w expects 2"),
        (_pm1(2, 3, 5, 5), _pm1(4, 3, 3, 3), {"stride": 0}, "stride and dilation must be >= 1"),
        (_pm1(2, 3, 5, 5), _pm1(4, 3, 3, 3), {"padding": -1}, "padding must be >= 0"),
        (_pm1(2, 3, 5, 5), _pm1(4, 3, 3, 3), {"stride": (1, 2, 3)}, "pair of ints"),
        (_pm1(2, 3, 5, 5).long(), _pm1(4, 3, 3, 3), {}, "floating"),
    ],
)
def test_counts_conv2d_rejects_bad_arguments(x, w, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        bnn.counts_conv2d(x, w, **kwargs)


def test_counts_dense_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        bnn.counts_dense(_pm1(2, 3, 4), _pm1(5, 3))
    with pytest.raises(ValueError, match="3 elements but w rows have 4"):
        bnn.counts_dense(_pm1(2, 3), _pm1(5, 4))


def test_measure_rejects_bad_counts_and_alpha():
    a = torch.ones(2, 3, 4)
    with pytest.raises(ValueError, match="count c has shape"):
        bnn.measure("M1", a, a, torch.ones(2, 3), a)
    with pytest.raises(ValueError, match=r"alpha must have shape \(4, 3\)"):
        bnn.measure("M7", a, a, a, a, torch.ones(3, 3))
    with pytest.raises(ValueError, match="B3"):
        bnn.measure("0-0-0-0-0-0-99", a, a, a, a)


def test_measure_constants_have_the_counts_shape_and_dtype():
    a = torch.full((2, 3, 4), 5.0, dtype=torch.float64)
    y = bnn.measure("15-1-1-1-0-0-0", a, a, a, a)  # alpha + 0 + (0 + 0): the initial alpha, 1.0
    assert y.shape == a.shape and y.dtype == a.dtype and torch.equal(y, torch.ones_like(a))
    assert torch.isnan(bnn.measure("1-1-0-0-4-0-0", a, a, a, a)).all()  # 0/0 + (b + c)


def test_layers_take_genomes_or_names_and_reject_unknown_measures():
    conv = bnn.BinaryConv2d(3, 4, 3, padding=1, measure="M9")
    assert str(conv.genome) == "3-2-3-10-0-4-6" and conv.alpha.shape == (4, 4)
    assert "measure='3-2-3-10-0-4-6'" in repr(conv)
    linear = bnn.BinaryLinear(6, 2, measure=conv.genome)
    assert linear.genome == conv.genome
    assert conv(torch.randn(2, 3, 5, 5)).shape == (2, 4, 5, 5)
    assert linear(torch.randn(7, 6)).shape == (7, 2)
    with pytest.raises(ValueError, match="unknown genome 'M12'"):
        bnn.BinaryConv2d(3, 4, 3, measure="M12")


@pytest.mark.parametrize("measure", ["baseline", "M7"])
def test_layers_trace_in_one_graph_under_torch_compile(measure):
    # bnn.train's --compile relies on this: no graph break in counts, measure or the STEs.
    torch.manual_seed(0)
    conv = bnn.BinaryConv2d(4, 5, 3, padding=1, measure=measure)
    x = torch.randn(2, 4, 6, 6, requires_grad=True)
    eager = conv(x)
    compiled = torch.compile(conv, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(eager, compiled)
    g_eager = torch.autograd.grad(eager.sum(), (x, conv.weight))
    g_compiled = torch.autograd.grad(compiled.sum(), (x, conv.weight))
    for e, c in zip(g_eager, g_compiled):
        torch.testing.assert_close(c, e)
