"""How fast this host is right now: the CPU seconds of a fixed piece of pure-Python work.

    python bench/host_gauge.py            # one line; .ci/run prints it before and after the tests

A shared 2-core VM's speed swings by half within an hour (docs/performance.md, "The test suite's
time": the same tree's CI took 8 min 17 s and 12 min 49 s), in CPU seconds too, so a CI time or a
suite time means little without the host's speed at that moment. The work is fixed (squares
modulo 7 over a range); the best of ``--repeat`` runs is printed, lower is faster.
"""
from __future__ import annotations

import sys
import time

from refimpl.cli import OneLineParser, positive_int

N = 2_000_000  # about 0.2 s of CPU on the 2-core hosts seen


def work(n: int = N) -> int:
    """The fixed work: the sum of i*i mod 7 for i < n."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def gauge(repeat: int = 5, n: int = N) -> dict:
    """Best CPU and wall seconds of ``repeat`` runs of ``work(n)``, and its result."""
    best_cpu = best_wall = float("inf")
    result = 0
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        result = work(n)
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return {"cpu_s": best_cpu, "wall_s": best_wall, "result": result}


def main(argv=None) -> int:
    """Print the gauge's one line."""
    p = OneLineParser(prog="bench/host_gauge.py", description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=positive_int, default=5, help="runs of the work, the best printed (default 5)")
    args = p.parse_args(argv)
    g = gauge(args.repeat)
    print(f"host gauge: {g['cpu_s']:.3f} s of CPU for fixed pure-Python work (best of {args.repeat}, lower is "
          f"faster; wall {g['wall_s']:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
