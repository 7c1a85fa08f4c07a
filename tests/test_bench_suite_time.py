"""bench/suite_time.py: pytest's --durations lines summed per test and per file."""
import pytest
from _bench_script import load

LINES = """============================= slowest durations ==============================
130.10s setup    tests/test_a.py::test_one
2.50s call     tests/test_a.py::test_one
1.25s teardown tests/test_a.py::test_one
7.00s call     verify/test_b.py::test_two[x-float32]
0.75s call     tests/test_a.py::test_three
(5151 durations < 0.005s hidden.  Use -vv to show these durations.)
2411 passed, 88 skipped in 1117.11s (0:18:37)""".splitlines()


def test_a_tests_phases_are_summed_and_files_ranked():
    m = load("suite_time")
    tests = m.durations(LINES)
    assert tests == [(pytest.approx(133.85), "tests/test_a.py::test_one"), (7.0, "verify/test_b.py::test_two[x-float32]"),
                     (0.75, "tests/test_a.py::test_three")]
    assert m.per_file(tests) == [(pytest.approx(134.6), 2, "tests/test_a.py"), (7.0, 1, "verify/test_b.py")]


def test_compile_log_counts_outermost_compiles_once_and_processes_per_kernel(tmp_path):
    m = load("compile_log")
    log = tmp_path / "log.jsonl"
    log.write_text('{"pid": 1, "kernel": "k.tile", "args": "", "s": 2.0, "depth": 1}\n'
                   '{"pid": 1, "kernel": "k.outer", "args": "", "s": 5.0, "depth": 0}\n'
                   '{"pid": 2, "kernel": "k.outer", "args": "", "s": 4.0, "depth": 0}\n'
                   '{"pid": 2, "kernel": "k.ti')  # a process killed mid-line
    total, rows = m.summarize(m.read_log(str(log)))
    assert total == 9.0  # the callee's 2 s are inside its caller's 5 s
    assert rows == [(9.0, 2, 2, "k.outer"), (0.0, 1, 1, "k.tile")]


def test_compile_log_sums_each_tests_outermost_compiles(tmp_path):
    m = load("compile_log")
    records = [{"pid": 1, "kernel": "k.tile", "s": 2.0, "depth": 1, "test": "t.py::a"},
               {"pid": 1, "kernel": "k.outer", "s": 5.0, "depth": 0, "test": "t.py::a"},
               {"pid": 2, "kernel": "k.outer", "s": 4.0, "depth": 0, "test": "t.py::b"},
               {"pid": 3, "kernel": "k.other", "s": 1.5, "depth": 0, "test": "t.py::b"},
               {"pid": 4, "kernel": "k.old", "s": 0.5, "depth": 0}]  # a log written before tests were recorded
    assert m.by_test(records) == [(5.5, 2, "t.py::b"), (5.0, 1, "t.py::a"), (0.5, 1, "")]
