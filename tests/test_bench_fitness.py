"""bench/bench_fitness.py (issue 16 item 5): its CPU smoke mode reports every number, consistently, and bad
flags are one line with exit status 2."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _bench_script import load
from _cli import run_main

from refimpl.genome import Genome

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "bench_fitness.py"


def _bench():
    return load("bench_fitness")


@pytest.fixture(scope="module")
def tiny():
    r = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--json", "--device", "cpu"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout  # --json: the one line and nothing else on stdout
    res = json.loads(lines[0])
    # A run stopped by a timeout leaves its numbers so far on stderr; the last one holds them all.
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith("progress {")]
    assert json.loads(progress[-1][len("progress "):]) == res
    return res


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def test_tiny_reports_throughput_of_both_networks_and_their_ratio(tiny):
    s = tiny["settings"]
    assert (s["model"], s["epochs"], s["lr"], s["images"], s["batch"]) == ("resnet18", 15, 5e-3, 64, 4)
    assert s["train_images"] + s["val_images"] == 64 and s["val_images"] == 6
    assert _positive(tiny["binary_images_per_s"]) and _positive(tiny["float_images_per_s"])
    assert tiny["binary_vs_float"] == pytest.approx(tiny["binary_images_per_s"] / tiny["float_images_per_s"])
    assert tiny["binary_images_per_s"] == pytest.approx(s["batch"] / tiny["step_s"])
    assert tiny["device"] == "cpu" and "CPU" in tiny["host"]


def test_tiny_reports_first_step_times_of_a_first_and_a_new_genome(tiny):
    assert tiny["genome"] == str(Genome.parse("baseline")) and tiny["new_genome"] != tiny["genome"]
    assert set(tiny["first_step_s"]) == {"eager"}  # no --compile
    assert all(_positive(v) for v in tiny["first_step_s"]["eager"].values())
    assert set(tiny["first_step_s"]["eager"]) == {"first_genome", "new_genome"}


def test_tiny_extrapolates_one_evaluation_and_says_how(tiny):
    assert tiny["evaluation_extrapolated"] is True
    steps = math.ceil(45_000 / 4)  # the paper's training split at the tiny batch
    training = 15 * steps * tiny["step_s"]
    assert tiny["evaluation_s"] > training  # plus validation and the new genome's set-up
    assert f"15 epochs x ({steps} steps" in tiny["extrapolation"]


def test_tiny_reports_evaluations_per_hour_from_the_aggregate_rate_of_k_processes(tiny):
    rows = tiny["concurrent"]
    assert [r["k"] for r in rows] == [1, 2]
    for r in rows:
        assert "error" not in r, r
        assert _positive(r["images_per_s"])
        # Written here, not read from the bench: an evaluation is 15 epochs of 45,000 images.
        assert r["evaluations_per_hour"] == pytest.approx(3600 * r["images_per_s"] / (15 * 45_000), rel=1e-9)
        assert 0 < r["evaluations_per_hour_incl_overhead"] < r["evaluations_per_hour"]
    assert tiny["best_k"] == max(rows, key=lambda r: r["images_per_s"])["k"]


def test_tiny_reports_k_models_stepped_in_one_process(tiny):
    [row] = tiny["in_process"]
    assert row["k"] == 2 and row["streams"] is False  # the CPU has no streams: the two step in turn
    assert _positive(row["images_per_s"])
    assert row["evaluations_per_hour"] == pytest.approx(3600 * row["images_per_s"] / (15 * 45_000), rel=1e-9)
    assert 0 < row["evaluations_per_hour_incl_overhead"] < row["evaluations_per_hour"]


@pytest.mark.parametrize("args,line", [
    (["--k", "0"], "error: argument --k: expected distinct positive integers separated by commas, or none, got '0'"),
    (["--k", "1,x"], "error: argument --k: expected distinct positive integers separated by commas, or none, got '1,x'"),
    (["--steps", "0"], "error: argument --steps: expected a positive integer, got '0'"),
    (["--streams", "2,2"], "error: argument --streams: expected distinct positive integers separated by commas, or none, "
                           "got '2,2'"),
    (["--images", "20"], "error: --images 20 leaves 18 training images, fewer than --batch 128; "
                         "give --images 142 or more"),
    (["--device", "tpu"], "error: --device 'tpu': expected auto, cpu, cuda or cuda:N"),
    (["--genome", "M99"], "error: "),
    (["--cudagraphs"], "error: --cudagraphs captures CUDA graphs of the compiled step: give it with --compile on a "
                       "CUDA device"),
    (["--cudagraphs", "--compile"], "error: --cudagraphs captures CUDA graphs"),  # the CPU has none
    (["--graphs", "--measure-op"], "error: --graphs captures the step with the Triton operator, not --measure-op's "
                                   "CPU-side one; give one"),
])
def test_a_bad_flag_is_one_line_and_exit_2(args, line):
    r = run_main(_bench().main, "--device", "cpu", *args)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_cuda_device_is_refused():
    r = run_main(_bench().main, "--device", "cuda")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: --device cuda: no CUDA device here; use --device cpu"


def test_the_gpu_session_script_refuses_an_unknown_option(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_session.sh"), "--bogus"], capture_output=True, text=True,
                       timeout=60, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})
    assert r.returncode == 2
    assert r.stderr.strip() == "error: unknown option '--bogus'; give --cpu-smoke or nothing"
    assert not (tmp_path / "out").exists()  # refused before anything is written


@pytest.mark.parametrize("script, usage", [
    ("gpu_session.sh", "bash bench/gpu_session.sh --cpu-smoke"),
    ("gpu_calibration.sh", "bash bench/gpu_calibration.sh --cpu-smoke"),
    ("second_search.sh", "bash bench/second_search.sh --smoke"),
    ("calibration_runner.sh", "bash bench/calibration_runner.sh start"),
])
def test_each_session_script_prints_its_header_as_help(tmp_path, script, usage):
    r = subprocess.run(["bash", str(ROOT / "bench" / script), "--help"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert any(line.lstrip().startswith(usage) for line in lines), r.stdout
    assert not any(line.startswith("#") or line.startswith("set ") for line in lines)  # the header, and only it
    assert list(tmp_path.iterdir()) == []

def _runner(tmp_path, *args, kind="Some CPU; torch AVX2; refimpl avx2\nznver4"):
    # A stand-in python that prints the CPU kind and LLVM's name, as the script's own probe does.
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nprintf '{kind}\\n'\n")
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "RUNS": str(tmp_path / "runs"),
           "FROZEN": str(tmp_path / "frozen")}
    return subprocess.run(["bash", str(ROOT / "bench" / "calibration_runner.sh"), *args], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.parametrize("args, message", [
    (["bogus"], "error: unknown command 'bogus'; give start, status, pause, cont or save"),
    ([], "error: unknown command ''; give start, status, pause, cont or save"),
    (["start"], "error: no calibration runs on this CPU kind (Some CPU; torch AVX2; refimpl avx2|znver4); "
                "docs/evidence.md section 5 names the kinds"),
    (["save"], "error: no calibration runs on this CPU kind (Some CPU; torch AVX2; refimpl avx2|znver4); "
               "docs/evidence.md section 5 names the kinds"),
])
def test_the_calibration_runner_refuses_a_command_or_a_cpu_kind_it_has_no_experiment_for(tmp_path, args, message):
    r = _runner(tmp_path, *args)
    assert r.returncode == 2 and r.stderr.strip() == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["python"]  # nothing written, no worktree


def test_the_calibration_runner_maps_each_kind_to_its_own_experiment(tmp_path):
    xeon = "Intel(R) Xeon(R) Processor; torch AVX512; refimpl avx512-vpopcntdq"
    for kind, name in ((f"{xeon}\nemeraldrapids", "calibration-cpu-xeon"),
                       ("AMD EPYC; torch AVX2; refimpl avx2\nznver3", "calibration-cpu")):
        r = _runner(tmp_path, "status", kind=kind)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[:2] == [f"kind: {kind.replace(chr(10), '|')} -> {name}", "runner: not running"]
    # The development host's Xeon has the same kind string and another core: not this experiment's kind.
    assert _runner(tmp_path, "status", kind=f"{xeon}\nrocketlake").returncode == 2


def test_the_calibration_runners_status_counts_cells_and_the_time_left(tmp_path):
    # The probe (python -c) answers this experiment's kind; the journal is read by the real interpreter.
    kind = "Intel(R) Xeon(R) Processor; torch AVX512; refimpl avx512-vpopcntdq\nemeraldrapids"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = -c ]; then printf \'{kind}\\n\'; else exec {sys.executable} "$@"; fi\n')
    fake.chmod(0o755)
    full = tmp_path / "runs" / "calibration-cpu-xeon" / "full"
    full.mkdir(parents=True)
    rows = [{"key": f"M1/binary/laplace/s{i}", "measure": "M1", "counts": "laplace", "status": "ok", "cpu_s": c}
            for i, c in enumerate([400.0, 500.0, 450.0])]
    rows.append({"key": "M6/binary/raw/s0", "measure": "M6", "counts": "raw", "status": "diverged", "cpu_s": 20.0})
    rows.append(dict(rows[0], cpu_s=410.0))  # a key journaled again: its last line counts, once
    (full / "journal.jsonl").write_text('{"protocol": {}}\n' + "".join(json.dumps(r) + "\n" for r in rows))
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "RUNS": str(tmp_path / "runs"),
           "FROZEN": str(tmp_path / "frozen")}
    r = subprocess.run(["bash", str(ROOT / "bench" / "calibration_runner.sh"), "status"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[2] == "4 of 96 cells journaled: M1/laplace, M6/raw"
    # 92 cells left at the median 450 s of the finished cells (410, 450, 500), two at a time: 5.75 h
    assert lines[3] == ("grid: 92 cells left, about 5.8 h with both cores to the runner (median 450 s of CPU a "
                        "finished cell); then the ladder")


@pytest.mark.parametrize("decided", [True, False])
def test_the_calibration_runners_chain_runs_the_calibration_only_until_it_has_decided(tmp_path, decided):
    # Run again after its decision, the calibration's ladder took the second search's finds (new measures in
    # the grid) for measures to calibrate: the chain goes straight to the second search once decided.
    frozen, runs = tmp_path / "frozen", tmp_path / "runs"
    (frozen / "bench").mkdir(parents=True)
    for script in ("gpu_calibration.sh", "second_search.sh"):
        (frozen / "bench" / script).write_text(f'echo "ran {script} $*" >> "{tmp_path}/calls"\n')
    logs = runs / "calibration-cpu-xeon" / "logs"
    logs.mkdir(parents=True)
    (logs / "calibrate.out").write_text('{"decision": {"search_flags": []}}\n' if decided else "| no decision |\n")
    kind = "Intel(R) Xeon(R) Processor; torch AVX512; refimpl avx512-vpopcntdq\nemeraldrapids"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nprintf '{kind}\\n'\n")
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "RUNS": str(runs), "FROZEN": str(frozen),
           "CAL_MODE": "--cpu", "S2_MODE": ""}
    r = subprocess.run(["bash", str(ROOT / "bench" / "calibration_runner.sh"), "chain", "calibration-cpu-xeon"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    calls = [line.strip() for line in (tmp_path / "calls").read_text().splitlines()]
    assert ("ran gpu_calibration.sh --cpu" in calls) == (not decided), calls


@pytest.mark.parametrize("args, env, message", [
    (["--bogus"], {}, "error: unknown option '--bogus'; give --cpu, --cpu-smoke or nothing"),
    ([], {"BNN_DATA_DIR": "/nonexistent/fm"},
     "error: no Fashion-MNIST in /nonexistent/fm; carry data/fashion-mnist (its four IDX files) or set BNN_DATA_DIR"),
    (["--cpu"], {"BNN_DATA_DIR": "/nonexistent/fm"},
     "error: no Fashion-MNIST in /nonexistent/fm; carry data/fashion-mnist (its four IDX files) or set BNN_DATA_DIR"),
])
def test_the_gpu_calibration_script_refuses_bad_input_before_writing(tmp_path, args, env, message):
    out, root = tmp_path / "out", tmp_path / "root"
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_calibration.sh"), *args], capture_output=True, text=True,
                       timeout=60, env={"PATH": "/usr/bin:/bin", "OUT": str(out), "CAL_ROOT": str(root), **env})
    assert r.returncode == 2 and r.stderr.strip() == message
    assert not out.exists() and not root.exists()


@pytest.mark.parametrize("args, env, message", [
    (["--bogus"], {}, "error: unknown option '--bogus'; give --smoke or nothing"),
    ([], {"BNN_DATA_DIR": "/nonexistent/fm"},
     "error: no Fashion-MNIST in /nonexistent/fm; set BNN_DATA_DIR to the folder of its four IDX files"),
    (["--smoke"], {}, "error: no decision in {cal}/logs/calibrate.out; run bash bench/gpu_calibration.sh --cpu "
                      "(or --cpu-smoke) to its end first, or set CAL_ROOT to the calibration's folder"),
])
def test_the_second_search_script_refuses_bad_input_before_writing(tmp_path, args, env, message):
    cal, run = tmp_path / "cal", tmp_path / "search"
    (cal / "logs").mkdir(parents=True)
    (cal / "logs" / "calibrate.out").write_text("| a calibration stopped before its decision |\n")
    r = subprocess.run(["bash", str(ROOT / "bench" / "second_search.sh"), *args], capture_output=True, text=True,
                       timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "CAL_ROOT": str(cal),
                                        "SEARCH_DIR": str(run), **env})
    assert r.returncode == 2 and r.stderr.strip() == message.format(cal=cal), r.stderr
    assert not run.exists() and sorted(p.name for p in cal.rglob("*")) == ["calibrate.out", "logs"]

def test_the_cpu_calibration_refuses_to_continue_a_journal_of_another_cpu_kind(tmp_path):
    # A CPU experiment is one kind of CPU (docs/evidence.md section 5): cells of two kinds are never one ranking.
    data, out, root = tmp_path / "fm", tmp_path / "out", tmp_path / "root"
    data.mkdir()
    (data / "train-images-idx3-ubyte.gz").write_bytes(b"")  # the script checks that the data is there, no more
    journal = root / "full" / "journal.jsonl"
    journal.parent.mkdir(parents=True)
    row = '{"key": "baseline/binary/s0", "cpu_kind": "Other CPU; torch AVX512; refimpl avx512bw"}\n{"key": "base'
    journal.write_text(row)  # and a torn last line, as a killed grid leaves it
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu_calibration.sh"), "--cpu"], capture_output=True, text=True,
                       timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "OUT": str(out),
                                         "CAL_ROOT": str(root), "BNN_DATA_DIR": str(data)})
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {journal} holds cells trained on ['Other CPU; torch AVX512; refimpl avx512bw'], "
                           "and this CPU is '"), r.stderr
    assert last.endswith("; continue this experiment on that kind only, or give a new root with CAL_ROOT=...")
    assert journal.read_text() == row and not out.exists() and not (root / "logs").exists()
