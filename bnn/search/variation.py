"""The GA's variation operators of the paper's Algorithm 1 (docs/design.md section 7), as pure functions.

A genome here is a length-7 ``numpy`` int array ``U1 U2 U3 U4 B1 B2 B3`` (see
``refimpl.Genome``). Every random choice comes from an explicit ``numpy.random.Generator``, never
from a global RNG: a search is then a deterministic function of its seed and of the fitness values
it receives, which is what makes ``--resume`` replay exact.

Grouped by family in DEAP's manner (``sel_*``, ``cx_*``, ``mut_*``). The order in which each
function draws from the generator is part of its contract: changing it changes every seeded run
(and makes old journals unreplayable), so tests pin it.
"""
from __future__ import annotations

import numpy as np

from refimpl.genome import SLOT_NAMES
from refimpl.operators import N_BINARY, N_UNARY, UNARY_SLOT_INPUTS

# The genome layout of refimpl: its unary slots (one per count a, d, b, c) first, then the binary ones.
GENES = len(SLOT_NAMES)
N_UNARY_SLOTS = len(UNARY_SLOT_INPUTS)
SELECTIONS = ("elitism", "tournament", "proportionate")


def gene_limits() -> np.ndarray:
    """Exclusive upper bound of each gene: the operator table's unary count for U1-U4, its binary count for B1-B3."""
    return np.array([N_UNARY] * N_UNARY_SLOTS + [N_BINARY] * (GENES - N_UNARY_SLOTS), dtype=np.int64)


def random_genome(rng: np.random.Generator) -> np.ndarray:
    """A uniformly random genome (initialization, Algorithm 1 line 3): each gene from its own set."""
    return rng.integers(0, gene_limits())


# -- selection -------------------------------------------------------------------------------------
# ``fitness`` is the population's fitness in rank order (best first); selections return indices
# into that order, parent 1 first.

def sel_elitism(fitness: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """The two best individuals. Draws nothing: rng is taken only for a uniform signature."""
    return 0, 1


def sel_tournament(fitness: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """A random individual, then a random one ranked below it (the paper's "right part").

    The first is drawn from ranks 0..S-2, because the last one has nobody ranked below it; the
    second uniformly from the ranks after the first.
    """
    size = len(fitness)
    first = int(rng.integers(0, size - 1))
    second = int(rng.integers(first + 1, size))
    return first, second


def sel_proportionate(fitness: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """Roulette wheel: fitness normalized by its sum, accumulated, two uniform draws in [0, 1).

    Draws are independent, so the same individual can be both parents (as in the paper). Negative
    or non-finite fitness has no share of the wheel; an all-zero population falls back to uniform.
    """
    f = np.where(np.isfinite(fitness), np.maximum(fitness, 0.0), 0.0).astype(np.float64)
    total = f.sum()
    p = f / total if total > 0 else np.full(len(f), 1.0 / len(f))
    cum = np.cumsum(p)
    cum[-1] = 1.0  # the paper: "the accumulated fitness of the last individual should be 1"
    u = rng.random(2)
    # side="right": u falls in slot i when cum[i-1] <= u < cum[i], so zero-width slots never win.
    i, j = np.searchsorted(cum, u, side="right")
    return int(min(i, len(f) - 1)), int(min(j, len(f) - 1))


_SELECT = {"elitism": sel_elitism, "tournament": sel_tournament, "proportionate": sel_proportionate}


def sel_hybrid(fitness: np.ndarray, rng: np.random.Generator) -> tuple[str, int, int]:
    """Algorithm 1 lines 16-17: one technique uniformly among the three, then its two parents."""
    name = SELECTIONS[int(rng.integers(0, len(SELECTIONS)))]
    i, j = _SELECT[name](fitness, rng)
    return name, i, j


# -- crossover and mutation ------------------------------------------------------------------------

def cx_one_point(p1: np.ndarray, p2: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int, bool]:
    """Single-point crossover (lines 18-23): ``k`` in 0..6, then the parents' order at random.

    Returns ``(child, k, swapped)``: ``P1[:k] + P2[k:]`` when not swapped, else ``P2[:k] + P1[k:]``.
    ``k = 0`` copies the right-hand parent whole, as ``randint(7)`` in the paper allows.
    """
    k = int(rng.integers(0, GENES))
    swapped = bool(rng.integers(0, 2))
    left, right = (p2, p1) if swapped else (p1, p2)
    return np.concatenate([left[:k], right[k:]]).astype(np.int64), k, swapped


def mut_single_point(genome: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int, int]:
    """Single-point mutation (lines 24-25): position ``m`` in 0..6, new gene from that slot's set.

    The new gene is drawn from the whole set (18 unary or 14 binary codes), so it may equal the old
    one, as in the paper's "replace C1[m] with a random gene". Returns ``(child, m, gene)``.
    """
    m = int(rng.integers(0, GENES))
    gene = int(rng.integers(0, gene_limits()[m]))
    child = np.array(genome, dtype=np.int64, copy=True)
    child[m] = gene
    return child, m, gene


def breed(population: list[np.ndarray], fitness: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """One child of Algorithm 1: hybrid selection, crossover, mutation. Returns (child, how)."""
    op, i, j = sel_hybrid(fitness, rng)
    c1, k, swapped = cx_one_point(population[i], population[j], rng)
    c2, m, gene = mut_single_point(c1, rng)
    return c2, {"op": op, "parents": [i, j], "k": k, "swapped": swapped, "m": m, "gene": gene}
