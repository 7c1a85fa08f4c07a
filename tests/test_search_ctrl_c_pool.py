"""Ctrl-C stops a search promptly, a ``--workers 2`` pool search included: the leaderboard is
printed, results.json is written and no worker is left alive.

What went wrong before: a terminal sends SIGINT to its whole foreground process group, and a
worker still importing torch died of it (then the pool restarted it), while the search itself
could lose its KeyboardInterrupt inside a Numba compile (ctypes callbacks print and swallow
exceptions) and ran on for minutes."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_worker_death import START_DEADLINE_S, _children, _kill_all, _stat, _wait_for

from bnn.search.loop import Search, SearchConfig

ROOT = Path(__file__).resolve().parents[1]
EXIT_DEADLINE_S = 120  # generous: a hang is what the tests catch, not a slow machine
SIGINT_BIT = 1 << (signal.SIGINT - 1)  # in the hexadecimal signal masks of /proc/PID/status

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")


def _pool_search(run: Path, delay: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bnn.search", "--workers", "2", "--backend", "local",
                             "--fitness", f"synthetic:1,delay={delay}", "--population", "6", "--epochs", "3",
                             "--thresholds", "0.2", "--max-evaluations", str(10**9), "--max-trainings", str(10**9),
                             "--no-progress", "--run-dir", str(run)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _sigint_masks(pid: int) -> tuple[bool, bool] | None:
    """(blocked, ignored) for SIGINT in a live process, None once it is gone."""
    try:
        fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)
    except (FileNotFoundError, ProcessLookupError):
        return None
    return bool(int(fields["SigBlk"], 16) & SIGINT_BIT), bool(int(fields["SigIgn"], 16) & SIGINT_BIT)


def _stop(p: subprocess.Popen, children) -> None:
    if p.poll() is None:
        p.kill()
        p.wait(timeout=30)
    _kill_all(children)


@linux_only
def test_a_pool_worker_cannot_be_killed_by_ctrl_c_from_its_first_instant(tmp_path):
    # Looked at as soon as each worker exists (its imports take seconds): SIGINT must already be
    # blocked (inherited from the search while it started the worker) or ignored (once running).
    p = _pool_search(tmp_path / "run", delay=0.05)
    seen: dict[int, list] = {}
    try:
        def both_workers_running():
            if p.poll() is not None:
                pytest.fail(f"the search exited ({p.returncode}): {p.communicate()[1][-2000:]}")
            for pid, cmd in _children(p.pid).items():
                if "spawn_main" in cmd:
                    masks = _sigint_masks(pid)
                    if masks is not None:
                        seen.setdefault(pid, []).append(masks)
            running = [pid for pid, masks in seen.items() if masks[-1] == (False, True)]
            return len(running) >= 2

        _wait_for(both_workers_running, START_DEADLINE_S, "two workers that ignore SIGINT")
        exposed = {pid: masks for pid, masks in seen.items() if (False, False) in masks}
        assert not exposed, f"workers seen with SIGINT neither blocked nor ignored: {exposed}"
        assert len(seen) == 2, f"a worker was restarted: {sorted(seen)}"
    finally:
        _stop(p, seen)


@linux_only
def test_ctrl_c_stops_a_pool_search_prints_the_leaderboard_and_leaves_no_worker(tmp_path):
    run = tmp_path / "run"
    journal = run / "journal.jsonl"
    p = _pool_search(run, delay=0.05)
    children: set[int] = set()
    try:
        def two_workers_and_results():
            if p.poll() is not None:
                pytest.fail(f"the search exited ({p.returncode}) before the interrupt: {p.communicate()[1][-2000:]}")
            workers = {pid for pid, cmd in _children(p.pid).items() if "spawn_main" in cmd}
            done = journal.exists() and journal.read_bytes().count(b'"type":"result"') >= 6
            return workers if len(workers) == 2 and done else None

        workers = _wait_for(two_workers_and_results, START_DEADLINE_S, "two workers and six results")
        children = set(_children(p.pid))  # the workers and the resource tracker
        assert workers <= children
        os.killpg(p.pid, signal.SIGINT)  # Ctrl-C: the search and its workers all get it
        out, err = p.communicate(timeout=EXIT_DEADLINE_S)
        assert p.returncode == 130, err
        assert "rank" in out and "fitness" in out and "Traceback" not in err, err
        assert "--resume" in err
        assert json.loads((run / "results.json").read_text())["summary"]["evaluations"] >= 6
        _wait_for(lambda: all(_stat(pid) is None for pid in children), 60,
                  f"the search's children {sorted(children)} to exit")
    finally:
        _stop(p, children)


def test_a_ctrl_c_that_lands_in_code_which_swallows_exceptions_still_stops_the_search(tmp_path):
    # As a ctypes callback of a Numba compile does: the KeyboardInterrupt raised inside is printed
    # and dropped. The search must stop anyway, at its next step, not run to its budget.
    cfg = SearchConfig(fitness="synthetic:3", epochs=4, population=6, thresholds=[0.2], threshold_steps=[0],
                       max_evaluations=200)
    s = Search(cfg, tmp_path / "run", progress=False)
    s.start_new()
    lookup = s.cache.lookup
    calls = []

    def swallowing_lookup(genome, threshold):
        calls.append(genome)
        try:
            if len(calls) == 5:
                os.kill(os.getpid(), signal.SIGINT)  # delivered to this (the main) thread
            return lookup(genome, threshold)
        except KeyboardInterrupt:
            return lookup(genome, threshold)

    s.cache.lookup = swallowing_lookup
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        s.run()
    assert len(s.results) < 10, f"the search ran on after Ctrl-C: {len(s.results)} evaluations"
    assert signal.getsignal(signal.SIGINT) is before  # the engine's handler is gone
