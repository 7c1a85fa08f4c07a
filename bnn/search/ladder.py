"""A paired, multi-fidelity fitness: the rungs a candidate climbs and the score the GA ranks it by.

Algorithm 1 scores every candidate with one training (``--epochs`` on ``--train-size`` images,
one seed). A ladder (``--rungs E:N[:K],...``) gives every candidate the cheap first rung and
promotes the best fraction (``--promote``, as asynchronous successive halving does) to longer
budgets: more epochs, more images, more seeds. ``--paired`` scores a candidate by its validation
accuracy minus XNOR's on the same seed, subset and budget (XNOR trained once per rung and seed:
the references), so the seed's luck cancels.

``Ladder`` is a pure state machine over the events in the order they happened (a rung result, a
reference): the same sequence gives the same promotions and scores, so a journal replayed through
it rebuilds the state of a killed search exactly. Promotion is decided when a candidate's rung is
complete, against the scores that rung has seen so far: promoted if its score is among the best
``ceil(fraction * n)`` of the ``n`` (ties promote). A candidate ends at the rung it was not promoted
from (or the last), and the GA ranks it by the rung reached first, then by the score there: its
fitness value is ``rung + (1 + score) / 2`` when paired (score in -1..1), ``rung + score`` when not.
A candidate that did not finish a training (rejected, diverged, error) stops climbing.
"""
from __future__ import annotations

import math

from .fitness import fitness_of

STOPPED = ("rejected", "diverged", "error", "screened")


def parse_rungs(text: str) -> list[dict]:
    """``E:N[:K],...``: epochs, training images (``all`` or 0 for the whole split) and seeds per rung,
    each rung dearer than the one before; a one-line ValueError otherwise."""
    rungs = []
    for i, part in enumerate(p.strip() for p in text.split(",")):
        fields = part.split(":")
        if not part or len(fields) not in (2, 3):
            raise ValueError(f"--rungs: rung {i + 1} is {part!r}; expected EPOCHS:IMAGES[:SEEDS], e.g. 2:5000 or 6:all:2")
        try:
            epochs = int(fields[0])
            size = None if fields[1].strip().lower() in ("all", "0") else int(fields[1])
            seeds = int(fields[2]) if len(fields) == 3 else 1
        except ValueError:
            raise ValueError(f"--rungs: rung {i + 1} ({part!r}) needs integers (IMAGES may be 'all')") from None
        if epochs < 1 or seeds < 1 or (size is not None and size < 1) or seeds > 64:
            raise ValueError(f"--rungs: rung {i + 1} ({part!r}) needs epochs >= 1, images >= 1 or 'all', seeds 1..64")
        rungs.append({"epochs": epochs, "train_size": size, "seeds": seeds})
    for i in range(1, len(rungs)):
        a, b = rungs[i - 1], rungs[i]
        more = (b["epochs"] >= a["epochs"] and b["seeds"] >= a["seeds"]
                and (b["train_size"] is None or (a["train_size"] is not None and b["train_size"] >= a["train_size"])))
        if not more or a == b:
            raise ValueError(f"--rungs: rung {i + 1} must not be cheaper than rung {i} in epochs, images or seeds")
    return rungs


def ga_value(rung: int, score: float, paired: bool) -> float:
    """The GA's fitness of a candidate that ended at ``rung`` with ``score``: rung first, then score."""
    return rung + ((1.0 + score) / 2.0 if paired else score)


class Ladder:
    """Which trainings each candidate needs next, its scores, promotions and final fitness."""

    def __init__(self, rungs: list[dict], paired: bool, fraction: float, train_seed: int):
        self.rungs, self.paired, self.fraction, self.train_seed = rungs, paired, fraction, train_seed
        self.ref: dict[tuple[int, int], float] = {}  # (rung, seed) -> XNOR's validation accuracy
        self.runs: dict[int, dict] = {}  # seq -> {"genome", "rung", "got": {seed: result}, "acc0"}
        self.scores: list[list[float]] = [[] for _ in rungs]  # each rung's scores in decision order
        self.waiting: list[int] = []  # seqs whose rung is complete but whose references are not
        self.promoted = [0] * len(rungs)

    # -- what to train ----------------------------------------------------------------------------
    def seeds(self, rung: int) -> list[int]:
        """The training seeds of ``rung``: the search's training seed and the next ones."""
        return [self.train_seed + i for i in range(self.rungs[rung]["seeds"])]

    def train_of(self, rung: int, seed: int) -> dict:
        """The training settings that ``rung`` and ``seed`` override in the search's (``SearchConfig.train_dict``)."""
        r = self.rungs[rung]
        return {"epochs": r["epochs"], "train_size": r["train_size"], "seed": seed}

    def references_needed(self) -> list[tuple[int, int]]:
        """(rung, seed) of every XNOR reference not yet known (none when not paired)."""
        if not self.paired:
            return []
        return [(r, s) for r in range(len(self.rungs)) for s in self.seeds(r) if (r, s) not in self.ref]

    def start(self, seq: int, genome: str) -> None:
        """A new candidate on the first rung."""
        self.runs[seq] = {"genome": genome, "rung": 0, "got": {}, "acc0": None}

    def needed(self, seq: int) -> list[tuple[int, int]]:
        """(rung, seed) of the trainings candidate ``seq`` still needs on its current rung."""
        run = self.runs[seq]
        return [(run["rung"], s) for s in self.seeds(run["rung"]) if s not in run["got"]]

    # -- events -------------------------------------------------------------------------------------
    def on_reference(self, rung: int, seed: int, result: dict) -> list[tuple]:
        """XNOR's training at (rung, seed); returns the decisions it unblocks, in seq order."""
        self.ref[(rung, seed)] = fitness_of(result)
        waiting, self.waiting = sorted(self.waiting), []
        return [d for seq in waiting if (d := self._decide(seq)) is not None]

    def on_result(self, seq: int, rung: int, seed: int, result: dict) -> list[tuple]:
        """Candidate ``seq``'s training at (rung, seed); returns ``[]`` while its rung is incomplete,
        else one decision: ``("promote", seq, rung)`` (train it there next) or ``("final", seq, rung,
        score, value, acc0)``."""
        run = self.runs[seq]
        if rung != run["rung"] or seed in run["got"] or seed not in self.seeds(rung):
            raise ValueError(f"candidate {seq} got a training at rung {rung}, seed {seed} it did not need")
        run["got"][seed] = result
        if self.needed(seq):
            return []
        d = self._decide(seq)
        return [] if d is None else [d]

    def screened(self, seq: int) -> tuple:
        """A candidate rejected untrained: final at the first rung with the lowest score."""
        self.runs.pop(seq, None)
        score = -1.0 if self.paired else 0.0
        return ("final", seq, 0, score, ga_value(0, score, self.paired), 0.0)

    def _decide(self, seq: int) -> tuple | None:
        run = self.runs[seq]
        r, seeds = run["rung"], self.seeds(run["rung"])
        if self.paired and any((r, s) not in self.ref for s in seeds):
            self.waiting.append(seq)
            return None
        accs = [fitness_of(run["got"][s]) for s in seeds]
        if r == 0:
            run["acc0"] = sum(accs) / len(accs)  # the threshold T is judged on the first rung's accuracy
        diffs = [a - self.ref[(r, s)] for a, s in zip(accs, seeds)] if self.paired else accs
        score = sum(diffs) / len(diffs)
        self.scores[r].append(score)
        stopped = any(run["got"][s].get("status") in STOPPED for s in seeds)
        better = sum(x > score for x in self.scores[r])
        if not stopped and r + 1 < len(self.rungs) and better < math.ceil(self.fraction * len(self.scores[r])):
            self.promoted[r] += 1
            run["rung"], run["got"] = r + 1, {}
            return ("promote", seq, r + 1)
        del self.runs[seq]
        return ("final", seq, r, score, ga_value(r, score, self.paired), run["acc0"])
