"""The search loop: GA + fitness cache + journal + evaluator + progress, and ``--resume``.

Order of every step, chosen so that a SIGKILL at any instant loses nothing that replay cannot
rebuild:

1. ``ga.propose()``; the proposal is journaled (flushed before a training starts on it, fsynced
   with its result: the journal is always a prefix of the event sequence, and a lost suffix
   is simply proposed again, identically, on resume).
2. Lookup (cache, equivalence, screening): a hit is finished at once; otherwise the job goes to
   the evaluator (or, asynchronously, waits for an identical function already training).
3. When a result comes back: ``ga.tell()``, then the result line is journaled.

Resume reads the journal and feeds the same proposal/result sequence through a fresh
``GeneticSearch`` with the same seed (each replayed proposal is checked against the journal), so
the population, the threshold schedule position and the generator state are exactly those of
the killed process. Proposals without a result are then dispatched again. Training is seeded
and the synthetic fitness is a function of the genome, so a re-run job returns what the killed
one would have: the resumed search ends exactly as an uninterrupted one (serial backend).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from refimpl import Genome
from refimpl.fileio import atomic_write_text

from ..settings import FITNESS, MEASURE_IMPL_BEFORE, PAPER_POPULATION, from_mapping
from . import journal as jr
from .fitness import FitnessCache, fitness_of, parse_fitness_spec
from .ga import GeneticSearch, Thresholds
from .interrupt import Interrupts
from .ladder_run import LadderRun

# Fields that define what a search computes: fixed at start, taken from the journal on resume.
SEARCH_FIELDS = ("dataset", "model", "downsample", "counts", "measure_impl", "epochs", "population", "seed", "thresholds", "threshold_steps",
                 "batch_size", "lr", "val_size", "train_size", "train_seed", "fitness", "cache", "equivalence",
                 "screening", "unique_members", "reuse", "rungs", "paired", "promote")
# Fields that must match for another run's trainings to be reused (--reuse).
TRAIN_FIELDS = ("dataset", "model", "downsample", "counts", "epochs", "batch_size", "lr", "val_size", "train_size", "train_seed",
                "fitness")
# Longest wait on a worker pool between two looks for a Ctrl-C (seconds).
POLL_S = 1.0
# What a journal written before a field existed computed: its start event lacks the key.
JOURNAL_DEFAULTS = {"downsample": "binary", "counts": "raw", "train_size": None, "measure_impl": MEASURE_IMPL_BEFORE,
                    "rungs": None, "paired": False, "promote": 1 / 3}


@dataclass
class SearchConfig:
    """Every setting of one search: what it computes (SEARCH_FIELDS) and how it runs (run control)."""
    dataset: str = "digits"
    model: str = "digits_net"
    downsample: str = "binary"  # binary | real: shortcut of units that change size or width (docs/design.md section 6)
    counts: str = "raw"  # the count convention of every candidate (refimpl/conventions.py; not a gene)
    # How the measure runs in a fitness training (bnn.settings.MEASURE_IMPLS). Eager, unlike bnn.train: every
    # candidate is a new genome whose fused kernels compile first (about 1 s on the 2-core Xeon), and the
    # default search's trainings take seconds: fused made it 1.21x slower (bench/bench_search_measure.py).
    # Fused pays off in long fitness trainings under raw counts (15 epochs: 0.74x; docs/performance.md).
    measure_impl: str = "eager"
    epochs: int = FITNESS.epochs
    population: int = PAPER_POPULATION
    seed: int = 0
    thresholds: list = field(default_factory=lambda: list(FITNESS.thresholds))
    threshold_steps: list = field(default_factory=lambda: list(FITNESS.threshold_steps))
    batch_size: int = FITNESS.batch_size
    lr: float = FITNESS.lr
    val_size: int | None = None
    train_size: int | None = None  # a seeded subset of the training split per fitness training; None = all
    train_seed: int = 0
    fitness: str = "train"
    cache: bool = True
    equivalence: bool = True
    screening: bool = True
    unique_members: bool = True  # a genome already in the population does not enter again
    reuse: list = field(default_factory=list)
    # The ladder (bnn.search.ladder): rungs of {epochs, train_size, seeds}, None = Algorithm 1's one
    # training; paired = fitness minus XNOR's on the same seed and budget; the fraction promoted.
    rungs: list | None = None
    paired: bool = False
    promote: float = 1 / 3
    # run control: may change on --resume
    max_evaluations: int | None = None
    max_trainings: int | None = None
    patience: int | None = None
    max_minutes: float | None = None  # wall-clock budget of this process (not replayable: see _should_stop)
    workers: int = 1
    workers_per_device: int | None = None  # K workers per device the fitness trains on; overrides workers
    backend: str = "serial"  # serial | local | ray
    ray_address: str | None = None
    data_dir: str | None = None
    device: str = "auto"
    step: str = "auto"  # how a fitness training step runs (bnn.train.config.STEPS)

    @classmethod
    def from_mapping(cls, mapping) -> "SearchConfig":
        """A config from a mapping of settings; a key that is not a setting is a one-line ValueError naming it."""
        return from_mapping(cls, mapping)

    def train_dict(self) -> dict:
        """The fitness training's settings as the workers take them."""
        return {"dataset": self.dataset, "model": self.model, "downsample": self.downsample, "counts": self.counts,
                "measure_impl": self.measure_impl, "epochs": self.epochs,
                "batch_size": self.batch_size, "lr": self.lr, "val_size": self.val_size,
                "train_size": self.train_size, "seed": self.train_seed, "data_dir": self.data_dir, "device": self.device,
                "step": self.step}


def _clean(v):
    """JSON without NaN/inf (the journal refuses them): non-finite floats become None."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class Search:
    """One search run: GA, fitness cache, journal and evaluator, driven by ``run()``."""
    def __init__(self, cfg: SearchConfig, run_dir: Path, *, progress: bool = True):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress_enabled = progress
        self.ga = GeneticSearch(cfg.population, Thresholds(cfg.thresholds, cfg.threshold_steps), cfg.seed,
                                unique_members=cfg.unique_members)
        self.cache = FitnessCache(cfg.cache, cfg.equivalence, cfg.screening, cfg.counts)
        self.results: dict[int, dict] = {}  # seq -> result event, in completion order
        self.proposals: dict[int, dict] = {}
        self.history: list[tuple[int, float, float]] = []  # (evaluations done, best, median)
        self.trainings_started = 0
        self.counts = {"source": {}, "status": {}}  # running tallies for the progress bar and summary
        self.replayed = 0
        self.stop_reason: str | None = None
        self.evaluator = None
        self.journal: jr.Journal | None = None
        self.parked: dict[str, list] = {}  # functional hash -> proposals waiting on its training
        self.training_hash: dict[int, str] = {}  # seq -> hash of jobs at the evaluator
        self.t_start = self.t_run = time.time()
        self.busy_s = 0.0
        self._bar = None
        self.ladder = LadderRun(self) if cfg.rungs or cfg.paired else None

    # -- setup -------------------------------------------------------------------------------------
    def load_reuse(self) -> int:
        """Load the trainings of the ``--reuse`` journals into the cache; returns how many."""
        n = 0
        for d in self.cfg.reuse:
            path = Path(d) / jr.JOURNAL
            events, _ = jr.read(path)
            start = {**JOURNAL_DEFAULTS, **events[0].get("config", {})}
            for k in TRAIN_FIELDS:
                if start.get(k) != getattr(self.cfg, k):
                    raise ValueError(f"--reuse {d}: its {k} is {start.get(k)!r}, this search's is "
                                     f"{getattr(self.cfg, k)!r}; only trainings of the same setting are reused")
            for e in events:
                if e.get("type") == "result" and e.get("source") == "train":
                    h = e.get("hash") or (self.cache.analysis(e["genome"]).hash if self.cache.use_equivalence else None)
                    self.cache.record(e["genome"], e, h, reused=True)
                    n += 1
        return n

    def start_new(self) -> None:
        """Create the run folder and its journal with the start line."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / jr.JOURNAL
        self.journal = jr.Journal.create(path, {"version": 1, "time": time.time(), "config": asdict(self.cfg)})

    @staticmethod
    def config_from_journal(run_dir: Path) -> dict:
        """The configuration stored in a run folder's journal, with defaults for keys older journals lack."""
        events, _ = jr.read(Path(run_dir) / jr.JOURNAL)
        return {**JOURNAL_DEFAULTS, **events[0]["config"]}

    def resume(self) -> int:
        """Replay the journal; returns how many proposals were in flight (re-dispatched by run)."""
        path = self.run_dir / jr.JOURNAL
        events, good = jr.read(path)
        torn = path.stat().st_size - good
        if torn:  # said, not silently cut: the user sees that a kill interrupted a write
            print(f"{path}: line {len(events) + 1} is incomplete ({torn} bytes, cut short by a kill mid-write); "
                  "it is dropped and what it recorded is computed again", file=sys.stderr, flush=True)
        try:
            self._replay(path, events)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:  # a damaged or crafted line
            raise jr.JournalError(f"{path}: a line cannot be replayed ({type(exc).__name__}: {exc}); "
                                  "not a journal this search wrote") from None
        self.replayed = len(self.results)
        self.journal = jr.Journal.open_for_append(path, good)
        self.journal.append({"type": "resume", "time": time.time(), "evaluations": len(self.results)})
        # Trainings counted so far include those in flight, which are dispatched again below.
        return len(self.ga.in_flight)

    def _replay(self, path: Path, events: list[dict]) -> None:
        for e in events[1:]:
            t = e.get("type")
            if self.ladder is not None and t in ("reference", "rung"):
                self.ladder.replay(e)
            if t == "proposal":
                p = self.ga.propose()
                if p.seq != e["seq"] or p.genome != e["genome"]:
                    raise jr.JournalError(
                        f"{path}: replay diverged at evaluation {e['seq']} (journal {e['genome']}, "
                        f"replay {p.genome}); the journal was written by different code or settings")
                self.proposals[p.seq] = p.to_dict()
                if self.ladder is not None:
                    self.ladder.replay(e)
            elif t == "result":
                if self.ladder is not None:
                    self.ladder.replay(e)
                self._apply_result(e, replay=True)

    def _make_evaluator(self):
        cfg = self.cfg
        train = cfg.train_dict()
        spec = parse_fitness_spec(cfg.fitness)
        if cfg.backend == "ray":
            from .evaluators import RayEvaluator

            return RayEvaluator(cfg.fitness, train, cfg.workers if cfg.workers > 1 else None, cfg.ray_address,
                                per_device=cfg.workers_per_device)
        # One local worker per GPU when training on GPUs (digits trains on the CPU: too small).
        gpus = (visible_gpus() if spec["kind"] == "train" and cfg.device in ("auto", "cuda")
                and not (cfg.device == "auto" and cfg.dataset == "digits") else [])
        if cfg.workers_per_device:
            from .evaluators import LocalPoolEvaluator, assign_devices

            return LocalPoolEvaluator(cfg.fitness, train, len(assign_devices(gpus, cfg.workers_per_device)), gpus)
        if cfg.backend == "local" or cfg.workers > 1:
            from .evaluators import LocalPoolEvaluator

            return LocalPoolEvaluator(cfg.fitness, train, cfg.workers, gpus)
        from .evaluators import SerialEvaluator

        return SerialEvaluator(cfg.fitness, train)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> str:
        """Run until a stop condition; returns the stop reason. KeyboardInterrupt (Ctrl-C)
        propagates after the evaluator is closed (the journal is already consistent at every
        line); see ``Interrupts`` for where it is raised."""
        self.t_run = time.time()
        with Interrupts() as ctrl_c:
            self.evaluator = self._make_evaluator()
            try:
                self._loop(ctrl_c)
            finally:
                self.busy_s = getattr(self.evaluator, "busy_s", 0.0)
                self.evaluator.close()
                if self._bar is not None:
                    self._bar.close()
        return self.stop_reason

    def _loop(self, ctrl_c: Interrupts) -> None:
        self._open_bar()
        if self.ladder is not None:
            self.ladder.restart()
        for seq in sorted(self.ga.in_flight) if self.ladder is None else ():  # resumed: what the killed process ran
            self._dispatch(self.ga.in_flight[seq])
        while True:
            ctrl_c.check()
            while self._has_free_slot():
                ctrl_c.check()
                reason = self._should_stop()
                if reason:
                    self.stop_reason = self.stop_reason or reason
                    break
                p = self.ga.propose()
                self.proposals[p.seq] = p.to_dict()
                self.journal.append(_clean({"type": "proposal", **p.to_dict()}), sync=False)
                self._dispatch(p)
            if not self.evaluator.outstanding:
                if any(self.parked.values()):  # cannot happen: parked jobs wait on an outstanding one
                    raise RuntimeError("internal error: candidates wait on a training that is not running")
                break
            # A pool is polled a second at a time, so the check above sees a Ctrl-C; a training
            # in this process must be interrupted where it is.
            in_process = getattr(self.evaluator, "trains_in_process", True)
            with ctrl_c.interruptible() if in_process else contextlib.nullcontext():
                done = self.evaluator.poll(timeout=POLL_S)
            for seq, res in done:
                self._finish_training(seq, res)
        self.stop_reason = self.stop_reason or self._should_stop() or "done"
        self.journal.append({"type": "end", "reason": self.stop_reason, "time": time.time()})

    def _has_free_slot(self) -> bool:
        ev = self.evaluator
        parked = sum(len(v) for v in self.parked.values())
        return ev.outstanding < ev.slots and parked < ev.slots

    def _should_stop(self) -> str | None:
        cfg = self.cfg
        if cfg.max_evaluations is not None and self.ga.next_seq >= cfg.max_evaluations:
            return f"max evaluations ({cfg.max_evaluations})"
        if cfg.max_trainings is not None and self.trainings_started >= cfg.max_trainings:
            return f"max trainings ({cfg.max_trainings})"
        if cfg.patience is not None and self.ga.children_failed_in_a_row >= cfg.patience:
            return f"patience: {cfg.patience} children in a row did not enter the population"
        # The one stop that depends on the machine's speed: it ends a run early but never
        # changes what was computed, so a run stopped by it continues exactly with --resume.
        if cfg.max_minutes is not None and time.time() - self.t_start >= 60 * cfg.max_minutes:
            return f"time budget ({cfg.max_minutes:g} min)"
        return None

    def _dispatch(self, p) -> None:
        if self.ladder is not None:
            self.ladder.dispatch_new(p)
            return
        hit = self.cache.lookup(p.genome, p.threshold)
        if hit is not None:
            source, res, dup = hit
            self._finish(p.seq, res, source, dup)
            return
        h = self.cache.fhash(p.genome) if self.cache.use_equivalence else None
        key = h or p.genome
        if (self.cache.use_cache or self.cache.use_equivalence) and key in self.training_hash.values():
            # Asynchronous only: the same function is training on another worker right now;
            # wait for it rather than train it twice.
            self.parked.setdefault(key, []).append(p)
            return
        self.training_hash[p.seq] = key
        self.trainings_started += 1
        self.journal.flush()  # visible to a reader before work starts (fsynced with its result)
        self.evaluator.submit({"seq": p.seq, "genome": p.genome, "reject_below": p.threshold})

    def _finish_training(self, seq, res: dict) -> None:
        if self.ladder is not None:
            self.ladder.on_done(seq, res)
            return
        key = self.training_hash.pop(seq, None)
        self._finish(seq, res, "train", None)
        for p in self.parked.pop(key, []) if key else []:
            self._dispatch(p)

    def _finish(self, seq: int, res: dict, source: str, dup: str | None) -> None:
        p = self.ga.in_flight[seq]
        event = {"type": "result", "seq": seq, "genome": p.genome, "kind": p.kind, "T": p.threshold,
                 "source": source, "fitness": fitness_of(res)}
        if dup:
            event["duplicate_of"] = dup
        for k in ("status", "val_acc", "val_acc_per_epoch", "test_acc", "epochs", "wall_s", "reason", "error"):
            if res.get(k) is not None:
                event[k] = res[k]
        if source == "train" and self.cache.use_equivalence:
            event["hash"] = self.cache.fhash(p.genome)
        event["time"] = time.time()
        self._apply_result(_clean(event), replay=False)

    def _apply_result(self, e: dict, replay: bool) -> None:
        seq = e["seq"]
        if e.get("source") == "train":
            self.cache.record(e["genome"], e, e.get("hash"))
            if replay:
                self.trainings_started += 1
        out = self.ga.tell(seq, e["fitness"], accuracy=e.get("accuracy"))
        e["entered"], e["rank"] = out["entered"], out["rank"]
        if not replay:
            self.journal.append(e)  # after tell: "entered"/"rank" are part of the record
        self.results[seq] = e
        for key in ("source", "status"):
            tally = self.counts[key]
            tally[e.get(key)] = tally.get(e.get(key), 0) + 1
        members = self.ga.members()
        if members:
            fits = [m.fitness for m in members]
            self.history.append((len(self.results), fits[0], statistics.median(fits)))
        self._tick(e)

    # -- progress ----------------------------------------------------------------------------------
    def _open_bar(self) -> None:
        if not self.progress_enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=self.cfg.max_evaluations, initial=len(self.results), unit="eval",
                         desc="search", dynamic_ncols=True, leave=False)
        self._tick(None)

    def _tick(self, e) -> None:
        if self._bar is None:
            return
        s = self.summary_counts()
        # Postfix before update(): update() redraws, and must show the new counts.
        extra = {} if self.ladder is None else {"rungs": self.ladder.progress()}
        self._bar.set_postfix(best=self.best_text(), trained=s["trainings"],
                              rejected=s["rejected"], cached=s["saved_by_cache"] + s["saved_by_equivalence"],
                              screened=s["saved_by_screening"], **extra, refresh=e is None)
        if e is not None:
            self._bar.update(1)

    def best_text(self) -> str:
        """The best member's value as the leaderboard reads it: the fitness, or on a ladder its score
        (vs XNOR when paired) at the rung it reached; the GA's rung-first sort key means nothing to a user."""
        members = self.ga.members()
        if not members:
            return "-"
        e = self.results.get(members[0].seq, {})
        if self.ladder is None or not isinstance(e.get("score"), (int, float)):
            return f"{members[0].fitness:.4f}"
        return f"{e['score']:{'+' if self.cfg.paired else ''}.4f} at rung {e.get('rung')}"

    # -- summary -----------------------------------------------------------------------------------
    def summary_counts(self) -> dict:
        """Tallies so far: evaluations, trainings, savings by source, rejected, diverged, errors."""
        src, st = self.counts["source"], self.counts["status"]
        counts = {
            "evaluations": len(self.results),
            "trainings": src.get("train", 0),
            "saved_by_cache": src.get("cache", 0) + src.get("reuse", 0),
            "saved_by_reuse": src.get("reuse", 0),
            "saved_by_equivalence": src.get("equivalent", 0),
            "saved_by_screening": src.get("screened", 0),
            "rejected": st.get("rejected", 0),
            "diverged": st.get("diverged", 0),
            "errors": st.get("error", 0),
        }
        if self.ladder is not None:  # a ladder's evaluation is several trainings (or cache answers)
            counts.update(self.ladder.counts(), saved_by_equivalence=0)
        return counts

    def leaderboard(self) -> list[dict]:
        """The population (or the members kept so far) as rows, best first."""
        rows = []
        for rank, m in enumerate(self.ga.members(), 1):
            e = self.results.get(m.seq, {})
            g = Genome.parse(m.genome)
            rows.append({"rank": rank, "genome": m.genome, "name": g.name, "formula": g.formula(),
                         "fitness": m.fitness, "epochs": e.get("epochs"), "status": e.get("status"),
                         "source": e.get("source"), "evaluation": m.seq,
                         **({"rung": e.get("rung"), "score": e.get("score")} if self.ladder is not None else {})})
        return rows

    def summary(self) -> dict:
        """The run's summary for results.json and ``--json``: the best measure, tallies, stop reason, timings."""
        board = self.leaderboard()
        best = None
        if board:
            best = {k: board[0][k] for k in ("genome", "name", "formula", "fitness", "epochs", "rung", "score")
                    if k in board[0]}  # rung and score: a ladder's, as its leaderboard shows them
        evals = len(self.results)
        wall = time.time() - self.t_start
        # This process's evaluations only (a resumed run replays the rest); includes one-time
        # warm-up (Numba, imports), so it is meaningful for long runs and the synthetic bench.
        done_here = evals - self.replayed
        # Workers train in parallel, so their busy seconds are shared over the slots: what is left of
        # the wall time is the engine's own work and the slots' idle time (never below 0 by summing).
        slots = max(1, int(getattr(self.evaluator, "slots", 1) or 1))
        engine = time.time() - self.t_run - self.busy_s / slots
        return _clean({
            "best": best,
            **self.summary_counts(),
            "population_formed": self.ga.formed,
            "stop_reason": self.stop_reason,
            "threshold_now": self.ga.thresholds.at(self.ga.next_seq),
            "wall_s": wall,
            "engine_overhead_ms_per_evaluation": (1000 * engine / done_here) if done_here > 0 else None,
            "run_dir": str(self.run_dir),
            **({"ladder": self.ladder.summary()} if self.ladder is not None else {}),
        })


def visible_gpus() -> list[str]:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES``, else torch's count; none without CUDA)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [x for x in env.split(",") if x.strip() and x.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch or no CUDA: CPU workers
        return []


def write_json_atomic(path: Path, obj) -> None:
    """Temp file, fsync, rename, fsync the folder (refimpl.fileio); a full disk keeps the old file."""
    atomic_write_text(path, json.dumps(obj, indent=1, allow_nan=False))
