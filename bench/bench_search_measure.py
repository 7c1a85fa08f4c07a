"""The search on a CPU with the eager measure (its default) against the fused one, whole runs compared.

    python bench/bench_search_measure.py                        # the default search (digits), 2 runs a path
    python bench/bench_search_measure.py --repeats 3 -- --counts laplace --epochs 15

Each run is ``python -m bnn.search --no-progress --measure-impl PATH`` and the arguments after ``--``,
in a new run folder and an empty measure cache (a temporary ``BNN_MEASURE_CACHE``), so the fused path
compiles each new genome's kernels (about 1 s) as a fresh install does; the two paths alternate which
runs first. Printed per run: wall seconds, CPU seconds of the search and its workers, its evaluations
line; then the ratio of the paths' medians, and the host. The paths agree to float32 rounding, not to
the bit, so their searches may take different paths (other genomes trained, other finds).
"""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]

PATHS = ("eager", "fused")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _search(path: str, extra: list[str]) -> dict:
    """One whole search on ``path``: wall and CPU seconds (workers included) and its evaluations line."""
    with tempfile.TemporaryDirectory(prefix="bnn-search-bench-") as tmp:
        env = {**os.environ, "BNN_MEASURE_CACHE": os.path.join(tmp, "cache")}
        cmd = [sys.executable, "-m", "bnn.search", "--no-progress", "--measure-impl", path,
               "--run-dir", os.path.join(tmp, "run"), *extra]
        cpu0, wall0 = _children_cpu(), time.perf_counter()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=os.path.join(_HERE, ".."))
        wall, cpu = time.perf_counter() - wall0, _children_cpu() - cpu0
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        raise SystemExit(f"error: the {path} search failed: {lines[-1] if lines else f'exit {out.returncode}'}")
    line = next((x.strip() for x in out.stdout.splitlines() if " evaluations, " in x), "")
    return {"wall_s": wall, "cpu_s": cpu, "evaluations": line}


def main(argv=None) -> int:
    """Run the search both ways, alternating, and print the table."""
    from bench_train import machine

    from refimpl.cli import OneLineParser, positive_int
    from refimpl.isa import current_path

    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = OneLineParser(prog="bench/bench_search_measure.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=positive_int, default=2, help="whole searches per path (default 2)")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if any(a.split("=")[0] in ("--measure-impl", "--run-dir") for a in extra):
        p.error("the arguments after -- are the search's own; the benchmark sets --measure-impl and --run-dir")
    print(f"host: {machine()}; refimpl kernel path {current_path()}")
    print(f"python -m bnn.search --no-progress {' '.join(extra)}".rstrip() + ", an empty measure cache each run")
    runs = {path: [] for path in PATHS}
    for i in range(args.repeats):
        for path in PATHS if i % 2 == 0 else PATHS[::-1]:
            r = _search(path, extra)
            runs[path].append(r)
            print(f"{path:<6} wall {r['wall_s']:7.1f} s  CPU {r['cpu_s']:7.1f} s  {r['evaluations']}", flush=True)
    wall = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["cpu_s"] for r in v) for k, v in runs.items()}
    print(f"median fused/eager: wall {wall['fused'] / wall['eager']:.2f}, CPU {cpu['fused'] / cpu['eager']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
