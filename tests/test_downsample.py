"""docs/design.md section 6 downsampling: ``binary`` (the paper's text) or ``real`` (Bi-Real), through the models,
training, checkpoints, export and the CPU engine.

Oracles: hand-written expected module types and shapes; torch's own functional ops
(``avg_pool2d``, ``conv2d``, ``batch_norm``) for the real shortcut's value; the PyTorch model in
eval mode for the engine's logits and counts.
"""
import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _engine_models import assert_logits_close, fresh_model, torch_logits
from safetensors import safe_open
from safetensors.numpy import load_file
from test_infer import _assert_counts_identical, _infer_here, _last_json, _rewrite
from torch import nn

from bnn.export import export_checkpoint, export_model
from bnn.nn.layers import BinaryConv2d
from bnn.nn.models import MODELS, BinaryUnit, build_model
from refimpl import engine
from refimpl.engine.format import FORMAT
from verify.nets import downsampling_net

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
    from bnn.search.fitness import Worker
    from bnn.search.loop import SearchConfig

    seen = []

    def fake_train(cfg, data=None, **kw):
        seen.append(cfg.downsample)
        return bnn.train.TrainResult(status="ok", val_acc=0.5, val_acc_per_epoch=[0.5], epochs=1)

    monkeypatch.setattr(bnn.train, "train_model", fake_train)
    for kind in ("real", "binary"):
        train = SearchConfig(downsample=kind, epochs=1, device="cpu").train_dict()
        worker = Worker("train", train)
        worker._data = {train.get("train_size"): object()}  # the fake training reads no data
        assert worker.run({"genome": "0-0-0-0-0-0-1"})["status"] == "ok"
    assert seen == ["real", "binary"]


# ---------------------------------------------------------------------------------------------
# Export and the CPU engine


def _smooth(n, shape, seed):
    # Blurred noise: images with structure, so activations are not all near zero.
    torch.manual_seed(seed)
    c, h, w = shape
    return F.avg_pool2d(torch.randn(n, c, h + 4, w + 4), 5, stride=1)[:, :, :h, :w] * 3


def _meta(path):
    with safe_open(str(path), "np") as f:
        return json.loads(f.metadata()[FORMAT])


@pytest.fixture(scope="module")
def real_file(tmp_path_factory):
    """A real-downsampling net on odd 14x14 maps, exported once: (model, path, images)."""
    x = _smooth(24, (1, 14, 14), seed=3)
    model = fresh_model("downsampling_net", "baseline", (1, 14, 14), x[:16], seed=1, downsample="real")
    path = tmp_path_factory.mktemp("real") / "real.bnn"
    export_model(model, str(path))
    return model, path, x


def test_export_writes_the_kind_and_each_real_shortcut(real_file):
    model, path, _ = real_file
    meta, tensors = _meta(path), load_file(str(path))
    assert meta["downsample"] == "real" and meta["version"] == 1
    units = [layer for layer in meta["layers"] if layer["op"] == "binary_unit"]
    # verify/nets.py: stride 1 same width, stride 2 + width, same, width alone, stride 2 alone, stride 2 + width.
    assert [u["residual"] for u in units] == ["identity", "real", "identity", "real", "real", "real"]
    assert [u["shortcut"]["pool"] for u in units if "shortcut" in u] == [[2, 2], [1, 1], [2, 2], [2, 2]]
    assert not any("down" in u for u in units) and not any(k.endswith(".bits") and "down" in k for k in tensors)
    unit = model.body[1]
    prefix = units[1]["shortcut"]["tensors"]
    np.testing.assert_array_equal(tensors[f"{prefix}.weight"], unit.down_conv.weight.detach().numpy())
    # The folded BatchNorm against its definition in float64 (rounding only).
    bn = unit.down_bn
    scale = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach().double().numpy()
    shift = bn.bias.detach().double().numpy() - bn.running_mean.double().numpy() * scale
    np.testing.assert_allclose(tensors[f"{prefix}.scale"], scale, rtol=1e-6)
    np.testing.assert_allclose(tensors[f"{prefix}.shift"], shift, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["binary", "real"])
@pytest.mark.parametrize("measure", ["baseline", "M5"])
def test_engine_matches_torch_with_either_kind_on_odd_maps(kind, measure, tmp_path):
    x = _smooth(24, (1, 14, 14), seed=5)
    model = fresh_model("downsampling_net", measure, (1, 14, 14), x[:16], seed=2, downsample=kind)
    expected = torch_logits(model, x.numpy())
    if not np.isfinite(expected).all():
        # docs/design.md section 6: M5 is inf where a binary 1x1 window has a = 0; the real shortcut avoids it.
        assert (kind, measure) == ("binary", "M5")
        return
    path = tmp_path / "m.bnn"
    export_model(model, str(path))
    cpu = engine.load(str(path))
    assert cpu.downsample == kind
    assert_logits_close(cpu.run(x.numpy().copy()), expected)
    if measure == "baseline":
        _assert_counts_identical(model, cpu, x.numpy()[:4].copy())


def test_a_file_without_the_key_loads_as_binary(tmp_path):
    x = _smooth(16, (1, 8, 8), seed=6)
    model = fresh_model("downsampling_net", "baseline", (1, 8, 8), x)
    new, old = tmp_path / "new.bnn", tmp_path / "old.bnn"
    export_model(model, str(new))
    _rewrite(new, old, edit_meta=lambda m: m.pop("downsample"))  # as written before the option
    assert "downsample" not in _meta(old)
    cpu = engine.load(str(old))
    assert cpu.downsample == "binary"
    np.testing.assert_array_equal(cpu.run(x.numpy().copy()), engine.load(str(new)).run(x.numpy().copy()))


def _set_kind(kind):
    return lambda m: m.update(downsample=kind)


def _shortcut(key, value):
    return lambda m: m["layers"][2]["shortcut"].update({key: value})


@pytest.mark.parametrize("edit_meta,edit_tensors,needle", [
    (_set_kind("binary"), None, "a 'real' shortcut in a file whose downsample is 'binary'"),
    (_set_kind("avg"), None, "downsample must be binary or real, got 'avg'"),
    (_shortcut("pool", [2]), None, "'pool' must be a pair of integers"),
    (_shortcut("pool", [0, 0]), None, "'pool' must be positive"),
    (_shortcut("in_channels", 7), None, "takes 7 channels, the previous layer gives 32"),
    (_shortcut("out_channels", 7), None, "gives 7 channels, the unit's conv gives 64"),
    (lambda m: m["layers"][2].pop("shortcut"), None, "shortcut: missing description"),
    (None, lambda t: t.pop("body.1.down_conv.shift"), "tensor 'body.1.down_conv.shift' is missing"),
    (None, lambda t: t.update({"body.1.down_conv.weight": np.zeros((64, 32), np.float32)}), "metadata implies"),
])
def test_bad_real_shortcut_fields_are_one_line_errors(real_file, tmp_path, edit_meta, edit_tensors, needle):
    bad = tmp_path / "bad.bnn"
    _rewrite(real_file[1], bad, edit_meta, edit_tensors)
    with pytest.raises(engine.ModelFileError, match=re.escape(needle)):
        engine.load(str(bad))


def test_a_binary_file_may_not_hold_a_real_shortcut_nor_a_real_one_a_binary(tmp_path):
    x = _smooth(8, (1, 8, 8), seed=7)
    binary = fresh_model("downsampling_net", "baseline", (1, 8, 8), x)
    export_model(binary, str(tmp_path / "b.bnn"))
    bad = tmp_path / "bad.bnn"
    _rewrite(tmp_path / "b.bnn", bad, _set_kind("real"))
    with pytest.raises(engine.ModelFileError, match="a 'down' shortcut in a file whose downsample is 'real'"):
        engine.load(str(bad))
    binary.config["downsample"] = "real"  # a config that lies about the shortcuts is refused at export
    with pytest.raises(ValueError, match="model.config says downsample='real'"):
        export_model(binary, str(tmp_path / "lie.bnn"))
    assert not (tmp_path / "lie.bnn").exists()


# ---------------------------------------------------------------------------------------------
# Training, the checkpoint and the exported file keep the kind


def test_train_real_one_epoch_then_export_and_engine_agree(tmp_path, monkeypatch, capsys):
    import bnn.train
    from bnn.data import load_dataset
    from bnn.nn.models import MODELS

    # A digits-sized net with downsampling units (digits_net keeps its width and size).
    monkeypatch.setitem(MODELS, "downsampling_net", downsampling_net)
    out = tmp_path / "run"
    argv = ["--model", "downsampling_net", "--downsample", "real", "--epochs", "1", "--out", str(out),
            "--json", "--no-progress"]
    assert bnn.train.main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["downsample"] == "real" and summary["status"] == "ok"
    assert json.loads((out / "summary.json").read_text())["config"]["downsample"] == "real"
    ckpt = bnn.train.load_checkpoint(str(out / "checkpoint.pt"))
    assert ckpt["model_config"]["downsample"] == ckpt["config"]["downsample"] == "real"
    meta = export_checkpoint(str(out / "checkpoint.pt"), str(tmp_path / "m.bnn"))
    assert meta["downsample"] == "real"
    model = build_model(**ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    model.eval()
    assert isinstance(model.body[1].down_pool, nn.AvgPool2d)
    data = load_dataset("digits")
    x = data.normalize(data.test_x).numpy()
    logits = engine.load(str(tmp_path / "m.bnn")).run(x)
    assert_logits_close(logits, torch_logits(model, x))
    assert float((logits.argmax(1) == data.test_y.numpy()).mean()) == pytest.approx(summary["test_acc"], abs=1e-12)


def test_a_checkpoint_from_before_the_option_exports_binary(tmp_path):
    model = build_model("digits_net", "baseline", 10, (1, 8, 8))
    config = {k: v for k, v in model.config.items() if k != "downsample"}
    ckpt = {"format": "bnn-train-checkpoint", "model_config": config, "data": {},
            "model": model.state_dict()}
    torch.save(ckpt, tmp_path / "old.pt")
    meta = export_checkpoint(str(tmp_path / "old.pt"), str(tmp_path / "old.bnn"))
    assert meta["downsample"] == "binary"


def test_infer_runs_a_real_file_and_says_so(real_file, tmp_path):
    model, path, x = real_file
    np.save(tmp_path / "x.npy", x.numpy())
    r = _infer_here(path, "--input", tmp_path / "x.npy", "--normalized", "--json", "--out", tmp_path / "p.npy")
    assert r.returncode == 0, r.stderr
    assert _last_json(r.stdout)["downsample"] == "real"
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), torch_logits(model, x.numpy()).argmax(1))
