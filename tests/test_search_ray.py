"""Parallel backends: Ray actors and local worker processes, each surviving a worker killed
mid-evaluation (SIGKILL from inside the job), with a journal that stays consistent."""
import json
from collections import Counter

import pytest

from bnn.search import journal as jr
from bnn.search.loop import Search, SearchConfig


def check_journal(run_dir, evaluations):
    events, _ = jr.read(run_dir / jr.JOURNAL)
    props = [e["seq"] for e in events if e["type"] == "proposal"]
    results = [e for e in events if e["type"] == "result"]
    assert props == list(range(evaluations)), "proposals are numbered without gaps"
    assert Counter(e["seq"] for e in results) == Counter(props), "exactly one result per proposal"
    for e in results:
        assert e["genome"] == next(p["genome"] for p in events if p["type"] == "proposal" and p["seq"] == e["seq"])
    assert events[-1]["type"] == "end"
    return results


def search(tmp_path, **kw):
    marker = tmp_path / "died"
    cfg = SearchConfig(fitness=f"synthetic:9,delay=0.02,die_once={marker}", epochs=3, population=6, seed=1,
                       thresholds=[0.2], threshold_steps=[0], max_evaluations=40, workers=2, **kw)
    s = Search(cfg, tmp_path / "run", progress=False)
    s.start_new()
    s.run()
    assert marker.exists(), "the test hook did not kill a worker"
    results = check_journal(s.run_dir, 40)
    assert not [e for e in results if e["status"] == "error"], "the killed job was retried, not failed"
    assert s.ga.formed and len(s.ga.population) == 6
    return s


def test_ray_backend_completes_and_survives_a_killed_worker(tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        s = search(tmp_path, backend="ray")
        assert s.summary_counts()["trainings"] >= 10
    finally:
        ray.shutdown()


def test_local_worker_processes_survive_a_killed_worker(tmp_path):
    s = search(tmp_path, backend="local")
    assert s.evaluator.slots == 2
    assert s.summary_counts()["trainings"] >= 10
    json.dumps(s.summary())
