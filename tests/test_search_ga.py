"""Algorithm 1 (docs/design.md section 7) through the engine: reference trajectory, optimum, savings."""
import bisect
import json

import numpy as np
import pytest

from bnn.search import fitness as F
from bnn.search.ga import BASELINE, GeneticSearch, Thresholds
from bnn.search.loop import Search, SearchConfig


def fitness_fn(seed=3, epochs=4):
    def f(genome, T):
        return F.fitness_of(F.synthetic_result(genome, seed, epochs, T))
    return f


def naive_algorithm_1(S, T, seed, fitness, steps):
    """The paper's pseudocode transcribed line by line (lists, no classes), drawing from the
    generator in the documented order. An independent oracle for GeneticSearch."""
    rng = np.random.Generator(np.random.PCG64(seed))
    limits = np.array([18] * 4 + [14] * 3)
    text = lambda g: "-".join(str(int(x)) for x in g)
    evaluated = []
    popu, fitv = [], []
    while len(popu) < S - 1:
        M = text(rng.integers(0, limits))
        f = fitness(M, T)
        evaluated.append(M)
        if f > T:
            popu.append(M)
            fitv.append(f)
    f0 = fitness(BASELINE, T)
    evaluated.append(BASELINE)
    popu.append(BASELINE)
    fitv.append(f0)
    order = sorted(range(S), key=lambda i: -fitv[i])
    popu, fitv = [popu[i] for i in order], [fitv[i] for i in order]
    for _ in range(steps):
        n = int(rng.integers(0, 3))
        if n == 0:
            i, j = 0, 1
        elif n == 1:
            i = int(rng.integers(0, S - 1))
            j = int(rng.integers(i + 1, S))
        else:
            w = np.array(fitv) / sum(fitv)
            cum = np.cumsum(w)
            cum[-1] = 1.0
            u = rng.random(2)
            i, j = (int(np.searchsorted(cum, x, side="right")) for x in u)
        P1 = [int(x) for x in popu[i].split("-")]
        P2 = [int(x) for x in popu[j].split("-")]
        k = int(rng.integers(0, 7))
        C1 = P1[:k] + P2[k:] if not rng.integers(0, 2) else P2[:k] + P1[k:]
        m = int(rng.integers(0, 7))
        C1[m] = int(rng.integers(0, limits[m]))
        C2 = text(C1)
        f = fitness(C2, T)
        evaluated.append(C2)
        if f > fitv[-1]:
            popu.pop()
            fitv.pop()
            pos = bisect.bisect_right([-x for x in fitv], -f)
            popu.insert(pos, C2)
            fitv.insert(pos, f)
    return evaluated, list(zip(popu, fitv))


@pytest.mark.parametrize("S,seed", [(5, 0), (12, 1), (30, 2)])
def test_serial_propose_tell_is_exactly_algorithm_1(S, seed):
    T = 0.3
    fit = fitness_fn()
    ref_evals, ref_pop = naive_algorithm_1(S, T, seed, fit, steps=150)
    ga = GeneticSearch(S, Thresholds([T]), seed)
    evals = []
    while len(evals) < len(ref_evals):
        p = ga.propose()
        evals.append(p.genome)
        ga.tell(p.seq, fit(p.genome, p.threshold))
    assert evals == ref_evals
    assert [(m.genome, m.fitness) for m in ga.population] == ref_pop


def test_initialization_keeps_only_above_T_then_adds_baseline_and_sorts():
    ga = GeneticSearch(4, Thresholds([0.5]), 0)
    script = [0.4, 0.7, 0.5, 0.6, 0.9]  # 0.4 and 0.5 (not > T) are dropped
    for f in script:
        p = ga.propose()
        assert p.kind == "init"
        ga.tell(p.seq, f)
    p = ga.propose()
    assert p.kind == "baseline" and p.genome == BASELINE
    assert not ga.formed
    ga.tell(p.seq, 0.3)  # the baseline joins whatever its fitness
    assert ga.formed
    assert [m.fitness for m in ga.population] == [0.9, 0.7, 0.6, 0.3]
    assert ga.population[-1].genome == BASELINE
    assert ga.propose().kind == "child"


def test_child_replaces_the_weakest_only_if_strictly_better_and_ranks_in_order():
    ga = GeneticSearch(3, Thresholds([0.0]), 0)
    for f in (0.8, 0.6):
        ga.tell(ga.propose().seq, f)
    ga.tell(ga.propose().seq, 0.4)  # baseline
    p = ga.propose()
    assert not ga.tell(p.seq, 0.4)["entered"]  # equal to the weakest: stays out
    assert ga.children_failed_in_a_row == 1
    p = ga.propose()
    out = ga.tell(p.seq, 0.7)
    assert out == {"entered": True, "rank": 1}
    assert [m.fitness for m in ga.population] == [0.8, 0.7, 0.6]
    assert ga.children_failed_in_a_row == 0
    p = ga.propose()
    assert ga.tell(p.seq, 0.8) == {"entered": True, "rank": 1}  # ties: after the incumbent
    assert len(ga.population) == 3


def test_thresholds_take_over_at_their_evaluation_index():
    t = Thresholds([0.11, 0.25, 0.35, 0.40], [0, 100, 200, 300])
    assert [t.at(i) for i in (0, 99, 100, 199, 200, 299, 300, 10**6)] == [0.11, 0.11, 0.25, 0.25, 0.35, 0.35, 0.40, 0.40]
    for bad in (([0.1, 0.2], [0]), ([0.1, 0.2], [1, 5]), ([0.1, 0.2], [0, 0]), ([1.5], [0])):
        with pytest.raises(ValueError):
            Thresholds(*bad)


def test_async_tell_out_of_order_still_forms_the_population():
    ga = GeneticSearch(3, Thresholds([0.2]), 5)
    props = [ga.propose() for _ in range(4)]  # four workers, all initialization
    for p, f in zip(reversed(props), (0.9, 0.8, 0.1, 0.7)):
        ga.tell(p.seq, f)
    p = ga.propose()
    assert p.kind == "baseline"  # two kept (S-1), the third above T waits as surplus
    ga.tell(p.seq, 0.5)
    assert ga.formed and [m.fitness for m in ga.population] == [0.9, 0.8, 0.7]  # surplus competed


# -- through the engine ---------------------------------------------------------------------------

def run_search(tmp_path, name="run", **kw):
    cfg = SearchConfig(**{"fitness": "synthetic:3", "epochs": 4, "population": 8, "seed": 0,
                          "thresholds": [0.2, 0.3], "threshold_steps": [0, 60], "max_evaluations": 200, **kw})
    s = Search(cfg, tmp_path / name, progress=False)
    s.start_new()
    s.run()
    return s


def test_ga_finds_the_planted_optimum(tmp_path):
    s = run_search(tmp_path, max_evaluations=600, population=12)
    target = "-".join(map(str, F.planted_target(3)))
    assert s.ga.population[0].genome == target


def test_duplicates_and_equivalents_are_never_trained(tmp_path, monkeypatch):
    trained = []
    real = F.synthetic_result

    def counting(genome, *a, **k):
        trained.append(genome)
        return real(genome, *a, **k)

    monkeypatch.setattr(F, "synthetic_result", counting)
    s = run_search(tmp_path, max_evaluations=300)
    assert len(trained) == len(set(trained)), "a genome was trained twice"
    hashes = [F.analyse(g).hash for g in trained]
    assert len(hashes) == len(set(hashes)), "two functionally equal genomes were both trained"
    c = s.summary_counts()
    assert c["trainings"] == len(trained)
    assert c["saved_by_cache"] > 0
    assert c["evaluations"] == c["trainings"] + c["saved_by_cache"] + c["saved_by_equivalence"] + c["saved_by_screening"]
    for e in s.results.values():
        if e["source"] == "equivalent":
            assert F.analyse(e["duplicate_of"]).hash == F.analyse(e["genome"]).hash != ""
            assert e["duplicate_of"] != e["genome"]


def test_paper_faithful_trains_every_candidate(tmp_path):
    s = run_search(tmp_path, max_evaluations=120, cache=False, equivalence=False, screening=False)
    c = s.summary_counts()
    assert c["trainings"] == c["evaluations"] == 120


def test_cache_gives_the_same_search_as_training_everything(tmp_path):
    # Training is a function of the genome (seeded), so the savings change no fitness and the
    # GA takes the same path: same candidates, same population.
    a = run_search(tmp_path, "a", max_evaluations=150, equivalence=False)
    b = run_search(tmp_path, "b", max_evaluations=150, cache=False, equivalence=False)
    assert [e["genome"] for e in a.results.values()] == [e["genome"] for e in b.results.values()]
    assert [(m.genome, m.fitness) for m in a.ga.population] == [(m.genome, m.fitness) for m in b.ga.population]


def test_equivalent_forms_share_a_hash_and_others_do_not():
    # U2 = 0 (zero) makes B1 = a' + 0, a' - 0 and max(a', 0) all equal to a (a >= 0).
    same = ["0-1-0-0-0-0-1", "0-1-0-0-1-0-1", "0-1-0-0-8-0-1"]
    hashes = {F.analyse(g).hash for g in same}
    assert len(hashes) == 1
    assert F.analyse("0-1-0-0-2-0-1").hash not in hashes  # 0 - a
    assert F.analyse(BASELINE).hash not in hashes
    # alpha is compared as a variable: alpha*x (code 16) is not x even though alpha starts at 1.
    assert F.analyse("16-0-0-0-0-0-1").hash != F.analyse(BASELINE).hash


def test_cache_answers_equivalents_with_duplicate_of_and_screens_untrained():
    cache = F.FitnessCache()
    rec = {"status": "ok", "val_acc": 0.8, "val_acc_per_epoch": [0.5, 0.8], "epochs": 2}
    cache.record("0-1-0-0-0-0-1", rec, cache.fhash("0-1-0-0-0-0-1"))
    assert cache.lookup("0-1-0-0-0-0-1", 0.3)[0] == "cache"
    source, res, dup = cache.lookup("0-1-0-0-8-0-1", 0.3)
    assert (source, res["val_acc"], dup) == ("equivalent", 0.8, "0-1-0-0-0-0-1")
    assert cache.lookup(BASELINE, 0.3) is None
    source, res, _ = cache.lookup("1-1-1-1-0-0-0", 0.3)
    assert source == "screened" and res["val_acc"] == 0.0 and "constant" in res["reason"]
    off = F.FitnessCache(cache=False, equivalence=False, screening=False)
    off.record("0-1-0-0-0-0-1", rec, None)
    assert all(off.lookup(g, 0.3) is None for g in ("0-1-0-0-0-0-1", "0-1-0-0-8-0-1", "1-1-1-1-0-0-0"))


def test_screening_rejects_constant_and_non_finite_measures_with_a_reason():
    assert "constant" in F.analyse("1-1-1-1-0-0-0").screen_reason  # all unary zero
    assert "constant" in F.analyse("15-15-15-15-0-0-1").screen_reason  # alpha only
    assert "non-finite" in F.analyse("0-1-0-0-4-0-0").screen_reason  # a/0 + (b + c): inf or nan
    # Non-finite only where a count is 0 (as for M5): rare in real windows, so it is trained.
    assert F.analyse("5-0-0-0-0-0-1").screen_reason is None  # log(a) + d - (b + c)
    import refimpl

    for name, g in refimpl.REGISTERED.items():
        assert F.analyse(g).screen_reason is None, name


def test_reuse_under_applies_the_papers_fitness_to_an_old_training():
    full = {"status": "ok", "val_acc": 0.9, "val_acc_per_epoch": [0.3, 0.6, 0.9], "epochs": 3}
    assert F.reuse_under(full, 0.2)["val_acc"] == 0.9
    r = F.reuse_under(full, 0.35)
    assert r["status"] == "rejected" and r["val_acc"] == 0.3 and r["epochs"] == 1
    rej = {"status": "rejected", "val_acc": 0.3, "val_acc_per_epoch": [0.3], "epochs": 1}
    assert F.reuse_under(rej, 0.4)["val_acc"] == 0.3
    assert F.reuse_under(rej, 0.2) is None  # would have trained fully: unknown, must train
    div = {"status": "diverged", "val_acc": 0.1, "val_acc_per_epoch": [], "epochs": 1}
    assert F.reuse_under(div, 0.05)["status"] == "diverged"
    assert F.reuse_under({"status": "error"}, 0.1) is None


def test_diverged_and_failing_candidates_are_results_not_crashes(tmp_path):
    s = run_search(tmp_path, max_evaluations=100, fitness="synthetic:3,fail=" + BASELINE)
    st = [e["status"] for e in s.results.values()]
    assert "diverged" in st
    err = [e for e in s.results.values() if e["status"] == "error"]
    assert err and err[0]["genome"] == BASELINE and "synthetic failure" in err[0]["error"]
    assert err[0]["fitness"] == 0.0
    assert len(s.results) == 100


def test_journal_has_one_result_per_proposal(tmp_path):
    s = run_search(tmp_path, max_evaluations=80)
    lines = [json.loads(x) for x in (s.run_dir / "journal.jsonl").read_text().splitlines()]
    props = [e["seq"] for e in lines if e["type"] == "proposal"]
    res = [e["seq"] for e in lines if e["type"] == "result"]
    assert props == list(range(80)) and sorted(res) == props
    assert lines[0]["type"] == "start" and lines[-1]["type"] == "end"


def test_patience_stops_after_k_children_fail_in_a_row(tmp_path):
    s = run_search(tmp_path, max_evaluations=5000, patience=15)
    assert s.ga.children_failed_in_a_row == 15
    assert "patience" in s.stop_reason


def test_reuse_skips_trainings_of_an_earlier_run(tmp_path):
    a = run_search(tmp_path, "a", max_evaluations=100)
    # load_reuse is the CLI's job; do it as the CLI does
    cfg = SearchConfig(**{**a.cfg.__dict__, "reuse": [str(a.run_dir)], "max_evaluations": 100})
    c = Search(cfg, tmp_path / "c", progress=False)
    assert c.load_reuse() > 0
    c.start_new()
    c.run()
    counts = c.summary_counts()
    assert counts["trainings"] == 0 and counts["saved_by_reuse"] > 0
    assert [e["genome"] for e in c.results.values()] == [e["genome"] for e in a.results.values()]


class FakeEvaluator:
    """Two slots; finishes jobs oldest first, with the synthetic fitness."""

    slots = 2

    def __init__(self):
        self.jobs = []
        self.submitted = []

    @property
    def outstanding(self):
        return len(self.jobs)

    def submit(self, job):
        self.jobs.append(job)
        self.submitted.append(job["genome"])

    def poll(self):
        job = self.jobs.pop(0)
        return [(job["seq"], F.synthetic_result(job["genome"], 3, 4, job["reject_below"]))]

    def close(self):
        pass


def test_async_candidate_equal_to_one_in_training_waits_instead_of_training(tmp_path):
    cfg = SearchConfig(fitness="synthetic:3", epochs=4, population=4, thresholds=[0.0], threshold_steps=[0],
                       max_evaluations=3, workers=2)
    s = Search(cfg, tmp_path / "run", progress=False)
    s.start_new()
    s.evaluator = ev = FakeEvaluator()
    props = [s.ga.propose() for _ in range(3)]
    props[0].genome = "0-1-0-0-0-0-1"
    props[1].genome = props[0].genome  # the same genome proposed while the first trains
    props[2].genome = "0-1-0-0-8-0-1"  # and a functional twin of it
    for p in props:
        s._dispatch(p)
    assert ev.submitted == ["0-1-0-0-0-0-1"], "the duplicate and the twin wait for the training"
    seq, res = ev.poll()[0]
    s._finish_training(seq, res)
    src = {e["seq"]: (e["source"], e.get("duplicate_of")) for e in s.results.values()}
    assert src == {0: ("train", None), 1: ("cache", None), 2: ("equivalent", "0-1-0-0-0-0-1")}
    assert s.results[1]["fitness"] == s.results[2]["fitness"] == s.results[0]["fitness"]


def test_unique_members_refuses_a_copy_that_algorithm_1_would_insert():
    # A child equal to a member, fitter than the weakest: Algorithm 1 inserts it again,
    # unique_members (the default with the cache on) does not.
    for unique, expect in ((False, True), (True, False)):
        ga = GeneticSearch(2, Thresholds([0.0]), 0, unique_members=unique)
        first = ga.propose()
        ga.tell(first.seq, 0.5)
        base = ga.propose()
        assert base.kind == "baseline"
        ga.tell(base.seq, 0.9)
        child = ga.propose()
        child.genome = base.genome  # the bred child happens to be the baseline again
        ga.in_flight[child.seq] = child
        assert ga.tell(child.seq, 0.9)["entered"] is expect
