"""bench/profile_step.py and bench/tune_gpu_measure.py (issue 37): the profile's plumbing on a CPU, and the
tile sweep's refusals where it cannot run."""
import os
import re

import pytest
import torch
from _bench_script import load as _load
from _cli import run_main

if not torch.cuda.is_available():
    # Before anything imports bnn.gpu: its kernels read this once, and a worker's later Triton tests need it.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def test_the_cpu_profile_reports_each_network_and_the_profilers_own_operators():
    r = run_main(_load("profile_step").main, "--device", "cpu", "--tiny", "--networks", "baseline:raw,float")
    assert r.returncode == 0, r.stderr
    heads = re.findall(r"^== (\S+): wall ([0-9.]+) ms/step captured, ([0-9.]+) uncaptured", r.stdout, re.M)
    assert [h[0] for h in heads] == ["baseline:raw", "float"]
    assert all(float(v) > 0 for h in heads for v in h[1:])
    float_rows = r.stdout.split("== float:")[1]
    # torch.profiler names the float network's convolutions; the binary one's count convolution too.
    assert "convolution" in float_rows and "convolution" in r.stdout.split("== float:")[0]


@pytest.mark.parametrize("spec", ["M6", "M6:laplace:fused", "M6:laplace:unfused:x"])
def test_a_network_the_profile_cannot_read_is_refused_in_one_line(spec):
    r = run_main(_load("profile_step").main, "--device", "cpu", "--tiny", "--networks", f"float,{spec}")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == (f"error: --networks: '{spec}' is not GENOME:COUNTS, "
                                                 "GENOME:COUNTS:unfused or float")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("args, interpreted, line", [
    (["--device", "cuda"], True, "error: --device cuda: no CUDA device here; give --device cpu under TRITON_INTERPRET=1"),
    (["--device", "cpu"], False, "error: --device cpu runs the kernels under Triton's interpreter: set TRITON_INTERPRET=1"),
])
def test_the_tile_sweep_refuses_what_it_cannot_run_in_one_line(args, interpreted, line, monkeypatch):
    pytest.importorskip("triton")
    from bnn.gpu import measure_kernels

    monkeypatch.setattr(measure_kernels, "INTERPRETED", interpreted)
    r = run_main(_load("tune_gpu_measure").main, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == line
