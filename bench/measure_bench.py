"""Searched measures in the engine: ``bench_infer.py --measure GENOME`` / ``--measures paper``.

One binary ResNet-18 (CIFAR shape; ``--model mnist_net``: the 1x28x28 network) per genome, built
with the same seed (so the same weights; BatchNorm statistics from one random batch through that
genome's own measure, non-finite ones replaced by 0 and 1), exported and loaded by
``refimpl.engine``; the float32 network in torch beside them. Batch-1 rounds (each engine five
times, then torch), then batch rounds (each once), so load from other processes hits all alike;
medians over the rounds, wall and process CPU time.

Columns: images/s at the batch, ms at batch 1, time relative to the engine's baseline (batch /
batch 1), how many times faster than torch float32 at the batch, and the epilogue's share of the
network time, with every unit run in two passes so that its epilogue is separable: (binary units'
time - their popcount GEMMs timed alone, right after) / network time (the fused path, timed in
the rounds, runs GEMM and epilogue per tile, where they do not separate). ``tables``: the
measure's lookup tables, one table lookup (a gather) per output each, most of what a measure
costs over the baseline (docs/performance.md, searched measures). ``first run s``: from
``engine.load`` to the first batch-1 output, compile included; with ``--cold`` every genome is
compiled into a fresh, empty epilogue cache, as a never-seen genome is.
"""
from __future__ import annotations

import os
import platform
import tempfile
import time

import numba
import numpy as np

PAPER = ("baseline",) + tuple(f"M{i}" for i in range(1, 11))


def genomes(args) -> list[str]:
    """The genomes asked for, baseline first, each once (names kept as the user wrote them)."""
    from refimpl import Genome

    asked = list(args.measure)
    if args.measures:
        asked += list(PAPER) if args.measures == "paper" else [m.strip() for m in args.measures.split(",") if m.strip()]
    out, seen = [], set()
    for name in ["baseline"] + asked:
        key = str(Genome.parse(name))  # ValueError naming a bad genome, before anything runs
        if key not in seen:
            seen.add(key)
            out.append(name)
    return out


def _calibrated(model, x):
    import torch

    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.momentum = None
    model.train()
    with torch.no_grad():
        model(x)
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                # A measure that is non-finite on random windows (M5: 0/0) leaves NaN statistics,
                # which export refuses; the timing does not depend on them.
                finite = torch.isfinite(mod.running_mean) & torch.isfinite(mod.running_var)
                mod.running_mean[~finite] = 0.0
                mod.running_var[~finite] = 1.0
    return model.eval()


SHAPES = {"resnet18": (3, 32, 32), "mnist_net": (1, 28, 28)}


def build_engines(names, arch: str, downsample: str, tmp: str) -> tuple[dict, dict]:
    """({name: engine Model}, {name: seconds from engine.load to the first batch-1 output})."""
    import torch

    from bnn.export import export_model
    from bnn.nn.models import build_model
    from refimpl import engine

    engines, first = {}, {}
    shape = SHAPES[arch]
    x = torch.randn(32, *shape, generator=torch.Generator().manual_seed(1))
    x1 = np.random.default_rng(0).standard_normal((1, *shape)).astype(np.float32)
    for name in names:
        torch.manual_seed(0)
        model = _calibrated(build_model(arch, name, 10, shape, binary=True, downsample=downsample), x)
        path = os.path.join(tmp, f"{name}.bnn")
        export_model(model, path)
        t = time.perf_counter()
        engines[name] = engine.load(path)
        engines[name].run(x1)
        first[name] = time.perf_counter() - t
    return engines, first


def _epilogue_share(eng, x, runs: int = 3) -> float:
    """The epilogue's share of the network time, with every unit in two passes (GEMM, then the
    epilogue over the counts it left in memory): (binary units' time - their GEMMs timed alone) /
    network time; medians of ``runs`` runs, the GEMMs timed right after."""
    from engine_timing import gemm_report

    from refimpl.engine import plan as plan_module

    saved, plan_module.FUSED_MIN_TILES_PER_THREAD = plan_module.FUSED_MIN_TILES_PER_THREAD, 1 << 62
    try:
        per = {}
        for _ in range(runs):
            eng.run(x, timings=True)
            for label, t in eng.last_timings:
                per.setdefault(label, []).append(t)
    finally:
        plan_module.FUSED_MIN_TILES_PER_THREAD = saved
    gemm_seconds = sum(r[2] for r in gemm_report(eng, x, 3))
    times = {k: float(np.median(v)) for k, v in per.items()}
    units = sum(t for label, t in times.items() if label not in ("stem", "global_avgpool", "classifier"))
    return max(0.0, units - gemm_seconds) / sum(times.values())


def _fast_share(eng, x) -> float | None:
    """The share of binary outputs whose pixel takes the epilogue's fast path: every cubed raw
    count below the module's ``CUBE_EXACT`` and every count of a saturating table in its constant
    tail (refimpl/codegen/measure_tables.py), from the counts of a debug run; None for a measure
    without either."""
    from refimpl.engine.plan import measure_tables

    ep = eng._epilogue
    if not ep.CUBE_TABLES and not ep.TAIL_TABLES:
        return None
    _, records = eng.run(x, debug=True)
    fast = total = 0
    for r in records:  # (N, C, H, W) counts of one binary convolution
        n = r["a"] + r["b"] + r["c"] + r["d"]
        tails = measure_tables(ep, np.array([int(n.max())]))[2]
        ok = [(r[ep.TABLE_COUNTS[k]] < ep.CUBE_EXACT).all(axis=1) for k in ep.CUBE_TABLES]
        ok += [(r[ep.TABLE_COUNTS[k]] >= tails[k]).all(axis=1) for k in ep.TAIL_TABLES]
        fast += int(np.logical_and.reduce(ok).sum()) * r["a"].shape[1]
        total += r["a"].size
    return fast / total


def _rounds(engines, torch_run, xb, x1, rounds: int):
    """Median seconds per engine (and 'torch') at the batch and at batch 1, interleaved: the
    batch-1 rounds first (each runner five times in a row), then the batch rounds, so that a
    batch-1 run never follows a large batch (which left it 1.5-2x slower, caches and threads cold)."""
    runners = {**{k: e.run for k, e in engines.items()}, "torch": torch_run}
    for fn in runners.values():  # warm: plans for both batch sizes, oneDNN primitives
        fn(xb)
        fn(x1)
    medians = []
    for x, per_round in ((x1, 5), (xb, 1)):
        times = {k: [] for k in runners}
        cpu = {k: [] for k in runners}
        for _ in range(rounds):
            for k, fn in runners.items():
                for _ in range(per_round):
                    c, t = time.process_time(), time.perf_counter()
                    fn(x)
                    times[k].append(time.perf_counter() - t)
                    cpu[k].append(time.process_time() - c)
        medians.append(({k: float(np.median(v)) for k, v in times.items()}, {k: float(np.median(v)) for k, v in cpu.items()}))
    return medians[1], medians[0]


def run_measures(args) -> int:
    """Build, time and print the measure table; 0."""
    import torch
    from bench_counts import cpu_name
    from engine_timing import build_models

    from bnn.nn.models import build_model
    from refimpl import Genome, info

    names = genomes(args)
    torch.set_num_threads(args.threads)
    numba.set_num_threads(args.threads)
    shape = SHAPES[args.model]
    if args.model == "resnet18":
        _, float_model, _ = build_models()
    else:
        torch.manual_seed(0)
        float_model = _calibrated(build_model(args.model, "baseline", 10, shape, binary=False), torch.randn(32, *shape))
    float_model = float_model.to(memory_format=torch.channels_last)

    def torch_run(x):
        with torch.inference_mode():
            return float_model(torch.from_numpy(x).contiguous(memory_format=torch.channels_last))

    rng = np.random.default_rng(0)
    xb = rng.standard_normal((args.batch, *shape)).astype(np.float32)
    x1 = xb[:1].copy()
    with tempfile.TemporaryDirectory() as tmp:  # open until the batch-64 kernels have compiled into it
        if args.cold:
            os.environ["BNN_MEASURE_CACHE"] = os.path.join(tmp, "cache")  # every genome never seen
        engines, first = build_engines(names, args.model, args.downsample, tmp)
        (thr, thr_cpu), (lat, lat_cpu) = _rounds(engines, torch_run, xb, x1, args.rounds)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {platform.python_implementation()} "
          f"{platform.python_version()}, numba {numba.__version__}, torch {torch.__version__}")
    print(f"{info.path_line()}; threads {args.threads}; load average at the end {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} (other processes share the cores: read the ratios)")
    print(f"binary {args.model} {'x'.join(map(str, shape))}, {args.downsample} downsampling; medians of {args.rounds} interleaved "
          f"rounds (batch 1: five runs each per round, then batch {args.batch}: one run each)\n")
    head = (f"{'measure':10s} {'genome':15s} {'tables':>6s} {'img/s b' + str(args.batch):>10s} {'ms b1':>7s} "
            f"{'vs baseline b' + str(args.batch) + '/b1':>20s} {'vs torch b' + str(args.batch):>12s} "
            f"{'epilogue share b' + str(args.batch) + '/b1':>22s} {'first run s':>11s} {'CPU time vs baseline':>21s} "
            f"{'fast path':>9s}")
    print(head)
    for name, eng in engines.items():
        share_b = _epilogue_share(eng, xb)
        share_1 = _epilogue_share(eng, x1, runs=9)
        rel = f"{thr[name] / thr['baseline']:.2f} / {lat[name] / lat['baseline']:.2f}"
        fast = _fast_share(eng, xb)
        print(f"{name:10s} {str(Genome.parse(name)):15s} {eng._epilogue.N_TABLES:6d} {args.batch / thr[name]:10.0f} "
              f"{lat[name] * 1e3:7.2f} "
              f"{rel:>20s} {thr['torch'] / thr[name]:11.2f}x {f'{share_b:.0%} / {share_1:.0%}':>22s} "
              f"{first[name]:11.2f} {thr_cpu[name] / thr_cpu['baseline']:10.2f} / {lat_cpu[name] / lat_cpu['baseline']:.2f} "
              f"{'-' if fast is None else f'{fast:.0%}':>9s}")
    print(f"{'torch f32':10s} {'(float)':15s} {'':6s} {args.batch / thr['torch']:10.0f} {lat['torch'] * 1e3:7.2f} "
          f"{thr['torch'] / thr['baseline']:.2f} / {lat['torch'] / lat['baseline']:.2f}".rstrip())
    print("\nCPU time: the process's CPU seconds of the same runs (both threads; immune to waiting for a core "
          "that another process holds)")
    print("fast path: the share of binary outputs whose pixel takes its cubes as products and its saturating "
          "tables' constant tails instead of lookups (refimpl/codegen/measure_tables.py)")
    print("first run: engine.load to the first batch-1 output, compile included" + (
        " (--cold: a fresh, empty epilogue cache, every genome never seen)" if args.cold else
        " (or Numba's cache when this genome was compiled before; --cold for a never-seen genome)"))
    return 0
