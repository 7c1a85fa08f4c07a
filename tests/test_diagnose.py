"""python -m bnn.diagnose: the instrumented training changes nothing, and it names where a measure breaks."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from _cli import run_main

from bnn.data import Dataset, load_dataset
from bnn.diagnose import diagnose, main
from bnn.diagnose.probe import Recorder, attach
from bnn.nn.models import build_model
from bnn.train.config import TrainConfig


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _blank_images(n=64) -> Dataset:
    # Zero images normalized to 0: the stem and its BatchNorm give 0 everywhere, sign(0) = +1, so the first
    # binary layer sees input bits all 1 and every window of it has b = d = 0.
    zeros = torch.zeros((n, 1, 8, 8), dtype=torch.uint8)
    labels = torch.arange(n) % 10
    return Dataset(name="digits", num_classes=10, class_names=[str(i) for i in range(10)], input_shape=(1, 8, 8),
                   mean=(0.0,), std=(1.0,), crop_pad=0, flip=False, train_x=zeros, train_y=labels,
                   val_x=zeros[:1], val_y=labels[:1], test_x=zeros[:1], test_y=labels[:1], val_size=1, split_seed=0,
                   device=torch.device("cpu"))


def _cfg(measure, **kw) -> TrainConfig:
    return TrainConfig(measure=measure, batch_size=32, **kw)


@pytest.mark.parametrize("measure,counts", [("M1", "raw"), ("M9", "freq"), ("M7", "laplace"), ("15-16-17-0-5-7-10", "freq")])
def test_the_instrumented_model_computes_the_same_bits_forward_and_backward(measure, counts):
    torch.manual_seed(0)
    plain = build_model("digits_net", measure, 10, (1, 8, 8), counts=counts)
    probed = copy.deepcopy(plain)
    attach(probed, Recorder())
    x = torch.randn(6, 1, 8, 8)
    y0, y1 = plain(x), probed(x)
    assert torch.equal(y0, y1)
    y0.square().sum().backward()
    y1.square().sum().backward()
    for p, q in zip(plain.parameters(), probed.parameters()):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad)


def test_the_baseline_stays_finite_and_the_layers_are_reported(digits):
    run = diagnose(_cfg("baseline"), 3, digits)
    assert run["first_nonfinite"] is None and run["diverged_at_step"] is None and run["steps_run"] == 3
    assert [r["layer"] for r in run["layers"]] == ["body.0.conv", "body.1.conv", "body.2.conv"]
    row = run["layers"][0]
    assert row["nonfinite_value_share"] == 0 and row["bn_input_var_max"] > 0
    assert row["grads"]["input bits"]["max_norm"] > 0 and row["grads"]["weight (parameter)"]["max_norm"] > 0


def test_a_division_by_zero_is_a_value_at_step_1_in_the_first_layer_at_B3(digits):
    # (a + d) / (0 + 0): B2 is 0 in every window, so B3 is inf (or NaN) from the first forward pass.
    run = diagnose(_cfg("0-0-1-1-0-0-4"), 5, digits)
    first = run["first_nonfinite"]
    assert (first["step"], first["kind"], first["layer"], first["operator"]) == (1, "value", "body.0.conv", "B3")
    assert first["window"]["B2"] == 0 and first["nonfinite_share"] == 1.0
    assert run["diverged_at_step"] == 1 and run["steps_run"] == 1
    assert run["layers"][0]["denominators"]["B3"]["zero_share"] == 1.0


def test_a_finite_forward_with_an_infinite_backward_is_a_gradient_made_by_its_unary_node():
    # a + sqrt(d) - (b + c) on windows with d = 0: finite values, but sqrt's derivative is 1/(2 sqrt(0)) = inf,
    # and the counts' backward turns that into NaN (inf * 0 bits) in every parameter it reaches.
    run = diagnose(_cfg("0-4-0-0-0-0-1"), 2, _blank_images())
    first = run["first_nonfinite"]
    assert (first["step"], first["kind"], first["operator"]) == (1, "gradient", "U2")
    assert first["layer"] == "body.0.conv"  # the layer whose windows all have d = 0
    assert "d (measure input)" in first["tensor"].split(" = ") and first["window"]["d"] == 0
    assert run["first_nonfinite_gradient"] == first
    assert run["first_nonfinite_parameter_grads"]["step"] == 1
    assert "body.0.conv.weight" in run["first_nonfinite_parameter_grads"]["parameters"]


def test_the_measure_grad_clip_keeps_that_backward_finite_and_the_forward_unchanged():
    clipped = diagnose(_cfg("0-4-0-0-0-0-1", measure_grad_clip=1.0), 2, _blank_images())
    plain = diagnose(_cfg("0-4-0-0-0-0-1"), 1, _blank_images())
    assert clipped["first_nonfinite"]["operator"] == "U2"  # still made there, before the clip
    assert clipped["first_nonfinite_parameter_grads"] is None  # but the clip stops it
    assert clipped["loss"][0] == plain["loss"][0]


def test_json_has_its_keys_and_the_text_names_the_failure():
    r = run_main(main, "--dataset", "digits", "--measure", "baseline,0-0-1-1-0-0-4", "--steps", "2", "--batch-size",
                 "64", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"command", "settings", "runs"}
    assert doc["settings"]["steps"] == 2 and doc["settings"]["batch_size"] == 64
    keys = {"measure", "genome", "formula", "counts", "measure_grad_clip", "steps_run", "diverged_at_step", "first_nonfinite_gradient",
            "first_nonfinite", "first_nonfinite_parameter_grads", "loss", "layers", "wall_s"}
    assert all(keys <= set(run) for run in doc["runs"])
    assert doc["runs"][0]["first_nonfinite"] is None and doc["runs"][1]["first_nonfinite"]["operator"] == "B3"
    assert doc["runs"][1]["loss"][0] == "nan"  # JSON has no NaN: non-finite numbers are named
    text = run_main(main, "--dataset", "digits", "--measure", "0-0-1-1-0-0-4", "--steps", "1", "--no-progress").stdout
    assert "first non-finite value at step 1, layer body.0.conv, operator B3" in text


@pytest.mark.parametrize("args", [["--steps", "0"], ["--counts", "raw,bogus"], ["--measure", "M11"], ["--lr", "nan"],
                                  ["--measure-grad-clip", "-1"], ["--milestones", "x"], ["--dataset", "nope"],
                                  ["--train-size", "99999999"], ["--model", "bogus"]])
def test_bad_input_is_one_line_and_exit_2(args):
    r = run_main(main, "--dataset", "digits", "--no-progress", *args)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and r.stdout == ""


def test_default_steps_are_the_evidence_protocols_epochs():
    from bnn.diagnose.cli import _configs, _parser

    args, _ = _parser().parse(["--data-dir", "/nonexistent"])
    configs, steps = _configs(args)
    assert steps == 3 * int(np.ceil(8000 / 128))
    assert (configs[0].train_size, configs[0].milestones, configs[0].model) == (8000, (2,), "mnist_net")


def test_its_steps_are_bnn_trains_steps(digits):
    # The same initialization, data order and Adam: the epoch's mean loss is bnn.train's, to float rounding.
    from bnn.train.loop import train_model

    cfg = TrainConfig(measure="M3", batch_size=256, epochs=1, eval_test=False)
    run = diagnose(TrainConfig(measure="M3", batch_size=256), run_steps := -(-len(digits.train_y) // 256), digits)
    sizes = [min(256, len(digits.train_y) - 256 * i) for i in range(run_steps)]
    mean = sum(loss * n for loss, n in zip(run["loss"], sizes)) / sum(sizes)
    assert train_model(cfg, digits).train_loss == pytest.approx(mean, rel=1e-5)


def test_an_overflow_in_the_counts_backward_is_named_with_its_sum():
    # Finite count gradients of 3e38 sum to dL/da = ga - gb - gc + gd = inf in the counts' backward, whose
    # convolution with 0/1 bits then gives inf * 0 = NaN: the first non-finite gradient is made there.
    from bnn.diagnose.run import _first_gradient_failure
    from bnn.nn.layers import BinaryConv2d

    torch.manual_seed(0)
    model = torch.nn.Sequential(BinaryConv2d(3, 4, 3, padding=1))
    recorder = Recorder()
    probes = attach(model, recorder)
    y = model(torch.randn(2, 3, 5, 5))
    y.backward(torch.full_like(y, 3e38))
    found = _first_gradient_failure(probes, recorder)
    assert found["operator"] == "counts backward" and found["tensor"] in ("input bits", "weight bits")
    assert found["dL/da inf"] > 0 and found["max_abs_grad_a"] == pytest.approx(3e38)
