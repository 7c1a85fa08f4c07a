"""Models for the export/engine tests: built by bnn.nn.models, BatchNorm statistics set from data."""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

from bnn.nn.layers import BinaryConv2d
from bnn.nn.models import build_model, calibrate_batchnorm

# verify/ is a package beside tests/; a bare ``pytest tests`` does not put the root on the path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from verify.nets import downsampling_net


def fresh_model(arch: str, measure: str, input_shape, x: torch.Tensor, seed: int = 0, random_alpha: bool = False,
                downsample: str = "binary"):
    """``arch``: a registered model, or ``downsampling_net`` (verify/nets.py)."""
    torch.manual_seed(seed)
    build = downsampling_net if arch == "downsampling_net" else lambda **kw: build_model(arch, **kw)
    model = build(measure=measure, num_classes=10, input_shape=input_shape, downsample=downsample)
    if random_alpha:
        # Per-channel alphas away from their initial values, so a transposed or mis-indexed alpha
        # cannot pass. Positive, so M7's a**3 / ... stays away from sign games.
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, BinaryConv2d):
                    m.alpha.copy_(0.5 + torch.rand(m.alpha.shape, generator=gen) * 2)
    return calibrate_batchnorm(model, x)


def digits_images() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits as uint8 (N, 1, 8, 8) and labels, without bnn.data's torch tensors."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.uint8).reshape(-1, 1, 8, 8), d.target.astype(np.int64)


def torch_logits(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def assert_logits_close(engine_logits: np.ndarray, torch_out: np.ndarray, rel: float = 1e-4) -> None:
    """Same predictions, logits within ``rel`` of the largest logit magnitude of each image."""
    assert engine_logits.shape == torch_out.shape
    assert np.isfinite(torch_out).all(), "pick data on which the torch model is finite"
    np.testing.assert_array_equal(engine_logits.argmax(1), torch_out.argmax(1))
    scale = np.abs(torch_out).max(axis=1, keepdims=True)
    err = np.abs(engine_logits - torch_out) / scale
    assert err.max() <= rel, f"max relative logit error {err.max():.3g} > {rel}"
