"""The paper's Algorithm 1 as a deterministic state machine: ``propose()`` and ``tell()``.

The GA never calls the fitness function itself. The engine asks it for the next candidate
(``propose``), evaluates that candidate however it likes (serial, worker pool, Ray, cache), and
reports the fitness back (``tell``). Two consequences:

* With one worker the engine alternates propose/tell, which is exactly Algorithm 1.
  With several it keeps every worker busy by proposing again before earlier results are back:
  asynchronous steady state, each child bred from the population as it is at that moment.
* The state after any sequence of propose/tell calls is a pure function of the seed and that
  sequence, so a journal of the calls, replayed through this same class, rebuilds the population,
  the threshold state and the generator state exactly (``--resume``).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from refimpl import Genome

from .variation import breed, random_genome

BASELINE = "0-0-0-0-0-0-1"


@lru_cache(maxsize=65536)
def _codes(genome: str) -> np.ndarray:
    # Parsed once per distinct genome: replaying a long journal breeds from S members per step.
    return np.array(Genome.parse(genome).codes, dtype=np.int64)


class Thresholds:
    """Early-rejection threshold ``T`` as a step schedule over the evaluation index.

    ``values[i]`` takes over at evaluation ``steps[i]`` (0-based index of the proposal), so with
    values 0.11,0.25 and steps 0,100 evaluations 0..99 use 0.11 and 100 onward 0.25. The index is
    that of the proposal, not of completion, so asynchronous runs use the same T for the same
    candidate whatever order results come back in.
    """

    def __init__(self, values, steps=None):
        values = [float(v) for v in values]
        if not values:
            raise ValueError("--thresholds needs at least one value")
        for v in values:
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"threshold {v} is outside 0..1 (thresholds are accuracies as fractions)")
        if steps is None:
            if len(values) != 1:
                raise ValueError(f"{len(values)} thresholds need --threshold-steps saying when each takes over")
            steps = [0]
        steps = [int(s) for s in steps]
        if len(steps) != len(values):
            raise ValueError(f"--threshold-steps has {len(steps)} entries but --thresholds has {len(values)}")
        if steps[0] != 0:
            raise ValueError(f"the first threshold must take over at evaluation 0, got {steps[0]}")
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"--threshold-steps must be strictly increasing, got {steps}")
        self.values = values
        self.steps = steps

    def at(self, index: int) -> float:
        """The threshold T in force for the proposal with index ``index``."""
        return self.values[bisect.bisect_right(self.steps, index) - 1]

    def to_dict(self) -> dict:
        """The schedule as JSON: values and the evaluation index at which each takes over."""
        return {"values": self.values, "steps": self.steps}


@dataclass
class Member:
    """One member of the population: genome, fitness and the evaluation (seq) that scored it."""
    genome: str
    fitness: float
    seq: int


@dataclass
class Proposal:
    """One candidate to evaluate: its seq, genome, kind, threshold T and (for a child) how it was bred."""
    seq: int
    genome: str
    kind: str  # "init" (random, kept only above T), "baseline", or "child"
    threshold: float
    how: dict = field(default_factory=dict)  # selection/crossover/mutation details of a child

    def to_dict(self) -> dict:
        """The proposal as the journal's JSON fields."""
        return {"seq": self.seq, "genome": self.genome, "kind": self.kind, "T": self.threshold, **self.how}


class GeneticSearch:
    """State of one search. See the module docstring for the propose/tell protocol."""

    def __init__(self, population_size: int, thresholds: Thresholds, seed: int, unique_members: bool = False):
        if population_size < 2:
            raise ValueError(f"population size must be at least 2 (two parents), got {population_size}")
        self.size = population_size
        self.thresholds = thresholds
        # Algorithm 1 lets a genome that is already a member enter again (a re-evaluated copy
        # beats the weakest as easily as the original did), and a small population then fills
        # with copies of its best member. With unique_members a copy is refused instead.
        self.unique_members = unique_members
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.next_seq = 0
        self.kept: list[Member] = []  # initialization: random members above T, in arrival order
        self.baseline: Member | None = None
        self.baseline_proposed = False
        self.surplus: list[Member] = []  # async only: init members that arrived once S-1 were kept
        self.population: list[Member] = []  # rank order once formed (best first)
        self.formed = False
        self.in_flight: dict[int, Proposal] = {}
        self.children = 0
        self.children_failed_in_a_row = 0  # for --patience
        self.entered = 0

    # -- protocol ----------------------------------------------------------------------------------
    def propose(self) -> Proposal:
        """The next candidate: random (initialization), the baseline, or a child bred from the population."""
        seq = self.next_seq
        T = self.thresholds.at(seq)
        if self.formed:
            genomes = [_codes(m.genome) for m in self.population]
            fitness = np.array([m.fitness for m in self.population], dtype=np.float64)
            child, how = breed(genomes, fitness, self.rng)
            how["parents"] = [self.population[i].genome for i in how["parents"]]
            p = Proposal(seq, str(Genome(tuple(int(x) for x in child))), "child", T, how)
        elif len(self.kept) >= self.size - 1 and not self.baseline_proposed:
            # Lines 11-13: once S-1 random members are kept, the baseline joins.
            self.baseline_proposed = True
            p = Proposal(seq, BASELINE, "baseline", T)
        else:
            # Lines 2-10. With several workers this also runs while the last initialization
            # candidates or the baseline are still training: more random candidates keep the
            # workers busy, and any that pass T compete as children once the population forms.
            g = random_genome(self.rng)
            p = Proposal(seq, str(Genome(tuple(int(x) for x in g))), "init", T)
        self.next_seq += 1
        self.in_flight[seq] = p
        return p

    def tell(self, seq: int, fitness: float, accuracy: float | None = None) -> dict:
        """Fitness of proposal ``seq``. Returns what happened: ``{"entered": bool, "rank": int|None}``.
        ``accuracy``: what the threshold T judges when the fitness is not an accuracy (a ladder's
        value, bnn.search.ladder); the fitness itself otherwise."""
        p = self.in_flight.pop(seq)
        fitness = float(fitness)
        judged = fitness if accuracy is None else float(accuracy)
        m = Member(p.genome, fitness, seq)
        out = {"entered": False, "rank": None}
        if p.kind == "baseline":
            self.baseline = m
            out["entered"] = True
        elif p.kind == "init":
            if judged > p.threshold:  # line 5: kept only if fitness(M) > T (strictly)
                if self.formed:
                    out = self._compete(m)
                elif len(self.kept) < self.size - 1:
                    self.kept.append(m)
                    out["entered"] = True
                else:
                    self.surplus.append(m)
        else:
            self.children += 1
            out = self._compete(m)
            self.children_failed_in_a_row = 0 if out["entered"] else self.children_failed_in_a_row + 1
        if not self.formed and self.baseline is not None and len(self.kept) >= self.size - 1:
            self._form()
        return out

    # -- internals ---------------------------------------------------------------------------------
    def _form(self) -> None:
        # Line 14: sort by fitness, best first. Python's sort is stable, so ties keep arrival
        # order with the baseline (appended last) after equally fit random members.
        self.population = sorted(self.kept + [self.baseline], key=lambda m: -m.fitness)
        self.formed = True
        for m in self.surplus:
            self._compete(m)
        self.surplus = []

    def _compete(self, m: Member) -> dict:
        # Lines 27-30: beat the weakest strictly, then insert in rank order. Among equal fitness
        # the newcomer goes after the incumbents (older members rank first).
        if self.unique_members and any(x.genome == m.genome for x in self.population):
            return {"entered": False, "rank": None}
        if m.fitness > self.population[-1].fitness:
            self.population.pop()
            keys = [-x.fitness for x in self.population]
            rank = bisect.bisect_right(keys, -m.fitness)
            self.population.insert(rank, m)
            self.entered += 1
            return {"entered": True, "rank": rank}
        return {"entered": False, "rank": None}

    # -- views -------------------------------------------------------------------------------------
    def members(self) -> list[Member]:
        """The population in rank order, or during initialization what has been kept so far."""
        if self.formed:
            return list(self.population)
        pool = self.kept + ([self.baseline] if self.baseline else [])
        return sorted(pool, key=lambda m: -m.fitness)
