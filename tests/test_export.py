"""bnn.export: the .bnn file holds what the engine needs, packed and folded as docs/design.md and torch say."""
import hashlib
import io
import json
import os
import shlex

import numpy as np
import pytest
import torch
from _cli import run_main
from _engine_models import fresh_model
from safetensors.numpy import load_file

from bnn.export import export_model, fold_batchnorm
from bnn.nn.layers import BinaryConv2d
from bnn.train import TrainConfig, train_model
from refimpl.engine.float_kernels import affine_sign_word
from refimpl.engine.format import FORMAT, VERSION
from refimpl.kernels.bits import unpack_bits


def _meta(path):
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        return json.loads(f.metadata()[FORMAT])


def test_folded_batchnorm_reproduces_torch_eval_bit_for_bit():
    torch.manual_seed(3)
    bn = torch.nn.BatchNorm2d(48).eval()
    with torch.no_grad():
        bn.running_mean.normal_(0, 20)
        bn.running_var.uniform_(0.01, 400)
        bn.weight.uniform_(-2, 2)
        bn.bias.normal_(0, 3)
        x = torch.randn(4, 48, 9, 7) * 30
        expected = bn(x).numpy()
    scale, shift = fold_batchnorm(bn)
    y = np.ascontiguousarray(x.numpy().reshape(4, 48, -1).transpose(0, 2, 1))  # channels last, as the engine
    for row in y.reshape(-1, 48):  # the stem's per-pixel BatchNorm + sign step
        word = affine_sign_word(row, scale, shift, 0, 48)
        assert word == sum(1 << c for c in range(48) if row[c] >= 0)
    # Bit for bit, not approximately: one ulp across zero would flip the next layer's sign bit.
    got = y.transpose(0, 2, 1).reshape(expected.shape)
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint32), expected.view(np.uint32))


def test_weights_are_packed_ohwi_with_bit_one_for_nonnegative(tmp_path):
    x = torch.randn(8, 1, 8, 8)
    model = fresh_model("digits_net", "baseline", (1, 8, 8), x)
    conv = model.body[1].conv
    with torch.no_grad():
        conv.weight[0, :5, 0, 0] = 0.0  # sign(0) = +1 (docs/design.md section 1)
    path = tmp_path / "m.bnn"
    export_model(model, str(path))
    bits = load_file(str(path))["body.1.conv.bits"]
    w = conv.weight.detach().numpy()
    assert bits.dtype == np.uint64 and bits.shape == (64, 3, 3, 1)
    expected = np.moveaxis(w, 1, -1) >= 0  # OIHW -> OHWI, bit 1 = +1
    np.testing.assert_array_equal(unpack_bits(bits, 64), expected)


def test_tail_bits_past_the_channels_are_zero(tmp_path):
    # NIN has 192 -> 160 -> 96 channels: 160 and 96 are not multiples of 64.
    x = torch.randn(2, 3, 32, 32)
    model = fresh_model("nin", "baseline", (3, 32, 32), x)
    path = tmp_path / "nin.bnn"
    export_model(model, str(path))
    bits = load_file(str(path))["body.1.conv.bits"]  # 160 input channels: 3 words, 32 tail bits
    assert bits.shape[-1] == 3
    assert not np.any(bits[..., -1] >> np.uint64(32))


def test_metadata_describes_the_network_in_execution_order(tmp_path):
    x = torch.randn(4, 3, 32, 32)
    model = fresh_model("resnet18", "M7", (3, 32, 32), x)
    path = tmp_path / "r.bnn"
    meta = export_model(model, str(path), mean=[1, 2, 3], std=[4, 5, 6], class_names=list("abcdefghij"),
                        source_sha256="ab" * 32)
    assert _meta(path) == meta
    assert (meta["format"], meta["version"], meta["genome"]) == (FORMAT, VERSION, "3-15-3-0-0-0-4")
    assert meta["class_names"] == list("abcdefghij") and meta["input"]["mean"] == [1, 2, 3]
    ops = [layer["op"] for layer in meta["layers"]]
    assert ops == ["stem"] + ["binary_unit"] * 16 + ["global_avgpool", "linear"]
    residuals = [layer["residual"] for layer in meta["layers"][1:17]]
    assert residuals.count("down") == 3 and residuals.count("identity") == 13
    tensors = load_file(str(path))
    binary = [m for m in model.modules() if isinstance(m, BinaryConv2d)]
    assert sum(k.endswith(".bits") for k in tensors) == len(binary) == 19
    alpha = tensors["body.0.conv.alpha"]
    assert alpha.dtype == np.float32 and alpha.shape == (4, 64)
    np.testing.assert_array_equal(alpha, model.body[0].conv.alpha.detach().numpy())


def test_binary_layers_take_at_most_a_25th_of_their_float32_size(tmp_path):
    x = torch.randn(2, 3, 32, 32)
    model = fresh_model("resnet18", "baseline", (3, 32, 32), x)
    path = tmp_path / "r.bnn"
    export_model(model, str(path))
    tensors = load_file(str(path))
    packed = sum(v.nbytes for k, v in tensors.items() if k.endswith(".bits"))
    as_float = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, BinaryConv2d))
    assert packed * 25 <= as_float, (packed, as_float)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    # The whole file, float stem/classifier/BN/alpha included, is far below the state_dict.
    assert os.path.getsize(path) * 10 < buf.getbuffer().nbytes


def _cli_here(*args):
    """bnn.export's main in this process (tests/_cli.py)."""
    from bnn.export import main

    return run_main(main, *args)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    torch.set_num_threads(2)
    r = train_model(TrainConfig(epochs=1, out_dir=str(out), eval_test=False))
    assert r.status == "ok"
    return os.path.join(out, "checkpoint.pt")


def test_export_cli_writes_the_checkpoint_hash_and_leaves_no_temp_file(checkpoint, tmp_path):
    out = tmp_path / "model.bnn"
    r = _cli_here(checkpoint, "-o", out)
    assert r.returncode == 0, r.stderr
    meta = _meta(out)
    with open(checkpoint, "rb") as f:
        assert meta["source_sha256"] == hashlib.sha256(f.read()).hexdigest()
    assert meta["arch"] == "digits_net" and meta["dataset"] == "digits"
    assert meta["input"]["mean"] == [4.884] and meta["input"]["pixel_max"] == 16
    assert os.listdir(tmp_path) == ["model.bnn"]
    # the hint it prints is a command that works on the file it wrote
    from refimpl.infer import main as infer_main

    summary = shlex.split(r.stdout.splitlines()[-1].split("costs: ", 1)[1])
    assert summary[:3] == ["python", "-m", "refimpl.infer"] and summary[-1] == "--summary"
    shown = run_main(infer_main, *summary[3:])
    assert shown.returncode == 0 and "digits_net" in shown.stdout and "Total:" in shown.stdout


@pytest.mark.parametrize("case", ["missing", "garbage"])
def test_export_cli_bad_checkpoint_is_one_line(case, tmp_path):
    src = tmp_path / "ckpt.pt"
    if case == "garbage":
        src.write_bytes(b"not a checkpoint")
    r = _cli_here(src, "-o", tmp_path / "m.bnn")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in r.stderr
    assert not (tmp_path / "m.bnn").exists()


def test_export_cli_help():
    r = _cli_here("--help")
    assert r.returncode == 0 and "CHECKPOINT" in r.stdout.upper()


def test_the_count_convention_is_in_the_file_and_sets_its_version(tmp_path):
    from refimpl.engine.format import COUNTS_VERSION
    from refimpl.engine.model_file import ModelFileError, describe

    x = torch.randn(4, 1, 8, 8)
    for counts, version in (("raw", VERSION), ("laplace", COUNTS_VERSION)):
        model = fresh_model("digits_net", "M1", (1, 8, 8), x)
        for m in model.modules():
            if isinstance(m, BinaryConv2d):
                m.counts = counts
        model.config["counts"] = counts
        meta = export_model(model, str(tmp_path / f"{counts}.bnn"))
        assert (meta["counts"], meta["version"]) == (counts, version)
        tensors = load_file(str(tmp_path / f"{counts}.bnn"))
        assert describe(meta, tensors, "m").counts == counts
        older = {k: v for k, v in meta.items() if k != "counts"}  # a file from before conventions
        if counts == "raw":
            assert describe(older, tensors, "m").counts == "raw"
        else:
            with pytest.raises(ModelFileError, match="version 2 does not go with counts 'raw'"):
                describe(older, tensors, "m")
    model.config["counts"] = "raw"  # its layers are laplace
    with pytest.raises(ValueError, match="counts='raw', which its binary layers do not all use"):
        export_model(model, str(tmp_path / "mixed.bnn"))
    assert not (tmp_path / "mixed.bnn").exists()
