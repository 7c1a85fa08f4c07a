"""bench/host_gauge.py: fixed work, its best time, one line."""
import importlib.util
import re
from pathlib import Path

from _cli import run_main

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "host_gauge.py"


def _module():
    spec = importlib.util.spec_from_file_location("host_gauge_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_work_is_the_sum_of_squares_mod_7():
    # i*i mod 7 repeats 0, 1, 4, 2, 2, 4, 1 (14 a period): a closed form, not the loop again.
    m = _module()
    for n in (0, 1, 7, 100, 12_345):
        full, rest = divmod(n, 7)
        assert m.work(n) == 14 * full + sum([0, 1, 4, 2, 2, 4, 1][:rest])


def test_the_gauge_keeps_the_best_of_its_runs_and_prints_one_line():
    m = _module()
    g = m.gauge(repeat=3, n=10_000)
    assert g["result"] == m.work(10_000) and 0 < g["cpu_s"] < 10 and 0 < g["wall_s"] < 10
    r = run_main(m.main, "--repeat", "1")
    assert r.returncode == 0 and r.stderr == ""
    assert re.fullmatch(r"host gauge: \d+\.\d{3} s of CPU for fixed pure-Python work \(best of 1, lower is faster; "
                        r"wall \d+\.\d{3} s\)\n", r.stdout), r.stdout
    bad = run_main(m.main, "--repeat", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--repeat" in bad.stderr
