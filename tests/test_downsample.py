"""SPEC §6 downsampling: ``binary`` (the paper's text) or ``real`` (Bi-Real), through the models,
training, checkpoints, export and the CPU engine.

Oracles: hand-written expected module types and shapes; torch's own functional ops
(``avg_pool2d``, ``conv2d``, ``batch_norm``) for the real shortcut's value; the PyTorch model in
eval mode for the engine's logits and counts.
"""
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bnn.layers import BinaryConv2d
from bnn.models import MODELS, BinaryUnit, build_model

# ---------------------------------------------------------------------------------------------
# The unit and the builders


def test_unknown_downsample_is_a_value_error_naming_the_valid_kinds():
    with pytest.raises(ValueError, match="unknown downsample 'avg'; choose one of binary, real"):
        BinaryUnit(8, 16, 3, 2, 1, residual=True, downsample="avg")
    with pytest.raises(ValueError, match="choose one of binary, real"):
        build_model("digits_net", downsample="Real")


@pytest.mark.parametrize("in_ch,out_ch,stride,size,pooled", [
    (8, 16, 2, 7, True),  # odd map: the pool's ceil mode gives 4x4, as the stride-2 conv does
    (8, 16, 2, 8, True),
    (8, 16, 1, 6, False),  # only the width changes: no pool
    (8, 8, 2, 5, True),
])
def test_real_shortcut_is_avgpool_then_float_1x1_conv_then_batchnorm(in_ch, out_ch, stride, size, pooled):
    torch.manual_seed(0)
    unit = BinaryUnit(in_ch, out_ch, 3, stride, 1, residual=True, downsample="real")
    assert type(unit.down_conv) is nn.Conv2d and unit.down_conv.kernel_size == (1, 1)
    assert unit.down_conv.stride == (1, 1) and unit.down_conv.bias is None
    assert (unit.down_pool is not None) == pooled
    with torch.no_grad():
        unit.down_bn.running_mean.uniform_(-1, 1)
        unit.down_bn.running_var.uniform_(0.5, 2)
    unit.eval()
    x = torch.randn(3, in_ch, size, size)
    with torch.no_grad():
        got = unit(x)
        main = unit.bn(unit.conv(x))
        # Independent: the functional ops, a partial window averaged over its in-bounds pixels.
        pooled_x = F.avg_pool2d(x, stride, stride, ceil_mode=True) if stride > 1 else x
        short = F.batch_norm(F.conv2d(pooled_x, unit.down_conv.weight), unit.down_bn.running_mean,
                             unit.down_bn.running_var, unit.down_bn.weight, unit.down_bn.bias, eps=unit.down_bn.eps)
    out_size = -(-size // stride)
    assert got.shape == (3, out_ch, out_size, out_size)
    torch.testing.assert_close(got, main + short, rtol=0, atol=0)
    if size % 2 and stride == 2:  # the corner pixel of an odd map is its own window
        torch.testing.assert_close(pooled_x[:, :, -1, -1], x[:, :, -1, -1])


def test_binary_shortcut_is_a_binary_1x1_conv_with_the_stride():
    unit = BinaryUnit(8, 16, 3, 2, 1, residual=True)  # the default
    assert unit.downsample == "binary" and unit.down_pool is None
    assert isinstance(unit.down_conv, BinaryConv2d) and unit.down_conv.stride in (2, (2, 2))


@pytest.mark.parametrize("arch", ["resnet18", "resnet34"])
def test_resnet_real_has_three_float_downsampling_convs_and_no_binary_ones(arch):
    binary, real = build_model(arch), build_model(arch, downsample="real")
    kinds = {}
    for name, model in (("binary", binary), ("real", real)):
        units = [u for u in model.body if u.down_conv is not None]
        kinds[name] = [(type(u.down_conv).__name__, u.down_pool is not None) for u in units]
    assert kinds["binary"] == [("BinaryConv2d", False)] * 3
    assert kinds["real"] == [("Conv2d", True)] * 3  # the 64->128, 128->256, 256->512 units
    float_convs = [m for m in real.modules() if type(m) is nn.Conv2d]
    assert len(float_convs) == 1 + 3  # the stem and the three shortcuts


@pytest.mark.parametrize("arch", list(MODELS))
@pytest.mark.parametrize("kind", ["binary", "real"])
def test_build_model_from_config_rebuilds_the_same_model(arch, kind):
    shape = (1, 8, 8) if arch == "digits_net" else (3, 32, 32)
    model = build_model(arch, "M5", 7, shape, downsample=kind)
    assert model.config["downsample"] == kind
    again = build_model(**model.config)
    assert again.config == model.config
    assert [(n, p.shape) for n, p in again.state_dict().items()] == [(n, p.shape) for n, p in model.state_dict().items()]


def test_a_config_without_the_key_builds_binary():
    # Checkpoints written before the option have no "downsample" in their model_config.
    config = {"arch": "resnet18", "measure": "baseline", "num_classes": 10, "input_shape": [3, 16, 16]}
    model = build_model(**config)
    assert model.config["downsample"] == "binary"
    assert all(isinstance(u.down_conv, BinaryConv2d) for u in model.body if u.down_conv is not None)


# ---------------------------------------------------------------------------------------------
# The search: --downsample is part of the fitness setting

_SYN = ["--fitness", "synthetic:2", "--population", "4", "--epochs", "2", "--thresholds", "0.2",
        "--max-evaluations", "12", "--max-trainings", "100", "--no-progress"]


def test_search_records_the_kind_and_keeps_it_on_resume(tmp_path, capsys):
    from bnn.search.cli import main

    run = tmp_path / "run"
    assert main([*_SYN, "--downsample", "real", "--run-dir", str(run)]) == 0
    assert json.loads((run / "results.json").read_text())["config"]["downsample"] == "real"
    start = json.loads((run / "journal.jsonl").read_text().splitlines()[0])
    assert start["config"]["downsample"] == "real"
    capsys.readouterr()
    # The kind defines the search: a resume may not change it.
    assert main(["--resume", str(run), "--downsample", "binary"]) == 2
    assert "downsample is 'real' in the journal" in capsys.readouterr().err
    assert main(["--resume", str(run), "--max-evaluations", "14", "--no-progress"]) == 0
    assert json.loads((run / "results.json").read_text())["config"]["downsample"] == "real"


def test_search_rejects_an_unknown_kind_in_one_line(tmp_path, capsys):
    from bnn.search.cli import main

    assert main([*_SYN, "--downsample", "avg", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid choice: 'avg'" in err[0]
    assert not (tmp_path / "r").exists()


def test_a_journal_from_before_the_option_is_binary_for_reuse(tmp_path, capsys):
    from bnn.search.cli import main

    old = tmp_path / "old"
    assert main([*_SYN, "--run-dir", str(old)]) == 0
    lines = (old / "journal.jsonl").read_text().splitlines()
    start = json.loads(lines[0])
    del start["config"]["downsample"]  # as written before the option existed
    (old / "journal.jsonl").write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    assert main([*_SYN, "--reuse", str(old), "--run-dir", str(tmp_path / "binary")]) == 0
    capsys.readouterr()
    assert main([*_SYN, "--downsample", "real", "--reuse", str(old), "--run-dir", str(tmp_path / "real")]) == 2
    assert "its downsample is 'binary', this search's is 'real'" in capsys.readouterr().err


def test_fitness_worker_trains_with_the_search_kind(monkeypatch):
    import bnn.train
    from bnn.search.engine import SearchConfig
    from bnn.search.fitness import Worker

    seen = []

    def fake_train(cfg, data=None, **kw):
        seen.append(cfg.downsample)
        return bnn.train.TrainResult(status="ok", val_acc=0.5, val_acc_per_epoch=[0.5], epochs=1)

    monkeypatch.setattr(bnn.train, "train_model", fake_train)
    for kind in ("real", "binary"):
        worker = Worker("train", SearchConfig(downsample=kind, epochs=1, device="cpu").train_dict())
        worker._data = object()  # the fake training reads no data
        assert worker.run({"genome": "0-0-0-0-0-0-1"})["status"] == "ok"
    assert seen == ["real", "binary"]
