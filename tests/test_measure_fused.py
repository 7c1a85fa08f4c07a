"""The fused training measure (bnn/measure_fused.py): its forward is the eager measure's and its
gradients are autograd's, up to the rounding of float32 libm calls."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_measure_tables import _counts, _latin_genomes

from bnn import measure_fused
from bnn.measure import measure as eager_measure
from bnn.measure_fused import apply, use_fused_measure
from refimpl.conventions import NAMES as CONVENTIONS
from refimpl.conventions import convert


@pytest.mark.parametrize("counts", CONVENTIONS)
@pytest.mark.parametrize("genome", _latin_genomes())
def test_fused_forward_is_the_eager_measure(genome, counts):
    # Counts of every size in each convention; the eager measure in float32 is the reference,
    # to a few ulps (libm) and with the same non-finite values.
    a, b, c, d = (torch.from_numpy(v) for v in _counts())
    n = (a + b + c + d).float()
    alpha = torch.from_numpy(np.random.default_rng(5).uniform(-2, 2, (4, 3)).astype(np.float32))
    converted = [convert(counts, v.float(), n).contiguous() for v in (a, b, c, d)]
    expected = eager_measure(genome, *converted, alpha).numpy()
    # raw counts are integers: the tabled kernels too, with every table entry up to n = 300 used
    for n_max in (None, int(n.max())) if counts == "raw" else (None,):
        got = apply(genome, *converted, alpha, n_max=n_max).numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
        finite = np.isfinite(expected)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-6 * np.abs(expected[finite]).max())


def _grads(fn, genome, counts, alpha, upstream):
    inputs = [t.clone().requires_grad_() for t in (*counts, alpha)]
    out = fn(genome, *inputs)
    grads = torch.autograd.grad(out, inputs, upstream, allow_unused=True)
    return [None if g is None else g.double().numpy() for g in grads]


def _fused(genome, a, b, c, d, alpha):
    return apply(genome, a, b, c, d, alpha)


def _fused_tabled(genome, a, b, c, d, alpha):
    return apply(genome, a, b, c, d, alpha, n_max=3)


@pytest.mark.parametrize("genome", _latin_genomes() + ["M5", "M9", "3-0-0-0-8-9-0"])
def test_fused_gradients_are_autograds(genome):
    # Positive non-integer counts (no log(0), no 0/0) and integer ones (ties of max and min).
    gen = torch.Generator().manual_seed(11)
    floats = [0.5 + 2.5 * torch.rand(2, 3, 40, generator=gen) for _ in range(4)]
    integers = [torch.randint(1, 4, (2, 3, 40), generator=gen).float() for _ in range(4)]
    for counts, fn in ((floats, _fused), (integers, _fused), (integers, _fused_tabled)):
        alpha = 0.5 + torch.rand(4, 3, generator=gen)
        upstream = torch.randn(2, 3, 40, generator=gen)
        ours = _grads(fn, genome, counts, alpha, upstream)
        # The reference: autograd in float64 on the same float32 values, to float32's precision.
        ref = _grads(eager_measure, genome, [t.double() for t in counts], alpha.double(), upstream.double())
        for name, g, r in zip(("a", "b", "c", "d", "alpha"), ours, ref):
            if r is None or not np.any(r):
                assert g is None or not np.any(g), f"{genome}: {name} gets a gradient autograd does not give"
                continue
            assert g is not None, f"{genome}: no gradient for {name}"
            finite = np.isfinite(r) & (np.abs(r) < 1e30)
            scale = np.abs(r[finite]).max() if finite.any() else 1.0
            np.testing.assert_allclose(g[finite], r[finite], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{genome}: {name}")


def test_a_model_trains_with_the_same_gradients_fused():
    from bnn.models import build_model

    torch.manual_seed(0)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    grads = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = build_model("mnist_net", "M6", 10, (1, 28, 28))
        if fused:
            use_fused_measure(model)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        grads.append([p.grad for p in model.parameters()] if loss.backward() is None else None)
    assert ("3-0-3-0-0-10-6", True) in measure_fused._MODULES  # raw counts took the tabled kernels
    for eager, ours in zip(*grads):
        if eager is None:  # alpha of a genome without alpha slots
            assert ours is None
            continue
        assert ours is not None
        np.testing.assert_allclose(ours.numpy(), eager.numpy(), rtol=1e-3, atol=1e-3 * eager.abs().max().item() + 1e-12)
