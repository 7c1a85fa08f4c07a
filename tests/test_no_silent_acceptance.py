"""Inputs that used to be accepted without a word (issue 18 item 11, and REFIMPL_ISA): Unicode
digits in genome text, non-integer geometry in both paths, export of a model the engine would
refuse, a torn last journal line on resume, and a bad kernel path at import."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _engine_models import fresh_model

import bnn
import refimpl
from bnn.export import export_model
from bnn.nn.layers import BinaryConv2d
from bnn.nn.models import build_model
from bnn.search import cli as search_cli
from refimpl import Genome, isa

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("option,text", [("--batch", "٦٤"), ("--threads", "２"), ("--batch", "0")])
def test_infer_counts_take_ascii_digits_only(tmp_path, capsys, option, text):
    from refimpl.engine import infer

    assert infer.main([str(tmp_path / "absent.bnn"), "--digits", option, text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0] and "positive integer" in err[0], err


# ---------------------------------------------------------------------------------------------
# Genome text: ASCII digits only


@pytest.mark.parametrize("text", ["٣-0-3-0-0-1-6", "3-0-3-0-0-1-٦", "３-0-3-0-0-1-6", "３０３００１６", "0-0-0-0-0-0-１",
                                  "٠٠٠٠٠٠١", "0-0-0-0-0-0-1\u0661"])
def test_genome_text_with_non_ascii_digits_is_refused(text):
    with pytest.raises(ValueError, match="genome"):
        Genome.parse(text)


def test_ascii_genome_text_still_parses():
    assert Genome.parse("3-0-3-0-0-1-6") == Genome.parse("3030016") == Genome.parse("M1")


# ---------------------------------------------------------------------------------------------
# Geometry: an integer or a pair of integers, never truncated, in both paths


@pytest.mark.parametrize("name, value", [("stride", 1.7), ("stride", "1"), ("stride", 1.0), ("padding", (0, 0.5)),
                                         ("dilation", True), ("padding", "0"), ("stride", (1, 1, 1))])
def test_non_integer_geometry_is_refused_by_both_paths(name, value):
    x = np.where(np.random.default_rng(0).random((1, 2, 5, 5)) < 0.5, -1.0, 1.0).astype(np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=f"{name} must be an int or a pair of ints"):
        refimpl.counts_conv2d(x, w, **{name: value})
    with pytest.raises(ValueError, match=f"{name} must be an int or a pair of ints"):
        bnn.counts_conv2d(torch.from_numpy(x), torch.from_numpy(w), **{name: value})
    with pytest.raises(ValueError, match=f"{name} must be an int or a pair of ints"):
        BinaryConv2d(2, 3, 3, **{name: value})  # at construction, not at the first forward pass


def test_numpy_integer_geometry_is_still_accepted_by_both_paths():
    x = np.where(np.random.default_rng(1).random((1, 2, 6, 6)) < 0.5, -1.0, 1.0).astype(np.float32)
    w = np.where(np.random.default_rng(2).random((3, 2, 3, 3)) < 0.5, -1.0, 1.0).astype(np.float32)
    ref = refimpl.counts_conv2d(x, w, stride=np.int64(2), padding=(np.int32(1), 1))
    got = bnn.counts_conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=np.int64(2), padding=(np.int32(1), 1))
    assert ref[0].shape == (1, 3, 3, 3)
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(r, g.numpy())


@pytest.mark.parametrize("kwargs, word", [(dict(input_shape=(1, 8.5, 8)), "input_shape"),
                                          (dict(input_shape=("1", 8, 8)), "input_shape"),
                                          (dict(input_shape=(1, -8, 8)), "input_shape"),
                                          (dict(num_classes=10.0), "num_classes")])
def test_a_model_config_with_non_integer_sizes_is_refused(kwargs, word):
    with pytest.raises(ValueError, match=word):
        build_model("digits_net", "baseline", **{"num_classes": 10, "input_shape": (1, 8, 8), **kwargs})


# ---------------------------------------------------------------------------------------------
# Export refuses what the engine would refuse (or could only run into inf/NaN), writing nothing


@pytest.fixture()
def model():
    return fresh_model("digits_net", "baseline", (1, 8, 8), torch.randn(64, 1, 8, 8), seed=3)


def test_export_refuses_a_batchnorm_whose_std_is_zero(tmp_path, model):
    bn = model.body[1].bn
    with torch.no_grad():
        bn.running_var[2] = -bn.eps  # var + eps = 0: the folded scale is 1/0
    path = tmp_path / "m.bnn"
    with pytest.raises(ValueError, match=r"body\.1\.conv\.scale.*BatchNorm"):
        export_model(model, str(path))
    assert not path.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("change, word", [
    (lambda m: m.config.update(input_shape=[1, -8, 8]), "input_shape"),
    (lambda m: m.config.update(input_shape=[1, 0, 8]), "input_shape"),
    (lambda m: m.classifier.bias.data.fill_(float("nan")), "classifier.bias"),
])
def test_export_refuses_a_shape_or_tensor_the_engine_cannot_run(tmp_path, model, change, word):
    change(model)
    path = tmp_path / "m.bnn"
    with pytest.raises(ValueError, match=word):
        export_model(model, str(path))
    assert not path.exists()


def test_export_refuses_an_input_std_of_zero(tmp_path, model):
    path = tmp_path / "m.bnn"
    with pytest.raises(ValueError, match="std must be positive"):
        export_model(model, str(path), mean=[0.0], std=[0.0])
    assert not path.exists()


def test_export_of_a_sound_model_still_loads_in_the_engine(tmp_path, model):
    from refimpl import engine

    path = tmp_path / "m.bnn"
    export_model(model, str(path), mean=[4.0], std=[6.0])
    assert engine.load(str(path)).num_classes == 10


# ---------------------------------------------------------------------------------------------
# A torn last journal line is reported on resume, then dropped and computed again

SYN = ["--fitness", "synthetic:2", "--population", "6", "--epochs", "3", "--thresholds", "0.2", "--no-progress"]


def test_resume_says_which_torn_line_it_drops(tmp_path, capsys):
    run = tmp_path / "run"
    assert search_cli.main([*SYN, "--max-evaluations", "12", "--run-dir", str(run)]) == 0
    journal = run / "journal.jsonl"
    complete = journal.read_bytes().count(b"\n")
    with open(journal, "ab") as f:
        f.write(b'{"type":"result","seq":1')  # a kill in the middle of a write
    capsys.readouterr()
    assert search_cli.main(["--resume", str(run), "--max-evaluations", "14", "--no-progress"]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "incomplete" in line]
    assert len(notes) == 1 and f"line {complete + 1} " in notes[0] and "dropped" in notes[0], err
    lines = journal.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])  # the torn bytes are gone


def test_resume_of_an_intact_journal_says_nothing_of_torn_lines(tmp_path, capsys):
    run = tmp_path / "run"
    assert search_cli.main([*SYN, "--max-evaluations", "8", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert search_cli.main(["--resume", str(run), "--max-evaluations", "9", "--no-progress"]) == 0
    assert "incomplete" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# REFIMPL_ISA: a bad name is one line at import, exit 2 for a command; a ValueError for a library


def test_a_bad_kernel_path_is_one_line_and_exit_2_for_a_command():
    env = {**os.environ, "REFIMPL_ISA": "bogus"}
    r = subprocess.run([sys.executable, "-m", "refimpl.info"], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and "'bogus'" in lines[0]
    assert all(path in lines[0] for path in isa.PATHS)


def test_a_bad_kernel_path_is_a_value_error_a_library_can_catch():
    code = ("try:\n    import refimpl\nexcept ValueError as exc:\n    print(type(exc).__name__, exc)\n"
            "else:\n    print('imported')\n")
    env = {**os.environ, "REFIMPL_ISA": "bogus"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("IsaError REFIMPL_ISA='bogus'"), (r.stdout, r.stderr)
