"""``python -m bnn.search`` as a user meets it: help, bad input, JSON summary, files written."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import run_main

ROOT = Path(__file__).resolve().parents[1]
SYN = ["--fitness", "synthetic:2", "--population", "6", "--epochs", "3", "--thresholds", "0.2",
       "--max-evaluations", "300", "--max-trainings", "1000", "--no-progress"]


def cli(*args):
    """bnn.search's main in this process (tests/_cli.py); the Ctrl-C test starts a real one."""
    from bnn.search.cli import main

    return run_main(main, *args)


def test_help():
    r = cli("--help")
    assert r.returncode == 0
    for flag in ("--population", "--thresholds", "--threshold-steps", "--resume", "--reuse", "--paper-faithful",
                 "--backend", "--ray-address", "--workers", "--patience", "--max-evaluations", "--json"):
        assert flag in r.stdout


@pytest.mark.parametrize("args,words", [
    (["--population", "0"], "positive"),
    (["--thresholds", "0.1,x"], "numbers"),
    (["--thresholds", "0.1,0.2", "--threshold-steps", "0"], "threshold-steps"),
    (["--thresholds", "0.1,0.2", "--threshold-steps", "5,10"], "evaluation 0"),
    (["--model", "nonet"], "nonet"),
    (["--fitness", "synthetic:x"], "seed"),
    (["--resume", "/nonexistent/run"], "journal"),
    (["--reuse", "/nonexistent/run", "--fitness", "synthetic:1"], "journal"),
    (["--measure-impl", "numba"], "invalid choice: 'numba' (choose from 'fused', 'eager', 'triton')"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, words):
    # In process (main() is what __main__ calls): an exception escaping it would be the traceback.
    from bnn.search.cli import main

    d = tmp_path / "run"
    assert main([*args, "--run-dir", str(d)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], err
    assert not d.exists()


def test_json_summary_leaderboard_results_and_plot(tmp_path):
    d = tmp_path / "run"
    r = cli(*SYN, "--run-dir", str(d), "--json")
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip().splitlines()
    s = json.loads(out[-1])
    for k in ("evaluations", "trainings", "saved_by_cache", "saved_by_equivalence", "saved_by_screening"):
        assert isinstance(s[k], int)
    assert set(s["best"]) >= {"genome", "formula", "fitness"}
    assert s["evaluations"] == 300 == s["trainings"] + s["saved_by_cache"] + s["saved_by_equivalence"] + s["saved_by_screening"]
    assert any(s["best"]["genome"] in line for line in out[:-1]), "the leaderboard is printed"
    res = json.loads((d / "results.json").read_text())
    assert len(res["evaluations"]) == 300 and len(res["population"]) == 6
    assert res["population"][0]["fitness"] == s["best"]["fitness"]
    pytest.importorskip("matplotlib")
    assert (d / "search.png").stat().st_size > 1000


def test_paper_faithful_switches_every_saving_off(tmp_path):
    r = cli(*SYN, "--max-evaluations", "60", "--run-dir", str(tmp_path / "run"), "--json", "--paper-faithful")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["trainings"] == s["evaluations"] == 60
    assert s["saved_by_cache"] == s["saved_by_equivalence"] == s["saved_by_screening"] == 0


def test_existing_run_dir_needs_resume(tmp_path, capsys):
    d = tmp_path / "run"
    assert cli(*SYN, "--max-evaluations", "10", "--run-dir", str(d)).returncode == 0
    before = (d / "journal.jsonl").read_bytes()
    from bnn.search.cli import main

    assert main([*SYN, "--run-dir", str(d)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (d / "journal.jsonl").read_bytes() == before


def test_ctrl_c_prints_the_leaderboard_writes_results_and_resumes(tmp_path):
    import os
    import signal
    import time

    d = tmp_path / "run"
    # No stop condition the search can reach by itself: the interrupt comes after a condition
    # (31 results journaled) is observed, however fast the host runs the search. results.json may
    # lag the journal by the one result being recorded when Ctrl-C lands (the journal line is
    # written first, so a resume loses nothing).
    p = subprocess.Popen([sys.executable, "-m", "bnn.search", "--fitness", "synthetic:2,delay=0.01", "--population", "6",
                          "--epochs", "3", "--thresholds", "0.2", "--max-evaluations", str(10**9),
                          "--max-trainings", str(10**9), "--no-progress", "--run-dir", str(d)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = d / "journal.jsonl"

    def results_journaled():
        return journal.exists() and journal.read_bytes().count(b'"type":"result"') >= 31

    while p.poll() is None and not results_journaled():
        time.sleep(0.01)
    assert p.poll() is None, f"the search stopped before the interrupt: {p.communicate()[1][-2000:]}"
    os.kill(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "rank" in out and "fitness" in out and "Traceback" not in err
    assert "--resume" in err
    done = json.loads((d / "results.json").read_text())["summary"]["evaluations"]
    assert done >= 30
    from bnn.search.cli import main

    assert main(["--resume", str(d), "--population", "9"]) == 2  # what the search computes is fixed
    r = cli("--resume", str(d), "--max-evaluations", str(done + 20), "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["evaluations"] == done + 20


def test_train_size_is_part_of_the_fitness_setting_and_trains_on_that_subset(tmp_path):
    from bnn.search.cli import main
    from bnn.search.fitness import Worker
    from bnn.search.loop import SearchConfig

    d = tmp_path / "run"
    assert main([*SYN, "--train-size", "100", "--max-evaluations", "3", "--no-progress", "--run-dir", str(d)]) == 0
    start = json.loads((d / "journal.jsonl").read_text().splitlines()[0])
    assert start["config"]["train_size"] == 100
    assert main(["--resume", str(d), "--train-size", "200"]) == 2  # what the search computes is fixed
    cfg = SearchConfig(dataset="digits", model="digits_net", epochs=1, train_size=100)
    worker = Worker("train", cfg.train_dict())
    result = worker.run({"seq": 0, "genome": "0-0-0-0-0-0-1", "reject_below": None})
    assert result["status"] == "ok", result
    assert [len(d.train_y) for d in worker._data.values()] == [100]


def test_the_count_convention_is_recorded_and_a_resume_cannot_change_it(tmp_path):
    from bnn.search import journal as jr

    d = tmp_path / "run"
    small = [a if a != "300" else "20" for a in SYN]
    r = cli(*small, "--counts", "laplace", "--run-dir", str(d))
    assert r.returncode == 0, r.stderr
    events, _ = jr.read(d / jr.JOURNAL)
    assert events[0]["config"]["counts"] == "laplace"
    assert json.loads((d / "results.json").read_text())["config"]["counts"] == "laplace"
    r = cli("--resume", str(d), "--counts", "raw", "--no-progress")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "counts is 'laplace' in the journal; it cannot change to 'raw'" in r.stderr


def test_a_journal_from_before_conventions_resumes_as_raw(tmp_path):
    from bnn.search.loop import Search

    d = tmp_path / "run"
    assert cli(*SYN, "--run-dir", str(d)).returncode == 0
    journal = d / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    start = json.loads(lines[0])
    del start["config"]["counts"]  # as a search journaled before the option
    journal.write_text(json.dumps(start) + "\n" + "".join(lines[1:]))
    assert Search.config_from_journal(d)["counts"] == "raw"
    r = cli("--resume", str(d), "--counts", "freq", "--no-progress")
    assert r.returncode == 2 and "counts is 'raw' in the journal" in r.stderr


def test_a_search_records_its_measure_path_and_a_journal_without_it_resumes_eager(tmp_path):
    from bnn.search.fitness import fitness_config
    from bnn.search.loop import Search, SearchConfig

    small = [a if a != "300" else "20" for a in SYN]
    assert cli(*small, "--run-dir", str(tmp_path / "default")).returncode == 0
    start = json.loads((tmp_path / "default" / "journal.jsonl").read_text().splitlines()[0])
    assert start["config"]["measure_impl"] == "eager"  # a new genome per candidate: no compile to pay
    d = tmp_path / "run"
    assert cli(*small, "--measure-impl", "fused", "--run-dir", str(d)).returncode == 0
    journal = d / "journal.jsonl"
    lines = journal.read_text().splitlines(keepends=True)
    start = json.loads(lines[0])
    assert start["config"]["measure_impl"] == "fused"
    del start["config"]["measure_impl"]  # as a search journaled before the option: its trainings ran eager
    journal.write_text(json.dumps(start) + "\n" + "".join(lines[1:]))
    stored = Search.config_from_journal(d)
    assert stored["measure_impl"] == "eager"
    assert fitness_config(SearchConfig.from_mapping(stored).train_dict(), "M1").measure_impl == "eager"
    r = cli("--resume", str(d), "--max-evaluations", "30", "--no-progress")
    assert r.returncode == 0, r.stderr  # continued, not refused
    r = cli("--resume", str(d), "--measure-impl", "fused", "--no-progress")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "measure_impl is 'eager' in the journal; it cannot change to 'fused'" in r.stderr


def test_equivalence_and_screening_probe_the_searched_convention():
    from bnn.search.fitness import FitnessCache, analyse

    raw, freq = analyse("M1", "raw"), analyse("M1", "freq")
    assert raw.hash != freq.hash  # the same genome is another function of the counts under freq
    assert FitnessCache(counts="freq").analysis("M1") == freq
    assert FitnessCache().analysis("M1") == raw == analyse("M1")
