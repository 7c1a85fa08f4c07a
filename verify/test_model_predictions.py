"""Whole models: the torch network and the exported CPU engine predict the same (docs/design.md section 5).

The oracle ladder's last rung. For drawn input batches, a digits_net per measure, and a
digits-sized net that downsamples (``verify/nets.py``) with each shortcut kind of docs/design.md section 6,
binary and real (BatchNorm statistics set from data, random per-channel alphas where the genome
has them) is run in PyTorch (eval, float32) and through ``bnn.export`` + ``refimpl.engine``:
predictions must be identical, logits within 1e-4 of each image's largest logit, and for the
baseline every binary layer's integer counts identical to ``bnn.counts_conv2d`` on the same
binarized activations. The CIFAR architectures are checked the same way in ``tests/test_infer.py``.
"""
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_digits

from bnn.export import export_model
from bnn.nn.counts import counts_conv2d
from bnn.nn.layers import BinaryConv2d, sign
from bnn.nn.models import build_model, calibrate_batchnorm
from refimpl import engine
from verify.nets import downsampling_net

MEASURES = ("baseline", "M1", "M7", "M9")
# (net, downsample kind, measure, count convention). M5 and M9 are not finite with binary
# downsampling and raw counts here (a 1x1 window has c = 0 somewhere; docs/design.md section 6),
# so the binary net is checked with finite measures; laplace counts are never 0 (section 2).
CASES = (
    [("digits_net", "binary", name, "raw") for name in MEASURES]
    + [("downsampling_net", "binary", name, "raw") for name in ("baseline", "M1")]
    + [("downsampling_net", "real", name, "raw") for name in ("baseline", "M5", "M9")]
    + [("digits_net", "binary", name, "freq") for name in ("M3", "M6", "M10")]
    + [("downsampling_net", "binary", "M5", counts) for counts in ("freq", "laplace")]
    + [("downsampling_net", "binary", "M9", "laplace")]  # freq keeps c = 0, and atan(0) = 0 divides
    + [("digits_net", "binary", name, "laplace") for name in ("baseline", "M1", "M7")]
)
_DIGITS = load_digits()
_IMAGES = torch.from_numpy(_DIGITS.images.astype(np.float32).reshape(-1, 1, 8, 8))
_MEAN, _STD = float(_IMAGES.mean()), float(_IMAGES.std())


def _normalized(idx) -> torch.Tensor:
    return (_IMAGES[idx] - _MEAN) / _STD


def _build(case, folder):
    """(torch model, engine model) of ``case``, exported to ``folder``."""
    net, kind, name, counts = case
    torch.manual_seed(0)
    if net == "downsampling_net":
        model = downsampling_net(name, 10, (1, 8, 8), downsample=kind, counts=counts)
    else:
        model = build_model(net, name, 10, (1, 8, 8), downsample=kind, counts=counts)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, BinaryConv2d):
                # Away from the initial values, so a mis-indexed alpha cannot pass.
                m.alpha.copy_(0.5 + 2 * torch.rand(m.alpha.shape, generator=gen))
    calibrate_batchnorm(model, _normalized(slice(0, 512)))
    path = folder / f"{net}-{kind}-{name}-{counts}.bnn"
    export_model(model, str(path))
    return model, engine.load(str(path))


class _Exported(dict):
    """case -> (torch model, engine model), each built on its first use (every case seeds its own
    model, so the order does not matter). Built all at once, every xdist worker built and compiled
    all 16 models, about a minute of CPU each in a cold run, though it runs only some of them."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def __missing__(self, case):
        self[case] = built = _build(case, self.folder)
        return built


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(net, kind, measure, counts) -> (torch model, engine model), each built once per session, on first use."""
    return _Exported(tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("case", CASES, ids="-".join)
@settings(max_examples=6)
@given(data=st.data())
def test_engine_predicts_what_torch_predicts(exported, case, data):
    model, cpu = exported[case]
    idx = data.draw(st.lists(st.integers(0, len(_IMAGES) - 1), min_size=1, max_size=40), label="images")
    x = _normalized(idx)
    with torch.no_grad():
        expected = model(x).numpy()
    # A measure may be non-finite on some inputs (docs/design.md section 2); those batches say nothing about
    # agreement. Hypothesis fails the test if it cannot find enough finite ones.
    assume(np.isfinite(expected).all())
    got = cpu.run(x.numpy().copy())
    np.testing.assert_array_equal(got.argmax(1), expected.argmax(1))
    scale = np.abs(expected).max(axis=1, keepdims=True)
    assert (np.abs(got - expected) / scale).max() <= 1e-4


@pytest.mark.parametrize("net,kind", [("digits_net", "binary"), ("downsampling_net", "binary"),
                                      ("downsampling_net", "real")])
@settings(max_examples=6)
@given(data=st.data())
def test_baseline_layer_counts_are_identical(exported, net, kind, data):
    model, cpu = exported[net, kind, "baseline", "raw"]
    idx = data.draw(st.lists(st.integers(0, len(_IMAGES) - 1), min_size=1, max_size=16), label="images")
    x = _normalized(idx)
    seen = []

    def hook(layer, inputs, _output):
        xb = sign(inputs[0])
        seen.append(counts_conv2d(xb, sign(layer.weight), layer.stride, layer.padding, layer.dilation))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, BinaryConv2d)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    _, records = cpu.run(x.numpy().copy(), debug=True)
    assert len(records) == len(seen) > 0
    for rec, counts in zip(records, seen):
        for key, t in zip("abcd", counts):
            np.testing.assert_array_equal(rec[key], t.numpy().astype(np.int64), err_msg=f"{rec['name']} {key}")
