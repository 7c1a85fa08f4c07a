"""bench/bench_search_measure.py alternates which path trains a genome first, totals each path's CPU
seconds into the ratio it prints, and stops with one line when a training fails."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_search_measure  # noqa: E402


def test_the_paths_alternate_and_the_totals_make_the_ratio(monkeypatch, capsys):
    calls = []
    seconds = {"eager": [4.0, 10.0, 2.5], "fused": [3.0, 12.0, 2.0]}

    def fake(path, genome, counts):
        calls.append((path, genome, counts))
        return {"cpu_s": seconds[path][sum(p == path for p, _, _ in calls) - 1], "wall_s": 0.0, "status": "ok",
                "val_acc": 0.5}

    monkeypatch.setattr(bench_search_measure, "_run", fake)
    assert bench_search_measure.main(["--genomes", "3", "--counts", "raw"]) == 0
    assert [p for p, _, _ in calls] == ["eager", "fused", "fused", "eager", "eager", "fused"]
    assert {c for _, _, c in calls} == {"raw"} and len({g for _, g, _ in calls}) == 3
    out = capsys.readouterr().out
    assert out.startswith("host: CPU: ") and "1 threads" in out.splitlines()[0]
    total = out.strip().splitlines()[-1].split()
    assert total == ["total", "16.5", "17.0", f"{17.0 / 16.5:.2f}"]


def test_a_failed_training_stops_the_run_in_one_line():
    with pytest.raises(SystemExit, match=r"error: the eager training of 9-9-9-9-99-9-9 failed: \w*Error: .*99"):
        bench_search_measure._run("eager", "9-9-9-9-99-9-9", "raw")  # B1 code 99: the child refuses the genome


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        bench_search_measure.main(["--genomes", "0"])
    with pytest.raises(SystemExit):
        bench_search_measure.main(["--counts", "log"])
