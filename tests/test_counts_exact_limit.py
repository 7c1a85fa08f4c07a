"""Counts past 2**24 in float32 (docs/design.md section 1): refused, never silently rounded.

float32 holds every integer up to 2**24 = 16777216 and not 16777217. The torch path's float32
counts (float32 inputs, and float16/bfloat16, which count in float32) and the engine's float32
epilogue therefore refuse a window that can hold more elements; float64 inputs count exactly,
as refimpl's int64 counts do. The expected values are written by hand.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from _tiny_bnn import model_bytes

import refimpl
from bnn.nn import counts as torch_counts
from refimpl import engine
from refimpl.genome import Genome

K = 2 ** 24 + 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_float32_dense_counts_past_2_24_are_refused(dtype):
    x, w = torch.ones(1, K, dtype=dtype), torch.ones(1, K, dtype=dtype)
    with pytest.raises(ValueError, match=r"2\*\*24"):
        torch_counts.counts_dense(x, w)


def test_float32_conv_counts_past_2_24_are_refused():
    # 4096 channels x 65 x 65 taps = 17305600 elements in a full window.
    x, w = torch.ones(1, 4096, 65, 65), torch.ones(1, 4096, 65, 65)
    with pytest.raises(ValueError, match=r"2\*\*24"):
        torch_counts.counts_conv2d(x, w)


def test_float32_counts_up_to_2_24_and_float64_past_it_are_exact():
    x = torch.ones(1, 2 ** 24)
    a, b, c, d = torch_counts.counts_dense(x, x)
    assert a.item() == 16777216 and b.item() == c.item() == d.item() == 0
    x64 = torch.ones(1, K, dtype=torch.float64)
    a, b, c, d = torch_counts.counts_dense(x64, -x64)
    assert (a.item(), b.item(), c.item(), d.item()) == (0, 0, 16777217, 0)
    ra, rb, rc, rd = refimpl.counts_dense(np.ones((1, K)), -np.ones((1, K)))
    assert (ra.item(), rb.item(), rc.item(), rd.item()) == (0, 0, 16777217, 0)


def test_engine_refuses_a_binary_window_past_2_24_at_load(tmp_path):
    # stem 1->64 (1x1), a 64->1 binary 513x513 convolution (64 * 513 * 513 = 16842816 elements
    # in a window), global pool, linear: small tensors, a window float32 cannot count.
    rng = np.random.default_rng(0)
    conv = {"tensors": "u.conv", "in_channels": 64, "out_channels": 1, "kernel": [513, 513], "stride": [1, 1],
            "padding": [256, 256], "dilation": [1, 1]}
    meta = {
        "format": engine.FORMAT, "version": 1, "genome": str(Genome.parse("baseline")), "num_classes": 2,
        "input_shape": [1, 513, 513], "input": {"mean": [0.0], "std": [1.0], "pixel_max": None},
        "class_names": ["a", "b"],
        "layers": [
            {"op": "stem", "tensors": "stem", "in_channels": 1, "out_channels": 64, "kernel": [1, 1],
             "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1]},
            {"op": "binary_unit", "name": "u", "conv": conv, "residual": "none"},
            {"op": "global_avgpool"},
            {"op": "linear", "tensors": "fc", "in_features": 1, "out_features": 2},
        ],
    }
    tensors = {
        "stem.weight": np.ones((64, 1, 1, 1), np.float32), "stem.scale": np.ones(64, np.float32),
        "stem.shift": np.zeros(64, np.float32),
        "u.conv.bits": rng.integers(0, 2 ** 63, (1, 513, 513, 1), dtype=np.uint64),
        "u.conv.alpha": np.ones((4, 1), np.float32), "u.conv.scale": np.ones(1, np.float32),
        "u.conv.shift": np.zeros(1, np.float32),
        "fc.weight": np.ones((2, 1), np.float32), "fc.bias": np.zeros(2, np.float32),
    }
    path = tmp_path / "wide.bnn"
    path.write_bytes(model_bytes(meta, tensors))
    with pytest.raises(engine.ModelFileError, match=r"16842816 elements.*2\*\*24"):
        engine.load(str(path))
