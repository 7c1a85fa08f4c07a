"""The fused training measure (bnn/nn/measure_fused.py): its forward is the eager measure's and its
gradients are autograd's, up to the rounding of float32 libm calls, under every count convention;
its lookup tables change no bit of what the untabled kernels compute."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from test_measure_tables import _counts, _latin_genomes

from bnn.nn import measure_fused
from bnn.nn.layers import set_measure_grad_clip, set_measure_impl, use_fused_measure
from bnn.nn.measure import measure as eager_measure
from bnn.nn.measure_fused import apply
from refimpl.conventions import NAMES as CONVENTIONS
from refimpl.operators import UNARY


def _window_counts():
    # (a, b, c, d) float32 (1, 3, L) and n (L,): every count at every value 0..n of a few window sizes n.
    a, b, c, d = (torch.from_numpy(v).float() for v in _counts())
    return (a, b, c, d), (a + b + c + d)[0, 0]


def _alpha():
    return torch.from_numpy(np.random.default_rng(5).uniform(-2, 2, (4, 3)).astype(np.float32))


def _bits(t):
    return t.detach().contiguous().numpy().view(np.uint32)


def _sum_genomes():
    # Every unary code in some slot, the three binary operators additions: the gradient reaching each
    # slot is the upstream one exactly, so a slot's gradient is its derivative table's entry.
    return ["-".join(map(str, [(4 * j + s) % len(UNARY) for s in range(4)] + [0, 0, 0])) for j in range(5)]


def _converted_genomes():
    # Under freq and laplace a table is the raw one's code after the conversion: every unary code
    # once (_sum_genomes: 5 genomes, 4 tables each), the gate operators whose 1 + exp(-y) is tabled
    # (binary codes 10 and 11 in B2 and B3), and M5, M9. Raw keeps the 18-genome Latin square (every
    # code in every slot). A genome's raw and converted tasks compile apart (forward and backward,
    # about 1 s each on the Xeon): the square under freq and laplace too took this file and
    # test_measure_impl.py from 47.6 to 65.7 s cold (2026-12-08), and found one case needing rtol 2e-5
    # there (11-12-13-14-11-2-7 under freq: 1.3e-5 where its y / (x + y) nearly cancels).
    return _sum_genomes() + ["5-6-7-8-5-10-1", "6-7-8-9-6-11-2", "0-1-2-3-0-5-10", "M5", "M9", "3-0-0-0-8-9-0"]


def _cases(raw_genomes):
    return ([(g, "raw") for g in raw_genomes]
            + [(g, c) for c in CONVENTIONS if c != "raw" for g in _converted_genomes()])


@pytest.mark.parametrize("genome, counts", _cases(_latin_genomes()))
def test_fused_forward_is_the_eager_measure_and_tables_change_no_bit(genome, counts):
    # Counts of every size in each convention; the eager measure in float32 is the reference, to a
    # few ulps (libm) and with the same non-finite values. The tabled kernels look every table entry
    # of every window size up, and equal the untabled ones bit for bit.
    raw, n = _window_counts()
    alpha = _alpha()
    expected = eager_measure(genome, *raw, alpha, counts=counts, n=n).numpy()
    got = apply(genome, *raw, alpha, counts, n).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-6 * np.abs(expected[finite]).max())
    tabled = apply(genome, *raw, alpha, counts, n, tabled=True)
    np.testing.assert_array_equal(_bits(tabled), got.view(np.uint32))


@pytest.mark.parametrize("counts", CONVENTIONS)
@pytest.mark.parametrize("genome", _sum_genomes())
def test_every_derivative_table_entry_is_the_untabled_gradient(genome, counts):
    raw, n = _window_counts()
    grads = []
    for tabled in (False, True):
        inputs = [t.clone().requires_grad_() for t in raw]
        out = apply(genome, *inputs, _alpha(), counts, n, tabled=tabled)
        grads.append(torch.autograd.grad(out, inputs, torch.ones_like(out), allow_unused=True))
    for name, g, ref in zip("abcd", grads[1], grads[0]):
        assert (g is None) == (ref is None), name
        if ref is not None:
            np.testing.assert_array_equal(_bits(g), _bits(ref), err_msg=f"{genome} {counts}: {name}")


def test_the_table_comparisons_see_one_ulp_in_one_entry():
    # erf(a) + 0 + (0 + 0) under laplace: the measure is the table's value and a's gradient its
    # derivative entry, so one entry moved by one ulp changes what the tests above compare bit for bit.
    genome = "11-1-1-1-0-0-0"
    raw, n = _window_counts()
    alpha = _alpha()
    mod = measure_fused.module(genome, tabled=True)
    inputs = [t.clone().requires_grad_() for t in raw]

    def run():
        out = apply(genome, *inputs, alpha, "laplace", n, tabled=True)
        return _bits(out).copy(), _bits(torch.autograd.grad(out, inputs[0], torch.ones_like(out))[0]).copy()

    out, grad = run()
    _, rows, _, tab, dtab, _ = measure_fused._geometry(mod, "laplace", n, n.numel())
    entry = int(rows[-1]) + 7  # erf((7 + 1) / (n + 4)) in the last position's window size
    saved = tab[0, entry], dtab[0, entry]
    try:
        tab[0, entry] = np.nextafter(tab[0, entry], np.float32(np.inf))
        dtab[0, entry] = np.nextafter(dtab[0, entry], np.float32(np.inf))
        out2, grad2 = run()
    finally:
        tab[0, entry], dtab[0, entry] = saved
    assert (out != out2).sum() >= 1 and (grad != grad2).sum() >= 1
    assert np.array_equal(run()[0], out)  # restored


def _grads(fn, counts, alpha, upstream):
    inputs = [t.clone().requires_grad_() for t in (*counts, alpha)]
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, upstream, allow_unused=True)
    return [None if g is None else g.double().numpy() for g in grads]


@pytest.mark.parametrize("genome, counts", _cases(_latin_genomes() + ["M5", "M9", "3-0-0-0-8-9-0"]))
def test_fused_gradients_are_autograds(genome, counts):
    # Positive non-integer counts (no log(0), no 0/0) and integer ones (ties of max and min), the
    # latter through the tables too; the windows' sizes vary by position (several table rows).
    gen = torch.Generator().manual_seed(11)
    floats = [0.5 + 2.5 * torch.rand(2, 3, 40, generator=gen) for _ in range(4)]
    integers = [torch.randint(1, 4, (2, 3, 40), generator=gen).float() for _ in range(4)]
    n = torch.randint(12, 15, (40,), generator=gen).float()
    for raw, tabled in ((floats, False), (integers, False), (integers, True)):
        alpha = 0.5 + torch.rand(4, 3, generator=gen)
        upstream = torch.randn(2, 3, 40, generator=gen)
        ours = _grads(lambda *t, tabled=tabled: apply(genome, *t, counts, n, tabled=tabled), raw, alpha, upstream)
        # The reference: autograd in float64 on the same float32 values, to float32's precision.
        ref = _grads(lambda *t: eager_measure(genome, *t[:4], t[4], counts=counts, n=n.double()),
                     [t.double() for t in raw], alpha.double(), upstream.double())
        for name, g, r in zip(("a", "b", "c", "d", "alpha"), ours, ref):
            if r is None or not np.any(r):
                assert g is None or not np.any(g), f"{genome}: {name} gets a gradient autograd does not give"
                continue
            assert g is not None, f"{genome}: no gradient for {name}"
            finite = np.isfinite(r) & (np.abs(r) < 1e30)
            scale = np.abs(r[finite]).max() if finite.any() else 1.0
            np.testing.assert_allclose(g[finite], r[finite], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{genome}: {name}")


def _model_grads(measure, counts, impl, clip=None, batch=8):
    from bnn.nn.models import build_model

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, 1, 28, 28, generator=gen), torch.randint(0, 10, (batch,), generator=gen)
    torch.manual_seed(0)
    model = set_measure_grad_clip(set_measure_impl(build_model("mnist_net", measure, 10, (1, 28, 28), counts=counts),
                                                   impl), clip)
    logits = model(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    return logits.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("counts", CONVENTIONS)
def test_a_model_trains_with_the_same_gradients_fused(counts):
    (eager_out, eager), (fused_out, fused) = (_model_grads("M6", counts, impl) for impl in ("eager", "fused"))
    tabled = measure_fused._MODULES[("3-0-3-0-0-10-6", True)].__name__  # the layers took the tabled kernels
    assert any(key[:2] == (tabled, counts) for key in measure_fused._GEOMETRY)  # under this convention
    np.testing.assert_allclose(fused_out.numpy(), eager_out.numpy(), rtol=1e-5, atol=1e-5)
    for e, f in zip(eager, fused):
        if e is None:  # alpha of a genome without alpha slots
            assert f is None
            continue
        assert f is not None
        np.testing.assert_allclose(f.numpy(), e.numpy(), rtol=1e-3, atol=1e-3 * e.abs().max().item() + 1e-12)


def test_use_fused_measure_sets_the_fused_implementation():
    from bnn.nn.models import build_model

    model = use_fused_measure(build_model("digits_net", "M1", 10, (1, 8, 8)))
    assert {m.measure_impl for m in model.modules() if hasattr(m, "genome")} == {"fused"}


@pytest.mark.parametrize("counts", ["raw", "laplace"])
def test_the_fused_backward_clips_as_measure_grad_clip_does(counts):
    # M1 = (b**3 - c) / (a**3 + d) under raw has infinite and NaN gradients on blank windows; clipped,
    # the fused gradients are the eager clipped ones.
    (eager_out, eager), (fused_out, fused) = (_model_grads("M1", counts, impl, clip=0.25) for impl in ("eager", "fused"))
    np.testing.assert_array_equal(torch.isfinite(fused_out).numpy(), torch.isfinite(eager_out).numpy())
    for e, f in zip(eager, fused):
        if e is None:
            assert f is None
            continue
        np.testing.assert_array_equal(torch.isfinite(f).numpy(), torch.isfinite(e).numpy())
        ok = torch.isfinite(e)
        np.testing.assert_allclose(f[ok].numpy(), e[ok].numpy(), rtol=1e-3, atol=1e-3 * e[ok].abs().max().item() + 1e-12)
