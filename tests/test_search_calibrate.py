"""`python -m bnn.search.calibrate`: each fitness design's values recomputed from the journal's own
training lines, rho against SciPy's, the ladder's cost and values, a torn journal continued."""
import json
from pathlib import Path

import pytest
from _cli import run_main

scipy_stats = pytest.importorskip("scipy.stats")

GENOMES = ["1-1-1-1-0-0-1", "2-2-2-2-0-0-1", "3-3-3-3-0-0-1", "4-4-4-4-0-0-1", "5-5-5-5-0-0-1", "6-6-6-6-0-0-1"]
FULL = [0.85, 0.86, 0.84, 0.88, 0.87, 0.83]


def calibrate(*args):
    from bnn.search.calibrate import main

    return run_main(main, *args)


@pytest.fixture
def grid(tmp_path):
    g = tmp_path / "grid"
    g.mkdir()
    rows = [{"measure": x, "genome": x, "counts": "laplace" if i % 2 else "raw", "n_ok": 6, "test_mean": v}
            for i, (x, v) in enumerate(zip(GENOMES, FULL))]
    (g / "results.json").write_text(json.dumps({"rows": rows, "wall_s": {"cells": 6000.0}, "cells_done": 12}))
    return g


def _args(grid, out):
    return ["--full", grid, "--rungs", "1:100,2:200:2", "--promote", "0.5", "--fitness", "synthetic:4",
            "--dataset", "digits", "--out", out, "--json"]


def test_every_design_is_recomputed_from_the_journals_lines(tmp_path, grid):
    r = calibrate(*_args(grid, tmp_path / "cal"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    lines = [json.loads(x) for x in (tmp_path / "cal" / "journal.jsonl").read_text().splitlines()[1:]]
    val = {(x["genome"], x["counts"], x["rung"], x["seed"]): x["val_acc"] for x in lines}
    assert len(lines) == 7 * 3  # 6 cells and XNOR, each on rung 0 (seed 100) and rung 1 (seeds 100, 101)
    counts = ["laplace" if i % 2 else "raw" for i in range(6)]
    rows = {d["design"]: d for d in out["designs"]}
    want0 = [val[(g, c, 0, 100)] for g, c in zip(GENOMES, counts)]
    want1p = [sum(val[(g, c, 1, s)] - val[("0-0-0-0-0-0-1", "raw", 1, s)] for s in (100, 101)) / 2
              for g, c in zip(GENOMES, counts)]
    assert rows["rung 0 (1 epochs, 100 images, 1 seed)"]["values"] == pytest.approx(want0, abs=1e-12)
    assert rows["rung 1 paired"]["values"] == pytest.approx(want1p, abs=1e-12)
    for name, want in (("rung 0 (1 epochs, 100 images, 1 seed)", want0), ("rung 1 paired", want1p)):
        assert rows[name]["rho"] == pytest.approx(scipy_stats.spearmanr(want, FULL).statistic, abs=1e-12)
    lad = rows["ladder to rung 1 (paired)"]
    secs = {(x["genome"], x["counts"], x["rung"]): 0.0 for x in lines}
    for x in lines:
        secs[(x["genome"], x["counts"], x["rung"])] += x["wall_s"]
    spent = []
    for g, c, v in zip(GENOMES, counts, lad["values"]):
        reached = int(v)  # the ladder value is the rung reached plus (1 + score) / 2, score in -1..1
        score = 2 * (v - reached) - 1
        if reached == 1:
            assert score == pytest.approx(want1p[GENOMES.index(g)], abs=1e-12)
        else:
            assert score == pytest.approx(val[(g, c, 0, 100)] - val[("0-0-0-0-0-0-1", "raw", 0, 100)], abs=1e-12)
        spent.append(sum(secs[(g, c, r)] for r in range(reached + 1)))
    assert 0 < sum(int(v) for v in lad["values"]) < 6  # some climbed, not all
    assert lad["seconds_per_measure"] == pytest.approx(sum(spent) / 6, abs=1e-9)
    assert lad["fraction_of_full"] == pytest.approx(lad["seconds_per_measure"] / 500.0)
    assert "| ladder to rung 1 (paired) |" in r.stdout


@pytest.mark.parametrize("counted", [12, 11])
def test_on_a_cpu_the_cost_is_cpu_seconds_where_every_cell_has_them(tmp_path, grid, counted):
    # A niced training's wall time on a shared host says what else ran; its CPU time what it cost. A grid
    # whose CPU seconds miss a cell (a journal from before them) keeps the wall clock.
    data = json.loads((grid / "results.json").read_text())
    (grid / "results.json").write_text(json.dumps({**data, "cpu_s": {"cells": 2400.0, "cells_counted": counted}}))
    r = calibrate(*_args(grid, tmp_path / "cal"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    clock, cell_s = ("cpu_s", 200.0) if counted == 12 else ("wall_s", 500.0)
    assert out["clock"] == clock and ("CPU time)" in r.stdout) == (clock == "cpu_s")
    lines = [json.loads(x) for x in (tmp_path / "cal" / "journal.jsonl").read_text().splitlines()[1:]]
    assert all(x["cpu_s"] >= 0 for x in lines)
    rung0 = {d["design"]: d for d in out["designs"]}["rung 0 paired"]
    want = sum(x[clock] for x in lines if x["rung"] == 0 and x["genome"] != "0-0-0-0-0-0-1") / 6
    assert rung0["seconds_per_measure"] == pytest.approx(want, abs=1e-9)
    assert rung0["fraction_of_full"] == pytest.approx(want / cell_s)


def test_a_torn_journal_continues_and_other_settings_are_refused(tmp_path, grid):
    out = tmp_path / "cal"
    assert calibrate(*_args(grid, out)).returncode == 0
    path = Path(out) / "journal.jsonl"
    whole = path.read_bytes()
    lines = whole.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:10]) + lines[10][:7])
    r = calibrate(*_args(grid, out))
    assert r.returncode == 0 and "incomplete" in r.stderr and "9 of 21 trainings journaled" in r.stderr
    strip = lambda b: [{k: v for k, v in json.loads(x).items() if k not in ("wall_s", "cpu_s")} for x in b.splitlines()]  # noqa: E731
    assert strip(path.read_bytes()) == strip(whole)
    r = calibrate(*[a if a != "0.5" else "0.4" for a in _args(grid, out)])
    assert r.returncode == 2 and "promote=0.5" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("extra, message", [(["--rungs", "2:100,1:100"], "must not be cheaper"),
                                            (["--promote", "2"], "fraction in (0, 1]"),
                                            (["--promote", "0"], "fraction in (0, 1]")])
def test_bad_options_get_one_line_and_exit_2(tmp_path, grid, extra, message):
    r = calibrate("--full", grid, "--rungs", "1:100", "--fitness", "synthetic:1", "--out", tmp_path / "c", *extra)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_each_training_records_its_processor_kind_and_another_kinds_journal_is_refused(tmp_path, grid):
    from bnn.train.host import cpu_kind, host_info

    out = tmp_path / "cal"
    assert calibrate(*_args(grid, out)).returncode == 0
    path = Path(out) / "journal.jsonl"
    lines = path.read_text().splitlines()
    here = cpu_kind(host_info("cpu"))
    assert {json.loads(x)["kind"] for x in lines[1:]} == {here}
    # One training from another kind (the rest of the journal is this machine's): refused whole.
    other = {**json.loads(lines[1]), "kind": "NVIDIA H200; torch 2.11.0+cu130; cuda 13.0"}
    path.write_text("\n".join([lines[0], json.dumps(other), *lines[2:]]) + "\n")
    before = path.read_bytes()
    r = calibrate(*_args(grid, out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "NVIDIA H200" in r.stderr and here in r.stderr and "another --out" in r.stderr
    assert path.read_bytes() == before  # nothing trained or appended


def test_worker_processes_journal_the_trainings_of_one_process(tmp_path, grid):
    # Each training is seeded: which worker ran it, and in which order they ended, changes nothing but the
    # journal's line order and the seconds (the synthetic fitness has no threads; on a CPU a real training's
    # bits depend on its thread count, so a CPU journal keeps its --workers).
    strip = lambda p: sorted(json.dumps({k: v for k, v in json.loads(x).items() if k not in ("wall_s", "cpu_s")},  # noqa: E731
                                        sort_keys=True)
                             for x in p.read_text().splitlines()[1:])
    one, two = tmp_path / "one", tmp_path / "two"
    r1, r2 = calibrate(*_args(grid, one)), calibrate(*_args(grid, two), "--workers", "2")
    assert r1.returncode == 0 and r2.returncode == 0, r2.stderr
    assert strip(two / "journal.jsonl") == strip(one / "journal.jsonl") and len(strip(one / "journal.jsonl")) == 21
    designs = lambda r: [(d["design"], d["values"], d["rho"]) for d in json.loads(r.stdout.strip().splitlines()[-1])["designs"]]  # noqa: E731
    assert designs(r2) == designs(r1)
    r = calibrate(*_args(grid, two))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--workers 2, not 1" in r.stderr and "thread count" in r.stderr


def test_no_cuda_is_one_line_before_anything_is_written(tmp_path, grid):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = calibrate("--full", grid, "--rungs", "1:100", "--device", "cuda", "--out", tmp_path / "c")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "CUDA is not available" in r.stderr and not (tmp_path / "c").exists()


def test_trainings_that_ended_in_error_are_named_and_trained_again(tmp_path, grid):
    # A crash is no fact about a measure: no design is computed from it, and the next run retries it.
    args = [a if a != "synthetic:4" else "synthetic:4,fail=3-3-3-3-0-0-1" for a in _args(grid, tmp_path / "cal")]
    r = calibrate(*args)
    last = r.stderr.strip().splitlines()[-1]  # after one progress line per training
    assert r.returncode == 2 and "Traceback" not in r.stderr and "rho" not in r.stdout
    assert last.startswith("error: 3 of 21 trainings ended in error (the first, 3-3-3-3-0-0-1/raw/r0/s100: "), last
    lines = (tmp_path / "cal" / "journal.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 21 and sum('"status": "error"' in x for x in lines) == 3
    r = calibrate(*args)
    assert r.returncode == 2 and "3 trainings journaled" not in r.stderr and "18 of 21 trainings journaled" in r.stderr
    assert len((tmp_path / "cal" / "journal.jsonl").read_text().splitlines()) == 1 + 21 + 3  # the three again


def test_each_design_names_the_search_flags_that_run_it(tmp_path, grid):
    from bnn.search.cli import build_parser

    r = calibrate(*_args(grid, tmp_path / "cal"))
    assert r.returncode == 0, r.stderr
    rows = {d["design"]: d for d in json.loads(r.stdout.strip().splitlines()[-1])["designs"]}
    # Written here from the ladder the command was given (1:100,2:200:2, promote 0.5, seeds from 100).
    r0, r1 = {"epochs": 1, "train_size": 100, "seeds": 1}, {"epochs": 2, "train_size": 200, "seeds": 2}
    want = {"rung 0 (1 epochs, 100 images, 1 seed)": ([r0], None, None), "rung 0 paired": ([r0], True, None),
            "rung 1 (2 epochs, 200 images, 2 seeds)": ([r1], None, None), "rung 1 paired": ([r1], True, None),
            "ladder to rung 1 (paired)": ([r0, r1], True, 0.5)}
    assert set(rows) == set(want)
    for name, (rungs, paired, promote) in want.items():
        args = build_parser().parse_args(rows[name]["search_flags"])  # the search's own parser
        assert (args.rungs, args.paired, args.promote, args.train_seed) == (rungs, paired, promote, 100), name


def _row(design, rho, fraction):
    return {"design": design, "rho": rho, "fraction_of_full": fraction, "search_flags": [f"--as {design}"]}


R0 = _row("rung 0 (2 epochs, 5,000 images, 1 seed)", 0.5, 0.03)


@pytest.mark.parametrize("rows, chosen, reason", [
    # the rule of docs/evidence.md section 5, case by case
    ([R0, _row("rung 1 paired", 0.85, 0.27), _row("ladder to rung 1 (paired)", 0.82, 0.12)],
     "ladder to rung 1 (paired)", "rho 0.82 at 0.120"),  # the better rung costs more than a quarter
    ([R0, _row("a", 0.9, 0.2), _row("b", 0.9, 0.1)], "b", "b: rho 0.90 at 0.100"),  # a tie: the cheaper
    ([R0, _row("a", 0.79, 0.2)], None, "below rho 0.8"),
    ([_row("rung 0 (x)", 0.85, 0.03), _row("rung 0 paired", 0.85, 0.03)], None, "not above rung 0's rho 0.85"),
    ([_row("a", None, 0.1), _row("b", 0.95, 0.26)], None, "no design costs at most 0.25"),
    ([R0, _row("a", 0.9, None)], None, "no cost"),
])
def test_the_decision_follows_the_rule_fixed_before_the_results(rows, chosen, reason):
    from bnn.search.calibrate import decide

    d = decide(rows)
    assert d["design"] == chosen and reason in d["reason"], d
    if chosen is None:
        assert d["search_flags"] == []  # Algorithm 1, the search's default: no flags


def test_the_decision_carries_the_chosen_designs_search_flags():
    from bnn.search.calibrate import decide

    flags = ["--rungs", "2:5000:1,3:15000:2", "--paired"]
    d = decide([R0, {**_row("ladder to rung 1 (paired)", 0.9, 0.1), "search_flags": flags}])
    assert d["design"] == "ladder to rung 1 (paired)" and d["search_flags"] == flags


def test_the_command_prints_its_decision(tmp_path, grid):
    r = calibrate(*_args(grid, tmp_path / "cal"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    line = next(x for x in r.stdout.splitlines() if x.startswith("Decision (docs/evidence.md section 5): "))
    if out["decision"]["design"] is None:
        assert "Algorithm 1's fitness stays the default; " + out["decision"]["reason"] in line
    else:
        assert "the search's default becomes " + out["decision"]["reason"] in line
        assert "Search with it: python -m bnn.search " + " ".join(out["decision"]["search_flags"]) in r.stdout


def test_a_measure_whose_every_cell_diverged_is_named_as_left_out_of_the_ranking(tmp_path, grid):
    data = json.loads((grid / "results.json").read_text())
    data["rows"].append({"measure": "M6", "genome": "3-0-3-0-0-10-6", "counts": "freq", "n_ok": 0, "test_mean": None})
    (grid / "results.json").write_text(json.dumps(data))
    r = calibrate(*_args(grid, tmp_path / "cal"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["unranked"] == ["M6 freq"] and len(out["cells"]) == 6  # ranked over the six that trained
    assert "Left out of the ranking (every full-recipe cell diverged: no test accuracy): M6 freq." in r.stdout


def _brute_split_half(per_seed):
    # Every unordered split of the seeds into a half of len // 2 and the rest, by frozensets; SciPy's rho.
    import itertools

    seeds = sorted(per_seed[0])
    seen, rhos = set(), []
    for a in itertools.combinations(seeds, len(seeds) // 2):
        b = tuple(s for s in seeds if s not in a)
        if frozenset((frozenset(a), frozenset(b))) in seen:
            continue
        seen.add(frozenset((frozenset(a), frozenset(b))))
        xs, ys = [], []
        for c in per_seed:
            va = [c[s] for s in a if not isinstance(c[s], str)]
            vb = [c[s] for s in b if not isinstance(c[s], str)]
            if va and vb:
                xs.append(sum(va) / len(va))
                ys.append(sum(vb) / len(vb))
        rhos.append(scipy_stats.spearmanr(xs, ys).statistic)
    return rhos


@pytest.mark.parametrize("n_seeds", [6, 5])
def test_split_half_ranks_each_half_of_the_seeds_against_the_other(n_seeds):
    import random

    from bnn.search.calibrate import split_half

    rng = random.Random(n_seeds)
    per_seed = [{str(s): round(0.80 + 0.01 * i + rng.uniform(-0.02, 0.02), 4) for s in range(n_seeds)} for i in range(7)]
    per_seed[2]["1"] = "diverged"  # sits out of its half's mean, as test_mean leaves it out
    per_seed[4] = {**per_seed[4], "0": "diverged", "3": "error"}
    want = _brute_split_half(per_seed)
    got = split_half(per_seed)
    assert got["splits"] == len(want) == 10  # C(6, 3) / 2 and C(5, 2)
    assert got["half"] == n_seeds // 2 and got["seeds"] == n_seeds
    assert got["rho_mean"] == pytest.approx(sum(want) / len(want), abs=1e-12)
    assert (got["rho_min"], got["rho_max"]) == pytest.approx((min(want), max(want)), abs=1e-12)


def test_split_half_needs_two_seeds_common_to_every_cell():
    from bnn.search.calibrate import split_half

    assert split_half([{"0": 0.8}, {"0": 0.7}, {"0": 0.9}]) is None
    assert split_half([{"0": 0.8, "1": 0.8}, {"2": 0.7, "3": 0.7}, {"0": 0.9, "1": 0.9}]) is None
    assert split_half([]) is None
    # out-of-range or non-finite values are no accuracy: with them out, fewer than 3 cells rank
    assert split_half([{"0": 0.8, "1": 0.81}, {"0": 2.0, "1": 0.7}, {"0": float("nan"), "1": 0.9}]) is None


def test_the_command_prints_the_full_recipes_split_half_ceiling(tmp_path, grid):
    data = json.loads((grid / "results.json").read_text())
    for i, row in enumerate(data["rows"]):  # six seeds around each cell's mean, spread so the halves disagree a little
        row["per_seed"] = {str(s): row["test_mean"] + 0.004 * (((i + 1) * (s + 2)) % 5 - 2) for s in range(6)}
    (grid / "results.json").write_text(json.dumps(data))
    r = calibrate(*_args(grid, tmp_path / "cal"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    want = _brute_split_half([row["per_seed"] for row in data["rows"]])
    assert out["split_half"]["rho_mean"] == pytest.approx(sum(want) / len(want), abs=1e-12)
    line = next(x for x in r.stdout.splitlines() if x.startswith("The full recipe against itself"))
    assert f"rho {sum(want) / len(want):.2f} on average over 10 splits ({min(want):.2f} to {max(want):.2f})" in line


def test_a_grid_without_per_seed_values_prints_no_ceiling(tmp_path, grid):
    r = calibrate(*_args(grid, tmp_path / "cal"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["split_half"] is None
    assert "against itself" not in r.stdout


def test_split_half_samples_the_splits_of_many_seeds_and_refuses_absurd_counts():
    import itertools
    import random

    from bnn.search.calibrate import split_half

    rng = random.Random(1)
    per_seed = [{str(s): 0.7 + 0.02 * i + rng.uniform(-0.03, 0.03) for s in range(16)} for i in range(5)]
    got = split_half(per_seed)
    assert got["splits"] == 500 and got["half"] == 8  # C(16, 8) / 2 = 6435 splits: a sample
    every = []
    seeds = sorted(per_seed[0])
    for a in itertools.combinations(seeds, 8):
        if seeds[0] in a:
            b = [s for s in seeds if s not in a]
            xs = [sum(c[s] for s in a) / 8 for c in per_seed]
            ys = [sum(c[s] for s in b) / 8 for c in per_seed]
            every.append(scipy_stats.spearmanr(xs, ys).statistic)
    assert min(every) - 1e-12 <= got["rho_min"] and got["rho_max"] <= max(every) + 1e-12
    assert abs(got["rho_mean"] - sum(every) / len(every)) < 0.05  # a sample's mean near the whole's
    assert split_half([{str(s): 0.8 for s in range(65)}] * 3) is None  # above MAX_SEEDS: no ceiling, no hang
