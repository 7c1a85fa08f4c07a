"""The evidence grid: its statistics, a whole tiny grid on digits, resume, the journal and the lock."""
import fcntl
import json
import math
import os
import statistics
import sys

import numpy as np
import pytest

from bnn import evidence
from bnn import train as bnn_train
from bnn.common import stats as _stats
from bnn.evidence.report import summarize

scipy_stats = pytest.importorskip("scipy.stats")


# =============================================================================================
# Statistics


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 10, 19, 29, 30, 31, 50, 120, 1000])
def test_t_quantile_matches_scipy(df):
    for p in (0.5, 0.6, 0.9, 0.95, 0.975, 0.995, 0.9995, 0.025, 0.001):
        assert _stats.t_ppf(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-9, abs=1e-12)


def test_t_quantile_refuses_a_probability_outside_0_1():
    with pytest.raises(ValueError, match="0 < p < 1"):
        _stats.t_ppf(1.0, 3)


def test_mean_and_sample_std_match_numpy():
    xs = [0.871, 0.8632, 0.8795, 0.8801]
    assert _stats.mean(xs) == pytest.approx(np.mean(xs), abs=1e-15)
    assert _stats.sample_std(xs) == pytest.approx(np.std(xs, ddof=1), abs=1e-15)
    assert _stats.sample_std([0.5]) is None and _stats.mean([]) is None


@pytest.mark.parametrize("n", [2, 3, 5, 12])
def test_paired_interval_matches_scipys_t_interval(n):
    rng = np.random.default_rng(n)
    x, y = rng.normal(0.88, 0.01, n), rng.normal(0.87, 0.01, n)
    d = x - y
    lo, hi = scipy_stats.t.interval(0.95, n - 1, loc=d.mean(), scale=scipy_stats.sem(d))
    got = _stats.paired_interval(list(x), list(y))
    assert got["n"] == n and got["mean"] == pytest.approx(d.mean(), abs=1e-14)
    assert (got["lo"], got["hi"]) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))


def test_paired_interval_of_one_pair_has_no_bounds():
    assert _stats.paired_interval([0.9], [0.8]) == {"n": 1, "mean": pytest.approx(0.1), "lo": None, "hi": None}


@pytest.mark.parametrize("lo, hi, expected", [
    (0.001, 0.02, "beats baseline"),
    (-0.02, -0.001, "worse"),
    (-0.01, 0.01, "within noise"),
    (0.0, 0.01, "within noise"),  # touching zero is not beating it
    (-0.01, 0.0, "within noise"),
    (None, None, "one pair: no interval"),  # a 66-point loss on one seed is not "noise"
])
def test_verdict_needs_the_whole_interval_on_one_side_of_zero(lo, hi, expected):
    assert _stats.verdict(lo, hi) == expected


def _entry(measure, seed, status="ok", test=None, kind="binary"):
    return {"key": f"{measure}/{kind}/s{seed}", "measure": measure, "genome": measure, "downsample": kind,
            "seed": seed, "status": status, "test_acc": test, "val_acc": test, "wall_s": 1.0}


def test_summary_counts_diverged_runs_apart_and_pairs_only_seeds_both_finished():
    entries = [_entry("baseline", 0, test=0.80), _entry("baseline", 1, test=0.82), _entry("baseline", 2, test=0.84),
               _entry("M1", 0, test=0.83), _entry("M1", 1, test=0.85), _entry("M1", 2, "diverged"),
               _entry("M2", 0, test=0.70), _entry("M2", 1, test=0.72), _entry("M2", 2, test=0.74),
               _entry("M5", 0, test=0.79), _entry("M5", 1, test=0.85),
               _entry("M9", 0, "diverged"), _entry("M9", 1, "diverged"), _entry("M9", 1, test=0.6, kind="real"),
               _entry("baseline", 0, test=0.5, kind="real")]
    rows = {(r["measure"], r["downsample"]): r for r in summarize(entries)}
    m1 = rows[("M1", "binary")]
    # diverged: counted, left out of the mean (0.84 by hand), not a zero accuracy
    assert (m1["n"], m1["n_ok"], m1["diverged"]) == (3, 2, 1)
    assert m1["test_mean"] == pytest.approx(0.84) and m1["test_std"] == pytest.approx(math.sqrt(2e-4))
    assert m1["per_seed"] == {"0": 0.83, "1": 0.85, "2": "diverged"}
    # paired over seeds 0 and 1 only: differences +0.03 and +0.03, an interval of zero width
    assert m1["vs_baseline"]["seeds"] == [0, 1] and m1["vs_baseline"]["mean"] == pytest.approx(0.03)
    assert m1["verdict"] == "beats baseline"
    assert rows[("M2", "binary")]["verdict"] == "worse"  # -0.10 on every seed
    assert rows[("M5", "binary")]["verdict"] == "within noise"  # -0.01 and +0.03
    assert rows[("baseline", "binary")]["verdict"] == "reference"
    assert rows[("M9", "binary")]["verdict"] == "all diverged" and rows[("M9", "binary")]["test_mean"] is None
    assert rows[("M9", "real")]["verdict"] == "no ok pairs"  # the real baseline has seed 0 only, M9 seed 1
    assert rows[("M5", "binary")]["vs_baseline"]["n"] == 2 and rows[("M9", "real")]["vs_baseline"] is None
    assert rows[("baseline", "real")]["test_mean"] == 0.5
    assert [(r["measure"], r["downsample"]) for r in summarize(entries)][:2] == [("baseline", "binary"), ("M1", "binary")]


# =============================================================================================
# The grid with a stand-in for training (journal, resume, protocol, lock)


@pytest.fixture
def fake_train(monkeypatch):
    """Replaces bnn.train.train_model: instant, deterministic, and counts its calls."""
    calls = _Calls()
    calls.fail = set()

    def train_model(cfg, data=None, **kw):
        calls.append(cfg)
        if (cfg.measure, cfg.seed) in calls.fail:
            raise RuntimeError("boom")
        acc = 0.5 + 0.01 * cfg.seed + (0.1 if cfg.measure != "0-0-0-0-0-0-1" else 0.0)
        return bnn_train.TrainResult(status="ok", val_acc=acc + 0.001, test_acc=acc, epochs=cfg.epochs)

    monkeypatch.setattr(bnn_train, "train_model", train_model)
    return calls


class _Calls(list):
    fail: set


def _grid(root, *extra):
    return ["--dataset", "digits", "--epochs", "1", "--root", str(root), "--no-progress", "--no-plot", *extra]


def _read_json(path):
    with open(path) as f:
        return json.load(f)


def _journal(root):
    with open(os.path.join(root, "journal.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_rerun_trains_only_the_cells_not_yet_finished(tmp_path, fake_train, capsys):
    root = tmp_path / "grid"
    assert evidence.main(_grid(root, "--measures", "baseline", "--seeds", "0,1", "--real-measures", "none")) == 0
    assert [(c.measure, c.seed) for c in fake_train] == [("0-0-0-0-0-0-1", 0), ("0-0-0-0-0-0-1", 1)]
    assert len(_journal(root)) == 1 + 2
    assert evidence.main(_grid(root, "--measures", "baseline,M1", "--seeds", "0,1", "--real-measures", "none")) == 0
    assert [(c.measure, c.seed) for c in fake_train[2:]] == [("3-0-3-0-0-1-6", 0), ("3-0-3-0-0-1-6", 1)]
    assert len(_journal(root)) == 1 + 4
    assert evidence.main(_grid(root, "--measures", "baseline,M1", "--seeds", "0,1", "--real-measures", "none")) == 0
    assert len(fake_train) == 4 and len(_journal(root)) == 1 + 4
    results = _read_json(root / "results.json")
    m1 = next(r for r in results["rows"] if r["measure"] == "M1")
    assert m1["per_seed"] == {"0": 0.6, "1": 0.61} and m1["vs_baseline"]["mean"] == pytest.approx(0.1)


def test_the_time_left_is_the_median_ok_cell_times_the_rounds_left():
    from bnn.evidence.grid import eta_text

    done = {f"k{i}": {"status": "ok", "wall_s": w} for i, w in enumerate([1100.0, 1300.0, 900.0, 1200.0])}
    done["div"] = {"status": "diverged", "wall_s": 60.0}  # a short divergence is not a cell's time
    median = float(np.median([1100.0, 1300.0, 900.0, 1200.0]))  # 1150
    # 7 cells left, 2 at a time: 4 rounds of 1150 s = 4600 s = 1 h 17 min
    assert median * 4 == 4600.0
    assert eta_text(done, 7, 2) == "; about 1 h 17 min left at the median 1,150 s of 4 finished cells, 2 at a time"
    assert eta_text(done, 1, 1) == "; about 19.2 min left at the median 1,150 s of 4 finished cells, 1 at a time"
    assert eta_text(done, 0, 2) == "" and eta_text({"div": done["div"]}, 7, 2) == ""
    assert eta_text({"k": {"status": "ok", "wall_s": 20.0}}, 2, 1) == "; about 40 s left at the median 20 s of 1 finished cell, 1 at a time"


def test_every_cell_gets_the_protocol_and_its_own_measure_and_seed(tmp_path, fake_train, capsys):
    args = _grid(tmp_path, "--measures", "M9", "--seeds", "3", "--batch-size", "64", "--lr", "0.002",
                 "--milestones", "5,7", "--real-measures", "baseline")
    assert evidence.main(args) == 0
    assert [(c.measure, c.downsample, c.seed) for c in fake_train] == \
        [("3-2-3-10-0-4-6", "binary", 3), ("0-0-0-0-0-0-1", "real", 3)]  # M9's genome, then the baseline's
    for cfg in fake_train:
        assert (cfg.dataset, cfg.model, cfg.epochs, cfg.batch_size, cfg.lr, cfg.milestones) == \
            ("digits", "digits_net", 1, 64, 0.002, (5, 7))
        # its own run folder under the root, resumed if a checkpoint is left there (bnn/evidence/cells.py)
        assert os.path.dirname(cfg.out_dir) == str(tmp_path / "cells") and cfg.resume and cfg.eval_test
    assert len({cfg.out_dir for cfg in fake_train}) == 2 and not (tmp_path / "cells").exists()  # removed once journaled
    rows = _read_json(tmp_path / "results.json")["rows"]
    assert [(r["measure"], r["downsample"], r["verdict"]) for r in rows] == \
        [("M9", "binary", "no baseline"), ("baseline", "real", "reference")]


def test_a_crashed_cell_is_journaled_as_error_and_trained_again_by_a_rerun(tmp_path, fake_train, capsys):
    fake_train.fail.add(("3-0-3-0-0-1-6", 1))
    args = _grid(tmp_path, "--measures", "baseline,M1", "--seeds", "0,1", "--real-measures", "none")
    assert evidence.main(args) == 1
    err = [r for r in _journal(tmp_path)[1:] if r["status"] == "error"]
    assert [r["key"] for r in err] == ["M1/binary/s1"] and "RuntimeError: boom" in err[0]["error"]
    fake_train.fail.clear()
    assert evidence.main(args) == 0
    assert len(fake_train) == 5 and _journal(tmp_path)[-1]["status"] == "ok"


def test_a_torn_last_line_is_reported_and_cut_off(tmp_path, fake_train, capsys):
    args = _grid(tmp_path, "--measures", "baseline", "--seeds", "0,1", "--real-measures", "none")
    assert evidence.main(args) == 0
    path = tmp_path / "journal.jsonl"
    whole = path.read_bytes()
    lines = whole.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:25])  # the last cell's write was cut
    capsys.readouterr()
    assert evidence.main(args) == 0
    assert "ignored a torn last line" in capsys.readouterr().err
    assert len(fake_train) == 3 and fake_train[-1].seed == 1  # only the torn cell again
    assert len(_journal(tmp_path)) == 3


def test_a_different_protocol_in_the_same_root_is_refused(tmp_path, fake_train, capsys):
    args = ["--measures", "baseline", "--seeds", "0", "--real-measures", "none"]
    assert evidence.main(_grid(tmp_path, *args)) == 0
    before = (tmp_path / "journal.jsonl").read_bytes()
    capsys.readouterr()
    assert evidence.main(_grid(tmp_path, *args, "--batch-size", "32")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "batch_size=128, not 32" in err and "another --root" in err
    assert (tmp_path / "journal.jsonl").read_bytes() == before and len(fake_train) == 1


def test_a_second_run_into_a_locked_root_is_refused(tmp_path, fake_train, capsys):
    with open(tmp_path / "lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running grid holds it
        assert evidence.main(_grid(tmp_path, "--measures", "baseline", "--seeds", "0")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: another bnn.evidence run holds") and err.count("\n") == 1
    assert not fake_train and not (tmp_path / "journal.jsonl").exists()


def test_each_count_convention_is_a_grid_of_cells_compared_with_xnor_on_raw_counts(tmp_path, fake_train, capsys):
    args = _grid(tmp_path, "--measures", "baseline,M1", "--seeds", "0,1", "--real-measures", "none",
                 "--counts", "raw,freq")
    assert evidence.main(args) == 0
    assert sorted((c.measure, c.counts, c.seed) for c in fake_train) == sorted(
        (m, k, s) for m in ("0-0-0-0-0-0-1", "3-0-3-0-0-1-6") for k in ("raw", "freq") for s in (0, 1))
    keys = [r["key"] for r in _journal(tmp_path)[1:]]
    assert "M1/binary/s0" in keys and "M1/binary/freq/s0" in keys  # raw keeps its old key
    assert all(r["counts"] in ("raw", "freq") for r in _journal(tmp_path)[1:])
    rows = {(r["measure"], r["counts"]): r for r in _read_json(tmp_path / "results.json")["rows"]}
    assert rows["baseline", "raw"]["verdict"] == "reference"
    # the stand-in gives the baseline 0.5 + 0.01 s on any counts and M1 0.1 more: every row is
    # compared with the raw baseline, so the freq baseline differs by 0 and M1 by 0.1
    assert rows["baseline", "freq"]["vs_baseline"]["mean"] == pytest.approx(0.0)
    assert rows["M1", "freq"]["vs_baseline"]["mean"] == pytest.approx(0.1)
    assert "| M1 | binary | freq |" in (tmp_path / "results.md").read_text()


def test_a_journal_from_before_conventions_resumes_as_raw_cells(tmp_path, fake_train, capsys):
    args = _grid(tmp_path, "--measures", "baseline", "--seeds", "0,1", "--real-measures", "none")
    assert evidence.main(args) == 0
    lines = _journal(tmp_path)
    for row in lines[1:]:
        row.pop("counts")  # as a journal written before the option holds it
    lines[0]["protocol"].pop("counts", None)
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert evidence.main(args) == 0
    assert len(fake_train) == 2  # nothing trained again
    assert evidence.main(_grid(tmp_path, "--measures", "baseline", "--seeds", "0,1", "--real-measures", "none",
                               "--counts", "laplace")) == 0
    assert [c.counts for c in fake_train[2:]] == ["laplace", "laplace"]


def test_a_new_grid_records_the_fused_measure_and_a_journal_without_the_key_continues_eager(tmp_path, fake_train,
                                                                                            capsys):
    args = _grid(tmp_path, "--measures", "baseline", "--seeds", "0", "--real-measures", "none")
    assert evidence.main(args) == 0
    assert fake_train[0].measure_impl == "fused" and _journal(tmp_path)[0]["protocol"]["measure_impl"] == "fused"
    lines = _journal(tmp_path)
    lines[0]["protocol"].pop("measure_impl")  # as a journal written before the option holds it: trained eager
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    more = _grid(tmp_path, "--measures", "baseline", "--seeds", "0,1", "--real-measures", "none")
    assert evidence.main(more) == 0  # not refused: the rerun takes the journal's eager
    assert [(c.seed, c.measure_impl) for c in fake_train[1:]] == [(1, "eager")]
    assert "measure_impl" not in _journal(tmp_path)[0]["protocol"]  # the journal's protocol line is kept
    capsys.readouterr()
    assert evidence.main([*more, "--measure-impl", "fused"]) == 2  # asked for against an eager grid: refused
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measure_impl='eager', not 'fused'" in err
    assert evidence.main([*more, "--measure-impl", "eager"]) == 0 and len(fake_train) == 2


def test_a_grid_keeps_the_measure_impl_it_was_started_with(tmp_path, fake_train, capsys):
    args = _grid(tmp_path, "--measures", "baseline", "--real-measures", "none")
    assert evidence.main([*args, "--seeds", "0", "--measure-impl", "eager"]) == 0
    assert evidence.main([*args, "--seeds", "0,1"]) == 0
    assert [c.measure_impl for c in fake_train] == ["eager", "eager"]


@pytest.mark.parametrize("args, message", [
    (["--measure-impl", "numba"], "argument --measure-impl: invalid choice: 'numba'"),
    (["--counts", "raw,fraq"], "unknown count convention 'fraq'; choose one of raw, freq, laplace"),
    (["--seeds", "0,x"], "--seeds must be comma-separated integers"),
    (["--measures", "M99"], "unknown genome 'M99'"),
    (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
    (["--measures", "none", "--real-measures", "none"], "no cells to run"),
    (["--dataset", "digits", "--table-only"], "has no journal to tabulate"),
])
def test_bad_options_get_one_line_and_exit_2(tmp_path, args, message, capsys):
    assert evidence.main(["--root", str(tmp_path / "r"), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_table_only_rebuilds_the_report_from_the_journal(tmp_path, fake_train, capsys):
    assert evidence.main(_grid(tmp_path, "--measures", "baseline,M1", "--seeds", "0,1", "--real-measures", "none")) == 0
    first = _read_json(tmp_path / "results.json")
    os.remove(tmp_path / "results.json")
    assert evidence.main(_grid(tmp_path, "--table-only")) == 0
    assert _read_json(tmp_path / "results.json")["rows"] == first["rows"] and len(fake_train) == 4


def test_progress_goes_to_stderr_and_json_is_the_last_line_of_stdout(tmp_path, fake_train, capsys):
    args = _grid(tmp_path, "--measures", "baseline", "--seeds", "0,1", "--real-measures", "none", "--json")
    assert evidence.main([a for a in args if a != "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and json.loads(out)["cells_done"] == 2
    assert "[2/2] baseline/binary/s1: ok, test 51.00%" in err and "2/2 [" in err  # the line and the bar


def test_without_matplotlib_the_plot_is_skipped_with_a_note(tmp_path, fake_train, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    args = [a for a in _grid(tmp_path, "--measures", "baseline", "--seeds", "0") if a != "--no-plot"]
    assert evidence.main(args) == 0
    assert "matplotlib is not installed; skipped accuracy.png" in capsys.readouterr().err
    assert (tmp_path / "results.json").exists() and not (tmp_path / "accuracy.png").exists()


def test_help_names_the_grid_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        evidence.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in ("--measures", "--seeds", "--real-measures", "--train-size", "--root", "--no-plot", "--smoke"):
        assert option in out


# =============================================================================================
# A whole tiny grid, really trained


def test_smoke_grid_trains_reports_and_journals_on_digits(tmp_path, capsys):
    root = tmp_path / "smoke"
    assert evidence.main(["--smoke", "--root", str(root), "--no-progress", "--json"]) == 0
    out = capsys.readouterr().out
    results = json.loads(out.strip().splitlines()[-1])
    assert results == _read_json(root / "results.json")
    journal = _journal(root)
    assert journal[0]["kind"] == "protocol" and journal[0]["protocol"]["epochs"] == 1
    cells = {r["key"]: r for r in journal[1:]}
    assert sorted(cells) == ["M1/binary/s0", "M1/binary/s1", "baseline/binary/s0", "baseline/binary/s1"]
    assert all(r["epochs"] == 1 and r["wall_s"] > 0 and 0 < r["cpu_s"] for r in cells.values())
    assert results["cpu_s"] == {"cells": pytest.approx(sum(r["cpu_s"] for r in cells.values()), abs=0.1),
                                "cells_counted": 4}
    rows = {r["measure"]: r for r in results["rows"]}
    for m in ("baseline", "M1"):
        ok = [cells[f"{m}/binary/s{s}"]["test_acc"] for s in (0, 1) if cells[f"{m}/binary/s{s}"]["status"] == "ok"]
        assert rows[m]["n"] == 2 and rows[m]["n_ok"] == len(ok)
        if ok:
            assert rows[m]["test_mean"] == pytest.approx(statistics.mean(ok), abs=1e-12)
    assert results["host"]["cores"] == os.cpu_count() and results["wall_s"]["cells"] > 0
    # the grid reports the final model of a plain bnn.train run with the same protocol
    cfg = bnn_train.TrainConfig(dataset="digits", model="digits_net", epochs=1, batch_size=512, milestones=(), seed=1)
    assert cells["baseline/binary/s1"]["test_acc"] == bnn_train.train_model(cfg).test_acc
    md = (root / "results.md").read_text()
    assert "1 epoch on all training images" in md and "| baseline | binary | " in md and "| M1 | binary | " in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (root / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _MachineStopped(BaseException):
    """What a kill looks like to the grid: nothing after it runs (not an Exception, so no cell catches it)."""


def test_a_cell_stopped_mid_training_continues_from_its_checkpoint_with_the_same_result(tmp_path, monkeypatch,
                                                                                      capsys):
    from bnn.evidence.cells import cell_folder

    args = ["--dataset", "digits", "--epochs", "2", "--measures", "baseline", "--seeds", "0", "--real-measures",
            "none", "--no-progress", "--no-plot"]
    assert evidence.main([*args, "--root", str(tmp_path / "whole")]) == 0
    [whole] = _journal(tmp_path / "whole")[1:]
    real = bnn_train.train_model

    def stopped_after_one_epoch(cfg, data=None, **kw):
        real(cfg, data=data, _stop_after_epoch=1, **kw)  # its checkpoint written, as at a kill after epoch 1
        raise _MachineStopped

    root = tmp_path / "stopped"
    monkeypatch.setattr(bnn_train, "train_model", stopped_after_one_epoch)
    with pytest.raises(_MachineStopped):
        evidence.main([*args, "--root", str(root)])
    folder = cell_folder(str(root), "baseline/binary/s0")
    [epoch1] = bnn_train.load_checkpoint(os.path.join(folder, "checkpoint.pt"))["history"]
    assert len(_journal(root)) == 1 and epoch1["epoch"] == 1 and epoch1["cpu_s"] > 0  # the protocol line only
    monkeypatch.setattr(bnn_train, "train_model", real)
    assert evidence.main([*args, "--root", str(root)]) == 0
    [resumed] = _journal(root)[1:]
    same = ("status", "val_acc", "test_acc", "epochs")
    assert {k: resumed[k] for k in same} == {k: whole[k] for k in same} and resumed["epochs"] == 2
    assert resumed["cpu_s"] > epoch1["cpu_s"] and resumed["wall_s"] > epoch1["wall_s"]  # the first run's time too
    assert sorted(os.listdir(root)) == ["journal.jsonl", "lock", "results.json", "results.md"]  # its folder removed

def test_jobs_train_cells_in_worker_processes_with_the_serial_results(tmp_path, capsys):
    import torch

    root = tmp_path / "jobs"
    assert evidence.main(["--smoke", "--root", str(root), "--no-progress", "--no-plot", "--jobs", "2"]) == 0
    parallel = {r["key"]: r for r in _journal(root)[1:]}
    assert sorted(parallel) == ["M1/binary/s0", "M1/binary/s1", "baseline/binary/s0", "baseline/binary/s1"]
    # each worker trains with cores // jobs threads; the same cell trained here with as many
    # threads gives the same model (its seed fixes every draw)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    try:
        cfg = bnn_train.TrainConfig(dataset="digits", model="digits_net", epochs=1, batch_size=512, milestones=(),
                                    seed=1, measure="M1")
        serial = bnn_train.train_model(cfg)
    finally:
        torch.set_num_threads(threads)
    assert parallel["M1/binary/s1"]["status"] == serial.status
    assert parallel["M1/binary/s1"]["test_acc"] == serial.test_acc
    assert {r["threads"] for r in parallel.values()} == {max(1, (os.cpu_count() or 1) // 2)}  # journaled per cell


def test_jobs_below_one_are_refused(tmp_path, capsys):
    assert evidence.main(["--smoke", "--root", str(tmp_path / "r"), "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_a_cifar_grid_trains_the_papers_fitness_recipe_on_resnet18(tmp_path, dataset):
    # The paper's fitness (bnn.settings.FITNESS): ResNet-18, 15 epochs, Adam 5e-3 constant, batch 128.
    args = evidence.grid._parser().parse_args(["--dataset", dataset, "--root", str(tmp_path / "g")])
    _, base, cells = evidence.grid.setup(args)
    assert (base.dataset, base.model, base.epochs, base.lr, base.batch_size, tuple(base.milestones), base.train_size) \
        == (dataset, "resnet18", 15, 0.005, 128, (), None)
    assert {c["measure"] for c in cells} >= {"baseline", "M1", "M10"}


def test_a_cifar_grid_runs_on_a_tiny_cifar_folder(tmp_path, capsys):
    from _tiny_cifar import make_cifar

    make_cifar(tmp_path / "data", per_batch=16)
    root = tmp_path / "grid"
    assert evidence.main(["--dataset", "cifar10", "--data-dir", str(tmp_path / "data"), "--root", str(root),
                          "--measures", "baseline", "--seeds", "0", "--real-measures", "none", "--epochs", "1",
                          "--val-size", "16", "--batch-size", "32", "--no-progress", "--no-plot"]) == 0
    results = _read_json(root / "results.json")
    assert results["protocol"]["dataset"] == "cifar10" and results["protocol"]["model"] == "resnet18"
    assert [(r["measure"], r["n_ok"]) for r in results["rows"]] == [("baseline", 1)]
