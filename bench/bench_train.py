"""Training throughput of the binary ResNet-18 (baseline and M9) against the same network in float.

    python bench/bench_train.py                  # CPU, and CUDA when available
    python bench/bench_train.py --device cuda --steps 30 --compile
    python bench/bench_train.py --measures paper [--steps 7]   # mnist_net, every paper measure, CPU
    python bench/bench_train.py --measures paper --fused --counts raw,laplace   # and eager beside the default
    python bench/bench_train.py --measure M6 --measure 3-0-3-0-0-1-6

One training step = augment + normalize + forward + cross-entropy + backward + Adam, the same
code path as ``bnn.train`` (bnn.data's batch ops on synthetic uint8 images). Each variant is
warmed up first (cuDNN autotuning, torch.compile), then timed step by step; the median is
reported (``--measure``/``--measures``: ``bench/train_measure_bench.py``, the CPU training step
of ``mnist_net`` per searched measure against the baseline's, interleaved, with the measure
implementation ``bnn.train`` uses by default and, with ``--fused``, eager beside it). From the CUDA step and evaluation times it estimates one 15-epoch fitness run on
CIFAR-10 (45,000 training and 5,000 validation images), the search's unit of work.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bnn.data import Dataset  # noqa: E402
from bnn.nn.models import build_model  # noqa: E402
from bnn.train import ADAM_BETAS, EVAL_BATCH, PRESETS, _setup_backend  # noqa: E402

VARIANTS = (("float ResNet-18", "baseline", False), ("binary baseline", "baseline", True), ("binary M9", "M9", True))
FITNESS_TRAIN, FITNESS_VAL = 45_000, 5_000


def machine() -> str:
    """One line naming the CPU, cores, torch version and threads (and the GPU when CUDA is there)."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    parts = [f"CPU: {cpu}, {os.cpu_count()} logical cores, torch {torch.__version__}, {torch.get_num_threads()} threads"]
    if torch.cuda.is_available():
        parts.append(f"GPU: {torch.cuda.get_device_name()}")
    return "; ".join(parts)


def synthetic_data(n: int, device: torch.device) -> Dataset:
    """A CIFAR-10-shaped ``bnn.data.Dataset`` of ``n`` seeded random uint8 images on ``device``, no validation split."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g).to(device)
    y = torch.randint(0, 10, (n,), generator=g).to(device)
    return Dataset("cifar10", 10, [str(i) for i in range(10)], (3, 32, 32), (125.3, 123.0, 113.9),
                   (63.0, 62.1, 66.7), 4, True, x, y, x[:0], y[:0], x, y, 0, 0, device)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_variant(measure, binary, device, batch, steps, warmup, compile_):
    """(median seconds of one training step, seconds of one evaluation batch) of one ResNet-18 variant."""
    torch.manual_seed(0)
    model = build_model("resnet18", measure, 10, (3, 32, 32), binary=binary).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    fwd = torch.compile(model) if compile_ else model
    opt = torch.optim.Adam(model.parameters(), lr=PRESETS["fitness"]["lr"], betas=ADAM_BETAS)
    data = synthetic_data(max(batch, EVAL_BATCH), device)
    gen = torch.Generator().manual_seed(1)
    plan = data.epoch_plan(gen)

    def step():
        idx = plan["perm"][:batch]
        x = data.normalize(data.augment(data.train_x[idx], plan["offsets"][idx], plan["flips"][idx]))
        loss = F.cross_entropy(fwd(x), data.train_y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        _sync(device)
        t = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t)
    # One evaluation batch (eval mode, no grad), for the fitness-time estimate.
    model.eval()
    with torch.no_grad():
        xe = data.normalize(data.test_x[:EVAL_BATCH])
        fwd(xe)
        _sync(device)
        t = time.perf_counter()
        fwd(xe)
        _sync(device)
        eval_s = time.perf_counter() - t
    return statistics.median(times), eval_s


def main() -> int:
    """Time every variant on each device asked for, print the table (and on CUDA the fitness-run estimate); 0."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (CPU, plus CUDA when available)")
    p.add_argument("--batch", type=int, help="images per step (default: the fitness preset's; 128 with --measures)")
    p.add_argument("--steps", type=int, help="timed steps per variant (default: 2 on CPU, 30 on CUDA)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default: 1 on CPU, 10 on CUDA)")
    p.add_argument("--compile", action="store_true", help="torch.compile each model (CUDA)")
    p.add_argument("--measure", action="append", default=[], metavar="GENOME",
                   help="time mnist_net's CPU training step with this measure against the baseline; repeatable")
    p.add_argument("--measures", metavar="LIST", help="'paper' (baseline and M1..M10) or a comma-separated list")
    p.add_argument("--fused", action="store_true",
                   help="with --measures: each genome through both measure implementations side by side, the "
                        "default (fused, bnn.nn.measure_fused) and eager (bnn.train --measure-impl)")
    p.add_argument("--counts", metavar="LIST",
                   help="with --measures: count conventions, comma-separated (raw, freq, laplace), a table each "
                        "(default: raw)")
    args = p.parse_args()
    if args.measure or args.measures:
        sys.path.insert(0, os.path.dirname(__file__))
        from train_measure_bench import run_measures

        return run_measures(argparse.Namespace(**{**vars(args), "batch": args.batch or 128}), machine())
    args.batch = args.batch or PRESETS["fitness"]["batch_size"]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) if args.device == "auto" else [args.device]
    print(machine())
    print(f"resnet18 (CIFAR, 3x32x32), batch {args.batch}, Adam; one step = augment + forward + backward + update")
    for name in devices:
        device = torch.device(name)
        _setup_backend(device)
        cuda = device.type == "cuda"
        steps = args.steps or (30 if cuda else 2)
        warmup = args.warmup if args.warmup is not None else (10 if cuda else 1)
        print(f"\n{name}: median of {steps} steps after {warmup} warm-up{' (compiled)' if args.compile else ''}")
        print(f"{'variant':<18}{'step ms':>10}{'images/s':>11}{'vs float':>10}")
        rows = {}
        for label, measure, binary in VARIANTS:
            step_s, eval_s = bench_variant(measure, binary, device, args.batch, steps, warmup, args.compile)
            rows[label] = (step_s, eval_s)
            base = rows[VARIANTS[0][0]][0]
            print(f"{label:<18}{1e3 * step_s:>10.1f}{args.batch / step_s:>11.0f}{base / step_s:>9.2f}x", flush=True)
        if cuda:
            steps_per_epoch = math.ceil(FITNESS_TRAIN / args.batch)
            evals_per_epoch = math.ceil(FITNESS_VAL / EVAL_BATCH)
            epochs = PRESETS["fitness"]["epochs"]
            print(f"\nestimated {epochs}-epoch fitness run on CIFAR-10 ({FITNESS_TRAIN} train, {FITNESS_VAL} val):")
            for label, (step_s, eval_s) in rows.items():
                total = epochs * (steps_per_epoch * step_s + evals_per_epoch * eval_s)
                print(f"  {label:<18}{total:>8.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
