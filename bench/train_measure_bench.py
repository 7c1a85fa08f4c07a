"""Searched measures in training: ``bench_train.py --measure GENOME`` / ``--measures paper``.

One ``mnist_net`` per genome (1x28x28, the Fashion-MNIST network of ``bnn.train``, same seed),
each with its own Adam; one step = forward + cross-entropy + backward + Adam update on a fixed
normalized random batch (the data pipeline is the same for every measure, so it is left out).
Rounds run one step of every model in turn, so load from other processes hits all alike; the
median step per model and its time relative to the baseline's, in wall time and in process CPU
time (what the step costs when other processes take the cores). ``measure fwd+bwd``: where the
difference goes, the measure alone (``bnn.measure.measure`` forward and backward, eager, as the
layers run it) on the counts every binary layer of that model produced in its last step, timed
in the same rounds. ``--fused``: each genome also as ``<name>+fused``, its layers' measure through
``bnn.measure_fused`` (one Numba pass forward, one backward), in the same rounds.
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

# The genomes a run compares, as the engine's bench reads them (--measure, --measures paper).
from measure_bench import genomes  # bench/ is on the path (bench_train.py)

from bnn.models import build_model
from bnn.train import ADAM_BETAS


def _recording(model):
    """Make each binary layer keep its last measure inputs; returns the list they go to."""
    from bnn.layers import _BinaryMeasureLayer

    seen = []
    for layer in model.modules():
        if isinstance(layer, _BinaryMeasureLayer):
            def keep(a, b, c, d, layer=layer, original=layer._measure):
                seen.append((layer, original, *(t.detach().clone() for t in (a, b, c, d))))
                return original(a, b, c, d)
            layer._measure = keep
    return seen


def _measure_alone(seen):
    """Forward and backward of the measure alone on the recorded counts of one step."""
    inputs = [(layer, fn, [t.clone().requires_grad_() for t in counts]) for layer, fn, *counts in seen]

    def run():
        for layer, fn, counts in inputs:
            m = fn(*counts)  # the layer's own path: eager, or fused with --fused
            # autograd.grad, not backward: no .grad accumulation that the real step does not have
            torch.autograd.grad(m, [*counts, layer.alpha], torch.ones_like(m), allow_unused=True)
    return run


def _stepper(name: str, batch: int, lr: float):
    from bnn.measure_fused import use_fused_measure

    torch.manual_seed(0)
    model = build_model("mnist_net", name.removesuffix("+fused"), 10, (1, 28, 28))
    if name.endswith("+fused"):
        use_fused_measure(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=ADAM_BETAS)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    model.train()
    seen = _recording(model)

    def step():
        seen.clear()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step.seen = seen
    return step


def run_measures(args, machine_line: str) -> int:
    """Time the training step of each genome in interleaved rounds and print the table; 0."""
    names = genomes(args)
    if args.fused:
        names = [v for name in names for v in (name, name + "+fused")]
    steppers = {name: _stepper(name, args.batch, 5e-3) for name in names}
    for step in steppers.values():  # warm: allocator, first-call dispatch
        step()
    alone = {name: _measure_alone(list(step.seen)) for name, step in steppers.items()}
    for run in alone.values():
        run()
    times = {name: [] for name in names}
    cpu = {name: [] for name in names}
    measure_cpu = {name: [] for name in names}
    rounds = args.steps or 7
    for _ in range(rounds):
        for name, step in steppers.items():
            c, t = time.process_time(), time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            c = time.process_time()
            alone[name]()
            measure_cpu[name].append(time.process_time() - c)
    med, med_cpu, med_m = ({k: sorted(v)[len(v) // 2] for k, v in d.items()} for d in (times, cpu, measure_cpu))
    load = os.getloadavg()
    print(machine_line)
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; load average at the end "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other processes share the cores: read the ratios)")
    print(f"mnist_net (1x28x28), batch {args.batch}, forward + backward + Adam, CPU; medians of {rounds} "
          "interleaved rounds\n")
    print(f"{'measure':10s} {'step ms':>9s} {'images/s':>9s} {'vs baseline':>12s} {'CPU ms':>8s} "
          f"{'CPU vs baseline':>16s} {'measure fwd+bwd CPU ms':>23s} {'share of step CPU':>18s}")
    for name in names:
        print(f"{name:10s} {med[name] * 1e3:9.1f} {args.batch / med[name]:9.0f} {med[name] / med['baseline']:11.2f}x "
              f"{med_cpu[name] * 1e3:8.1f} {med_cpu[name] / med_cpu['baseline']:15.2f}x {med_m[name] * 1e3:23.1f} "
              f"{med_m[name] / med_cpu[name]:17.0%}")
    return 0
