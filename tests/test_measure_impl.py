"""--measure-impl: the fused measure is float32 CPU training's default, eager stays what it was, and a
run, grid or search recorded before the setting existed continues eager (bnn.settings.MEASURE_IMPLS)."""
from __future__ import annotations

import json

import pytest
import torch
from _cli import run_main

from bnn.nn import measure_fused
from bnn.nn.layers import BinaryMeasureLayer, set_measure_impl
from bnn.nn.models import build_model
from bnn.train import main
from bnn.train.config import TrainConfig
from bnn.train.files import CHECKPOINT, load_checkpoint
from bnn.train.loop import train_model

SMALL = dict(dataset="digits", model="digits_net", epochs=2, train_size=256, batch_size=64, milestones=(1,))


def _train(**settings):
    cfg = TrainConfig.from_mapping({**SMALL, **settings})
    return train_model(cfg)


def test_cpu_training_runs_the_fused_measure_by_default():
    assert TrainConfig().measure_impl == "fused"
    measure_fused._MODULES.clear()
    r = _train(measure="M9", counts="laplace", epochs=1)
    assert r.status == "ok" and r.config["measure_impl"] == "fused"
    assert ("3-2-3-10-0-4-6", True) in measure_fused._MODULES  # the layers took the tabled kernels


def test_measure_impl_eager_is_the_eager_path_to_the_bit(monkeypatch):
    # The eager path as the layers ran it before the setting existed: convert, clip, measure.
    eager = _train(measure="M1", counts="laplace", measure_impl="eager")
    monkeypatch.setattr(BinaryMeasureLayer, "_measure_counts",
                        lambda self, counts, n: self._measure(*self._converted(counts, n)))
    before = _train(measure="M1", counts="laplace", measure_impl="fused")  # the fused path is not reached
    assert eager.train_loss == before.train_loss and eager.val_acc_per_epoch == before.val_acc_per_epoch
    fused = _train(measure="M1", counts="laplace")
    assert fused.train_loss == pytest.approx(eager.train_loss, rel=1e-3)


def test_the_fused_path_is_left_to_eager_where_it_does_not_apply():
    model = set_measure_impl(build_model("digits_net", "M5", 10, (1, 8, 8), counts="freq"), "fused").double()
    x = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    eager = set_measure_impl(build_model("digits_net", "M5", 10, (1, 8, 8), counts="freq"), "eager").double()
    eager.load_state_dict(model.state_dict())
    assert torch.equal(model(x), eager(x))  # float64 counts: the eager measure, bit for bit


def test_bad_measure_impl_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown measure_impl 'numba'; choose one of fused, eager"):
        TrainConfig(measure_impl="numba").validate()
    with pytest.raises(ValueError, match="measure_impl"):
        set_measure_impl(build_model("digits_net", "M1", 10, (1, 8, 8)), "Fused")
    r = run_main(main, "--no-progress", "--measure-impl", "numba", "--out", tmp_path / "x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "invalid choice: 'numba'" in r.stderr
    assert not (tmp_path / "x").exists()


def test_a_checkpoint_without_the_key_resumes_eager_and_a_new_run_records_fused(tmp_path):
    out = tmp_path / "run"
    args = ["--no-progress", "--epochs", "2", "--train-size", "256", "--batch-size", "128", "--measure", "M1"]
    r = run_main(main, *args, "--epochs", "1", "--out", out, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["measure_impl"] == "fused"
    assert json.loads((out / "summary.json").read_text())["config"]["measure_impl"] == "fused"
    ckpt = load_checkpoint(str(out / CHECKPOINT))
    assert ckpt["config"]["measure_impl"] == "fused"
    del ckpt["config"]["measure_impl"]  # as a checkpoint written before the setting: trained eager
    torch.save(ckpt, out / CHECKPOINT)
    with pytest.raises(ValueError, match="it was trained with measure_impl='eager', not 'fused'"):
        train_model(TrainConfig.from_mapping({**ckpt["config"], "out_dir": str(out), "resume": True, "epochs": 2}))
    r = run_main(main, "--no-progress", "--resume", out, "--epochs", "2", "--json")
    assert r.returncode == 0, r.stderr  # continued eager, not refused
    assert json.loads(r.stdout.splitlines()[-1])["measure_impl"] == "eager"
    assert load_checkpoint(str(out / CHECKPOINT))["config"]["measure_impl"] == "eager"
    r = run_main(main, "--no-progress", "--resume", out, "--measure-impl", "fused")
    assert r.returncode == 2 and r.stderr.startswith("error: --resume and --measure-impl")
