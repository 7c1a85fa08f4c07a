"""Outputs (issue 18 items 9, 10): every file is written durably and atomically (temp file, fsync,
rename, fsync the folder), a full disk is one line that keeps the old file, a destination that is
not a regular file or is the command's input is refused, a finished run is neither overwritten
nor rewritten, and temp files of killed writers are removed at start."""
import errno
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
from _tiny_bnn import model_bytes, tiny_model

from refimpl import fileio

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
TRAIN = ["--epochs", "1", "--train-size", "64", "--no-progress"]  # digits: about a second
ENOSPC = "No space left on device"


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _files(folder) -> dict:
    """name -> bytes of every regular file in a folder (the lock file aside)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != "lock"}


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)  # reaped by run(): no process has this pid now


def _fail_fsync(monkeypatch, marker: str = "", calls: list | None = None):
    """os.fsync raises ENOSPC for a file whose path holds ``marker`` ("" = every file)."""
    real = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if calls is not None:
            calls.append(path)
        if marker in path and stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.ENOSPC, ENOSPC)
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


# ---------------------------------------------------------------------------------------------
# refimpl.fileio


def test_a_write_fsyncs_the_file_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    seen = []
    real = os.fsync

    def fsync(fd):
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        seen.append((kind, path.read_bytes()))  # what the final name holds at that moment
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fileio.atomic_write_bytes(path, b"new")
    assert seen == [("file", b"old"), ("folder", b"new")]
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]


@needs_proc
@pytest.mark.parametrize("where", ["write", "fsync"])
def test_a_full_disk_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch, where):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old content")
    if where == "fsync":
        _fail_fsync(monkeypatch)
    with pytest.raises(OSError) as err:
        with fileio.atomic_file(path) as f:
            f.write(b"partial")
            if where == "write":  # a write that runs out of space half-way: some bytes reached the temp file
                f.flush()
                raise OSError(errno.ENOSPC, ENOSPC)
    assert str(err.value) == f"cannot write {path}: No space left on device; free space and rerun"
    assert err.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"old content"
    assert sorted(os.listdir(tmp_path)) == ["out.bin"]


def test_the_callers_own_error_passes_unchanged_and_leaves_nothing(tmp_path):
    path = tmp_path / "out.bin"
    with pytest.raises(ValueError, match="^mine$"):
        with fileio.atomic_file(path) as f:
            f.write(b"half")
            raise ValueError("mine")
    assert os.listdir(tmp_path) == []


@needs_fifo
def test_non_regular_destinations_are_refused_and_left_as_they_are(tmp_path):
    fifo, folder, link = tmp_path / "fifo", tmp_path / "folder", tmp_path / "link"
    os.mkfifo(fifo)
    folder.mkdir()
    (tmp_path / "target").write_bytes(b"t")
    link.symlink_to(tmp_path / "target")
    for path, kind in ((fifo, "a FIFO"), (folder, "a folder"), (link, "a symbolic link")):
        with pytest.raises(OSError) as err:
            fileio.atomic_write_bytes(path, b"data")
        assert str(err.value).startswith(f"refusing to write {path}: it is {kind}, and replacing it would destroy it;")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and folder.is_dir() and link.is_symlink()
    assert (tmp_path / "target").read_bytes() == b"t"
    assert sorted(os.listdir(tmp_path)) == ["fifo", "folder", "link", "target"]


def test_an_output_that_is_an_input_is_refused_by_any_spelling(tmp_path):
    src = tmp_path / "in.pt"
    src.write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    os.link(src, tmp_path / "hard.pt")
    for out in (src, tmp_path / "sub" / ".." / "in.pt", tmp_path / "hard.pt"):
        with pytest.raises(OSError, match="is the input"):
            fileio.check_output(out, [str(src)])
    fileio.check_output(tmp_path / "other.pt", [src, None])  # another file, or no input: fine


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    stale = fileio.temp_name("checkpoint.pt", dead)
    # A live writer's temp, and names a user may choose that only look like temps (issue 30 item 3).
    kept = [fileio.temp_name("summary.json", alive), "notes.tmp.txt", f".x.tmp.{dead}.npy",
            f".checkpoint.pt.tmp.{dead}", f"checkpoint.pt.tmp.{dead}", f".checkpoint.pt.tmp.{dead}.0123456789ab"]
    for n in [stale, *kept]:
        (tmp_path / n).write_bytes(b"")
    (tmp_path / fileio.temp_name("dir", dead)).mkdir()  # not a file: never removed
    assert fileio.remove_stale_temps(tmp_path) == [stale]
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, fileio.temp_name("dir", dead)])


# ---------------------------------------------------------------------------------------------
# bnn.train: a finished run is neither replaced nor rewritten; checkpoints are durable


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    import torch

    from bnn.train import main

    torch.set_num_threads(2)
    out = tmp_path_factory.mktemp("train") / "run"
    assert main(["--out", str(out), *TRAIN]) == 0
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    return out


def test_train_out_into_a_finished_run_is_refused_and_overwrite_replaces_it(run_copy, capsys):
    import json

    from bnn.train import main

    before = _files(run_copy)
    assert main(["--out", str(run_copy), "--epochs", "2", "--train-size", "64", "--no-progress"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == (f"error: {run_copy} holds a finished run (summary.json); pass --overwrite to replace it, "
                    "or choose another --out")
    assert _files(run_copy) == before
    (run_copy / "summary.json").unlink()  # a run killed before it finished: its checkpoint is refused too
    assert main(["--out", str(run_copy), *TRAIN]) == 2
    assert f"continue it with --resume {run_copy}" in _one_error_line(capsys.readouterr().err)
    assert main(["--out", str(run_copy), "--overwrite", "--epochs", "2", "--train-size", "64", "--no-progress"]) == 0
    assert json.loads((run_copy / "summary.json").read_text())["epochs"] == 2
    assert len((run_copy / "metrics.jsonl").read_text().splitlines()) == 2


def test_overwrite_does_not_go_with_resume(run_copy, capsys):
    from bnn.train import main

    before = _files(run_copy)
    assert main(["--resume", str(run_copy), "--overwrite", "--no-progress"]) == 2
    assert "--overwrite" in _one_error_line(capsys.readouterr().err)
    assert _files(run_copy) == before


def test_resume_of_a_finished_run_reports_it_and_rewrites_nothing(run_copy, capsys):
    import json

    from bnn.train import main

    before = _files(run_copy)
    mtimes = {p.name: p.stat().st_mtime_ns for p in run_copy.iterdir() if p.name != "lock"}  # the lock holds the pid
    recorded = json.loads(before["summary.json"])
    assert main(["--resume", str(run_copy), "--json", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert f"{run_copy} is a finished run (ok, 1 epochs): nothing was trained or rewritten" in err
    assert json.loads(out.splitlines()[-1])["wall_s"] == recorded["wall_s"]  # the run's own figure
    assert _files(run_copy) == before
    assert {p.name: p.stat().st_mtime_ns for p in run_copy.iterdir() if p.name != "lock"} == mtimes


def test_resume_of_a_finished_run_restores_a_missing_summary_with_its_recorded_figures(run_copy, capsys):
    import json

    from bnn.train import main

    recorded = json.loads((run_copy / "summary.json").read_text())
    (run_copy / "summary.json").unlink()  # a kill between the last checkpoint and the summary
    last = json.loads((run_copy / "metrics.jsonl").read_text().splitlines()[-1])
    assert main(["--resume", str(run_copy), "--no-progress"]) == 0
    restored = json.loads((run_copy / "summary.json").read_text())
    assert restored["wall_s"] == last["wall_s"]
    assert {k: restored[k] for k in ("status", "epochs", "val_acc", "test_acc")} == \
        {k: recorded[k] for k in ("status", "epochs", "val_acc", "test_acc")}


@needs_proc
def test_a_full_disk_during_a_checkpoint_save_is_one_line_and_keeps_the_last_checkpoint(run_copy, monkeypatch, capsys):
    from bnn.train import main

    before = (run_copy / "checkpoint.pt").read_bytes()
    _fail_fsync(monkeypatch, ".checkpoint.pt.tmp.")
    assert main(["--resume", str(run_copy), "--epochs", "2", "--no-progress"]) == 2  # extends: saves epoch 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == f"error: cannot write {run_copy}/checkpoint.pt: No space left on device; free space and rerun"
    assert (run_copy / "checkpoint.pt").read_bytes() == before
    assert not [n for n in os.listdir(run_copy) if ".tmp" in n]


def test_train_removes_stale_temp_files_at_start(run_copy):
    from bnn.train import main

    dead = _dead_pid()
    stale = fileio.temp_name("checkpoint.pt", dead)
    users = [f".checkpoint.pt.tmp.{dead}", f"results.tmp.{dead}", f".draft.tex.tmp.{dead}"]  # look alike, not ours
    for n in [stale, *users]:
        (run_copy / n).write_bytes(b"half a checkpoint")
    assert main(["--resume", str(run_copy), "--no-progress"]) == 0
    assert stale not in os.listdir(run_copy)
    assert set(users) <= set(os.listdir(run_copy))


@needs_fifo
def test_train_output_that_is_not_a_regular_file_is_refused_before_training(tmp_path, capsys):
    from bnn.train import main

    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "metrics.jsonl")
    assert main(["--out", str(out), *TRAIN]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: refusing to write {out}/metrics.jsonl: it is a FIFO")
    assert stat.S_ISFIFO(os.lstat(out / "metrics.jsonl").st_mode)
    assert sorted(os.listdir(out)) == ["lock", "metrics.jsonl"]


# ---------------------------------------------------------------------------------------------
# bnn.export


def test_export_onto_its_own_checkpoint_is_refused_and_the_checkpoint_survives(run_copy, capsys):
    from bnn.export import main

    ckpt = run_copy / "checkpoint.pt"
    before = ckpt.read_bytes()
    for out in (ckpt, run_copy / ".." / "run" / "checkpoint.pt"):
        assert main([str(ckpt), "-o", str(out)]) == 2
        assert "is the input" in _one_error_line(capsys.readouterr().err)
    assert ckpt.read_bytes() == before


@needs_fifo
def test_export_to_a_fifo_is_refused(run_copy, capsys):
    from bnn.export import main

    os.mkfifo(run_copy / "model.bnn")
    assert main([str(run_copy / "checkpoint.pt"), "-o", str(run_copy / "model.bnn")]) == 2
    assert "it is a FIFO" in _one_error_line(capsys.readouterr().err)
    assert stat.S_ISFIFO(os.lstat(run_copy / "model.bnn").st_mode)


@needs_proc
def test_export_on_a_full_disk_is_one_line_and_keeps_the_old_model(run_copy, monkeypatch, capsys):
    from bnn.export import main

    model = run_copy / "model.bnn"
    model.write_bytes(b"the previous export")
    before = set(os.listdir(run_copy))
    _fail_fsync(monkeypatch, ".model.bnn.tmp.")
    assert main([str(run_copy / "checkpoint.pt"), "-o", str(model)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == f"error: cannot write {model}: No space left on device; free space and rerun"
    assert model.read_bytes() == b"the previous export"
    assert set(os.listdir(run_copy)) == before


# ---------------------------------------------------------------------------------------------
# refimpl.infer --out


@pytest.fixture
def tiny(tmp_path):
    meta, tensors = tiny_model(classes=3)
    path = tmp_path / "tiny.bnn"
    path.write_bytes(model_bytes(meta, tensors))
    x = np.random.default_rng(0).integers(0, 256, (5, 8, 8, 1), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    return tmp_path


def _infer(*args) -> int:
    from refimpl.infer import main

    return main([*map(str, args)])


def test_infer_out_writes_only_the_predictions(tiny, capsys):
    assert _infer(tiny / "tiny.bnn", "--input", tiny / "x.npy", "--threads", "1", "--out", tiny / "preds") == 0
    preds = np.load(tiny / "preds", allow_pickle=False)
    assert preds.dtype == np.int64 and preds.shape == (5,) and ((0 <= preds) & (preds < 3)).all()
    assert sorted(os.listdir(tiny)) == ["preds", "tiny.bnn", "x.npy"]


@needs_fifo
def test_infer_out_that_is_a_folder_a_fifo_or_the_model_is_refused_and_leaves_nothing(tiny, capsys):
    (tiny / "folder").mkdir()
    os.mkfifo(tiny / "fifo")
    model = (tiny / "tiny.bnn").read_bytes()
    for out, words in (("folder", "it is a folder"), ("fifo", "it is a FIFO"), ("tiny.bnn", "is the input"),
                       ("x.npy", "is the input")):
        assert _infer(tiny / "tiny.bnn", "--input", tiny / "x.npy", "--out", tiny / out) == 2
        assert words in _one_error_line(capsys.readouterr().err)
    assert sorted(os.listdir(tiny)) == ["fifo", "folder", "tiny.bnn", "x.npy"]
    assert os.listdir(tiny / "folder") == [] and stat.S_ISFIFO(os.lstat(tiny / "fifo").st_mode)
    assert (tiny / "tiny.bnn").read_bytes() == model


# ---------------------------------------------------------------------------------------------
# bnn.search: results.json and search.png


SEARCH = ["--fitness", "synthetic:2", "--population", "6", "--epochs", "3", "--thresholds", "0.2",
          "--max-evaluations", "12", "--no-progress"]


@needs_fifo
def test_search_refuses_a_non_regular_output_before_it_starts(tmp_path, capsys):
    from bnn.search.cli import main

    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "results.json")
    assert main([*SEARCH, "--run-dir", str(run)]) == 2
    assert f"refusing to write {run}/results.json: it is a FIFO" in _one_error_line(capsys.readouterr().err)
    assert sorted(os.listdir(run)) == ["lock", "results.json"]  # no journal: nothing was started


@needs_proc
def test_search_on_a_full_disk_keeps_the_old_results_and_removes_stale_temps(tmp_path, monkeypatch, capsys):
    from bnn.search.cli import main

    run = tmp_path / "run"
    run.mkdir()
    dead = _dead_pid()
    (run / "results.json").write_bytes(b"old results")
    (run / fileio.temp_name("results.json", dead)).write_bytes(b"half")  # a killed writer's
    for n in (f"notes.tmp.{dead}", "results.json.tmp"):  # a user's files, not temps of this version
        (run / n).write_bytes(b"mine")
    _fail_fsync(monkeypatch, ".results.json.tmp.")
    assert main([*SEARCH, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"bnn.search: error: cannot write {run}/results.json: "
                                            "No space left on device; free space and rerun")
    assert (run / "results.json").read_bytes() == b"old results"
    assert sorted(n for n in os.listdir(run) if ".tmp" in n) == sorted([f"notes.tmp.{dead}", "results.json.tmp"])
