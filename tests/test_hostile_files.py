"""Files in a user's folder (issue 30 items 1-3): a planted symbolic link or a file the project did
not write is never written through, truncated or deleted: run locks, journals, temp files."""
import os
import subprocess
import sys

import pytest

from bnn import evidence
from bnn.common.jsonl import append_line
from bnn.common.runlock import hold_run_dir
from bnn.search import cli as search_cli
from bnn.search import journal as jr
from refimpl import fileio

SYN = ["--fitness", "synthetic:2", "--population", "4", "--epochs", "3", "--thresholds", "0.2",
       "--max-evaluations", "6", "--no-progress"]
PRECIOUS = b"precious notes\n"


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _planted(tmp_path, run, name):
    """``run/name`` -> a user's file outside ``run``; returns the target."""
    run.mkdir(parents=True, exist_ok=True)
    target = run.parent / "v.txt"
    target.write_bytes(PRECIOUS)
    os.symlink(target, run / name)
    return target


def test_a_lock_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    target = _planted(tmp_path, tmp_path / "run", "lock")
    with pytest.raises(OSError, match="symbolic link"):
        hold_run_dir(tmp_path / "run")
    assert target.read_bytes() == PRECIOUS


def test_a_lock_that_is_a_hard_link_to_another_file_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "v.txt").write_bytes(PRECIOUS)
    os.link(tmp_path / "v.txt", tmp_path / "run" / "lock")
    with pytest.raises(OSError, match="hard links"):
        hold_run_dir(tmp_path / "run")
    assert (tmp_path / "v.txt").read_bytes() == PRECIOUS


def test_a_lock_that_is_a_fifo_is_refused_without_hanging(tmp_path):
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "lock")
    with pytest.raises(OSError, match="FIFO"):
        hold_run_dir(tmp_path / "run")


def test_search_into_a_folder_with_a_planted_lock_link_is_one_line(tmp_path, capsys):
    target = _planted(tmp_path, tmp_path / "run", "lock")
    assert search_cli.main([*SYN, "--run-dir", str(tmp_path / "run")]) == 2
    assert "symbolic link" in _one_error_line(capsys.readouterr().err)
    assert target.read_bytes() == PRECIOUS
    assert sorted(os.listdir(tmp_path / "run")) == ["lock"]


# -- the evidence grid's journal ------------------------------------------------------------------

def test_a_journal_of_one_line_of_user_text_is_refused_not_truncated(tmp_path):
    path = tmp_path / "journal.jsonl"
    for text in (b"my notes, no newline", b"my notes\n", b"[1, 2\n"):
        path.write_bytes(text)
        with pytest.raises(evidence.GridError, match="line 1 is not"):
            evidence.read_journal(str(path), print)
        assert path.read_bytes() == text


def test_a_last_line_of_user_text_after_the_grids_lines_is_refused_not_truncated(tmp_path):
    path = tmp_path / "journal.jsonl"
    good = b'{"kind": "protocol", "version": 1, "protocol": {}}\n'
    for tail in (b"my notes", b'{"note": "mine"'):
        path.write_bytes(good + tail)
        with pytest.raises(evidence.GridError, match="line 2 is not"):
            evidence.read_journal(str(path), print)
        assert path.read_bytes() == good + tail


def test_a_torn_protocol_line_is_still_cut_off(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"kind": "protocol", "version": 1, "proto')
    logged = []
    assert evidence.read_journal(str(path), logged.append) == (None, {})
    assert path.read_bytes() == b"" and logged == [f"{path}: ignored a torn last line"]


def test_a_journal_that_is_a_symbolic_link_is_refused_and_its_target_untouched(tmp_path):
    root = tmp_path / "ev"
    target = _planted(tmp_path, root, "journal.jsonl")
    with pytest.raises(OSError, match="symbolic link"):
        evidence.read_journal(str(root / "journal.jsonl"), print)
    with pytest.raises(OSError, match="symbolic link"):
        append_line(str(root / "journal.jsonl"), {"kind": "x"})
    assert target.read_bytes() == PRECIOUS


def test_evidence_smoke_with_a_planted_journal_or_lock_link_is_one_line(tmp_path):
    for name in ("journal.jsonl", "lock"):
        root = tmp_path / name / "ev"
        target = _planted(tmp_path / name, root, name)
        r = subprocess.run([sys.executable, "-m", "bnn.evidence", "--smoke", "--root", str(root), "--no-progress",
                            "--no-plot"], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        assert r.returncode == 2, r.stderr
        assert "symbolic link" in _one_error_line(r.stderr)
        assert target.read_bytes() == PRECIOUS


@pytest.mark.parametrize("planted", ["cells", "cells/baseline_binary_s0"])
def test_an_evidence_cells_folder_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, capsys, planted):
    # A cell keeps its checkpoint in ROOT/cells/<key> and the grid deletes that folder once journaled.
    root, target = tmp_path / "ev", tmp_path / "users"
    (target / "baseline_binary_s0").mkdir(parents=True)
    (target / "baseline_binary_s0" / "notes.txt").write_bytes(PRECIOUS)
    (root / planted).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target if planted == "cells" else target / "baseline_binary_s0", root / planted)
    assert evidence.main(["--smoke", "--root", str(root), "--no-progress", "--no-plot"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"refusing to use {root / planted}: it is a symbolic link" in line
    assert (target / "baseline_binary_s0" / "notes.txt").read_bytes() == PRECIOUS
    assert sorted(os.listdir(target)) == ["baseline_binary_s0"] and os.path.islink(root / planted)


# -- the search journal -----------------------------------------------------------------------------

def test_a_search_journal_link_is_refused_on_resume_and_its_target_untouched(tmp_path, capsys):
    run = tmp_path / "run"
    assert search_cli.main([*SYN, "--run-dir", str(run)]) == 0
    target = tmp_path / "v.txt"
    os.replace(run / jr.JOURNAL, target)
    os.symlink(target, run / jr.JOURNAL)
    before = target.read_bytes()
    capsys.readouterr()
    assert search_cli.main(["--resume", str(run), "--max-evaluations", "8", "--no-progress"]) == 2
    assert "symbolic link" in _one_error_line(capsys.readouterr().err)
    assert target.read_bytes() == before


# -- temp files -------------------------------------------------------------------------------------

def test_a_users_files_that_look_like_temps_survive_the_cleanup(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    users = [f"results.tmp.{dead}", f".draft.tex.tmp.{dead}", f"notes.tmp.{dead}", "results.json.tmp"]
    for n in users:
        (tmp_path / n).write_bytes(PRECIOUS)
    ours = fileio.temp_name("results.json", int(dead))
    (tmp_path / ours).write_bytes(b"half")
    assert fileio.remove_stale_temps(tmp_path) == [ours]
    assert sorted(os.listdir(tmp_path)) == sorted(users)
