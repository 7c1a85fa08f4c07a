"""Counts on the GPU are exact (issue 16 item 3): the torch count path on a CUDA device gives, bit for bit,
``refimpl.counts_conv2d``'s a, b, c, d on every binary layer shape of the CIFAR ResNet-18, with cuDNN's
autotuner on and off, TF32 allowed, NCHW and channels_last, float32 and float16 inputs (the path counts
half inputs in float32: docs/design.md section 1).

Skipped without CUDA. ``BNN_COUNTS_DEVICE=cpu`` runs the same comparisons on the CPU, to check this
file itself on a machine without a GPU (bench/gpu_session.sh --cpu-smoke does).
"""
import os

import numpy as np
import pytest
import torch

import refimpl
from bnn.nn.counts import counts_conv2d
from bnn.nn.models import binary_layers, build_model

DEVICE = os.environ.get("BNN_COUNTS_DEVICE", "cuda")
needs_device = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")
BATCH = 2

# (in channels, out channels, input side, kernel, stride, padding) of every binary layer of the
# CIFAR ResNet-18 with binary downsampling; the first test checks the list against the model.
SHAPES = [
    (64, 64, 32, 3, 1, 1),  # stage 1
    (64, 128, 32, 3, 2, 1),  # stage 2 opens with stride 2
    (64, 128, 32, 1, 2, 0),  # and its 1x1 downsampling shortcut
    (128, 128, 16, 3, 1, 1),
    (128, 256, 16, 3, 2, 1),
    (128, 256, 16, 1, 2, 0),
    (256, 256, 8, 3, 1, 1),
    (256, 512, 8, 3, 2, 1),
    (256, 512, 8, 1, 2, 0),
    (512, 512, 4, 3, 1, 1),
]


def _model_shapes() -> set:
    model = build_model("resnet18", "baseline", 10, (3, 32, 32))
    seen = set()

    def hook(layer, inputs, output):
        x = inputs[0]
        seen.add((layer.in_channels, layer.out_channels, x.shape[-1], layer.kernel_size[0], layer.stride,
                  layer.padding))

    for layer in binary_layers(model):
        layer.register_forward_hook(hook)
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, 32, 32))
    return seen


def test_the_shapes_are_every_binary_layer_of_resnet18():
    assert set(SHAPES) == _model_shapes()


@pytest.fixture(params=[False, True], ids=["benchmark-off", "benchmark-on"])
def cudnn_benchmark(request):
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.benchmark = request.param
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True  # what training sets
    yield request.param
    torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _pm1(shape, gen, fill=None) -> torch.Tensor:
    if fill is not None:
        return torch.full(shape, float(fill))
    return torch.randint(0, 2, shape, generator=gen).float() * 2 - 1


@needs_device
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16-in"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "{}to{}-{}px-k{}s{}".format(*s[:5]))
def test_counts_on_the_device_equal_refimpl(shape, layout, dtype, cudnn_benchmark):
    cin, cout, side, k, stride, pad = shape
    gen = torch.Generator().manual_seed(sum(shape))
    # Random signs, plus one all-+1 image (a = the whole window, the largest count) against
    # all-+1 filters, and one all--1 image (d = the whole window).
    x = torch.cat([_pm1((BATCH, cin, side, side), gen), _pm1((1, cin, side, side), gen, 1),
                   _pm1((1, cin, side, side), gen, -1)])
    w = torch.cat([_pm1((cout - 1, cin, k, k), gen), _pm1((1, cin, k, k), gen, 1)])
    want = refimpl.counts_conv2d(x.numpy(), w.numpy(), stride=stride, padding=pad)
    xd, wd = x.to(DEVICE, dtype), w.to(DEVICE, dtype)
    if layout == "channels_last":
        xd, wd = xd.contiguous(memory_format=torch.channels_last), wd.contiguous(memory_format=torch.channels_last)
    got = counts_conv2d(xd, wd, stride=stride, padding=pad)
    for name, g, r in zip("abcd", got, want):
        assert g.dtype == torch.float32, f"{name}: counts of {dtype} inputs must come back in float32"
        g64 = g.double().cpu().numpy()
        assert np.array_equal(g64, np.round(g64)), f"{name}: a count that is not an integer"
        bad = np.argwhere(g64 != r)
        assert bad.size == 0, f"{name}: {len(bad)} counts differ, first at {tuple(bad[0])}: {g64[tuple(bad[0])]} != {r[tuple(bad[0])]}"
