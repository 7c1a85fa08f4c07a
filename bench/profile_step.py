"""Where one training step's device time goes: the binary networks against the float one, kernel by kernel.

    python bench/profile_step.py --device cuda                      # ResNet-18, baseline/raw and M6/laplace
    python bench/profile_step.py --device cpu --tiny                # the smoke the tests run (eager measure)

The step is bench_fitness.py's ``--graphs`` step (bnn/train/graph_step.py: forward, loss, backward, fused
Adam), run uncaptured under torch.profiler so every kernel is seen by name; the captured replay of the
same step is timed beside it. For each network it prints wall ms per step (captured, uncaptured), the
device's kernel time per step (the sum of kernel durations: what a CUDA graph cannot remove), and the
kernels that take the most of it. Captured wall close to kernel time means the step is bound by the
device: only faster kernels then raise images/s, and more processes per GPU do not.
"""
from __future__ import annotations

import os
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]

from bench_train import machine  # noqa: E402
from fitness_step import StepLoop, sync, synthetic_data  # noqa: E402

from bnn.train.loop import setup_backend  # noqa: E402
from refimpl.cli import OneLineParser, positive_int  # noqa: E402


def build_parser() -> OneLineParser:
    """The command line (see the module docstring)."""
    p = OneLineParser(description=__doc__.split("\n\n")[0], epilog="Prints one table per network.")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--networks", default="baseline:raw,M6:laplace,float",
                   help="GENOME:COUNTS[:unfused] of binary networks and 'float', comma-separated (default "
                        "%(default)s); ':unfused' binarizes the layers' inputs with torch's operators, not bnn/gpu/relax.py")
    p.add_argument("--model", default="resnet18", help="default resnet18 (mnist_net with --tiny)")
    p.add_argument("--batch", type=positive_int, default=128, help="images per step (default 128)")
    p.add_argument("--steps", type=positive_int, default=20, help="profiled and timed steps (default 20)")
    p.add_argument("--warmup", type=positive_int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--top", type=positive_int, default=18, help="kernels listed per network (default 18)")
    p.add_argument("--tiny", action="store_true", help="mnist_net, batch 4, 2 steps, the eager measure: a smoke test")
    return p


def _loop(data, spec: str, args, capture: bool) -> StepLoop:
    binary = spec != "float"
    genome, counts, *how = spec.split(":") if binary else ("baseline", "raw")
    triton = binary and data.device.type == "cuda"
    opts = {"relax": how != ["unfused"], "batch": args.batch, "compile": False, "compile_backend": None, "measure_op": False,
            "fused_adam": True, "cudagraphs": False, "triton": triton, "graphs": True, "counts": counts,
            "model": args.model}
    loop = StepLoop(data, genome, binary, opts)
    loop.graph.capture = capture and data.device.type == "cuda"
    return loop


def _kernel_rows(prof, steps: int, device: torch.device) -> list[tuple[str, float, int]]:
    # (name, device ms per step, calls per step) of each kernel; on the CPU, the operators' own CPU time.
    rows = []
    for e in prof.key_averages():
        ms = (e.self_device_time_total if device.type == "cuda" else e.self_cpu_time_total) / 1000.0 / steps
        if ms > 0 and (device.type != "cuda" or e.device_type == torch.autograd.DeviceType.CUDA):
            rows.append((e.key, ms, round(e.count / steps)))
    return sorted(rows, key=lambda r: -r[1])


def profile(data, spec: str, args) -> dict:
    """Wall ms per step captured and uncaptured, kernel ms per step, and the kernels, for one network."""
    device = data.device
    captured = _loop(data, spec, args, capture=True)
    captured.run(args.warmup)
    wall_captured = captured.run(args.steps) / args.steps * 1000.0
    del captured
    loop = _loop(data, spec, args, capture=False)
    loop.run(args.warmup)
    wall_eager = loop.run(args.steps) / args.steps * 1000.0
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        loop.run(args.steps)
        sync(device)
    rows = _kernel_rows(prof, args.steps, device)
    return {"network": spec, "wall_captured_ms": wall_captured, "wall_uncaptured_ms": wall_eager,
            "kernel_ms": sum(r[1] for r in rows) if device.type == "cuda" else None, "rows": rows}


def main(argv=None) -> int:
    """Profile each network and print its table; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.tiny:
        args.model, args.batch, args.steps, args.warmup = "mnist_net", 4, 2, 1
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        build_parser().error("--device cuda: no CUDA device here; give --device cpu")
    specs = [spec.strip() for spec in args.networks.split(",")]
    for spec in specs:
        parts = spec.split(":")
        if spec != "float" and (len(parts) not in (2, 3) or parts[2:] not in ([], ["unfused"])):
            build_parser().error(f"--networks: '{spec}' is not GENOME:COUNTS, GENOME:COUNTS:unfused or float")
    setup_backend(device)
    data = synthetic_data(max(10 * args.batch, 64), device)
    print(f"host: {machine()}" + (f"; GPU: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""))
    print(f"{args.model}, batch {args.batch}, {args.steps} steps after {args.warmup}; bench_fitness.py's graphs step, "
          f"fused Adam; profiled uncaptured")
    for spec in specs:
        t0 = time.perf_counter()
        r = profile(data, spec, args)
        kern = f", kernels {r['kernel_ms']:.2f} ms" if r["kernel_ms"] is not None else ""
        print(f"\n== {r['network']}: wall {r['wall_captured_ms']:.2f} ms/step captured, "
              f"{r['wall_uncaptured_ms']:.2f} uncaptured{kern} ({time.perf_counter() - t0:.0f} s to measure)")
        for name, ms, calls in r["rows"][:args.top]:
            print(f"  {ms:8.3f} ms {calls:5d}x  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
