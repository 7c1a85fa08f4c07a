"""--measure-grad-clip: the gradients reaching the measure's inputs clipped, the forward untouched, recorded."""
from __future__ import annotations

import json
import math

import pytest
import torch
from _cli import run_main

from bnn.nn.layers import BinaryConv2d, BinaryLinear, set_measure_grad_clip
from bnn.train import main
from bnn.train.config import TrainConfig
from bnn.train.files import CHECKPOINT, load_checkpoint

SQRT_D = "0-4-0-0-0-0-1"  # a + sqrt(d) - (b + c): finite everywhere, its derivative in d infinite at d = 0


def _grads(layer, x):
    x = x.clone().requires_grad_()
    y = layer(x)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    return y.detach(), x.grad, layer.weight.grad


@pytest.mark.parametrize("make,shape", [(lambda: BinaryConv2d(4, 3, 3, padding=1, measure=SQRT_D), (2, 4, 5, 5)),
                                        (lambda: BinaryLinear(8, 3, measure=SQRT_D), (2, 8))])
def test_an_infinite_measure_gradient_becomes_finite_and_the_forward_keeps_its_bits(make, shape):
    torch.manual_seed(0)
    layer = make()
    x = torch.ones(shape)  # input bits all 1: d = 0 in every window, so d/dd sqrt(d) = inf
    y_plain, gx_plain, gw_plain = _grads(layer, x)
    assert not torch.isfinite(gx_plain).all() and not torch.isfinite(gw_plain).all()
    layer.weight.grad = None
    set_measure_grad_clip(layer, 0.5)
    y_clip, gx_clip, gw_clip = _grads(layer, x)
    assert torch.equal(y_plain, y_clip)
    assert torch.isfinite(gx_clip).all() and torch.isfinite(gw_clip).all()


def test_gradients_inside_the_limit_pass_unchanged():
    torch.manual_seed(1)
    layer = BinaryConv2d(4, 3, 3, padding=1, measure="M10", counts="freq")
    x = torch.randn(2, 4, 5, 5)
    _, gx0, gw0 = _grads(layer, x)
    layer.weight.grad = None
    set_measure_grad_clip(layer, 1e30)
    _, gx1, gw1 = _grads(layer, x)
    assert torch.equal(gx0, gx1) and torch.equal(gw0, gw1)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "1"])
def test_bad_limits_are_refused(bad):
    with pytest.raises(ValueError, match="measure_grad_clip"):
        TrainConfig(measure_grad_clip=bad).validate()
    with pytest.raises(ValueError, match="measure_grad_clip"):
        set_measure_grad_clip(BinaryLinear(2, 2), bad)


def test_a_config_without_it_is_off():
    cfg = TrainConfig.from_mapping({k: v for k, v in TrainConfig().to_dict().items() if k != "measure_grad_clip"})
    assert cfg.measure_grad_clip is None


def test_train_records_it_in_checkpoint_summary_and_json(tmp_path):
    out = tmp_path / "run"
    r = run_main(main, "--no-progress", "--epochs", "1", "--train-size", "256", "--batch-size", "128", "--measure", SQRT_D,
                 "--measure-grad-clip", "2.5", "--out", out, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["measure_grad_clip"] == 2.5
    assert load_checkpoint(str(out / CHECKPOINT))["config"]["measure_grad_clip"] == 2.5
    assert json.loads((out / "summary.json").read_text())["config"]["measure_grad_clip"] == 2.5
    r = run_main(main, "--no-progress", "--resume", out, "--measure-grad-clip", "1")
    assert r.returncode == 2 and r.stderr.startswith("error: --resume and --measure-grad-clip")
    r = run_main(main, "--no-progress", "--measure-grad-clip", "0", "--out", tmp_path / "x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
