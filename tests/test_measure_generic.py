"""One compiled module for every genome (bnn/nn/measure_generic.py): the per-genome kernels' bits
(bnn/nn/measure_fused.py's generated code, an independent straight-line program of the whole
genome), forward and gradients, tabled and untabled, under every count convention, clipped or not;
a genome it cannot take goes to the per-genome kernels; a new genome compiles nothing. Untabled, it
is what bnn/nn/measure_fused.py runs (tests only); tabled, training keeps each genome's own kernels,
which are faster (bench/bench_measure_generic.py)."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from test_measure_fused import _alpha, _window_counts

from bnn.nn import measure_fused, measure_generic
from refimpl.conventions import NAMES as CONVENTIONS
from refimpl.operators import BINARY

# Chosen to reach what the module replays of the per-genome Program: operands used twice (binary 5
# and 7) at B3 over B nodes that use theirs twice, with expression slots (square, alpha*x, alpha+x)
# copied four times and named ones (tables, alpha) accumulated; the gates 1 + exp(-U) of 10 and 11
# tabled (on a table, on a square, on the count itself); ties of max and min; the paper's M5 and M6.
GENOMES = ["2-16-17-15-5-7-5", "16-3-14-2-7-5-7", "9-2-0-12-11-10-8", "2-4-6-0-13-11-9", "M5", "M6"]


def _bits(t):
    # float32 bits, every NaN as one: LLVM keeps no NaN's sign or payload, so neither path has one to keep.
    a = t.detach().contiguous().numpy().copy()
    bits = a.view(np.uint32).copy()
    bits[np.isnan(a)] = 0x7FC00000
    return bits


def _run(genome, counts, tabled, clip, generic):
    raw, n = _window_counts()
    inputs = [t.clone().requires_grad_() for t in raw]
    alpha = _alpha().requires_grad_()
    out = measure_fused.apply(genome, *inputs, alpha, counts, n, tabled=tabled, clip=clip, generic=generic)
    upstream = torch.from_numpy(np.random.default_rng(3).standard_normal(out.shape).astype(np.float32))
    grads = torch.autograd.grad(out, [*inputs, alpha], upstream, allow_unused=True)
    return [_bits(out)] + [None if g is None else _bits(g) for g in grads]


# Untabled (every slot inline, as tests on non-integer counts run) for the two genomes of copies only:
# each per-genome module compiles in about 2 s.
@pytest.mark.parametrize("genome, tabled", [(g, True) for g in GENOMES] + [(g, False) for g in GENOMES[:2]])
def test_the_one_module_computes_the_per_genome_kernels_bits(genome, tabled):
    assert measure_generic.plan(genome, False, tabled) is not None
    for counts in CONVENTIONS:
        for clip in (None, 0.25):
            ours = _run(genome, counts, tabled, clip, generic=True)
            theirs = _run(genome, counts, tabled, clip, generic=False)
            for name, x, y in zip(("out", "a", "b", "c", "d", "alpha"), ours, theirs):
                assert (x is None) == (y is None), f"{genome} {counts}: {name}"
                if x is not None:
                    np.testing.assert_array_equal(x, y, err_msg=f"{genome} {counts} clip={clip}: {name}")
    assert isinstance(measure_fused.module(genome, tabled, generic=True), measure_generic.GenomeKernels)


def test_the_copies_replayed_are_the_programs():
    # x / (x + y): three occurrences, the reverse adds to x at the division first; y / (x + y): y twice.
    assert measure_generic.occurrence_orders(5) == (["x", "x", "y"], [0, 1, 2])
    assert measure_generic.occurrence_orders(7) == (["y", "x", "y"], [0, 1, 2])
    assert all(len(measure_generic.occurrence_orders(c)[0]) == 2 for c in range(len(BINARY)) if c not in (5, 7))
    # 2-16-17-15-5-7-5: B3 = x / (x + y) reverses B2's copy, then B1's second copy, then its first.
    plan = measure_generic.plan("2-16-17-15-5-7-5", False)
    steps = measure_generic.steps(plan)
    nodes = [tuple(row[1:3]) for row in steps if row[0] == 0]
    assert nodes == [(5, measure_generic.B1_BUF), (7, 2), (5, 0), (5, 0)]
    # In B1's copies: the square (slot 0, an expression) copied twice, in reverse order; alpha*x (slot
    # 1) once. In B2's: alpha (slot 3, a name) gets its two occurrences in the reverse pass's order.
    slots = [(int(row[1]), int(row[2]) - measure_generic.OCC_BUF) for row in steps if row[0] == 1]
    assert slots[:3] == [(3, 0), (3, 2), (2, 1)]
    assert slots[3:6] == [(1, 2), (0, 1), (0, 0)] and slots[6:] == [(1, 2), (0, 1), (0, 0)]


def test_a_genome_whose_constants_merge_tables_goes_to_its_own_kernels():
    # erf(a) + 0: split tables the whole node, whose derivative rounds once; the slots cannot say that.
    genome = "11-1-1-1-0-0-0"
    assert measure_generic.plan(genome, False) is None
    assert measure_generic.plan(genome, False, tabled=False) is not None  # untabled, every genome
    raw, n = _window_counts()
    measure_fused.apply(genome, *raw, _alpha(), "laplace", n, tabled=True, generic=True)
    assert not isinstance(measure_fused.module(genome, True, generic=True), measure_generic.GenomeKernels)
    for name in ("M1", "M2", "M3", "M4", "M5", "M6", "M7", "M8", "M9", "M10", "baseline"):
        assert measure_generic.plan(measure_fused.Genome.parse(name), True) is not None, name


def test_a_new_genome_compiles_nothing():
    raw, n = _window_counts()
    measure_fused.apply("M9", *[t.clone().requires_grad_() for t in raw], _alpha(), "freq", n, tabled=True, generic=True)
    before = {name for name in sys.modules if name.startswith(("bnn_measure_fused_", "bnn_measure_generic_"))}
    compiled = {name: len(getattr(measure_generic.module(), name).signatures)
                for name in ("forward_task", "backward_task", "build")}
    for genome in ("4-9-10-13-3-12-1", "12-7-5-3-8-2-0", "6-11-14-10-9-13-12"):
        inputs = [t.clone().requires_grad_() for t in raw]
        for tabled in (True, False):  # training's tables, and the untabled kernels tests run (the default)
            out = measure_fused.apply(genome, *inputs, _alpha(), "freq", n, tabled=tabled, generic=tabled or None)
            out.sum().backward()
            assert isinstance(measure_fused.module(genome, tabled, generic=True), measure_generic.GenomeKernels)
    after = {name for name in sys.modules if name.startswith(("bnn_measure_fused_", "bnn_measure_generic_"))}
    assert after == before
    assert compiled == {name: len(getattr(measure_generic.module(), name).signatures) for name in compiled}
