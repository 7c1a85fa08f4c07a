"""One binary convolution's training step on a GPU: bnn/gpu's Triton measure against the eager measure and a float conv.

    python bench/bench_gpu_measure.py [--batch 128] [--channels 64] [--size 32] [--genomes M5,M9,baseline]

Per genome, milliseconds per forward + backward of one 3x3 layer (CUDA events, after warm-up): the
float ``nn.Conv2d``, ``BinaryConv2d`` with the eager measure, and the same layer routed through
``bnn_gpu::measure``; then the time from ``set_genome`` to the end of the first step of a new genome.
Prints the GPU it ran on. Needs CUDA and triton.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from bnn.gpu.measure_op import set_genome, use_triton_measure
from bnn.nn.layers import BinaryConv2d


def cuda_ms(fn, iters: int, warmup: int = 3) -> float:
    """Milliseconds per call of ``fn`` on the current CUDA stream (CUDA events), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    """Parse the arguments, time each genome, print one line each."""
    p = argparse.ArgumentParser(description="One binary convolution's training step: Triton measure, eager measure, float conv.")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--genomes", default="baseline,M1,M5,M9,0-16-17-15-8-9-12")
    p.add_argument("--counts", default="raw")
    p.add_argument("--profile", action="store_true", help="then the CUDA kernels of one step of each path (M5)")
    args = p.parse_args()
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    c = args.channels
    x = torch.randn(args.batch, c, args.size, args.size, device=dev, requires_grad=True)
    dy = torch.randn(args.batch, c, args.size, args.size, device=dev)

    def step(layer):
        def run():
            x.grad = None
            layer(x).backward(dy)
        return run

    conv = nn.Conv2d(c, c, 3, padding=1, bias=False).to(dev)
    float_ms = cuda_ms(step(conv), args.iters)
    print(f"float conv2d: {float_ms:.3f} ms per forward+backward")
    routed = use_triton_measure(BinaryConv2d(c, c, 3, padding=1, counts=args.counts).to(dev))
    for genome in args.genomes.split(","):
        eager = BinaryConv2d(c, c, 3, padding=1, measure=genome, counts=args.counts).to(dev)
        eager_ms = cuda_ms(step(eager), args.iters)
        t0 = time.perf_counter()
        set_genome(routed, genome)
        step(routed)()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        triton_ms = cuda_ms(step(routed), args.iters)
        print(f"{genome:>20}: eager {eager_ms:7.3f} ms, triton {triton_ms:7.3f} ms ({eager_ms / triton_ms:4.2f}x), "
              f"float/triton {float_ms / triton_ms:4.2f}, set_genome to first step done {first_s * 1e3:6.1f} ms")
    if args.profile:
        set_genome(routed, "M5")
        eager = BinaryConv2d(c, c, 3, padding=1, measure="M5", counts=args.counts).to(dev)
        for name, layer in (("eager", eager), ("triton", routed)):
            run = step(layer)
            run()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    run()
                torch.cuda.synchronize()
            print(f"--- {name}, 5 steps")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
