"""``bnn.search --workers-per-device K`` (issue 16 item 4): K workers on each device the fitness trains
on, each pinned to its device; the CPU counts as one device; bad values are one line, exit 2."""
import json
from collections import Counter

import pytest
from _cli import run_main

from bnn.search import evaluators

SYN = ["--fitness", "synthetic:4,delay=0.2", "--population", "4", "--epochs", "2", "--thresholds", "0.0",
       "--max-evaluations", "8", "--no-progress"]


def cli(*args):
    from bnn.search.cli import main

    return run_main(main, *args)


@pytest.mark.parametrize("n_gpus", [1, 2, 8])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_each_gpu_gets_k_workers_and_the_first_n_cover_every_gpu(n_gpus, k):
    gpus = [str(i) for i in range(n_gpus)]
    got = evaluators.assign_devices(gpus, k)
    assert len(got) == k * n_gpus
    assert Counter(got) == {g: k for g in gpus}
    # Started in order, the first n_gpus workers already use every GPU once.
    assert sorted(got[:n_gpus]) == sorted(gpus)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_without_a_gpu_the_cpu_is_one_device_with_k_workers(k):
    assert evaluators.assign_devices([], k) == [None] * k


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5"])
def test_a_bad_count_is_one_line_and_writes_nothing(tmp_path, value):
    d = tmp_path / "run"
    r = cli(*SYN, "--workers-per-device", value, "--run-dir", d)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers-per-device" in lines[0] and repr(value) in lines[0], r.stderr
    assert not d.exists()


@pytest.mark.parametrize("extra,words", [(["--workers", "2"], "--workers"), (["--backend", "serial"], "serial")])
def test_clashing_options_are_one_line(tmp_path, extra, words):
    d = tmp_path / "run"
    r = cli(*SYN, "--workers-per-device", "2", *extra, "--run-dir", d)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert not d.exists()


class _Recorder:
    """Stands in for LocalPoolEvaluator: records how the search asked for workers, starts nothing."""

    def __init__(self, fitness_spec, train, workers, gpus):
        self.asked = (workers, list(gpus), train["device"])


@pytest.mark.parametrize("visible,device,k,workers", [
    ("0,1", "cuda", 2, 4), ("0,1,2,3,4,5,6,7", "auto", 4, 32), ("3", "cuda", 1, 1),
    ("0,1", "cuda:1", 2, 2),  # one named device: K workers on it
    ("0,1", "cpu", 2, 2),  # the CPU is one device
])
def test_the_search_asks_for_k_workers_per_training_device(tmp_path, monkeypatch, visible, device, k, workers):
    from bnn.search.loop import Search, SearchConfig

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)  # fake GPUs: nothing here touches CUDA
    monkeypatch.setattr(evaluators, "LocalPoolEvaluator", _Recorder)
    cfg = SearchConfig(dataset="cifar10", model="resnet18", device=device, workers_per_device=k, backend="local")
    ev = Search(cfg, tmp_path / "run", progress=False)._make_evaluator()
    gpus = visible.split(",") if device in ("auto", "cuda") else []
    assert ev.asked == (workers, gpus, device)
    # The pool pins worker i to pool_devices(...)[i]: K workers on each of those GPUs.
    assert evaluators.pool_devices(gpus, workers) == evaluators.assign_devices(gpus, k)


def test_a_small_cpu_search_runs_two_workers_at_once(tmp_path, monkeypatch):
    pids, slots = set(), []
    poll = evaluators.LocalPoolEvaluator.poll

    def spy(self, timeout=None):
        slots.append(self.slots)
        out = poll(self, timeout)
        pids.update(res["pid"] for _, res in out)
        return out

    monkeypatch.setattr(evaluators.LocalPoolEvaluator, "poll", spy)
    r = cli(*SYN, "--workers-per-device", "2", "--device", "cpu", "--run-dir", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert set(slots) == {2}
    assert len(pids) == 2  # both workers trained: each job waits 0.2 s, so the second one got work


def test_ray_puts_k_actors_on_each_gpu_each_asking_for_a_kth_of_it():
    ray = pytest.importorskip("ray")
    # Two GPUs declared to Ray, none real: the synthetic fitness never touches CUDA. Ray reserves a
    # CPU for each actor by default, so four are declared for the four actors.
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    ev = None
    try:
        ev = evaluators.RayEvaluator("synthetic:1", {"epochs": 2, "device": "cuda"}, None, None, per_device=2)
        assert ev.slots == 4
        for seq in range(4):
            ev.submit({"seq": seq, "genome": "baseline", "reject_below": None})
        done = []
        while len(done) < 4:
            got = ev.poll(timeout=120)
            assert got, "an actor was never scheduled"
            done += got
        assert len({res["pid"] for _, res in done}) == 4  # one job to each free actor: all four ran
        gpu_ids = ray.get([a.__ray_call__.remote(lambda self: tuple(ray.get_gpu_ids())) for a in ev.actors])
        assert Counter(gpu_ids) == {(0,): 2, (1,): 2}
    finally:
        if ev is not None:
            ev.close()
        ray.shutdown()


def test_engine_overhead_shares_the_workers_busy_time_over_the_slots(tmp_path):
    # 16 jobs of 0.5 s on 2 workers: 8 s of training in about 4 s of wall time. The overhead is
    # the wall time the slots were not training; summing both workers' seconds made it negative.
    syn = [a if not a.startswith("synthetic:") else "synthetic:4,delay=0.5" for a in SYN]
    syn[syn.index("--max-evaluations") + 1] = "16"
    r = cli(*syn, "--workers-per-device", "2", "--device", "cpu", "--run-dir", tmp_path / "run", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["evaluations"] == 16
    assert 0 <= summary["engine_overhead_ms_per_evaluation"] < 1000 * summary["wall_s"] / 16
