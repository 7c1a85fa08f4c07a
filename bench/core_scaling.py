"""Do this machine's cores scale? One process alone, then one per core at once, on fixed work.

    python bench/core_scaling.py            # about 20 s on 2 cores
    python bench/core_scaling.py --reps 5

A cold test suite keeps both cores of a 2-core host busy (docs/performance.md, "The test suite's
time"), so its wall time is its CPU time over two only if two busy processes each run as fast as one
alone. On a VM whose two vCPUs are hyperthreads of one physical core, or whose cores share what the
work needs (memory bandwidth, a cache), each runs slower beside the other, and its CPU seconds grow
with it. Each kind of work (a pure-Python loop, a NumPy pass over an array larger than the caches)
runs REPS times alone and REPS times with one copy per core at once; printed per kind: the best
seconds alone, the best per-process seconds together, and their ratio (1.00: the cores scale; about
0.5-0.6: they share one core's execution units). Work is fixed, so the ratio is the measurement.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import time

import numpy as np

from refimpl.cli import OneLineParser, positive_int

_BIG = 32 * 1024 * 1024 // 8  # 32 MB of float64: past the L2 caches of every host seen


def _python_loop() -> None:
    total = 0
    for i in range(4_000_000):
        total += i * i % 7


def _numpy_stream() -> None:
    a = np.ones(_BIG)
    for _ in range(100):
        a *= 1.0000001  # read and write the whole array


WORK = {"python loop": _python_loop, "numpy stream": _numpy_stream}


def _timed(name: str, start, out) -> None:
    fn = WORK[name]
    fn()  # warm: imports, page faults of the array
    start.wait()
    t0 = time.perf_counter()
    fn()
    out.put(time.perf_counter() - t0)


def _run(name: str, procs: int) -> list[float]:
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_timed, args=(name, start, out)) for _ in range(procs)]
    for w in workers:
        w.start()
    times = [out.get() for _ in workers]
    for w in workers:
        w.join()
    return times


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    """Print each kind of work's best time alone, together and their ratio; 0."""
    parser = OneLineParser(prog="python bench/core_scaling.py", description=__doc__.split("\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=positive_int, default=3, help="runs of each kind alone and together (default 3)")
    parser.add_argument("--procs", type=positive_int, default=os.cpu_count() or 1,
                        help="processes at once (default: one per logical CPU)")
    args = parser.parse_args(argv)
    print(f"host: {_cpu_model()}, {os.cpu_count()} logical CPUs; {args.procs} processes at once, best of {args.reps}")
    print(f"{'work':14} {'alone, s':>9} {'together, s':>12} {'ratio':>6}")
    for name in WORK:
        alone = min(min(_run(name, 1)) for _ in range(args.reps))
        together = min(max(_run(name, args.procs)) for _ in range(args.reps))  # the slower process of each run
        print(f"{name:14} {alone:9.4f} {together:12.4f} {alone / together:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
