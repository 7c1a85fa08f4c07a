"""`python -m bnn.search.cost`: the search's cost from its journal, and the rank correlation of its
fitness with an evidence grid, checked against hand counts, SciPy and the synthetic fitness."""
from __future__ import annotations

import json
import math
import warnings

import pytest
from _cli import run_main
from hypothesis import given, settings
from hypothesis import strategies as st

from bnn.common.stats import spearman
from bnn.search.fitness import synthetic_result

scipy_stats = pytest.importorskip("scipy.stats")


def cost_cli(*argv):
    from bnn.search.cost import main

    r = run_main(main, *[str(a) for a in argv])
    return r.returncode, r.stdout, r.stderr


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-3, 3)), min_size=2, max_size=12))
def test_spearman_is_scipys(pairs):
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SciPy warns of a constant side, then answers nan
        want = scipy_stats.spearmanr(xs, ys).statistic
    got = spearman(xs, ys)
    if math.isnan(want):
        assert got is None  # a constant side: undefined, not 0
    else:
        assert got == pytest.approx(want, abs=1e-12)


def _journal(tmp_path, results):
    lines = [{"type": "start", "version": 1, "time": 1000.0, "config": {"counts": "laplace", "fitness": "synthetic:5"}}]
    lines += results
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_cost_counts_each_way_an_evaluation_was_answered(tmp_path):
    r = lambda source, status, wall, t: {"type": "result", "genome": "1-1-1-1-0-0-1", "source": source,  # noqa: E731
                                         "status": status, "fitness": 0.5, "wall_s": wall, "time": t}
    _journal(tmp_path, [r("train", "ok", 20.0, 1020.0), r("train", "ok", 30.0, 1050.0), r("train", "ok", 40.0, 1090.0),
                        r("train", "rejected", 10.0, 1100.0), r("cache", "ok", None, 1100.5),
                        r("screened", "screened", None, 1101.0),
                        {"type": "resume", "time": 5000.0}, r("train", "diverged", 5.0, 5060.0)])
    rc, out, err = cost_cli(tmp_path, "--json")
    assert rc == 0, err
    c = json.loads(out.strip().splitlines()[-1])["cost"]
    assert c["evaluations"] == 7 and c["trainings"] == 5
    assert c["by_source"] == {"train": 5, "cache": 1, "screened": 1}
    assert c["trained_by_status"]["ok"] == {"n": 3, "median_s": 30.0, "mean_s": 30.0, "total_s": 90.0}
    assert c["trained_by_status"]["rejected"]["n"] == 1
    assert c["wall_s"] == pytest.approx(101.0 + 60.0)  # two segments: 1000..1101 and 5000..5060
    printed = cost_cli(tmp_path)[1]
    assert "| ok | 3 | 30.0 | 30.0 | 1.5 |" in printed and "| rung |" not in printed


@pytest.mark.parametrize("argv, words", [
    (["{d}/nothing"], "no such file"),
    (["{d}", "--screen", "{d}"], "--full"),
    (["{d}", "--score"], "--full"),
    ([], "RUN_DIR"),  # argparse's own refusals are one line too, without the usage block
    (["{d}", "--bogus"], "--bogus"),
])
def test_refused_inputs_are_one_line(tmp_path, argv, words):
    _journal(tmp_path, [])
    rc, out, err = cost_cli(*[a.format(d=tmp_path) for a in argv])
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:") and words in err


def test_score_trains_what_the_search_did_not_and_ranks_it(tmp_path):
    from bnn.search.cli import main as search_main

    run = tmp_path / "search"
    r = run_main(search_main, "--fitness", "synthetic:5", "--population", "6", "--epochs", "3",
                          "--max-evaluations", "12", "--max-trainings", "100", "--seed", "2",
                 "--no-progress", "--run-dir", str(run))
    assert r.returncode == 0, r.stderr
    events = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]
    trained = next(e for e in events if e.get("type") == "result" and e["source"] == "train" and e["status"] == "ok")
    others = ["3-0-3-0-0-10-6", "3-15-3-0-0-0-4", "0-0-0-0-0-0-1"]
    others = [g for g in others if g != trained["genome"]]
    full = {"rows": [
        {"measure": "searched", "genome": trained["genome"], "counts": "raw", "n_ok": 2, "test_mean": 0.81},
        {"measure": "M6", "genome": others[0], "counts": "raw", "n_ok": 2, "test_mean": 0.80},
        {"measure": "M7", "genome": others[1], "counts": "freq", "n_ok": 2, "test_mean": 0.79},
        {"measure": "M1", "genome": "1-0-1-0-0-0-6", "counts": "raw", "n_ok": 0, "test_mean": None},  # never trained
    ]}
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / "results.json").write_text(json.dumps(full))
    rc, out, err = cost_cli(run, "--full", grid, "--score", "--json")
    assert rc == 0, err
    pairs = {p["genome"]: p for p in json.loads(out.strip().splitlines()[-1])["ranks"][0]["pairs"]}
    assert set(pairs) == {trained["genome"], *others[:2]}
    assert pairs[trained["genome"]]["short"] == trained["fitness"]  # from the journal, not trained again
    for g in others[:2]:  # the synthetic fitness of 3 epochs, computed here independently
        res = synthetic_result(g, 5, 3, None)
        assert pairs[g]["short"] == pytest.approx(res["val_acc"])
    extra = (run / "fitness-extra.jsonl").read_text().splitlines()
    assert len(extra) == 2
    rc, out2, err = cost_cli(run, "--full", grid, "--score", "--json")  # scored already: nothing trains again
    assert rc == 0, err
    assert len((run / "fitness-extra.jsonl").read_text().splitlines()) == 2
    rho = json.loads(out2.strip().splitlines()[-1])["ranks"][0]["rho"]
    ps = list(pairs.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = scipy_stats.spearmanr([p["short"] for p in ps], [p["full"] for p in ps]).statistic
    assert (rho is None and math.isnan(want)) or rho == pytest.approx(want)


def test_help_names_every_option():
    rc, out, _ = cost_cli("--help")
    assert rc == 0
    for flag in ("--full", "--screen", "--score", "--json", "RUN_DIR"):
        assert flag in out


def test_full_prints_the_grids_split_half_ceiling_over_the_ranked_cells(tmp_path):
    from bnn.search.cli import main as search_main

    run = tmp_path / "search"
    r = run_main(search_main, "--fitness", "synthetic:5", "--population", "6", "--epochs", "3",
                 "--max-evaluations", "12", "--max-trainings", "100", "--seed", "2", "--no-progress", "--run-dir", str(run))
    assert r.returncode == 0, r.stderr
    events = [json.loads(x) for x in (run / "journal.jsonl").read_text().splitlines()]
    genomes = list(dict.fromkeys(e["genome"] for e in events if e.get("type") == "result" and e["status"] == "ok"))[:4]
    assert len(genomes) == 4
    per_seed = [{"0": 0.80, "1": 0.82, "2": 0.81, "3": 0.79}, {"0": 0.84, "1": 0.80, "2": 0.83, "3": 0.85},
                {"0": 0.70, "1": 0.72, "2": "diverged", "3": 0.71}, {"0": 0.75, "1": 0.86, "2": 0.77, "3": 0.78}]
    rows = [{"measure": f"m{i}", "genome": g, "counts": "raw", "n_ok": 4, "test_mean": 0.8, "per_seed": p}
            for i, (g, p) in enumerate(zip(genomes, per_seed))]
    rows.append({"measure": "unsearched", "genome": "3-0-3-0-0-10-6", "counts": "freq", "n_ok": 4, "test_mean": 0.5,
                 "per_seed": {"0": 0.1, "1": 0.9, "2": 0.1, "3": 0.9}})  # no fitness: not among the ranked cells
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / "results.json").write_text(json.dumps({"rows": rows}))
    rc, out, err = cost_cli(run, "--full", grid, "--json")
    assert rc == 0, err
    got = json.loads(out.strip().splitlines()[-1])["cost"]["full_split_half"]
    want = []  # the 3 splits of 4 seeds, by hand: {0,1}|{2,3}, {0,2}|{1,3}, {0,3}|{1,2}
    for a, b in ((("0", "1"), ("2", "3")), (("0", "2"), ("1", "3")), (("0", "3"), ("1", "2"))):
        xs = [sum(v for s in a if isinstance(v := p[s], float)) / sum(isinstance(p[s], float) for s in a) for p in per_seed]
        ys = [sum(v for s in b if isinstance(v := p[s], float)) / sum(isinstance(p[s], float) for s in b) for p in per_seed]
        want.append(scipy_stats.spearmanr(xs, ys).statistic)
    assert got["splits"] == 3 and got["rho_mean"] == pytest.approx(sum(want) / 3, abs=1e-12)
    assert f"rho {sum(want) / 3:.2f} on average over 3 splits" in out
