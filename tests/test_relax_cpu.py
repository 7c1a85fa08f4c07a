"""bnn/nn/relax.py: a binary convolution's input on the CPU in one Numba pass each way, against NumPy and against the
unfused path (ste_sign, then the count convolution's own relaxation) bit for bit, in layers and in training steps; and
Numba's thread pool, launched by the first fused kernel of a process, leaves torch's thread count as it was."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from bnn.nn import layers
from bnn.nn import relax as R
from bnn.nn.layers import BinaryConv2d, set_measure_impl
from bnn.nn.models import build_model

ROOT = Path(__file__).resolve().parents[1]


def _x(shape, seed):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 1.5
    flat = x.view(-1)
    flat[::7] = 0.0  # zero binarizes to +1
    flat[3::11] = 1.0  # the straight-through window's edges are inside it
    flat[5::13] = -1.0
    flat[1], flat[2], flat[4] = float("nan"), float("inf"), -float("inf")
    return x


def test_forward_and_backward_are_numpys_formulas():
    x = _x((3, 5, 4, 6), 1)
    xb, xsum = R.relax(x)
    v = x.numpy()
    want = np.where(v >= 0, np.float32(1), np.float32(0))  # NaN >= 0 is false
    np.testing.assert_array_equal(xb.numpy(), want)
    np.testing.assert_array_equal(xsum.numpy(), want.sum(axis=1, keepdims=True, dtype=np.float32))
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    gs = torch.randn((3, 1, 4, 6), generator=torch.Generator().manual_seed(3))
    x.requires_grad_()
    xb, xsum = R.relax(x)
    torch.autograd.backward((xb, xsum), (g, gs))
    with np.errstate(invalid="ignore"):
        inside = np.abs(v) <= np.float32(1)
    np.testing.assert_array_equal(x.grad.numpy(), np.where(inside, (g.numpy() + gs.numpy()) * np.float32(0.5), 0))


def test_it_takes_only_what_it_can():
    x = torch.zeros((2, 3, 4, 4))
    assert R.applies(x)
    for other in (x.double(), x[:, :, :, :2], x.contiguous(memory_format=torch.channels_last), x[0], x[:0]):
        assert not R.applies(other)


def _unfused(monkeypatch):
    monkeypatch.setattr(layers, "relax_applies", lambda x: False)


def _layer_run(counts, genome, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = nn.Sequential(BinaryConv2d(4, 6, 3, padding=1, measure=genome, counts=counts), nn.BatchNorm2d(6),
                        BinaryConv2d(6, 5, 1, stride=2, measure=genome, counts=counts))
    set_measure_impl(net, "fused")
    x = _x((2, 4, 7, 7), 4).nan_to_num(0.0, 2.0, -2.0).requires_grad_()
    y = net(x)
    y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(5)))
    return [y.detach(), x.grad] + [p.grad for p in net.parameters()]


@pytest.mark.parametrize("counts, genome", [("raw", "baseline"), ("laplace", "M6"), ("freq", "16-7-11-12-1-12-2")])
@pytest.mark.parametrize("threads", [1, 2])
def test_layers_have_the_unfused_paths_bits(counts, genome, threads, monkeypatch):
    before = torch.get_num_threads()
    try:
        fused = _layer_run(counts, genome, threads)
        with monkeypatch.context() as m:
            _unfused(m)
            plain = _layer_run(counts, genome, threads)
    finally:
        torch.set_num_threads(before)
    # y, dL/dx and 6 parameters' gradients (None for an alpha the genome does not read, in both paths)
    assert len(fused) == 8 and fused[1] is not None
    assert all((u is None and v is None) or torch.equal(u, v) for u, v in zip(fused, plain))


def test_training_steps_have_the_unfused_paths_bits(monkeypatch):
    def train():
        torch.manual_seed(0)
        model = build_model("mnist_net", "16-7-11-12-1-12-2", 10, (1, 28, 28), counts="laplace")
        opt = torch.optim.Adam(model.parameters(), 5e-3)
        gen = torch.Generator().manual_seed(1)
        for _ in range(2):
            x, y = torch.randn(16, 1, 28, 28, generator=gen), torch.randint(0, 10, (16,), generator=gen)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    fused = train()
    with monkeypatch.context() as m:
        _unfused(m)
        plain = train()
    assert all(torch.equal(u, v) for u, v in zip(fused, plain))


def test_numbas_first_pool_leaves_torchs_threads_alone():
    # In a fresh process: Numba's OpenMP pool starts with the first fused kernel and set OpenMP's width (which torch
    # reads as its own) to every core's thread, so a one-thread training went on with two.
    code = ("import torch; torch.set_num_threads(1)\n"
            "from bnn.nn import relax\n"
            "x = torch.randn(2, 3, 4, 4, requires_grad=True); xb, s = relax.relax(x); (xb.sum() + s.sum()).backward()\n"
            "print(torch.get_num_threads())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "1"
