"""Workers die with their parent (issue 18 item 4): a SIGKILLed ``bnn.search --workers 2`` leaves
no worker process and no multiprocessing resource tracker behind, through the parent-death
signal and, where that is not used, through the liveness pipe."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START_DEADLINE_S = 120  # spawning two workers and importing torch on a loaded 2-core machine
DEATH_DEADLINE_S = 60

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="finds processes through /proc (Linux only)")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a live process, None once it is gone or a zombie (a reparented child
    may stay a zombie where the container's init does not reap it: it holds no memory)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ppid = text[text.rindex(")") + 2:].split()[:2]  # the name may hold spaces and ')'
    return None if state in "ZX" else (state, int(ppid))


def _children(pid: int) -> dict[int, str]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[1] == pid:
                try:
                    out[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except FileNotFoundError:
                    pass
    return out


def _wait_for(condition, deadline_s: float, what: str):
    end = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(0.05)  # polling a condition, not a race: the deadline fails the test


def _kill_all(pids) -> None:
    for pid in pids:  # processes this test started (directly or through the search): never others
        if _stat(pid) is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _kill_parent_and_expect_children_gone(parent: subprocess.Popen, workers: set[int]) -> None:
    children = set(_children(parent.pid))  # the workers and the resource tracker
    assert workers <= children
    try:
        parent.kill()
        parent.wait(timeout=30)
        _wait_for(lambda: all(_stat(pid) is None for pid in children), DEATH_DEADLINE_S,
                  f"the children {sorted(children)} of the killed process to exit "
                  f"(alive: {[p for p in children if _stat(p) is not None]})")
    finally:
        _kill_all(children)


def test_sigkill_of_a_pool_search_leaves_no_worker_and_no_resource_tracker(tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "bnn.search", "--workers", "2", "--backend", "local",
                          "--fitness", "synthetic:1,delay=0.05", "--population", "6", "--epochs", "3",
                          "--thresholds", "0.2", "--max-evaluations", str(10**9), "--max-trainings", str(10**9),
                          "--no-progress", "--run-dir", str(run)], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def two_working_workers():
            if p.poll() is not None:
                pytest.fail(f"the search exited ({p.returncode}) before it was killed")
            workers = {pid for pid, cmd in _children(p.pid).items() if "spawn_main" in cmd}
            journal = run / "journal.jsonl"
            # Results from the pool: both workers have started and set up their parent watch.
            done = journal.exists() and journal.read_bytes().count(b'"type":"result"') >= 4
            return workers if len(workers) == 2 and done else None

        workers = _wait_for(two_working_workers, START_DEADLINE_S, "two workers and four results")
        _kill_parent_and_expect_children_gone(p, workers)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


# A parent that starts one worker which watches only the liveness pipe (the fallback used where
# there is no parent-death signal), prints the worker's pid, then waits to be killed.
FALLBACK_PARENT = """
import multiprocessing as mp, os, sys
sys.path.insert(0, sys.argv[1])
from tests._liveness_child import pipe_watching_worker
if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    theirs, ours = ctx.Pipe(duplex=False)
    ready_r, ready_w = ctx.Pipe(duplex=False)
    w = ctx.Process(target=pipe_watching_worker, args=(theirs, ready_w), daemon=True)
    w.start()
    theirs.close()
    ready_w.close()
    ready_r.recv()  # the worker's watcher thread is running
    print(w.pid, flush=True)
    sys.stdin.read()
"""


def test_the_liveness_pipe_ends_a_worker_when_its_parent_dies(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", FALLBACK_PARENT, str(ROOT)], cwd=tmp_path, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline().strip()  # the condition: the worker watches its pipe now
        assert line.isdigit(), f"the parent did not start its worker (exit {p.poll()})"
        worker = int(line)
        assert _stat(worker) is not None and _stat(worker)[1] == p.pid
        _kill_parent_and_expect_children_gone(p, {worker})
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
