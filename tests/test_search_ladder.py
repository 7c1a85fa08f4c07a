"""The paired, multi-fidelity fitness (bnn/search/ladder.py): promotions and scores by hand, the
journal's scores recomputed from its own training lines, the GA ranking by rung, and --resume
after a kill at every kind of line equal to an uninterrupted run."""
import json
import math
import shutil
from pathlib import Path

import pytest
from _cli import run_main

from bnn.search.ladder import Ladder, ga_value, parse_rungs

ARGS = ["--fitness", "synthetic:5", "--population", "5", "--rungs", "1:100,2:200,3:all:2", "--paired",
        "--promote", "0.5", "--thresholds", "0.2", "--max-evaluations", "60", "--max-trainings", "45",
        "--seed", "3", "--train-seed", "11", "--no-progress", "--json"]


def cli(*args):
    from bnn.search.cli import main

    return run_main(main, *args)


def ok(v, status="ok"):
    return {"status": status, "val_acc": v}


# =============================================================================================
# The ladder by hand


def test_promotions_and_paired_scores_by_hand():
    lad = Ladder([{"epochs": 1, "train_size": 10, "seeds": 1}, {"epochs": 2, "train_size": 20, "seeds": 2}],
                 paired=True, fraction=0.5, train_seed=7)
    assert lad.seeds(0) == [7] and lad.seeds(1) == [7, 8] and lad.references_needed() == [(0, 7), (1, 7), (1, 8)]
    for seq in range(4):
        lad.start(seq, f"g{seq}")
    assert lad.on_result(0, 0, 7, ok(0.60)) == []  # XNOR's rung-0 accuracy is not known yet
    # score 0.60 - 0.50 = +0.10, the best of 1: the top ceil(0.5 * 1) = 1 climbs
    assert lad.on_reference(0, 7, ok(0.50)) == [("promote", 0, 1)]
    # +0.05, second of 2: not in the top ceil(0.5 * 2) = 1; ends at rung 0 with value (1 + 0.05) / 2
    (d,) = lad.on_result(1, 0, 7, ok(0.55))
    assert d[:3] == ("final", 1, 0) and d[3] == pytest.approx(0.05) and d[4] == pytest.approx(0.525) and d[5] == 0.55
    assert lad.on_result(2, 0, 7, ok(0.70)) == [("promote", 2, 1)]  # +0.20, best of 3, top 2 climb
    with pytest.raises(ValueError, match="did not need"):
        lad.on_result(2, 0, 7, ok(0.70))
    # rejected at epoch 1 with the best accuracy: a training that did not finish stops climbing
    (d,) = lad.on_result(3, 0, 7, ok(0.90, "rejected"))
    assert d[:3] == ("final", 3, 0) and d[3] == pytest.approx(0.40)
    assert lad.needed(0) == [(1, 7), (1, 8)]
    assert lad.on_result(0, 1, 7, ok(0.80)) == [] and lad.on_result(0, 1, 8, ok(0.70)) == []
    assert lad.on_reference(1, 7, ok(0.75)) == []  # seed 8's reference is still missing
    # the last rung: (0.80 - 0.75 + 0.70 - 0.60) / 2 = +0.075, value 1 + 1.075 / 2
    (d,) = lad.on_reference(1, 8, ok(0.60))
    assert d[:3] == ("final", 0, 1) and d[3] == pytest.approx(0.075) and d[4] == pytest.approx(1.5375)
    assert d[5] == pytest.approx(0.60)  # what the threshold T judges: the first rung's accuracy
    lad.on_result(2, 1, 7, ok(0.10, "diverged"))
    (d,) = lad.on_result(2, 1, 8, ok(0.90))
    assert d[3] == pytest.approx((0.10 - 0.75 + 0.90 - 0.60) / 2) and lad.promoted == [2, 0]


def test_unpaired_scores_are_accuracies_and_need_no_reference():
    lad = Ladder([{"epochs": 1, "train_size": None, "seeds": 2}], paired=False, fraction=1 / 3, train_seed=0)
    assert lad.references_needed() == []
    lad.start(0, "g")
    lad.on_result(0, 0, 0, ok(0.4))
    (d,) = lad.on_result(0, 0, 1, ok(0.5))
    assert d[:3] == ("final", 0, 0) and d[3] == pytest.approx(0.45) and d[4] == pytest.approx(0.45)


def test_a_higher_rung_always_ranks_above_a_lower_one():
    for paired, lo, hi in ((True, -1.0, 1.0), (False, 0.0, 1.0)):
        assert ga_value(1, lo, paired) >= ga_value(0, hi, paired) and ga_value(0, lo, paired) >= 0.0


@pytest.mark.parametrize("text, expected", [
    ("2:5000", [{"epochs": 2, "train_size": 5000, "seeds": 1}]),
    ("1:500, 4:all:3", [{"epochs": 1, "train_size": 500, "seeds": 1}, {"epochs": 4, "train_size": None, "seeds": 3}]),
])
def test_rungs_parse(text, expected):
    assert parse_rungs(text) == expected


@pytest.mark.parametrize("text, message", [
    ("2", "expected EPOCHS:IMAGES"), ("2:x", "needs integers"), ("0:100", "epochs >= 1"),
    ("2:100:0", "seeds 1..64"), ("4:1000,2:2000", "must not be cheaper"), ("2:all,3:100", "must not be cheaper"),
    ("2:100,2:100", "must not be cheaper"), ("2:100,", "expected EPOCHS:IMAGES"),
])
def test_bad_rungs_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_rungs(text)


@pytest.mark.parametrize("extra, message", [
    (["--rungs", "1:100", "--epochs", "3"], "drop --epochs and --train-size"),
    (["--paired", "--paper-faithful"], "--paper-faithful is Algorithm 1"),
    (["--rungs", "3:100,1:100"], "must not be cheaper"),
    (["--promote", "1.5"], "fraction in (0, 1]"),
    (["--paired", "--reuse", "."], "--reuse reads one-training journals"),
])
def test_bad_ladder_options_get_one_line_and_exit_2(tmp_path, extra, message):
    r = cli("--fitness", "synthetic:1", "--run-dir", tmp_path / "run", *extra)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


# =============================================================================================
# A whole search


def _journal(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "journal.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    d = tmp_path_factory.mktemp("ladder") / "run"
    r = cli(*ARGS, "--run-dir", d)
    assert r.returncode == 0, r.stderr
    return d


def test_every_score_is_the_candidates_accuracy_minus_xnors_from_the_journals_own_lines(uninterrupted):
    events = _journal(uninterrupted)
    rungs = parse_rungs("1:100,2:200,3:all:2")
    ref = {(e["rung"], e["seed"]): e["val_acc"] for e in events if e["type"] == "reference"}
    assert sorted(ref) == [(0, 11), (1, 11), (2, 11), (2, 12)]
    trained = {(e["seq"], e["rung"], e["seed"]): e for e in events if e["type"] == "rung"}
    finals = [e for e in events if e["type"] == "result"]
    assert len(finals) == 17 and {e["rung"] for e in finals} == {0, 1, 2}  # stopped by --max-trainings 45
    assert sum(e["type"] == "reference" or e["type"] == "rung" and e["source"] == "train" for e in events) == 45
    for e in finals:
        if e["source"] == "screened":
            continue
        r, seeds = e["rung"], [11 + i for i in range(rungs[e["rung"]]["seeds"])]
        diffs = [trained[(e["seq"], r, s)]["val_acc"] - ref[(r, s)] for s in seeds]
        assert e["score"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-12)
        assert e["fitness"] == pytest.approx(r + (1 + e["score"]) / 2, abs=1e-12)
        assert all((e["seq"], lower, 11) in trained for lower in range(r))  # it climbed every rung below
        assert e["epochs"] == rungs[r]["epochs"]
    for (_seq, r, _s), e in trained.items():  # the rung's budget reached the worker: the noise differs per rung
        assert e["epochs"] in (1, rungs[r]["epochs"]) and (e["T"] == 0.2) == (r == 0)


def test_the_population_is_ranked_by_rung_then_score_and_results_json_shows_both(uninterrupted):
    res = json.loads((uninterrupted / "results.json").read_text())
    pop = res["population"]
    keys = [(m["rung"], m["score"]) for m in pop]
    assert keys == sorted(keys, reverse=True) and pop[0]["rung"] == 2
    lad = res["summary"]["ladder"]
    assert lad["paired"] and lad["promote"] == 0.5 and sum(lad["trained"]) + sum(lad["cached"]) > 17
    assert res["summary"]["trainings"] == sum(lad["trained"]) + 4  # the four XNOR references


def _comparable(run_dir):
    volatile = ("time", "wall_s")
    events = [{k: v for k, v in e.items() if k not in volatile} for e in _journal(run_dir)
              if e["type"] in ("proposal", "rung", "reference", "result")]
    res = json.loads((Path(run_dir) / "results.json").read_text())
    return events, res["population"]


def test_resume_after_a_kill_at_any_line_matches_the_uninterrupted_run(tmp_path, uninterrupted):
    lines = (uninterrupted / "journal.jsonl").read_bytes().splitlines(keepends=True)
    kinds = [json.loads(line)["type"] for line in lines]
    # A cut after the first reference, after a rung line whose result line was lost, after a result,
    # in the middle of a line, and every 9th line besides.
    cuts = {kinds.index("reference") + 1, next(i for i in range(1, len(kinds) - 1)
                                               if kinds[i] == "rung" and kinds[i + 1] == "result") + 1,
            kinds.index("result") + 1, *range(1, len(lines) - 1, 9)}
    want = _comparable(uninterrupted)
    for cut in sorted(cuts):
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        torn = lines[cut][: len(lines[cut]) // 2] if cut % 2 else b""
        (d / "journal.jsonl").write_bytes(b"".join(lines[:cut]) + torn)
        r = cli("--resume", d, "--no-progress", "--json")
        assert r.returncode == 0, (cut, r.stderr)
        assert _comparable(d) == want, f"resumed after line {cut} ({kinds[cut - 1]}) differs"


def test_a_journal_whose_result_contradicts_its_rung_lines_is_refused(tmp_path, uninterrupted):
    events = _journal(uninterrupted)
    i = next(i for i, e in enumerate(events) if e["type"] == "result" and e["source"] == "ladder")
    events[i]["fitness"] += 0.25
    d = tmp_path / "run"
    d.mkdir()
    (d / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[: i + 1]))
    r = cli("--resume", d, "--no-progress")
    assert r.returncode == 2 and "replay diverged" in r.stderr


def test_an_old_journal_without_ladder_keys_resumes_as_algorithm_1(tmp_path):
    d = tmp_path / "run"
    base = ["--fitness", "synthetic:2", "--population", "4", "--epochs", "2", "--no-progress", "--json"]
    assert cli(*base, "--max-evaluations", "6", "--run-dir", d).returncode == 0
    events = _journal(d)
    for key in ("rungs", "paired", "promote"):
        del events[0]["config"][key]
    (d / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    r = cli("--resume", d, "--max-evaluations", "10", "--no-progress", "--json")
    assert r.returncode == 0, r.stderr
    after = _journal(d)
    assert not any(e["type"] in ("rung", "reference") for e in after)
    assert sum(e["type"] == "result" for e in after) == 10
    assert not math.isnan(json.loads(r.stdout.strip().splitlines()[-1])["best"]["fitness"])
    shutil.rmtree(d)


def test_real_trainings_take_each_rungs_budget_and_xnor_trains_on_raw_counts(tmp_path):
    from bnn.search.fitness import fitness_config
    from bnn.search.loop import SearchConfig
    from bnn.train import train_model

    d = tmp_path / "run"
    r = cli("--dataset", "digits", "--rungs", "1:300,2:600", "--paired", "--promote", "1", "--counts", "laplace",
            "--population", "2", "--max-evaluations", "2", "--train-seed", "5", "--thresholds", "0",
            "--device", "cpu", "--no-progress", "--json", "--run-dir", d)
    assert r.returncode == 0, r.stderr
    events = _journal(d)
    train = SearchConfig(dataset="digits", model="digits_net", counts="laplace", device="cpu").train_dict()
    ref = next(e for e in events if e["type"] == "reference" and e["rung"] == 1)
    want = train_model(fitness_config({**train, "epochs": 2, "train_size": 600, "seed": 5, "counts": "raw"},
                                      "0-0-0-0-0-0-1"), progress=False)
    assert ref["val_acc"] == want.val_acc and ref["epochs"] == 2
    cand = next(e for e in events if e["type"] == "rung" and e["rung"] == 1 and e["source"] == "train")
    want = train_model(fitness_config({**train, "epochs": 2, "train_size": 600, "seed": 5}, cand["genome"]),
                       progress=False)
    assert cand["val_acc"] == want.val_acc


def test_cost_counts_each_rungs_trainings_cache_answers_and_references(uninterrupted):
    from bnn.search.cost import main

    r = run_main(main, uninterrupted, "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout.strip().splitlines()[-1])
    events = _journal(uninterrupted)
    for rung in (0, 1, 2):
        mine = [e for e in events if e.get("rung") == rung and e["type"] in ("rung", "reference")]
        row = c["cost"]["ladder"][rung]
        assert row["trained"] == sum(e["type"] == "rung" and e["source"] == "train" for e in mine)
        assert row["cached"] == sum(e["type"] == "rung" and e["source"] != "train" for e in mine)
        assert row["references"] == (2 if rung == 2 else 1)
        assert row["reached"] == sum(e["type"] == "result" and e["rung"] >= rung for e in events)
    assert c["cost"]["trainings"] == 45
    printed = run_main(main, uninterrupted).stdout  # the per-rung table, not Algorithm 1's table left empty
    assert "| rung | trained |" in printed and "trained, outcome" not in printed


def test_the_progress_line_shows_how_many_candidates_each_rung_scored(tmp_path):
    from bnn.search.loop import Search, SearchConfig

    r = cli("--fitness", "synthetic:5", "--population", "4", "--rungs", "1:100,2:200", "--paired",
            "--max-evaluations", "6", "--run-dir", tmp_path / "bar")
    assert r.returncode == 0 and "rungs=" in r.stderr  # the bar draws it (tqdm decides how often)
    cfg = SearchConfig(fitness="synthetic:5", population=4, rungs=parse_rungs("1:100,2:200"), paired=True,
                       max_evaluations=10)
    search = Search(cfg, tmp_path / "run", progress=False)
    search.start_new()
    search.run()
    ends = [e["rung"] for e in _journal(tmp_path / "run") if e["type"] == "result" and e["source"] == "ladder"]
    assert search.ladder.progress() == f"{sum(x >= 0 for x in ends)}/{sum(x >= 1 for x in ends)}"


def test_the_progress_line_and_summary_show_the_best_as_the_leaderboard_reads_it(tmp_path):
    # The GA sorts by rung + (1 + score) / 2; a user reads the score vs XNOR and the rung, as the leaderboard prints.
    from bnn.search.loop import Search, SearchConfig

    cfg = SearchConfig(fitness="synthetic:5", population=4, rungs=parse_rungs("1:100,2:200"), paired=True,
                       max_evaluations=10)
    search = Search(cfg, tmp_path / "run", progress=False)
    search.start_new()
    search.run()
    top = search.leaderboard()[0]
    assert top["fitness"] > 1  # the sort key, not a score a user could read
    assert search.best_text() == f"{top['score']:+.4f} at rung {top['rung']}"
    best = search.summary()["best"]
    assert (best["rung"], best["score"], best["genome"]) == (top["rung"], top["score"], top["genome"])
    plain = Search(SearchConfig(fitness="synthetic:5", population=4, max_evaluations=6), tmp_path / "plain",
                   progress=False)
    plain.start_new()
    plain.run()
    assert plain.best_text() == f"{plain.leaderboard()[0]['fitness']:.4f}" and "rung" not in plain.summary()["best"]


def test_the_plot_draws_every_source_a_ladder_search_journals_and_labels_its_fitness(tmp_path):
    from bnn.search.loop import Search, SearchConfig
    from bnn.search.report import SOURCE_STYLES, fitness_label

    labels = {}
    for name, extra in (("plain", {}), ("ladder", {"rungs": parse_rungs("1:100,2:200")}),
                        ("paired", {"rungs": parse_rungs("1:100,2:200"), "paired": True})):
        search = Search(SearchConfig(fitness="synthetic:5", population=4, max_evaluations=8, **extra),
                        tmp_path / name, progress=False)
        search.start_new()
        search.run()
        sources = {e["source"] for e in _journal(tmp_path / name) if e["type"] == "result"}
        assert sources and sources <= set(SOURCE_STYLES), sources - set(SOURCE_STYLES)
        labels[name] = fitness_label(search)
    assert labels == {"plain": "fitness (validation accuracy)",
                      "ladder": "fitness: rung reached + validation accuracy",
                      "paired": "fitness: rung reached + (1 + validation accuracy vs XNOR) / 2"}
