"""Where the test suite's time goes: one run of pytest, its wall and CPU time, and each file's share.

    python bench/suite_time.py                       # the README's command: tests and verify, -n auto
    python bench/suite_time.py --top 30 verify       # one folder; 30 files and 30 tests listed
    BNN_MEASURE_CACHE=$(mktemp -d) python bench/suite_time.py   # a cold generated-kernel cache, as CI has

Prints the host (CPU model, refimpl's kernel path), the run's wall time and the CPU time of pytest
and everything it started (user + sys), then the files and the tests by their summed set-up, call
and tear-down time. Test durations are wall times inside busy workers: they add up to about
workers x wall, and a test's share is what it holds a worker for. Compare two trees by running
this in each, back to back on an otherwise idle machine (docs/performance.md, the suite's time).
"""
from __future__ import annotations

import collections
import os
import re
import resource
import subprocess
import sys
import time

from refimpl.cli import OneLineParser, positive_int

_DURATION = re.compile(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)")


def durations(lines) -> list[tuple[float, str]]:
    """(seconds, test id) summed over set-up, call and tear-down, from pytest's --durations=0 lines."""
    per_test: dict[str, float] = collections.defaultdict(float)
    for line in lines:
        m = _DURATION.match(line)
        if m:
            per_test[m[3]] += float(m[1])
    return sorted(((t, name) for name, t in per_test.items()), reverse=True)


def per_file(tests: list[tuple[float, str]]) -> list[tuple[float, int, str]]:
    """(seconds, tests, file) for each file, slowest first."""
    total: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for t, name in tests:
        f = name.split("::")[0]
        total[f] += t
        count[f] += 1
    return sorted(((t, count[f], f) for f, t in total.items()), reverse=True)


def main(argv=None) -> int:
    """Run the suite once and print where its time went; pytest's exit status."""
    p = OneLineParser(prog="bench/suite_time.py", description=__doc__.splitlines()[0])
    p.add_argument("--top", type=positive_int, default=20, help="files and tests to list (default 20)")
    p.add_argument("--workers", default="auto", help="pytest-xdist workers (default auto: one per core)")
    p.add_argument("paths", nargs="*", default=["tests", "verify"], help="what to run (default: tests verify)")
    args = p.parse_args(argv)
    cmd = [sys.executable, "-m", "pytest", "-n", args.workers, "--dist", "worksteal", "-q", "--durations=0",
           "-p", "no:cacheprovider", *args.paths]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from refimpl.info import cpu_model
    from refimpl.isa import host_path

    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = run.stdout.splitlines()
    tests = durations(lines)
    summary = next((ln for ln in reversed(lines) if " in " in ln and ("passed" in ln or "failed" in ln)), "?")
    print(f"host: {cpu_model()}, {os.cpu_count()} logical cores, refimpl path {host_path()}")
    print(f"command: {' '.join(cmd[1:])}")
    print(f"pytest: {summary.strip('= ')}")
    print(f"wall {wall:.0f} s, CPU {usage.ru_utime + usage.ru_stime:.0f} s (user {usage.ru_utime:.0f} + sys "
          f"{usage.ru_stime:.0f}), tests' summed time {sum(t for t, _ in tests):.0f} s")
    print(f"\nslowest files (of {len(per_file(tests))}):")
    for t, n, f in per_file(tests)[:args.top]:
        print(f"{t:8.1f} s {n:5d} tests  {f}")
    print(f"\nslowest tests (of {len(tests)}):")
    for t, name in tests[:args.top]:
        print(f"{t:8.1f} s  {name}")
    if run.returncode not in (0, 5):
        print("\n".join(lines[-30:]), file=sys.stderr)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
