"""Every Numba compile of a command and all the Python processes it starts: which kernels, how long, how often.

    python bench/compile_log.py --log /tmp/compiles.jsonl -- python -m pytest -n auto tests verify
    python bench/compile_log.py --log /tmp/compiles.jsonl --report-only

Runs the command with a ``sitecustomize`` on PYTHONPATH that installs a listener of Numba's compile
events (``numba:compile``: a real compile, never a cache load) in every process that imports Numba;
each finished compile appends one JSON line (pid, kernel, seconds, nesting depth) to the log. Then
prints the host, the command's wall time, the compile time of outermost compiles (a callee compiled
inside its caller is counted once, in the caller), and the kernels by total time, with how many
processes compiled each: a kernel compiled by several processes is work a shared, warmed cache
would do once. A test that clears PYTHONPATH for its subprocess is not logged there.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

from refimpl.cli import OneLineParser, positive_int

SITECUSTOMIZE = r'''
import os, sys
_LOG = os.environ.get("BNN_COMPILE_LOG")
if _LOG:
    import importlib.abc, time, json

    def _install():
        from numba.core import event

        class _Listener(event.Listener):
            def __init__(self):
                self.starts = []  # one entry per compile in progress: its depth is len(starts) - 1

            def on_start(self, ev):
                self.starts.append(time.perf_counter())

            def on_end(self, ev):
                seconds = time.perf_counter() - self.starts.pop()
                d = ev.data or {}
                disp = d.get("dispatcher")
                py = getattr(disp, "py_func", None)
                name = f"{getattr(py, '__module__', '?')}.{getattr(py, '__qualname__', '?')}"
                # pytest sets PYTEST_CURRENT_TEST in its workers, and the tests' subprocesses inherit it.
                test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
                line = json.dumps({"pid": os.getpid(), "kernel": name, "args": str(d.get("args"))[:200],
                                   "s": round(seconds, 4), "depth": len(self.starts), "test": test})
                fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, (line + "\n").encode())
                finally:
                    os.close(fd)

        event.register("numba:compile", _Listener())

    class _Hook(importlib.abc.MetaPathFinder):
        # Install once numba.core.event exists, without importing Numba into processes that never use it.
        def find_spec(self, name, path=None, target=None):
            if name == "numba.core.event":
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                loader = spec.loader
                real_exec = loader.exec_module

                def exec_module(module):
                    real_exec(module)
                    _install()

                loader.exec_module = exec_module
                return spec
            return None

    import importlib.util
    sys.meta_path.insert(0, _Hook())
'''


def read_log(path: str) -> list[dict]:
    """The log's records (a torn last line, from a killed process, is skipped)."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def summarize(records: list[dict]) -> tuple[float, list[tuple[float, int, int, str]]]:
    """(outermost compile seconds, [(seconds, compiles, processes, kernel)] slowest first)."""
    total = sum(r["s"] for r in records if r["depth"] == 0)
    seconds: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    pids: dict[str, set] = collections.defaultdict(set)
    for r in records:
        if r["depth"] == 0:
            seconds[r["kernel"]] += r["s"]
        count[r["kernel"]] += 1
        pids[r["kernel"]].add(r["pid"])
    rows = sorted(((seconds[k], count[k], len(pids[k]), k) for k in count), reverse=True)
    return total, rows


def by_test(records: list[dict]) -> list[tuple[float, int, str]]:
    """(outermost compile seconds, compiles, test) slowest first: the test that was running when each
    compile happened (its own process or a subprocess it started); "" for compiles outside a test."""
    seconds: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for r in records:
        if r["depth"] == 0:
            seconds[r.get("test", "")] += r["s"]
            count[r.get("test", "")] += 1
    return sorted(((seconds[t], count[t], t) for t in seconds), key=lambda row: (-row[0], row[2]))


def main(argv=None) -> int:
    """Run the command under the listener (unless --report-only), then print the summary."""
    p = OneLineParser(prog="bench/compile_log.py", description=__doc__.splitlines()[0])
    p.add_argument("--log", required=True, help="the JSON-lines log to append to (and read)")
    p.add_argument("--top", type=positive_int, default=30, help="kernels to list (default 30)")
    p.add_argument("--report-only", action="store_true", help="only summarize an existing log")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    rc, wall = 0, None
    if not args.report_only:
        if not command:
            p.error("give the command after --, or --report-only")
        with tempfile.TemporaryDirectory() as site:
            with open(os.path.join(site, "sitecustomize.py"), "w") as f:
                f.write(SITECUSTOMIZE)
            env = dict(os.environ, BNN_COMPILE_LOG=os.path.abspath(args.log))
            env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            t0 = time.perf_counter()
            rc = subprocess.run(command, env=env).returncode
            wall = time.perf_counter() - t0
    if not os.path.isfile(args.log):
        p.error(f"--log {args.log}: no such log" + ("" if args.report_only else " (the command compiled nothing)"))
    records = read_log(args.log)
    total, rows = summarize(records)
    from refimpl.isa import host_path

    print(f"host: {os.cpu_count()} logical cores, refimpl path {host_path()}; command exit {rc}"
          + (f", wall {wall:.0f} s" if wall is not None else ""))
    print(f"{len(records)} compiles in {len({r['pid'] for r in records})} processes; "
          f"outermost compiles {total:.0f} s")
    print(f"{'seconds':>9} {'compiles':>8} {'procs':>5}  kernel")
    for s, n, procs, kernel in rows[:args.top]:
        print(f"{s:9.1f} {n:8d} {procs:5d}  {kernel}")
    tests = by_test(records)
    if any(t for _, _, t in tests):
        print(f"\nthe tests that compiled most (of {len(tests)}; compiles while each ran, subprocesses included):")
        print(f"{'seconds':>9} {'compiles':>8}  test")
        for s, n, test in tests[:args.top]:
            print(f"{s:9.1f} {n:8d}  {test or '(outside any test)'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
