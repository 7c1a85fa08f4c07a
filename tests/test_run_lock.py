"""One writer per run folder (issue 18 item 3): the lock helper, ``bnn.search`` and ``bnn.train``
refusing a held folder, and the search journal written in append mode."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bnn import train as train_cli
from bnn.common.runlock import RunDirInUse, hold_run_dir
from bnn.search import cli as search_cli
from bnn.search import journal as jr

ROOT = Path(__file__).resolve().parents[1]
SYN = ["--fitness", "synthetic:2", "--population", "4", "--epochs", "3", "--thresholds", "0.2",
       "--max-evaluations", "12", "--no-progress"]
# A second process that takes the lock, says so, and holds it until its stdin closes.
HOLDER = ("import sys; from bnn.common.runlock import hold_run_dir; lock = hold_run_dir(sys.argv[1]); "
          "print('held', flush=True); sys.stdin.read()")


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _in_use(line: str, run_dir, pid: int) -> bool:
    return f"{run_dir} is in use by another process (pid {pid}): wait for it to finish or use another folder" in line


def test_a_second_holder_is_refused_with_the_holders_pid(tmp_path):
    with hold_run_dir(tmp_path / "run") as lock:
        assert lock.held and (tmp_path / "run" / "lock").read_text().strip() == str(os.getpid())
        with pytest.raises(RunDirInUse) as info:
            hold_run_dir(tmp_path / "run")  # another open file description: flock refuses it too
        assert info.value.pid == os.getpid() and _in_use(str(info.value), tmp_path / "run", os.getpid())
    with hold_run_dir(tmp_path / "run"):  # released on leaving the block
        pass


def test_a_missing_folder_is_not_created_when_asked_not_to(tmp_path):
    with pytest.raises(FileNotFoundError):
        hold_run_dir(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()


def test_another_process_holds_it_until_it_dies(tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], cwd=ROOT, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"  # the condition: the child holds it now
        with pytest.raises(RunDirInUse) as info:
            hold_run_dir(run)
        assert info.value.pid == p.pid
    finally:
        p.kill()  # the kernel drops a dead process's lock: no stale lock, only a stale file
        p.wait(timeout=30)
    with hold_run_dir(run):
        pass


# -- bnn.search ------------------------------------------------------------------------------------

def test_search_resume_of_a_held_folder_is_refused_and_the_journal_is_untouched(tmp_path, capsys):
    run = tmp_path / "run"
    assert search_cli.main([*SYN, "--run-dir", str(run)]) == 0
    before = (run / jr.JOURNAL).read_bytes()
    capsys.readouterr()
    with hold_run_dir(run):  # as a running search holds it
        assert search_cli.main(["--resume", str(run), "--max-evaluations", "20", "--no-progress"]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert _in_use(line, run, os.getpid()) and line.startswith("bnn.search: error: ")
        # A new search into it is refused alike (it holds a journal and is in use).
        assert search_cli.main([*SYN, "--run-dir", str(run)]) == 2
        assert _in_use(_one_error_line(capsys.readouterr().err), run, os.getpid())
    assert (run / jr.JOURNAL).read_bytes() == before
    assert search_cli.main(["--resume", str(run), "--max-evaluations", "20", "--no-progress"]) == 0
    assert len((run / jr.JOURNAL).read_bytes()) > len(before)


def test_a_new_search_into_a_held_empty_folder_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    with hold_run_dir(run):
        assert search_cli.main([*SYN, "--run-dir", str(run)]) == 2
    assert _in_use(_one_error_line(capsys.readouterr().err), run, os.getpid())
    assert sorted(os.listdir(run)) == ["lock"], "nothing was written"


def test_search_holds_the_lock_while_it_runs(tmp_path, monkeypatch):
    seen = []
    real_run = search_cli.Search.run

    def run_and_probe(self):
        with pytest.raises(RunDirInUse):
            hold_run_dir(self.run_dir)
        seen.append(True)
        return real_run(self)

    monkeypatch.setattr(search_cli.Search, "run", run_and_probe)
    assert search_cli.main([*SYN, "--run-dir", str(tmp_path / "run")]) == 0
    assert seen == [True]
    with hold_run_dir(tmp_path / "run"):  # and gives it back at the end
        pass


# -- the journal -----------------------------------------------------------------------------------

def test_the_journal_appends_after_what_another_handle_appended(tmp_path):
    path = tmp_path / jr.JOURNAL
    j = jr.Journal.create(path, {"n": 0, "config": {}})
    j.append({"type": "x", "n": 1})
    j.close()
    _, good = jr.read(path)
    with open(path, "ab") as fh:
        fh.write(b'{"torn":')  # a torn tail, cut off on opening
    j = jr.Journal.open_for_append(path, good)
    with open(path, "ab") as other:
        other.write(b'{"type":"other"}\n')  # a concurrent append by another handle
    j.append({"type": "x", "n": 2})
    j.close()
    lines = path.read_bytes().splitlines()
    assert [json.loads(x).get("n", json.loads(x)["type"]) for x in lines] == [0, 1, "other", 2]


def test_create_never_clobbers_a_journal(tmp_path):
    path = tmp_path / jr.JOURNAL
    path.write_bytes(b"keep\n")
    with pytest.raises(FileExistsError):
        jr.Journal.create(path, {})
    assert path.read_bytes() == b"keep\n"


# -- bnn.train -------------------------------------------------------------------------------------

def test_train_out_into_a_held_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    with hold_run_dir(out):
        code = train_cli.main(["--out", str(out), "--epochs", "1", "--no-progress"])
    assert code == 2
    assert _in_use(_one_error_line(capsys.readouterr().err), out, os.getpid())
    assert sorted(os.listdir(out)) == ["lock"], "nothing was written"


def test_train_resume_of_a_held_folder_is_refused_before_the_checkpoint_is_read(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"not read while another process trains here")
    with hold_run_dir(out):
        assert train_cli.main(["--resume", str(out), "--no-progress"]) == 2
    assert _in_use(_one_error_line(capsys.readouterr().err), out, os.getpid())
    assert sorted(os.listdir(out)) == ["checkpoint.pt", "lock"]


def test_train_with_a_bad_setting_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert train_cli.main(["--out", str(out), "--epochs", "0", "--no-progress"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--epochs" in line and "positive integer" in line
    assert not out.exists()
