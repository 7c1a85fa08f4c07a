"""Engine overhead of ``bnn.search`` per evaluation, and the trainings its savings avoid.

Runs a search with the synthetic fitness (a function of the genome, ~50 us), so nearly all the
time measured is the engine's own: GA bookkeeping, the functional hash and screening (Numba on
~1000 probe values), the journal (one or two fsynced lines per evaluation), the leaderboard
state. Numba is warmed before timing. Prints the CPU it ran on.

    python bench/bench_search.py [--evaluations 300] [--population 30] [--seed 0]
"""
import argparse
import platform
import tempfile
import time
from pathlib import Path

from bnn.search import fitness as F
from bnn.search.loop import Search, SearchConfig
from bnn.settings import FITNESS, PAPER_POPULATION


def main():
    """Run the synthetic-fitness search with savings on and paper-faithful, and print the engine's time per evaluation."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--evaluations", type=int, default=300)
    p.add_argument("--population", type=int, default=PAPER_POPULATION)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=FITNESS.epochs)
    a = p.parse_args()
    F.analyse("0-0-0-0-0-0-1")  # JIT / cache load outside the timing
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"CPU: {cpu}")
    for label, extra in (("savings on", {}), ("paper-faithful", dict(cache=False, equivalence=False, screening=False))):
        with tempfile.TemporaryDirectory() as d:
            cfg = SearchConfig(fitness=f"synthetic:{a.seed}", epochs=a.epochs, population=a.population, seed=a.seed,
                               thresholds=list(FITNESS.thresholds), threshold_steps=list(FITNESS.threshold_steps),
                               max_evaluations=a.evaluations, **extra)
            s = Search(cfg, Path(d) / "run", progress=False)
            s.start_new()
            t0 = time.perf_counter()
            s.run()
            wall = time.perf_counter() - t0
            c = s.summary_counts()
            engine = wall - s.busy_s
            print(f"{label:>15}: {c['evaluations']} evaluations, {c['trainings']} trainings; saved by cache "
                  f"{c['saved_by_cache']}, equivalence {c['saved_by_equivalence']}, screening {c['saved_by_screening']}; "
                  f"engine overhead {1000 * engine / c['evaluations']:.2f} ms/evaluation "
                  f"(fitness itself {1000 * s.busy_s / c['evaluations']:.2f} ms)")


if __name__ == "__main__":
    main()
