"""How well a fitness ranks measures: Spearman's rho with a bootstrap interval, the top 3's
agreement, and the cost per candidate against a full-recipe cell, as bnn.search.cost prints them."""
import json
import random
import warnings

import numpy as np
import pytest
from _cli import run_main

from bnn.common.stats import bootstrap_spearman, top_agreement

scipy_stats = pytest.importorskip("scipy.stats")


def test_the_bootstrap_interval_is_the_percentiles_of_scipys_rho_over_the_same_resamples():
    xs = [0.690, 0.709, 0.732, 0.715, 0.740, 0.735, 0.733, 0.701, 0.722, 0.650, 0.611, 0.745]
    ys = [87.78, 87.90, 87.57, 87.68, 87.96, 88.15, 88.23, 87.60, 87.71, 86.90, 85.20, 88.01]
    rng, rhos = random.Random(0), []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2000):
            idx = [rng.randrange(12) for _ in range(12)]
            r = scipy_stats.spearmanr([xs[i] for i in idx], [ys[i] for i in idx]).statistic
            if not np.isnan(r):
                rhos.append(r)
    want = np.percentile(rhos, [2.5, 97.5], method="inverted_cdf")  # the order statistics the interval takes
    lo, hi = bootstrap_spearman(xs, ys)
    assert lo == pytest.approx(want[0], abs=1e-12) and hi == pytest.approx(want[1], abs=1e-12)
    assert lo < scipy_stats.spearmanr(xs, ys).statistic < hi
    assert bootstrap_spearman(xs[:2], ys[:2]) == (None, None)


@pytest.mark.parametrize("xs, ys, k, want", [
    ([4, 3, 2, 1], [40, 30, 20, 10], 3, 3),
    ([4, 3, 2, 1], [10, 20, 30, 40], 3, 2),  # the middle two are in both top threes
    ([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], 3, 0),
    ([5, 9, 1, 7], [0.5, 0.9, 0.1, 0.8], 2, 2),
])
def test_top_agreement_counts_the_shared_best(xs, ys, k, want):
    assert top_agreement(xs, ys, k) == want


def test_cost_prints_the_interval_the_top_3_and_the_cost_against_a_full_recipe_cell(tmp_path):
    from bnn.search.cost import main

    genomes = ["1-1-1-1-0-0-1", "2-2-2-2-0-0-1", "3-3-3-3-0-0-1", "4-4-4-4-0-0-1", "5-5-5-5-0-0-1"]
    fitness = [0.60, 0.70, 0.65, 0.80, 0.75]
    full = [0.85, 0.86, 0.84, 0.88, 0.87]
    events = [{"type": "start", "version": 1, "time": 0.0, "config": {"counts": "laplace", "fitness": "synthetic:1"}}]
    events += [{"type": "result", "genome": g, "source": "train", "status": "ok", "fitness": f, "wall_s": 30.0,
                "time": 10.0 * i} for i, (g, f) in enumerate(zip(genomes, fitness))]
    run = tmp_path / "run"
    run.mkdir()
    (run / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    grid = tmp_path / "grid"
    grid.mkdir()
    rows = [{"measure": g, "genome": g, "counts": "laplace", "n_ok": 6, "test_mean": v} for g, v in zip(genomes, full)]
    (grid / "results.json").write_text(json.dumps({"rows": rows, "wall_s": {"cells": 3000.0}, "cells_done": 10}))
    r = run_main(main, run, "--full", grid, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    rank = out["ranks"][0]
    assert rank["rho"] == pytest.approx(scipy_stats.spearmanr(fitness, full).statistic)
    assert rank["rho_ci"] == list(bootstrap_spearman(fitness, full)) and rank["top3_agree"] == 3
    # 5 trainings of 30 s over 5 candidates against 3,000 s over 10 full-recipe cells
    assert out["cost"]["cost_per_candidate"] == {"training_s": 30.0, "full_recipe_cell_s": 300.0,
                                                 "fraction_of_full": 0.1}
    assert "the top 3 agree on 3 of 3" in r.stdout and "0.100 of a full-recipe cell (300.0 s" in r.stdout
