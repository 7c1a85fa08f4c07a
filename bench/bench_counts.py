"""Packed popcount counts vs torch float32 conv2d on the 3x3 layers of a CIFAR ResNet-18.

    python bench/bench_counts.py [--threads T] [--batch 64] [--repeats 15]

Everything is measured side by side in one process at the same thread count; times are medians.
One binary MAC is one bit of ``popcount(x AND w)``; MACs are counted nominally
(N*Ho*Wo * O * C*KH*KW, padding included), as for the float conv.

Rows:
* ``torch conv2d``: ``F.conv2d`` float32, the faster of NCHW and channels_last.
* ``kernel``: the blocked popcount GEMM alone on packed operands (``a`` only).
* ``counts packed``: a, b, c, d from packed operands (window sums, then the fused kernel: the
  GEMM and the identities in one pass).
* ``counts API``: ``refimpl.counts_conv2d`` from +-1 float32 NCHW, packing included, returning
  four int64 arrays, as a loop that drops each result sees it (the memory of dropped outputs
  is recycled: fresh pages cost more than the popcounts; 32 bytes are written per output).
* ``API, out=``: the same call writing into four arrays from ``np.empty``, reused (``out=``).
The popcount ceiling is measured by ``bench/popcount_peak.c`` (gcc, AVX-512 vpopcntq, L1
resident) in the same run. Then the torch count path (bench/bench_counts_torch.py), if present.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import refimpl  # noqa: E402
from refimpl import blocked  # noqa: E402
from refimpl.bits import pack_bits, pack_nchw  # noqa: E402
from refimpl.counts import counts_conv2d_packed  # noqa: E402

LAYERS = ((64, 32), (128, 16), (256, 8), (512, 4))  # (channels, spatial) of ResNet-18's 3x3 convs


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def median_time(fn, repeats: int) -> float:
    fn()  # warm: JIT, caches, allocator
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def popcount_peak(threads: int) -> float | None:
    """T binary MACs/s of the C ceiling loop, or None without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "peak")
        build = subprocess.run(
            [gcc, "-O3", "-march=native", "-fopenmp", "-o", exe, str(HERE / "popcount_peak.c")],
            capture_output=True, text=True,
        )
        if build.returncode != 0:
            return None
        out = subprocess.run([exe, str(threads)], capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for numba and torch (default: all cores)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    print(f"# {cpu_name()}, {os.cpu_count()} cores; {args.threads} threads; batch {args.batch}")
    print(f"# numpy {np.__version__}, numba {numba.__version__}, torch {torch.__version__}")
    peak = popcount_peak(args.threads)
    print("# popcount ceiling (bench/popcount_peak.c): " + (f"{peak:.2f} T binary MACs/s" if peak else "gcc not available"))
    header = (f"{'layer':>14} | {'torch conv2d':>12} | {'kernel':>17} | {'counts packed':>16} | "
              f"{'counts API':>16} | {'API, out=':>16} | {'kernel/peak':>11}")
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(0)
    n = args.batch
    for channels, size in LAYERS:
        x = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(n, channels, size, size))
        w = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(channels, channels, 3, 3))
        macs = n * size * size * channels * channels * 9
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        xcl = xt.contiguous(memory_format=torch.channels_last)
        wcl = wt.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            t_torch = min(
                median_time(lambda: F.conv2d(xt, wt, padding=1), args.repeats),
                median_time(lambda: F.conv2d(xcl, wcl, padding=1), args.repeats),
            )
        xp, wp = pack_nchw(x), pack_bits(np.moveaxis(w, 1, -1))
        a = np.empty((n, channels, size * size), dtype=np.int64)
        t_kernel = median_time(lambda: blocked.popcount_conv(xp, wp, (1, 1), (1, 1), (1, 1), size, size, a), args.repeats)
        t_packed = median_time(lambda: counts_conv2d_packed(xp, wp, channels, 1, 1, 1), args.repeats)
        t_api = median_time(lambda: refimpl.counts_conv2d(x, w, 1, 1, 1), args.repeats)
        out = tuple(np.empty((n, channels, size, size), dtype=np.int64) for _ in range(4))
        t_out = median_time(lambda: refimpl.counts_conv2d(x, w, 1, 1, 1, out=out), args.repeats)
        tera = lambda t: macs / t / 1e12  # noqa: E731
        ratio = lambda t: t_torch / t  # noqa: E731
        peak_share = f"{tera(t_kernel) / peak:.0%}" if peak else "n/a"
        print(
            f"{f'{channels}ch {size}x{size}':>14} | {t_torch * 1e3:9.2f} ms | "
            f"{t_kernel * 1e3:6.2f} ms {tera(t_kernel):4.2f}T | {t_packed * 1e3:6.2f} ms x{ratio(t_packed):5.1f} | "
            f"{t_api * 1e3:6.2f} ms x{ratio(t_api):5.1f} | {t_out * 1e3:6.2f} ms x{ratio(t_out):5.1f} | {peak_share:>11}"
        )
    print("# T = tera binary MACs/s; xR = speed-up over torch conv2d float32 in the same run")
    print(f"# torch conv2d float32 reached {tera(t_torch):.2f} T MACs/s on the last layer")

    torch_bench = HERE / "bench_counts_torch.py"
    if torch_bench.exists():
        print()
        sys.stdout.flush()
        subprocess.run([sys.executable, str(torch_bench), "--threads", str(args.threads)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
