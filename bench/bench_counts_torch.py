"""The torch count path (forward + backward, baseline measure) vs a plain float conv2d and vs
the naive four-convolution formulation, at the 3x3 layers of a CIFAR ResNet-18, batch 64.

    python bench/bench_counts_torch.py [--repeats 7] [--batch 64] [--layers 256] [--threads 1] [--compile]
                                       [--device cuda]

Medians over repeats, all variants timed side by side in one process at torch's thread count.
``bench/bench_counts.py`` can call ``run()`` and print ``format_table()`` for its own report.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# Run from a checkout without installing, as bench/bench_counts.py does.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bnn  # noqa: E402

# (channels, spatial size) of ResNet-18's 3x3 layers on CIFAR.
LAYERS = ((64, 32), (128, 16), (256, 8), (512, 4))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _four_convolutions(x, w):
    xb, wb = (x + 1) * 0.5, (w + 1) * 0.5
    pad = lambda t: F.pad(t, (1, 1, 1, 1))  # noqa: E731
    a = F.conv2d(pad(xb), wb)
    b = F.conv2d(pad(1 - xb), wb)
    c = F.conv2d(pad(xb), 1 - wb)
    d = F.conv2d(pad(1 - xb), 1 - wb)
    return a, b, c, d


def _count_path(x, w):
    return bnn.measure("baseline", *bnn.counts_conv2d(x, w, padding=1))


def _variants(compiled=False):
    variants = {
        "conv2d": lambda x, w: F.conv2d(x, w, padding=1),
        "counts+measure": _count_path,
        "4-conv+measure": lambda x, w: bnn.measure("baseline", *_four_convolutions(x, w)),
    }
    if compiled:
        # torch.compile fuses the elementwise passes of the identities and the measure.
        variants["compiled counts"] = torch.compile(_count_path, fullgraph=True)
    return variants


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, x, w, grad, repeats):
    times = []
    for i in range(repeats + 1):  # the first run warms oneDNN's primitive cache (cuDNN's choice)
        x.grad = w.grad = None
        _sync(x.device)
        start = time.perf_counter()
        fn(x, w).backward(grad)
        _sync(x.device)  # CUDA launches are asynchronous: time the work, not the launch
        elapsed = time.perf_counter() - start
        if i:
            times.append(elapsed)
    return statistics.median(times)


def run(batch=64, layers=LAYERS, repeats=7, compiled=False, device="cpu"):
    """Rows of (channels, size, {variant: median seconds fwd+bwd})."""
    device = torch.device(device)
    rows = []
    variants = _variants(compiled)
    gen = torch.Generator().manual_seed(0)
    for channels, size in layers:
        x = bnn.sign(torch.randn(batch, channels, size, size, generator=gen)).to(device).requires_grad_()
        w = bnn.sign(torch.randn(channels, channels, 3, 3, generator=gen)).to(device).requires_grad_()
        grad = torch.randn(batch, channels, size, size, generator=gen).to(device)
        # Interleave the variants so machine load affects them alike.
        samples = {name: [] for name in variants}
        for _ in range(repeats):
            for name, fn in variants.items():
                samples[name].append(_time(fn, x, w, grad, 1))
        rows.append((channels, size, {k: statistics.median(v) for k, v in samples.items()}))
    return rows


def _device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}), torch {torch.__version__}"
    return f"{_cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def format_table(rows, batch=64, device="cpu") -> str:
    """The table of ``run()``'s rows: per layer, conv2d, counts+measure and four-conv times in ms and their ratios."""
    lines = [
        f"torch count path, forward+backward, batch {batch}, 3x3, padding 1; {_device_name(device)}",
        f"{'layer':>12} {'conv2d ms':>10} {'counts ms':>10} {'4-conv ms':>10} {'counts/conv':>12} {'4-conv/counts':>14}",
    ]
    if "compiled counts" in rows[0][2]:
        lines[1] += f" {'compiled ms':>12} {'compiled/conv':>14}"
    for channels, size, t in rows:
        conv, ours, four = t["conv2d"], t["counts+measure"], t["4-conv+measure"]
        line = (
            f"{f'{channels}x{size}x{size}':>12} {conv * 1e3:>10.2f} {ours * 1e3:>10.2f} {four * 1e3:>10.2f} "
            f"{ours / conv:>12.2f} {four / ours:>14.2f}"
        )
        if "compiled counts" in t:
            line += f" {t['compiled counts'] * 1e3:>12.2f} {t['compiled counts'] / conv:>14.2f}"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None):
    """Time the layers chosen on the command line and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--layers", type=int, nargs="*", help="channel counts to run (default: all four)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--compile", action="store_true", help="also time the count path under torch.compile")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.exit(2, f"bench_counts_torch: --device {args.device}: torch sees no CUDA device here\n")
    if args.threads:
        torch.set_num_threads(args.threads)
    layers = [layer for layer in LAYERS if not args.layers or layer[0] in args.layers]
    rows = run(args.batch, layers, args.repeats, args.compile, args.device)
    print(format_table(rows, args.batch, args.device))


if __name__ == "__main__":
    main()
