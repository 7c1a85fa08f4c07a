"""Searched measures in training: ``bench_train.py --measure GENOME`` / ``--measures paper``.

One ``mnist_net`` per genome, count convention and measure implementation (1x28x28, the
Fashion-MNIST network of ``bnn.train``, same seed), each with its own Adam; one step = forward +
cross-entropy + backward + Adam update on a fixed normalized random batch (the data pipeline is
the same for every measure, so it is left out). Rounds run one step of every model in turn, so
load from other processes hits all alike; the median step per model and its time relative to
the baseline's of the same convention and implementation, in wall time and in process CPU time
(what the step costs when other processes take the cores). ``measure CPU ms``: where the
difference goes, the measure alone (each binary layer's conversion and measure, forward and
backward, by the layer's own path) on the counts every binary layer of that model produced in
its warm-up step, timed in the same rounds.

The models train as ``bnn.train`` trains them: with ``TrainConfig``'s default ``measure_impl``
(``fused``: bnn/nn/measure_fused.py on float32 CPU counts); ``--fused`` adds each genome with the
eager torch measure beside it (``--measure-impl eager``), in the same rounds. ``--counts``: one
table per convention (comma-separated; raw, freq, laplace).
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

# The genomes a run compares, as the engine's bench reads them (--measure, --measures paper).
from measure_bench import genomes  # bench/ is on the path (bench_train.py)

from bnn.nn.layers import set_measure_impl
from bnn.nn.models import build_model
from bnn.train import ADAM_BETAS, TrainConfig
from refimpl.conventions import check_counts

DEFAULT_IMPL = TrainConfig().measure_impl


def _recorded(model, step) -> list:
    """Run ``step`` once with each binary layer keeping its counts and window sizes; returns them
    (the timed steps copy nothing)."""
    from bnn.nn.layers import BinaryMeasureLayer

    seen = []
    layers = [m for m in model.modules() if isinstance(m, BinaryMeasureLayer)]
    for layer in layers:
        def keep(counts, n, layer=layer, original=layer._measure_counts):
            seen.append((layer, original, n, *(t.detach().clone() for t in counts)))
            return original(counts, n)
        layer._measure_counts = keep
    step()
    for layer in layers:
        del layer._measure_counts  # the class's method again
    return seen


def _measure_alone(seen):
    """Forward and backward of the measure alone (conversion included) on the recorded counts of one step."""
    inputs = [(layer, fn, n, [t.clone().requires_grad_() for t in counts]) for layer, fn, n, *counts in seen]

    def run():
        for layer, fn, n, counts in inputs:
            m = fn(counts, n)  # the layer's own path: fused or eager
            # autograd.grad, not backward: no .grad accumulation that the real step does not have
            torch.autograd.grad(m, [*counts, layer.alpha], torch.ones_like(m), allow_unused=True)
    return run


def _stepper(name: str, counts: str, impl: str, batch: int, lr: float):
    torch.manual_seed(0)
    model = set_measure_impl(build_model("mnist_net", name, 10, (1, 28, 28), counts=counts), impl)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=ADAM_BETAS)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    model.train()

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step.model = model
    return step


def run_measures(args, machine_line: str) -> int:
    """Time the training step of each genome in interleaved rounds and print one table per convention; 0."""
    names = genomes(args)
    conventions = [check_counts(c.strip()) for c in (args.counts or "raw").split(",") if c.strip()]
    impls = [DEFAULT_IMPL] + (["eager"] if args.fused and DEFAULT_IMPL != "eager" else [])
    keys = [(c, name, impl) for c in conventions for name in names for impl in impls]
    steppers = {k: _stepper(k[1], k[0], k[2], args.batch, 5e-3) for k in keys}
    for step in steppers.values():  # warm: allocator, first-call dispatch, kernels compiled
        step()
    alone = {k: _measure_alone(_recorded(step.model, step)) for k, step in steppers.items()}
    for run in alone.values():
        run()
    times, cpu, measure_cpu = ({k: [] for k in keys} for _ in range(3))
    rounds = args.steps or 7
    for _ in range(rounds):
        for k, step in steppers.items():
            c, t = time.process_time(), time.perf_counter()
            step()
            times[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
            c = time.process_time()
            alone[k]()
            measure_cpu[k].append(time.process_time() - c)
    med, med_cpu, med_m = ({k: sorted(v)[len(v) // 2] for k, v in d.items()} for d in (times, cpu, measure_cpu))
    load = os.getloadavg()
    print(machine_line)
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; load average at the end "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other processes share the cores: read the ratios)")
    print(f"mnist_net (1x28x28), batch {args.batch}, forward + backward + Adam, CPU; medians of {rounds} "
          f"interleaved rounds; each ratio against the baseline of the same convention and measure path")
    for counts in conventions:
        print(f"\n{counts} counts")
        head = f"{'measure':10s}"
        for impl in impls:
            label = f"{impl} (default)" if impl == DEFAULT_IMPL else impl
            head += f" | {label + ': step ms':>22s} {'wall vs base':>12s} {'CPU vs base':>11s} {'measure CPU ms':>14s}"
        # the default path against the faster of the two baselines, too: no ratio won by a slower baseline
        head += f" | {'default CPU vs min base':>23s}" if len(impls) > 1 else ""
        print(head)
        for name in names:
            line = f"{name:10s}"
            for impl in impls:
                k, base = (counts, name, impl), (counts, names[0], impl)
                line += (f" | {med[k] * 1e3:22.1f} {med[k] / med[base]:11.2f}x {med_cpu[k] / med_cpu[base]:10.2f}x "
                         f"{med_m[k] * 1e3:14.1f}")
            if len(impls) > 1:
                fastest = min(med_cpu[counts, names[0], impl] for impl in impls)
                line += f" | {med_cpu[counts, name, DEFAULT_IMPL] / fastest:22.2f}x"
            print(line)
    return 0
