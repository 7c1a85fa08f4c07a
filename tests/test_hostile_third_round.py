"""Issue 36 items 2-4: journals that survive a torn tail, records that must agree, and one line
(exit 2) instead of a traceback in the commands added since the second round.

Item 1 (a small .bnn file asking for unbounded memory) is tests/test_hostile_plan_memory.py; the
fuzzing of the new readers is tests/test_fuzz_third_round.py."""
from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from _cli import run_main

from bnn import evidence
from bnn.common import jsonl as ej
from refimpl.fileio import OutputError
from refimpl.genome import Genome

SYNTHETIC = {"counts": "raw", "fitness": "synthetic:5"}
GRID_ROWS = [{"measure": "M6", "genome": "3-0-3-0-0-10-6", "counts": "raw", "n_ok": 2, "test_mean": 0.80},
             {"measure": "M7", "genome": "3-15-3-0-0-0-4", "counts": "raw", "n_ok": 2, "test_mean": 0.79},
             {"measure": "baseline", "genome": "0-0-0-0-0-0-1", "counts": "raw", "n_ok": 2, "test_mean": 0.85}]


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and lines[0].startswith("error: "), err
    return lines[0]


def cost_cli(*argv):
    from bnn.search.cost import main

    return run_main(main, *argv)


def _search_dir(tmp_path, results=(), config=None):
    run = tmp_path / "search"
    run.mkdir(exist_ok=True)
    lines = [{"type": "start", "version": 1, "time": 1000.0, "config": config or SYNTHETIC}, *results]
    (run / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return run


def _grid(tmp_path, rows=GRID_ROWS, raw: bytes | None = None):
    grid = tmp_path / "grid"
    grid.mkdir(exist_ok=True)
    (grid / "results.json").write_bytes(raw if raw is not None else json.dumps({"rows": rows}).encode())
    return grid


def _result(genome="0-0-0-0-0-0-1", **fields):
    return {"type": "result", "genome": genome, "source": "train", "status": "ok", "fitness": 0.5, "wall_s": 1.0,
            "time": 1001.0, **fields}


# -- item 2: fitness-extra.jsonl survives a torn tail; appends write every byte or fail -------------------

def test_a_torn_last_line_of_fitness_extra_is_cut_off_and_its_training_runs_again(tmp_path):
    run, grid = _search_dir(tmp_path), _grid(tmp_path)
    good = {"key": "0-0-0-0-0-0-1/raw", "genome": "0-0-0-0-0-0-1", "counts": "raw", "fitness": 0.4, "status": "ok"}
    (run / "fitness-extra.jsonl").write_bytes((json.dumps(good) + "\n").encode() + b'{"key": "3-0-3-0-0-10-6/raw", "gen')
    r = cost_cli(run, "--full", grid, "--score", "--json")
    assert r.returncode == 0, r.stderr
    assert "ignored a torn last line" in r.stderr and "fitness-extra.jsonl" in r.stderr
    lines = (run / "fitness-extra.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(x) for x in lines[:-1])  # whole lines only
    assert sorted(json.loads(x)["key"] for x in lines[:-1]) == ["0-0-0-0-0-0-1/raw", "3-0-3-0-0-10-6/raw",
                                                                  "3-15-3-0-0-0-4/raw"]
    again = cost_cli(run, "--full", grid, "--score", "--json")  # every scored training is still there
    assert again.returncode == 0, again.stderr
    assert len(json.loads(again.stdout.strip().splitlines()[-1])["ranks"][0]["pairs"]) == 3


def test_without_score_a_torn_tail_is_ignored_and_left_for_the_lock_holder(tmp_path):
    run, grid = _search_dir(tmp_path), _grid(tmp_path)
    raw = b'{"key": "0-0-0-0-0-0-1/raw", "genome": "0-0'
    (run / "fitness-extra.jsonl").write_bytes(raw)
    r = cost_cli(run, "--full", grid)
    assert r.returncode == 0 and "torn" in r.stderr, r.stderr
    assert (run / "fitness-extra.jsonl").read_bytes() == raw  # a scorer may be writing it right now


def _short_writes(monkeypatch, fail_after: int | None):
    """os.write in the journal module taking 7 bytes a call, then (fail_after calls) a full disk."""
    real, calls = os.write, []

    def write(fd, data):
        calls.append(len(data))
        if fail_after is not None and len(calls) > fail_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, bytes(data[:7]))

    monkeypatch.setattr(ej.os, "write", write)
    return calls


def test_an_append_writes_every_byte_when_the_os_takes_them_a_few_at_a_time(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    calls = _short_writes(monkeypatch, fail_after=None)
    ej.append_line(str(path), {"key": "k", "value": 12345})
    assert json.loads(path.read_bytes()) == {"key": "k", "value": 12345} and len(calls) > 1


def test_an_append_that_a_full_disk_stops_fails_and_leaves_no_torn_tail(tmp_path, monkeypatch):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"key": "first"}\n')
    _short_writes(monkeypatch, fail_after=2)
    with pytest.raises(OutputError, match="j.jsonl"):
        ej.append_line(str(path), {"key": "second", "value": 12345})
    assert path.read_bytes() == b'{"key": "first"}\n'


# -- item 3: records that contradict each other or hold the wrong type ----------------------------------

def _checkpoint(path, config_counts="raw", model_counts="freq", data=None):
    from bnn.nn.models import build_model

    model = build_model("digits_net", "baseline", 10, (1, 8, 8), counts=model_counts)
    torch.save({"format": "bnn-train-checkpoint", "version": 1,
                "config": {"model": "digits_net", "dataset": "digits", "measure": "baseline", "counts": config_counts},
                "model_config": dict(model.config), "data": {} if data is None else data, "model": model.state_dict(),
                "history": [], "epoch": 1, "status": "ok"}, path)


@pytest.mark.parametrize("data, field", [("raw", "is str"), ({"class_names": 5}, "class_names"), ({"mean": 5}, "mean"),
                                         ({"pixel_max": "16"}, "pixel_max"), ({"name": ["digits"]}, "name")])
def test_a_checkpoint_whose_data_record_has_the_wrong_type_exports_nothing_in_one_line(tmp_path, data, field):
    # Found by tests/test_fuzz_third_round.py: data "raw" was an AttributeError traceback.
    from bnn.export import main as export_main

    _checkpoint(tmp_path / "c.pt", "freq", "freq", data=data)
    r = run_main(export_main, tmp_path / "c.pt", "-o", tmp_path / "m.bnn")
    assert r.returncode == 2 and f"data record {field}" if field == "is str" else f"data record has {field}" in _one_error_line(r.stderr), r.stderr
    assert not (tmp_path / "m.bnn").exists()


def test_a_checkpoint_whose_config_and_model_config_disagree_on_counts_is_refused(tmp_path):
    from bnn.export import main as export_main
    from bnn.train import load_checkpoint

    _checkpoint(tmp_path / "c.pt")
    with pytest.raises(ValueError, match="config.counts is 'raw' but model_config.counts is 'freq'"):
        load_checkpoint(str(tmp_path / "c.pt"))
    r = run_main(export_main, tmp_path / "c.pt", "-o", tmp_path / "m.bnn")
    assert r.returncode == 2 and "model_config.counts" in _one_error_line(r.stderr)
    assert not (tmp_path / "m.bnn").exists()


@pytest.mark.parametrize("raw", [b"\x80\x43junkjunk", b"\x80\x05K\x07."])  # a pickle protocol torch warns of; a bare int
def test_a_crafted_checkpoint_is_one_error_and_no_torch_warning(tmp_path, raw):
    import warnings

    from bnn.train import load_checkpoint

    (tmp_path / "c.pt").write_bytes(raw)
    with warnings.catch_warnings(record=True) as seen, pytest.raises(ValueError) as exc:
        warnings.simplefilter("always")
        load_checkpoint(str(tmp_path / "c.pt"))
    assert "c.pt is not a" in str(exc.value) and "\n" not in str(exc.value)
    assert [str(w.message) for w in seen] == []  # it printed above bnn.export's one line


def test_a_checkpoint_whose_two_records_agree_still_loads(tmp_path):
    from bnn.train import load_checkpoint

    _checkpoint(tmp_path / "c.pt", "freq", "freq")
    assert load_checkpoint(str(tmp_path / "c.pt"))["model_config"]["counts"] == "freq"


PROTOCOL = {"dataset": "digits", "model": "digits_net", "epochs": 1, "batch_size": 128, "lr": 0.005,
            "train_size": None, "val_size": None, "gamma": 0.2, "split_seed": 0, "milestones": [2]}
CELL = {"key": "M1/binary/laplace/s0", "measure": "M1", "genome": "3-0-3-0-0-1-6", "downsample": "binary",
        "counts": "laplace", "seed": 0, "status": "ok", "val_acc": 0.5, "test_acc": 0.5, "epochs": 1, "wall_s": 1.0,
        "host": "h", "cpu_kind": "x86_64 avx2"}


@pytest.mark.parametrize("change, field", [({"counts": "raw"}, "key"), ({"key": "M1/binary/s0"}, "key"),
                                           ({"measure": "M3"}, "measure"), ({"genome": "0-0-0-0-0-0-1"}, "measure"),
                                           ({"downsample": "sideways", "key": "M1/sideways/laplace/s0"}, "downsample"),
                                           ({"seed": 1}, "key"), ({"genome": "9-9-9-9-99-0-0"}, "genome"),
                                           ({"threads": 0}, "threads"), ({"threads": True}, "threads"),
                                           ({"threads": "2"}, "threads"), ({"cpu_s": "927"}, "a wall_s, cpu_s"),
                                           ({"cpu_s": None}, "a wall_s, cpu_s")])
def test_an_evidence_cell_whose_fields_contradict_each_other_is_one_error_line(tmp_path, change, field, capsys):
    root = tmp_path / "ev"
    root.mkdir()
    rows = [{"kind": "protocol", "version": 1, "protocol": PROTOCOL}, CELL, {**CELL, **change}]
    (root / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert evidence.main(["--dataset", "digits", "--root", str(root), "--table-only", "--no-plot"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "line 3 has " + field in line, line
    assert not (root / "results.json").exists()


@pytest.mark.parametrize("fitness", [float("nan"), True, 1e308, -0.5, "0.5"])
def test_cost_refuses_a_trained_fitness_that_is_not_an_accuracy(tmp_path, fitness):
    rows = [_result(g, fitness=0.3 + i / 10) for i, g in enumerate(["3-0-3-0-0-10-6", "3-15-3-0-0-0-4"])]
    run = _search_dir(tmp_path, [*rows, _result(fitness=fitness)])
    r = cost_cli(run, "--full", _grid(tmp_path), "--json")
    line = _one_error_line(r.stderr)
    assert r.returncode == 2 and "journal.jsonl: line 4 has a trained result whose fitness" in line, line
    assert r.stdout == ""


@pytest.mark.parametrize("change, field", [({"test_mean": float("nan")}, "test_mean"), ({"test_mean": 1e308}, "test_mean"),
                                           ({"test_mean": None}, "test_mean"), ({"n_ok": True}, "n_ok"),
                                           ({"counts": "median"}, "counts"), ({"genome": 7}, "genome")])
def test_cost_refuses_a_grid_row_with_a_wrong_value(tmp_path, change, field):
    run = _search_dir(tmp_path, [_result()])
    raw = json.dumps({"rows": [*GRID_ROWS[:2], {**GRID_ROWS[2], **change}]}).encode()  # NaN as json writes it
    r = cost_cli(run, "--full", _grid(tmp_path, raw=raw))
    line = _one_error_line(r.stderr)
    assert r.returncode == 2 and f"results.json: row 3 has {field}" in line, line


@pytest.mark.parametrize("change, words", [({"key": "3-0-3-0-0-10-6/freq"}, "contradicts"), ({"fitness": float("nan")}, "fitness"),
                                           ({"fitness": 2.0}, "fitness"), ({"counts": "median", "key": "0-0-0-0-0-0-1/median"}, "counts")])
def test_cost_refuses_a_fitness_extra_record_with_a_wrong_or_contradicting_value(tmp_path, change, words):
    run = _search_dir(tmp_path)
    rec = {"key": "0-0-0-0-0-0-1/raw", "genome": "0-0-0-0-0-0-1", "counts": "raw", "fitness": 0.4, **change}
    (run / "fitness-extra.jsonl").write_text(json.dumps(rec) + "\n")
    r = cost_cli(run, "--full", _grid(tmp_path))
    line = _one_error_line(r.stderr)
    assert r.returncode == 2 and "fitness-extra.jsonl: line 1 has" in line and words in line, line


# -- item 4: tracebacks -----------------------------------------------------------------------------

@pytest.mark.parametrize("clip", [1e39, 3.5e38])
def test_a_measure_grad_clip_above_float32s_largest_is_refused(clip):
    from bnn.nn.layers import check_measure_grad_clip

    with pytest.raises(ValueError, match="float32"):
        check_measure_grad_clip(clip)
    assert check_measure_grad_clip(3.4028234663852886e38) == 3.4028234663852886e38  # float32's largest is fine


@pytest.mark.parametrize("argv", [["--measure-grad-clip", "1e39"], ["--milestones=-1"], ["--milestones=0,3"]])
def test_train_refuses_a_bad_clip_or_milestone_in_one_line_before_training(tmp_path, argv):
    from bnn.train import main as train_main

    r = run_main(train_main, "--dataset", "digits", "--epochs", "1", "--out", tmp_path / "run", "--no-progress", *argv)
    assert r.returncode == 2 and ("float32" in r.stderr or "milestones" in r.stderr), r.stderr
    _one_error_line(r.stderr)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_diagnose_refuses_a_clip_above_float32s_largest_in_one_line(tmp_path):
    from bnn.diagnose import main as diagnose_main

    r = run_main(diagnose_main, "--dataset", "digits", "--steps", "2", "--measure-grad-clip", "1e39", "--no-progress")
    assert r.returncode == 2 and "float32" in _one_error_line(r.stderr), r.stderr


@pytest.mark.parametrize("results, words", [
    ([{"type": "result", "source": "train", "fitness": 0.5}], "line 2 has a result whose genome"),
    ([_result(time="late")], "line 2 has time 'late'"),
    ([_result(wall_s="long")], "line 2 has a result whose wall_s"),
])
def test_cost_refuses_a_journal_result_without_its_fields_in_one_line(tmp_path, results, words):
    r = cost_cli(_search_dir(tmp_path, results), "--full", _grid(tmp_path))
    assert r.returncode == 2 and words in _one_error_line(r.stderr), r.stderr


@pytest.mark.parametrize("raw, words", [
    (json.dumps({"rows": [{"measure": "M6", "counts": "raw", "n_ok": 2, "test_mean": 0.8}]}).encode(), "row 1 has genome"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
], ids=["no genome", "nested 100,000 deep"])
def test_cost_refuses_a_grid_without_genome_or_nested_too_deep_in_one_line(tmp_path, raw, words):
    r = cost_cli(_search_dir(tmp_path, [_result()]), "--full", _grid(tmp_path, raw=raw))
    assert r.returncode == 2 and words in _one_error_line(r.stderr), r.stderr


def test_cost_says_it_cannot_read_a_folder_not_that_it_refuses_to_write(tmp_path):
    (tmp_path / "grid" / "results.json").mkdir(parents=True)
    r = cost_cli(_search_dir(tmp_path, [_result()]), "--full", tmp_path / "grid")
    line = _one_error_line(r.stderr)
    assert r.returncode == 2 and "cannot read" in line and "it is a folder" in line and "write" not in line, line


def test_cost_cuts_a_long_error_line_as_the_other_commands_do(tmp_path):
    r = cost_cli(tmp_path / ("x" * 2000), "--full", tmp_path)
    line = _one_error_line(r.stderr)
    assert r.returncode == 2 and len(line) < 600 and "more characters" in line, line


def test_cost_refuses_a_search_journal_with_an_unknown_convention(tmp_path):
    run = _search_dir(tmp_path, [_result()], config={"counts": "median", "fitness": "synthetic:5"})
    r = cost_cli(run, "--full", _grid(tmp_path))
    assert r.returncode == 2 and "line 1 has config.counts 'median'" in _one_error_line(r.stderr), r.stderr


def test_a_folder_in_place_of_a_measure_cache_entry_is_bypassed_with_a_warning(tmp_path, monkeypatch, capsys):
    from refimpl.engine import epilogue

    monkeypatch.setenv("BNN_MEASURE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir(mode=0o700)
    key, text = epilogue.module_name("M3", "freq")
    (tmp_path / "cache" / f"{key}.py").mkdir()
    module = epilogue.compile_module(key, text)
    assert module.GENOME == str(Genome.parse("M3")) and not module.__file__.startswith(str(tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("refimpl: warning:") and f"{key}.py" in err[0], err
    assert sorted(os.listdir(tmp_path / "cache")) == [f"{key}.py"]  # no temp file left behind
