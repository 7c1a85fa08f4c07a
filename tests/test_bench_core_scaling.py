"""bench/core_scaling.py: each kind of work timed alone and one copy per process at once, and their ratio."""
import re
import uuid

import pytest
from _bench_script import load


def test_each_work_is_timed_alone_and_together_and_the_ratio_is_theirs(capsys, tmp_path):
    m = load("core_scaling")
    marks = tmp_path / "runs"
    marks.mkdir()

    def tiny():  # each call leaves a file, so the runs can be counted from outside the forked processes
        sum(range(300_000))  # a few milliseconds, so that the printed times are not zero
        (marks / uuid.uuid4().hex).touch()

    m.WORK = {"tiny": tiny}
    assert m.main(["--reps", "2", "--procs", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "3 processes at once, best of 2" in out[0]
    [row] = [line for line in out if line.startswith("tiny")]
    alone, together, ratio = map(float, row.split()[1:])
    assert alone > 0 and together > 0 and ratio == pytest.approx(alone / together, rel=0.03)
    # Each process warms once and times once: 2 reps alone (1 process), 2 reps together (3 processes).
    assert len(list(marks.iterdir())) == 2 * (2 * 1 + 2 * 3)


def test_a_bad_count_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        load("core_scaling").main(["--reps", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r"error: argument --reps: expected a positive integer, got '0'", err), err
