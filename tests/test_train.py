"""Training: every CIFAR model trains, resume is exact, divergence and rejection are statuses,
and the command line fails with one line."""
import json
import os
import subprocess
import sys

import pytest
import torch
from _cli import run_main
from _tiny_cifar import ARCHIVE, make_cifar

from bnn.data import load_dataset
from bnn.train import PRESETS, TrainConfig, load_checkpoint, train_model

TIMING = {"images_per_s", "wall_s", "cpu_s"}
# 0/0 everywhere: U1..U4 = zero, B1 = B2 = x+y, B3 = x/y.
NAN_GENOME = "1-1-1-1-0-0-4"


def _strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def cifar_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    # 20 training images (4 of them validation), 4 test: one step per epoch at batch 16.
    make_cifar(root, "cifar10", per_batch=4)
    make_cifar(root, "cifar100", per_batch=4)
    return str(root)


def _cfg(cifar_dirs, **kw):
    base = dict(model="digits_net", dataset="cifar10", data_dir=cifar_dirs, val_size=4, epochs=1,
                batch_size=16, milestones=(), seed=0)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("model", ["resnet18", "resnet34", "vgg13", "nin"])
def test_each_cifar_model_trains_one_epoch_on_cpu(cifar_dirs, model, tmp_path):
    torch.set_num_threads(2)
    r = train_model(_cfg(cifar_dirs, model=model, out_dir=str(tmp_path)))
    assert r.status == "ok" and r.epochs == 1
    assert 0.0 <= r.val_acc <= 1.0 and 0.0 <= r.test_acc <= 1.0
    [row] = _metrics(tmp_path)
    assert set(row) >= {"epoch", "train_loss", "train_acc", "val_acc", "lr", "images_per_s", "wall_s", "status"}
    ckpt = load_checkpoint(os.path.join(tmp_path, "checkpoint.pt"))
    assert ckpt["model_config"]["arch"] == model and ckpt["data"]["class_names"][0] == "class0"
    assert len(ckpt["data"]["mean"]) == 3 and ckpt["status"] == "ok"


def test_cifar100_has_100_classes_and_top5(cifar_dirs):
    r = train_model(_cfg(cifar_dirs, dataset="cifar100", model="nin"))
    assert r.status == "ok" and r.test_top5 is not None and r.test_top5 >= r.test_acc


def test_resume_after_a_kill_reproduces_the_uninterrupted_metrics(cifar_dirs, tmp_path):
    cfg = dict(epochs=3, milestones=(2,), batch_size=8)  # crop, flip and an lr step all resumed
    full = train_model(_cfg(cifar_dirs, out_dir=str(tmp_path / "full"), **cfg))
    killed = train_model(_cfg(cifar_dirs, out_dir=str(tmp_path / "cut"), **cfg), _stop_after_epoch=1)
    assert killed.status == "running" and len(_metrics(tmp_path / "cut")) == 1
    resumed = train_model(_cfg(cifar_dirs, out_dir=str(tmp_path / "cut"), resume=True, **cfg))
    assert resumed.status == full.status == "ok"
    assert _strip(_metrics(tmp_path / "cut")) == _strip(_metrics(tmp_path / "full"))
    assert resumed.val_acc_per_epoch == full.val_acc_per_epoch and resumed.test_acc == full.test_acc
    a = load_checkpoint(str(tmp_path / "full" / "checkpoint.pt"))["model"]
    b = load_checkpoint(str(tmp_path / "cut" / "checkpoint.pt"))["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_same_seed_same_run_other_seed_other_run(cifar_dirs):
    a, b, c = (train_model(_cfg(cifar_dirs, seed=s, batch_size=8)) for s in (0, 0, 1))
    assert a.val_acc_per_epoch == b.val_acc_per_epoch and a.train_loss == b.train_loss
    assert a.train_loss != c.train_loss


def test_non_finite_loss_is_status_diverged(cifar_dirs, tmp_path):
    r = train_model(_cfg(cifar_dirs, measure=NAN_GENOME, epochs=3, out_dir=str(tmp_path)))
    assert r.status == "diverged" and r.epochs == 1
    [row] = _metrics(tmp_path)
    assert row["status"] == "diverged" and row["train_loss"] is None
    assert json.load(open(tmp_path / "summary.json"))["status"] == "diverged"


def test_low_first_epoch_accuracy_is_status_rejected(cifar_dirs):
    r = train_model(_cfg(cifar_dirs, epochs=3), reject_below=1.01)
    assert r.status == "rejected" and r.epochs == 1 and r.test_acc is None
    assert len(r.val_acc_per_epoch) == 1


def test_preloaded_data_is_reused_and_must_match_the_config(cifar_dirs):
    data = load_dataset("cifar10", cifar_dirs, val_size=4)
    r = train_model(_cfg(cifar_dirs), data=data)
    assert r.status == "ok"
    with pytest.raises(ValueError, match="preloaded"):
        train_model(_cfg(cifar_dirs, dataset="cifar100"), data=data)
    with pytest.raises(ValueError, match="validation"):
        train_model(_cfg(cifar_dirs, val_size=6), data=data)


def test_presets_hold_the_papers_settings():
    assert PRESETS["paper-eval"] == dict(epochs=300, batch_size=128, lr=5e-3, milestones=(80, 150, 200, 240, 270), gamma=0.2)
    assert PRESETS["fitness"] == dict(epochs=15, batch_size=128, lr=5e-3, milestones=(), gamma=0.2)
    cfg = TrainConfig.from_preset("paper-eval", model="resnet18", dataset="cifar10")
    assert cfg.epochs == 300 and cfg.milestones == (80, 150, 200, 240, 270)


# --- the command line: in this process (tests/_cli.py), in subprocesses where one is killed --------


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "bnn.train", "--no-progress", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


def _cli_here(*args):
    from bnn.train import main

    return run_main(main, "--no-progress", *args)


def _assert_one_line_error(proc, *words):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    for w in words:
        assert w in lines[0]


def test_cli_missing_data_dir(tmp_path):
    proc = _cli_here("--dataset", "cifar10", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o"))
    _assert_one_line_error(proc, "cifar-10-python.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar.html")


def test_cli_corrupt_archive(tmp_path):
    (tmp_path / ARCHIVE["cifar100"]).write_bytes(b"\x1f\x8b\x08 broken gzip")
    proc = _cli_here("--dataset", "cifar100", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o"))
    _assert_one_line_error(proc, "cifar-100-python.tar.gz")


def test_cli_unknown_model_and_measure(tmp_path):
    _assert_one_line_error(_cli_here("--model", "resnet99", "--out", str(tmp_path)), "resnet99")
    _assert_one_line_error(_cli_here("--measure", "M42", "--out", str(tmp_path)), "M42")
    _assert_one_line_error(_cli_here("--epochs", "many"), "--epochs")


def test_cli_kill_and_resume_across_processes_with_json(cifar_dirs, tmp_path):
    common = ["--dataset", "cifar10", "--data-dir", cifar_dirs, "--model", "digits_net", "--val-size", "4",
              "--epochs", "2", "--batch-size", "16"]
    full = _cli(*common, "--out", str(tmp_path / "full"), "--json")
    assert full.returncode == 0, full.stderr
    killed = _cli(*common, "--out", str(tmp_path / "cut"), env={"BNN_TRAIN_KILL_AFTER_EPOCH": "1"})
    assert killed.returncode == 137 and not (tmp_path / "cut" / "summary.json").exists()
    resumed = _cli("--resume", str(tmp_path / "cut"), "--json")
    assert resumed.returncode == 0, resumed.stderr
    a, b = json.loads(full.stdout.splitlines()[-1]), json.loads(resumed.stdout.splitlines()[-1])
    assert a["status"] == "ok" and a["epochs"] == 2
    assert {k: a[k] for k in ("val_acc", "test_acc", "epochs")} == {k: b[k] for k in ("val_acc", "test_acc", "epochs")}
    assert _strip(_metrics(tmp_path / "cut")) == _strip(_metrics(tmp_path / "full"))


def test_cli_diverged_run_exits_cleanly_with_status(cifar_dirs, tmp_path):
    proc = _cli_here("--dataset", "cifar10", "--data-dir", cifar_dirs, "--model", "digits_net", "--val-size", "4",
                     "--epochs", "2", "--measure", NAN_GENOME, "--out", str(tmp_path), "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["status"] == "diverged" and summary["test_acc"] is None
    assert set(summary) >= {"status", "epochs", "val_acc", "test_acc", "wall_s"}


def test_the_count_convention_is_recorded_and_a_resume_cannot_change_it(cifar_dirs, tmp_path):
    out = str(tmp_path / "run")
    proc = _cli_here("--dataset", "cifar10", "--data-dir", cifar_dirs, "--model", "digits_net", "--val-size", "4",
                     "--epochs", "1", "--batch-size", "16", "--counts", "laplace", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["counts"] == "laplace"
    ckpt = load_checkpoint(os.path.join(out, "checkpoint.pt"))
    assert ckpt["config"]["counts"] == ckpt["model_config"]["counts"] == "laplace"
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["config"]["counts"] == "laplace"
    _assert_one_line_error(_cli_here("--resume", out, "--counts", "raw"), "--counts")
    _assert_one_line_error(_cli_here("--counts", "fraq", "--out", str(tmp_path / "x")), "fraq")
    with pytest.raises(ValueError, match="counts='laplace', not 'freq'"):
        train_model(_cfg(cifar_dirs, out_dir=out, resume=True, epochs=2, counts="freq"))
