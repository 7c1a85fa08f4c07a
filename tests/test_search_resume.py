"""SIGKILL at any moment + --resume == an uninterrupted run (serial backend, fixed seed).

Real subprocesses, killed with SIGKILL once the journal reaches a given number of lines (so the
kill lands wherever the process happens to be: mid-write, mid-"training", between lines), then
resumed, sometimes killed again, and compared with an uninterrupted run of the same command.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli import run_main

from bnn.search import journal as jr
from bnn.search.loop import Search, SearchConfig

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--fitness", "synthetic:5,delay=0.003", "--population", "8", "--epochs", "3",
        "--thresholds", "0.2,0.3", "--threshold-steps", "0,40", "--max-evaluations", "100",
        "--max-trainings", "1000", "--seed", "4", "--no-progress", "--json"]


def cli(*extra):
    """bnn.search's main in this process (tests/_cli.py): the uninterrupted run and the last resume
    need no process of their own; the killed ones are real subprocesses."""
    from bnn.search.cli import main

    return run_main(main, *extra)


def comparable(run_dir):
    r = json.loads((Path(run_dir) / "results.json").read_text())
    volatile = ("time", "wall_s")
    evals = [{k: v for k, v in e.items() if k not in volatile} for e in r["evaluations"]]
    return evals, r["population"]


def kill_when(run_dir, lines, extra=()):
    """Start the search and SIGKILL it once its journal has at least ``lines`` lines."""
    p = subprocess.Popen([sys.executable, "-m", "bnn.search", *ARGS, "--run-dir", str(run_dir), *extra],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = Path(run_dir) / jr.JOURNAL
    deadline = time.time() + 120
    try:
        while time.time() < deadline and p.poll() is None:
            if path.exists() and path.read_bytes().count(b"\n") >= lines:
                break
            time.sleep(0.001)
        os.kill(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
    return p.returncode


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref") / "run"
    r = cli(*ARGS, "--run-dir", str(d))
    assert r.returncode == 0, r.stderr
    return comparable(d)


@pytest.mark.parametrize("kills", [[2], [9, 60], [150, 170]],
                         ids=["in-first-proposal", "init-then-evolution", "evolution-twice"])
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, reference, kills):
    d = tmp_path / "run"
    killed_mid_run = 0
    for i, n in enumerate(kills):
        if i == 0:
            rc = kill_when(d, n)
        else:  # kill the resumed process too
            p = subprocess.Popen([sys.executable, "-m", "bnn.search", "--resume", str(d), "--json", "--no-progress"],
                                 cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            path = d / jr.JOURNAL
            while p.poll() is None and path.read_bytes().count(b"\n") < n:
                time.sleep(0.001)
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            rc = p.wait()
        killed_mid_run += rc == -signal.SIGKILL
    assert killed_mid_run >= 1, "no kill landed before the run finished; the test proved nothing"
    r = cli("--resume", str(d), "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert comparable(d) == reference
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["evaluations"] == 100


def test_torn_last_line_is_ignored_and_cut_off(tmp_path):
    cfg = SearchConfig(fitness="synthetic:5", epochs=3, population=6, thresholds=[0.2], threshold_steps=[0],
                       max_evaluations=30)
    a = Search(cfg, tmp_path / "a", progress=False)
    a.start_new()
    a.run()
    path = tmp_path / "a" / jr.JOURNAL
    lines = path.read_bytes().splitlines(keepends=True)
    cut = lines[:25]
    torn = lines[25][: len(lines[25]) // 2]  # half a line, no newline: a write cut by a kill
    path.write_bytes(b"".join(cut) + torn)
    events, good = jr.read(path)
    assert len(events) == 25 and good == len(b"".join(cut))
    b = Search(cfg, tmp_path / "a", progress=False)
    b.resume()
    b.run()
    events, good = jr.read(path)
    assert good == path.stat().st_size, "the torn bytes were truncated before appending"
    assert [e["genome"] for e in b.results.values()] == [e["genome"] for e in a.results.values()]
    assert [(m.genome, m.fitness) for m in b.ga.population] == [(m.genome, m.fitness) for m in a.ga.population]


def test_garbage_in_the_middle_of_a_journal_is_an_error(tmp_path):
    path = tmp_path / jr.JOURNAL
    path.write_text('{"type":"start","config":{}}\nnot json\n{"type":"end"}\n')
    with pytest.raises(jr.JournalError):
        jr.read(path)
