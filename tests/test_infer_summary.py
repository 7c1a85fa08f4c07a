"""``refimpl.infer MODEL.bnn --summary``: each layer's output and costs, checked against the PyTorch
model the file was exported from (forward hooks on its convolutions and classifier count the
multiply-accumulates and measure evaluations on the shapes torch actually made)."""
import json
import math

import numpy as np
import pytest
import torch
from _cli import run_main
from _engine_models import fresh_model

from bnn.export import export_model
from bnn.nn.layers import BinaryConv2d
from refimpl.engine import summary
from refimpl.engine.model_file import describe, read


def _torch_costs(model, x) -> dict:
    """The costs counted on torch's own modules and output shapes, independently of the file."""
    got = {"binary_macs": 0, "float_macs": 0, "measures": 0, "binary_weights": 0, "bit_bytes": 0, "outputs": []}

    def hook(module, inputs, out):
        if isinstance(module, torch.nn.Linear):
            got["float_macs"] += module.in_features * module.out_features
            return
        per_image = out.shape[1] * out.shape[2] * out.shape[3]
        kh, kw = module.weight.shape[2:]
        macs = per_image * module.in_channels * kh * kw
        if isinstance(module, BinaryConv2d):
            got["binary_macs"] += macs
            got["measures"] += per_image
            got["binary_weights"] += module.weight.numel()
            got["bit_bytes"] += module.out_channels * kh * kw * math.ceil(module.in_channels / 64) * 8
            got["outputs"].append(list(out.shape[1:]))
        else:
            got["float_macs"] += macs

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (BinaryConv2d, torch.nn.Conv2d, torch.nn.Linear))]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return got


@pytest.mark.parametrize("arch, shape, downsample", [
    ("digits_net", (1, 8, 8), "binary"),
    ("resnet18", (3, 16, 16), "binary"),  # binary 1x1 shortcuts
    ("resnet18", (3, 16, 16), "real"),    # Bi-Real shortcuts: float 1x1 convolutions after an average pool
    ("nin", (3, 16, 16), "binary"),       # pools between the binary units
])
def test_summary_counts_what_the_torch_model_computes(arch, shape, downsample, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, *shape)
    model = fresh_model(arch, "M6", shape, x, downsample=downsample)
    export_model(model, str(tmp_path / "m.bnn"))
    d = describe(*read(str(tmp_path / "m.bnn")), "m.bnn")
    want = _torch_costs(model.eval(), x[:1])
    table = summary.rows(d)
    t = summary.totals(table)
    for key in ("binary_macs", "float_macs", "measures", "binary_weights", "bit_bytes"):
        assert t[key] == want[key], key
    # a binary unit's output is its conv's (a down shortcut makes the same map)
    units = [r["output"] for r in table if r["kind"].startswith("binary")]
    assert all(u in want["outputs"] for u in units) and units[-1] == want["outputs"][-1]
    assert table[-1]["output"] == [10, 1, 1] and t["float32_bytes"] == 4 * (t["binary_weights"] + t["float_weights"])
    assert t["bytes"] == t["bit_bytes"] + t["float_bytes"] < t["float32_bytes"]


@pytest.fixture(scope="module")
def digits_file(tmp_path_factory):
    torch.manual_seed(0)
    x = torch.randn(8, 1, 8, 8)
    path = tmp_path_factory.mktemp("summary") / "digits.bnn"
    export_model(fresh_model("digits_net", "baseline", (1, 8, 8), x), str(path))
    return path


def test_the_command_prints_a_row_per_layer_the_totals_and_json(digits_file):
    from refimpl.infer import main

    r = run_main(main, digits_file, "--summary", "--json")
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    costs = json.loads(lines[-1])
    d = describe(*read(str(digits_file)), "digits")
    assert (costs["downsample"], costs["counts"], costs["genome"]) == ("binary", "raw", "0-0-0-0-0-0-1")
    assert [row["name"] for row in costs["layers"]] == [row["name"] for row in summary.rows(d)]
    assert lines[2].split()[:3] == ["layer", "kind", "output"]
    assert sum(line.startswith(row["name"] + " ") for line in lines for row in costs["layers"]) == len(d.layers)
    # digits_net by hand: a 3x3 stem 1 -> 64 on 8x8, three 3x3 binary units 64 -> 64, a 64 -> 10 classifier
    assert costs["totals"]["float_macs"] == 64 * 64 * 9 + 64 * 10
    assert costs["totals"]["binary_macs"] == 3 * 64 * 64 * 64 * 9 and costs["totals"]["measures"] == 3 * 64 * 64
    assert any(line.startswith("Total: 7.08 M 1-bit MACs, 37.50 k 32-bit MACs") for line in lines)


@pytest.mark.parametrize("extra", [["--out", "p.npy"], ["--labels", "y.npy"], ["--normalized"], ["--download"]])
def test_summary_refuses_what_only_a_run_takes(digits_file, tmp_path, monkeypatch, extra):
    from refimpl.infer import main

    monkeypatch.chdir(tmp_path)
    r = run_main(main, digits_file, "--summary", *extra)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1 and extra[0] in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_summary_of_a_damaged_file_is_one_line(tmp_path):
    from refimpl.infer import main

    (tmp_path / "bad.bnn").write_bytes(np.arange(64, dtype=np.uint8).tobytes())
    r = run_main(main, tmp_path / "bad.bnn", "--summary")
    assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.splitlines()) == 1


def test_a_loaded_model_prints_the_same_summary_as_the_command(digits_file):
    from refimpl import engine
    from refimpl.infer import main

    shown = run_main(main, digits_file, "--summary").stdout
    assert engine.load(str(digits_file)).summary() == shown
