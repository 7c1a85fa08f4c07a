"""Timing the engine, shared by ``bench_infer.py`` and ``measure_bench.py``: the seeded ResNet-18
pair both time, interleaved medians of wall and CPU seconds, and the binary GEMMs alone.

Its own module so that the two scripts import it and never each other.
"""
from __future__ import annotations

import time

import numba
import numpy as np


def build_models(seed: int = 0):
    """Binary and float ResNet-18 (CIFAR shape) with seeded random weights and BatchNorm statistics
    set from one random batch; returns ``(binary, float, bnn.export.export_model)``."""
    import torch

    from bnn.export import export_model
    from bnn.nn.models import resnet18

    torch.manual_seed(seed)
    x = torch.randn(32, 3, 32, 32)
    models = {}
    for binary in (True, False):
        m = resnet18(binary=binary)
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.momentum = None
        m.train()
        with torch.no_grad():
            m(x)
        models[binary] = m.eval()
    return models[True], models[False], export_model


def median(times) -> float:
    """Median of a sequence of seconds, as a Python float."""
    return float(np.median(times))


def interleaved(fns: dict, repeats: int, cpu: dict | None = None, block: int = 1) -> dict:
    """Median wall seconds per function; with ``cpu`` (a dict) also median process CPU seconds.

    CPU time is what a run costs when other processes take the cores away: on a busy machine
    wall time includes waiting for a core, CPU time does not. At one thread it is the calling
    thread's time (both engines compute on it; idle pool threads that spin do not count); at
    more threads the process's, which includes time spent spinning at barriers.
    """
    clock = time.thread_time if numba.get_num_threads() == 1 else time.process_time
    for fn in fns.values():
        fn()  # warm: JIT, allocator, oneDNN primitive cache
        fn()
    times = {k: [] for k in fns}
    cpus = {k: [] for k in fns}
    # Blocks of ``block`` runs per engine, alternating: load from other processes hits both
    # alike, while each engine still runs with its own data warm in cache, as a deployed
    # model would (alternating single runs made each batch-1 run start with the other
    # engine's 44 MB of float weights in L2: the engine's time doubled).
    for _ in range(-(-repeats // block)):
        for k, fn in fns.items():
            for _ in range(block):
                c = clock()
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
                cpus[k].append(clock() - c)
    if cpu is not None:
        cpu.update({k: median(v) for k, v in cpus.items()})
    return {k: median(v) for k, v in times.items()}


def binary_macs(conv, n_img, out_h, out_w) -> int:
    """Nominal binary MACs of one convolution at this batch: N*Ho*Wo * O * C*KH*KW."""
    kh, kw = conv.kernel
    return n_img * out_h * out_w * conv.out_channels * conv.in_channels * kh * kw


def gemm_report(model, x, repeats, cpu_seconds: list | None = None):
    """Per binary convolution: (name, MACs, seconds of the GEMM alone) at this batch; with
    ``cpu_seconds`` (a list) also each GEMM's median CPU seconds (see ``interleaved``)."""
    model.run(x)
    plan = model._plan(x.shape[0])
    rows = []
    for step in plan.steps:
        if not hasattr(step, "run_gemm"):
            continue
        for which, (conv, out_h, out_w) in enumerate(step.convs()):
            cpu = {}
            t = interleaved({"g": lambda step=step, which=which: step.run_gemm(which)}, repeats, cpu)["g"]
            if cpu_seconds is not None:
                cpu_seconds.append(cpu["g"])
            rows.append((conv.name, binary_macs(conv, x.shape[0], out_h, out_w), t,
                         (x.shape[0], conv.in_channels, out_h, conv.out_channels, conv.kernel[0])))
    return rows


def layer_report(model, x, repeats):
    """Per engine layer: (label, median seconds) over ``repeats`` timed runs on ``x``."""
    per = {}
    for _ in range(repeats):
        model.run(x, timings=True)
        for label, t in model.last_timings:
            per.setdefault(label, []).append(t)
    return [(k, median(v)) for k, v in per.items()]
