"""Fitness: what a candidate's training yields, and how to avoid training it at all.

Three savings, applied before any training and switched off together by ``--paper-faithful``:

* exact cache: a genome already evaluated (in this run or in a ``--reuse`` journal) is not
  trained again;
* functional equivalence: two genomes computing the same function of (a, b, c, d, alpha) train
  the same network, so the measure is evaluated with ``refimpl`` (float64) on a fixed probe set
  and the rounded outputs hashed; a known hash reuses that fitness (``duplicate_of``);
* screening: a measure constant in the counts (wherever it is finite) cannot carry the input to
  the next layer, and one non-finite on most probes poisons BatchNorm; both are rejected untrained.

The worker side (``run_job``) turns a job into a result dict; it imports torch only for real
training, so the synthetic fitness used by tests stays cheap.
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass

import numba
import numpy as np

import refimpl
from refimpl import Genome

from ..settings import FITNESS, MEASURE_IMPL_BEFORE
from .variation import gene_limits

# -- probe set -------------------------------------------------------------------------------------
# Count tuples: every (a, b, c, d) in {0..3}^4 except all-zero (small windows and the degenerate
# cases a = 0, d = 0 ... where divisions and logs misbehave), plus random splits of the window
# sizes real layers have (n = C_in * k * k: 9 .. 4608), plus each count alone taking the whole
# window. Alpha: the initial values of docs/design.md section 2 and two fixed random settings, one per channel column,
# so alpha-dependent measures are compared as functions of alpha too.
_PROBE_SEED = 20220607  # fixed forever: changing it changes every hash in old journals
_WINDOW_SIZES = (9, 27, 64, 72, 288, 576, 1152, 2304, 4608)


def _probe_counts() -> tuple[np.ndarray, np.ndarray]:
    small = np.stack(np.meshgrid(*[np.arange(4)] * 4, indexing="ij"), -1).reshape(-1, 4)[1:]
    rng = np.random.Generator(np.random.PCG64(_PROBE_SEED))
    rand, realistic = [], []
    for n in _WINDOW_SIZES:
        for _ in range(6):
            cuts = np.sort(rng.integers(0, n + 1, size=3))
            rand.append(np.diff(np.concatenate([[0], cuts, [n]])))
            realistic.append(True)
        for i in range(4):
            one = np.zeros(4, dtype=np.int64)
            one[i] = n
            rand.append(one)
            realistic.append(False)
    counts = np.concatenate([small, np.array(rand)]).astype(np.float64)
    mask = np.concatenate([np.zeros(len(small), bool), np.array(realistic)])
    return counts, mask


# PROBE_COUNTS: (P, 4) columns a, b, c, d. REALISTIC: the random splits of real window sizes,
# where a layer's counts usually are; "non-finite on most probes" is judged on those alone,
# since the small and one-count tuples are full of zeros (log 0, 0/0) that real windows rarely
# have, and would screen measures that train (docs/design.md section 2: M5 is non-finite only at a = 0, d large).
PROBE_COUNTS, REALISTIC = _probe_counts()


def _probe_alpha(genome: Genome) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(_PROBE_SEED + 1))
    init = refimpl.default_alpha(genome, 1)[:, 0]
    # Slots that do not use alpha ignore it, so random values everywhere are harmless.
    return np.stack([init, rng.uniform(-2.0, 2.0, 4), rng.uniform(0.1, 3.0, 4)], axis=1)  # (4, 3)


def probe_outputs(genome, counts: str = "raw") -> np.ndarray:
    """The measure on every probe tuple (rows) under every alpha setting (columns), float64, the
    tuples converted by the count convention ``counts`` (each tuple its own window of n = a+b+c+d)."""
    g = Genome.parse(genome)
    alpha = _probe_alpha(g)
    cols = alpha.shape[1]
    a, b, c, d = (np.repeat(PROBE_COUNTS[:, i : i + 1], cols, axis=1) for i in range(4))
    # One thread: ~1000 values are far too few to pay for waking Numba's thread pool, which on
    # busy cores cost ~5 ms per call instead of ~0.25 ms. The setting is per calling thread.
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return refimpl.measure(g, a, b, c, d, alpha=alpha, dtype=np.float64, counts=counts)
    finally:
        numba.set_num_threads(threads)


def _rounded(y: np.ndarray) -> np.ndarray:
    # 30-bit mantissas (about 9 significant digits): equal functions written differently differ
    # in the last bits of some outputs, so exact bits would miss them. NaN, +inf and -inf get
    # their own codes; -0.0 and 0.0 agree. A value straddling a rounding boundary only costs a
    # missed saving, never a wrong one.
    finite = np.isfinite(y)
    mant, expo = np.frexp(np.where(finite, y, 0.0))
    mant = np.round(mant * (1 << 30)).astype(np.int64)
    expo = np.where(mant == 0, 0, expo).astype(np.int64)
    special = np.where(np.isnan(y), 1, np.where(y == np.inf, 2, np.where(y == -np.inf, 3, 0)))
    return np.stack([mant, expo, special.astype(np.int64)], -1)


@dataclass(frozen=True)
class Analysis:
    """A genome's functional hash and, if it is screened out untrained, why."""
    hash: str
    screen_reason: str | None  # why it is rejected untrained, or None


def analyse(genome, counts: str = "raw") -> Analysis:
    """Functional hash and screening verdict of one genome under a count convention (about 50 us
    after Numba warm-up). Two genomes equal on raw counts may differ on converted ones, so the
    hash is a function's under one convention: a search runs one, and --reuse needs the same."""
    y = probe_outputs(genome, counts)
    r = _rounded(y)
    h = hashlib.blake2b(r.tobytes(), digest_size=12).hexdigest()
    finite = np.isfinite(y)
    frac_bad = 1.0 - finite[REALISTIC].mean()
    reason = None
    if frac_bad > 0.5:
        reason = f"non-finite on {frac_bad:.0%} of realistic probes"
    else:
        # Constant per alpha setting over all count tuples where finite (the non-finite ones,
        # if any, only make it worse: NaN or inf where it is not constant).
        constant = True
        for j in range(y.shape[1]):
            col = r[finite[:, j], j]
            if len(col) and not (col == col[0]).all():
                constant = False
                break
        if constant:
            reason = "constant in a, b, c, d" + ("" if finite.all() else " wherever finite")
    return Analysis(h, reason)


# -- results and reuse -----------------------------------------------------------------------------

def fitness_of(result: dict) -> float:
    """Fitness of a worker result: last validation accuracy trained (epoch 1 when rejected, the
    accuracy when it diverged); 0 when there is none (errors, NaN), which never beats a member."""
    v = result.get("val_acc")
    if v is None or not isinstance(v, (int, float)) or not math.isfinite(v):
        return 0.0
    return float(v)


def reuse_under(record: dict, threshold: float) -> dict | None:
    """The result an earlier training ``record`` implies under threshold ``threshold``, or None
    if it cannot tell (the record was rejected at epoch 1 under a higher T, so the full training
    this T asks for never happened).

    Paper's fitness: ACC_1 if ACC_1 < T else ACC_15. A fully trained record knows both.
    """
    status = record.get("status")
    per_epoch = record.get("val_acc_per_epoch") or []
    epochs = int(record.get("epochs") or 0)
    if status not in ("ok", "rejected", "diverged"):
        return None
    if status == "diverged" and epochs <= 1:
        return dict(record)  # it never reached the rejection point, under any T
    if not per_epoch:
        return None
    acc1 = per_epoch[0]
    if acc1 is not None and math.isfinite(acc1) and acc1 < threshold:
        out = dict(record)
        out.update(status="rejected", val_acc=acc1, val_acc_per_epoch=[acc1], epochs=1)
        return out
    if status == "rejected":
        return None
    return dict(record)


_RESULT_KEYS = ("status", "val_acc", "val_acc_per_epoch", "test_acc", "epochs", "wall_s")


class FitnessCache:
    """Exact and functional lookups over every training seen so far (this run and ``--reuse``).

    ``lookup`` returns (source, result, duplicate_of) without training, or None. ``pending`` lets
    an asynchronous engine park a candidate whose function is already training elsewhere.
    """

    def __init__(self, cache=True, equivalence=True, screening=True, counts="raw"):
        self.use_cache, self.use_equivalence, self.use_screening = cache, equivalence, screening
        self.counts = counts  # the search's count convention: the probes' too
        self.by_genome: dict[str, dict] = {}
        self.by_hash: dict[str, tuple[str, dict]] = {}
        self.reused: dict[str, dict] = {}  # from --reuse journals, by genome
        self.reused_by_hash: dict[str, tuple[str, dict]] = {}
        self._analysis: dict[str, Analysis] = {}

    def analysis(self, genome: str) -> Analysis:
        """The genome's Analysis, computed once and memoized."""
        a = self._analysis.get(genome)
        if a is None:
            a = self._analysis[genome] = analyse(genome, self.counts)
        return a

    @property
    def needs_analysis(self) -> bool:
        """Whether lookups need the functional analysis (equivalence or screening is on)."""
        return self.use_equivalence or self.use_screening

    def record(self, genome: str, result: dict, fhash: str | None, reused=False) -> None:
        """Remember a training (not cache hits: they add nothing new)."""
        if result.get("status") not in ("ok", "rejected", "diverged"):
            return  # errors are not facts about the measure
        rec = {k: result.get(k) for k in _RESULT_KEYS}
        table, htable = (self.reused, self.reused_by_hash) if reused else (self.by_genome, self.by_hash)
        if _more_complete(rec, table.get(genome)):
            table[genome] = rec
        if fhash and _more_complete(rec, htable.get(fhash, (None, None))[1]):
            htable[fhash] = (genome, rec)

    def lookup(self, genome: str, threshold: float):
        """(source, result, duplicate_of) for a genome that needs no training under ``threshold``, else None."""
        if self.use_cache:
            for source, table in (("cache", self.by_genome), ("reuse", self.reused)):
                rec = table.get(genome)
                if rec is not None:
                    out = reuse_under(rec, threshold)
                    if out is not None:
                        return source, out, None
        if self.needs_analysis:
            an = self.analysis(genome)
            if self.use_screening and an.screen_reason:
                return "screened", {"status": "screened", "val_acc": 0.0, "val_acc_per_epoch": [],
                                    "epochs": 0, "reason": an.screen_reason}, None
            if self.use_equivalence:
                for table in (self.by_hash, self.reused_by_hash):
                    hit = table.get(an.hash)
                    if hit is not None and hit[0] != genome:
                        out = reuse_under(hit[1], threshold)
                        if out is not None:
                            return "equivalent", out, hit[0]
        return None

    def fhash(self, genome: str) -> str | None:
        """The genome's functional hash, or None when equivalence is off."""
        return self.analysis(genome).hash if self.use_equivalence else None


def _more_complete(new: dict, old: dict | None) -> bool:
    return old is None or int(new.get("epochs") or 0) > int(old.get("epochs") or 0)


# -- worker side -----------------------------------------------------------------------------------

def parse_fitness_spec(spec: str) -> dict:
    """``train`` (real training) or ``synthetic:SEED[,delay=S][,die_once=PATH][,fail=GENOME]``."""
    if spec == "train":
        return {"kind": "train"}
    if spec.startswith("synthetic:"):
        parts = spec[len("synthetic:"):].split(",")
        try:
            out = {"kind": "synthetic", "seed": int(parts[0]), "delay": 0.0, "die_once": None, "fail": None}
        except ValueError:
            raise ValueError(f"--fitness {spec!r}: the synthetic seed must be an integer") from None
        for p in parts[1:]:
            key, _, val = p.partition("=")
            if key == "delay":
                out["delay"] = float(val)
            elif key in ("die_once", "fail"):
                out[key] = val
            else:
                raise ValueError(f"--fitness {spec!r}: unknown option {key!r} (delay, die_once, fail)")
        return out
    raise ValueError(f"--fitness {spec!r}: expected 'train' or 'synthetic:SEED'")


def planted_target(seed: int) -> tuple[int, ...]:
    """The synthetic fitness's optimum: a fixed, non-degenerate genome per seed."""
    rng = np.random.Generator(np.random.PCG64([seed, 7]))
    return tuple(int(x) for x in rng.integers(0, gene_limits()))


def synthetic_result(genome: str, seed: int, epochs: int, reject_below: float | None,
                     budget: dict | None = None) -> dict:
    """A cheap stand-in for training: a known function of the genome plus seeded noise.

    Accuracy rises with the number of genes equal to ``planted_target(seed)``; the noise is seeded
    by (seed, genome), so the same genome always gets the same result (as seeded CPU training
    does), which the cache and the resume tests rely on. About 5% of genomes "diverge".
    ``budget`` (a ladder's rung: training seed and images) seeds the noise too, so a rung's
    trainings differ from each other as real ones do.
    """
    codes = Genome.parse(genome).codes
    target = planted_target(seed)
    match = sum(int(a == b) for a, b in zip(codes, target)) / len(codes)
    extra = [] if budget is None else [int(budget.get("seed") or 0), int(budget.get("train_size") or 0), epochs]
    rng = np.random.Generator(np.random.PCG64([seed, *codes, *extra]))
    noise = rng.normal(0.0, 0.01, size=epochs)
    final = 0.3 + 0.65 * match  # 0.3 for no matching gene, 0.95 at the planted optimum
    # Learning curve: 70% of the final accuracy after epoch 1, approaching it geometrically.
    curve = [float(np.clip(final * (1 - 0.3 * 0.5 ** e) + noise[e], 0.0, 1.0)) for e in range(epochs)]
    if rng.random() < 0.05:
        return {"status": "diverged", "val_acc": 0.1, "val_acc_per_epoch": [0.1],
                "test_acc": None, "epochs": 1}
    if reject_below is not None and curve[0] < reject_below:
        return {"status": "rejected", "val_acc": curve[0], "val_acc_per_epoch": curve[:1],
                "test_acc": None, "epochs": 1}
    return {"status": "ok", "val_acc": curve[-1], "val_acc_per_epoch": curve,
            "test_acc": curve[-1], "epochs": epochs}


def fitness_config(train: dict, genome: str):
    """The TrainConfig of one fitness training of ``genome`` under the search's training settings
    ``train`` (``SearchConfig.train_dict()``): the paper's constant-lr schedule, no files, no test set.
    A key ``TrainConfig`` lacks is a one-line ValueError naming it, never dropped."""
    from bnn.train import TrainConfig

    t = train
    return TrainConfig.from_mapping(dict(
        model=t["model"], dataset=t["dataset"], measure=genome, epochs=t["epochs"],
        downsample=t.get("downsample", "binary"), counts=t.get("counts", "raw"),
        measure_impl=t.get("measure_impl", MEASURE_IMPL_BEFORE),
        batch_size=t["batch_size"], lr=t["lr"], seed=t["seed"], device=t["device"], step=t.get("step", "auto"),
        data_dir=t.get("data_dir"), val_size=t.get("val_size"), train_size=t.get("train_size"),
        milestones=FITNESS.milestones, gamma=FITNESS.gamma,  # the paper's fitness schedule
        out_dir=None,  # no files per candidate
        eval_test=False,  # fitness is validation accuracy; the test set stays out of the search
    ))


class Worker:
    """Evaluates jobs in one process, holding what is costly to set up (the data set on the
    device) across jobs: one per worker process, Ray actor, or the serial engine."""

    def __init__(self, fitness_spec: str, train: dict):
        self.spec = parse_fitness_spec(fitness_spec)
        self.train = dict(train)
        self._data: dict = {}  # train_size -> the data set on the device (a ladder's rungs differ in it)
        # Under --measure-impl triton: one model, optimizer and captured step per training setting, reset in
        # place for each candidate (bnn.train.loop.reset_training), so a new genome compiles and captures nothing.
        self._kept: dict = {}

    def run(self, job: dict) -> dict:
        """Never raises: an application error is a result with status "error"."""
        t0, c0 = time.time(), time.process_time()
        try:
            out = self._run(job)
        except Exception as exc:  # noqa: BLE001 - any failure of one candidate is that candidate's result
            out = {"status": "error", "val_acc": None, "val_acc_per_epoch": [], "epochs": 0,
                   "error": f"{type(exc).__name__}: {exc}"[:500]}
        out.setdefault("wall_s", time.time() - t0)
        out["cpu_s"] = time.process_time() - c0  # this process's CPU seconds: a training's cost on a shared CPU
        out["pid"] = os.getpid()
        return out

    def _run(self, job: dict) -> dict:
        s = self.spec
        if s["kind"] == "synthetic":
            if s["die_once"] and not os.path.exists(s["die_once"]):
                # Test hook: the first job any worker sees kills that worker process outright,
                # mid-evaluation, to prove the pool survives it and retries the job.
                open(s["die_once"], "w").close()
                os.kill(os.getpid(), 9)
            if s["fail"] and job["genome"] == s["fail"]:
                raise RuntimeError("synthetic failure requested for this genome")
            if s["delay"]:
                time.sleep(s["delay"])
            epochs = job.get("train", {}).get("epochs", self.train["epochs"])
            return synthetic_result(job["genome"], s["seed"], epochs, job.get("reject_below"), job.get("train"))
        return self._train(job)

    def _train(self, job: dict) -> dict:
        from bnn.train import TrainConfig, resolve_device, train_model  # torch only when training

        t = {**self.train, **job.get("train", {})}  # a ladder's rung overrides epochs, images and seed
        if t.get("train_size") not in self._data:
            from bnn.data import load_dataset

            device = resolve_device(t["device"], t["dataset"])
            # The validation split is TrainConfig's (split_seed), not the training seed: every
            # candidate is scored on the same held-out images.
            self._data[t.get("train_size")] = load_dataset(t["dataset"], t.get("data_dir"), t.get("val_size"),
                                                           TrainConfig.split_seed, device, train_size=t.get("train_size"))
        cfg = fitness_config(t, job["genome"])
        import warnings

        with warnings.catch_warnings():
            # A diverged step skips optimizer.step(); torch then warns about the scheduler order
            # on every such candidate, which says nothing about the search.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
            res = train_model(cfg, data=self._data[t.get("train_size")], reject_below=job.get("reject_below"), progress=False,
                              keep=self._kept)
        d = res.to_dict() if hasattr(res, "to_dict") else dict(res.__dict__)
        return {k: d.get(k) for k in _RESULT_KEYS}
