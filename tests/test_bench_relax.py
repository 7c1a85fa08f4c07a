"""bench/bench_relax_cpu.py runs both paths, prints one row per case with the host, and finds their parameters equal
(it exits 1 when they differ); bad arguments are one usage error."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_relax_cpu  # noqa: E402


def test_a_tiny_run_prints_every_case_and_the_same_parameters(capsys):
    assert bench_relax_cpu.main(["--rounds", "1", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("host: CPU: ") and "refimpl kernel path" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["baseline"], ["M6"], ["16-7-11-12-1-12-2"])]
    assert [r[:2] for r in rows] == [["baseline", "raw"], ["M6", "laplace"], ["16-7-11-12-1-12-2", "laplace"]]
    assert all(len(r) == 6 and float(r[4]) > 0 for r in rows) and "DIFFER" not in out


def test_bad_arguments_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        bench_relax_cpu.main(["--rounds", "0"])
    assert e.value.code == 2 and "at least 1" in capsys.readouterr().err
