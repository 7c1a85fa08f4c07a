"""bench/bench_search_measure.py alternates which path searches first, passes the search's own arguments
through, prints the ratio of the paths' medians, and stops with one line when a search fails."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))

import bench_search_measure  # noqa: E402


def test_the_paths_alternate_and_the_medians_make_the_ratio(monkeypatch, capsys):
    calls = []
    seconds = {"eager": [100.0, 120.0, 110.0], "fused": [150.0, 130.0, 160.0]}

    def fake(path, extra):
        calls.append((path, tuple(extra)))
        k = sum(p == path for p, _ in calls) - 1
        return {"wall_s": seconds[path][k], "cpu_s": 2 * seconds[path][k], "evaluations": "63 evaluations, ..."}

    monkeypatch.setattr(bench_search_measure, "_search", fake)
    assert bench_search_measure.main(["--repeats", "3", "--", "--counts", "laplace"]) == 0
    assert [p for p, _ in calls] == ["eager", "fused", "fused", "eager", "eager", "fused"]
    assert {e for _, e in calls} == {("--counts", "laplace")}
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("host: CPU: ") and out[1].startswith("python -m bnn.search --no-progress --counts laplace")
    assert out[-1] == f"median fused/eager: wall {150.0 / 110.0:.2f}, CPU {300.0 / 220.0:.2f}"


def test_a_failed_search_stops_the_run_in_one_line():
    with pytest.raises(SystemExit, match="error: the eager search failed: .*'log'"):
        bench_search_measure._search("eager", ["--counts", "log"])  # refused by the search's own parser


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        bench_search_measure.main(["--repeats", "0"])
    for extra in (["--measure-impl", "fused"], ["--run-dir=x"]):
        with pytest.raises(SystemExit):
            bench_search_measure.main(["--", *extra])
