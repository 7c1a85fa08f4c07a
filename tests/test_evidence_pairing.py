"""The evidence report pairs a measure with XNOR only on seeds whose two cells trained on one kind of
CPU, and reads a verdict from a family-wise (Bonferroni) interval when asked to."""
import json
import os
import platform

import numpy as np
import pytest

from bnn import evidence
from bnn.evidence.report import summarize

scipy_stats = pytest.importorskip("scipy.stats")

XEON = "Intel(R) Xeon(R) Processor @ 2.50GHz; torch AVX512; refimpl avx512bw"
EPYC = "AMD EPYC 9B45; torch AVX512; refimpl avx512-vpopcntdq"
EPYC_AVX2 = "AMD EPYC 7B13; torch AVX2; refimpl avx2"


def _cell(measure, seed, test, cpu_kind=None, host=None):
    e = {"key": f"{measure}/binary/s{seed}", "measure": measure, "genome": measure, "downsample": "binary",
         "seed": seed, "status": "ok", "test_acc": test, "val_acc": test, "wall_s": 1.0}
    if cpu_kind is not None:
        e["cpu_kind"] = cpu_kind
    if host is not None:
        e["host"] = host
    return e


def _rows(entries, family=1):
    return {r["measure"]: r for r in summarize(entries, family=family)}


def test_a_seed_whose_arms_ran_on_different_cpu_kinds_is_not_paired_and_is_named():
    entries = [_cell("baseline", 0, 0.80, XEON), _cell("baseline", 1, 0.82, XEON), _cell("baseline", 2, 0.84, XEON),
               _cell("M1", 0, 0.90, EPYC), _cell("M1", 1, 0.83, XEON), _cell("M1", 2, 0.86, XEON)]
    m1 = _rows(entries)["M1"]
    # seed 0 (+0.10, across kinds) is left out; seeds 1 and 2 give +0.01 and +0.02
    assert m1["vs_baseline"]["seeds"] == [1, 2] and m1["vs_baseline"]["other_kind_seeds"] == [0]
    assert m1["vs_baseline"]["mean"] == pytest.approx(0.015, abs=1e-12)
    assert m1["cpu_kinds"] == sorted([EPYC, XEON])
    results = {"protocol": {"dataset": "digits", "model": "digits_net", "epochs": 1, "batch_size": 8, "lr": 0.1},
               "wall_s": {"cells": 1.0, "this_run": 1.0}, "cells_done": 6, "cells_ran_on": ["h"], "host": {},
               "rows": list(_rows(entries).values())}
    assert "Not paired (the two arms trained on different kinds of CPU; rerun both on one kind): M1/binary/raw: seeds 0." \
        in evidence.report.markdown(results)


def test_no_pair_on_one_kind_says_so_instead_of_a_verdict():
    entries = [_cell("baseline", 0, 0.80, EPYC_AVX2), _cell("baseline", 1, 0.82, EPYC_AVX2),
               _cell("M1", 0, 0.90, EPYC), _cell("M1", 1, 0.91, EPYC)]
    m1 = _rows(entries)["M1"]
    assert m1["vs_baseline"] is None and m1["verdict"] == "no pairs on one CPU kind"


def test_cells_journaled_before_kinds_pair_by_the_cpu_model_of_their_host_label():
    old = "AMD EPYC 9B45, 2 cores, device cpu, torch 2.11.0"
    other = "Intel(R) Xeon(R) Processor @ 2.50GHz, 2 cores, device cpu, torch 2.11.0"
    entries = [_cell("baseline", 0, 0.80, host=old), _cell("baseline", 1, 0.82, host=old),
               _cell("baseline", 2, 0.84),  # no host at all: pairs with anything
               _cell("M1", 0, 0.81, EPYC), _cell("M1", 1, 0.84, host=other), _cell("M1", 2, 0.87, XEON)]
    m1 = _rows(entries)["M1"]
    assert m1["vs_baseline"]["seeds"] == [0, 2] and m1["vs_baseline"]["other_kind_seeds"] == [1]


@pytest.mark.parametrize("family", [2, 3, 6])
def test_the_family_wise_interval_is_scipys_t_interval_at_bonferronis_level(family):
    rng = np.random.default_rng(family)
    x, y = rng.normal(0.88, 0.004, 12), rng.normal(0.878, 0.004, 12)
    entries = [_cell("baseline", s, float(v), XEON) for s, v in enumerate(y)]
    entries += [_cell("M1", s, float(v), XEON) for s, v in enumerate(x)]
    m1 = _rows(entries, family)["M1"]
    d = x - y
    for key, level in (("vs_baseline", 0.95), ("vs_baseline_family", 1 - 0.05 / family)):
        lo, hi = scipy_stats.t.interval(level, 11, loc=d.mean(), scale=scipy_stats.sem(d))
        assert m1[key]["level"] == pytest.approx(level)
        assert (m1[key]["lo"], m1[key]["hi"]) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))
    assert m1["vs_baseline_family"]["family"] == family and "vs_baseline_family" not in _rows(entries)["M1"]


def test_the_verdict_is_read_from_the_family_wise_interval():
    # differences +0.010, +0.012, +0.006, +0.014: the 95% interval is above zero ...
    base = [0.80, 0.81, 0.82, 0.83]
    diffs = [0.010, 0.012, 0.006, 0.014]
    entries = [_cell("baseline", s, b, XEON) for s, b in enumerate(base)]
    entries += [_cell("M1", s, b + dd, XEON) for s, (b, dd) in enumerate(zip(base, diffs))]
    lo95 = scipy_stats.t.interval(0.95, 3, loc=np.mean(diffs), scale=scipy_stats.sem(diffs))[0]
    lo_fw = scipy_stats.t.interval(1 - 0.05 / 40, 3, loc=np.mean(diffs), scale=scipy_stats.sem(diffs))[0]
    assert lo95 > 0 > lo_fw  # ... and the family-wise one over 40 comparisons reaches below it
    assert _rows(entries)["M1"]["verdict"] == "beats baseline"
    assert _rows(entries, 40)["M1"]["verdict"] == "within noise"


def test_a_trained_cell_records_the_cpu_kind_it_ran_on(tmp_path, capsys):
    import torch

    from refimpl import isa

    root = tmp_path / "smoke"
    args = ["--smoke", "--measures", "baseline", "--seeds", "0", "--root", str(root), "--no-progress", "--no-plot",
            "--family", "2"]
    assert evidence.main(args) == 0
    with open(os.path.join(root, "journal.jsonl")) as f:
        cell = json.loads(f.read().splitlines()[1])
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 None) if os.path.exists("/proc/cpuinfo") else None
    assert cell["cpu_kind"] == (f"{model or platform.processor() or platform.machine()}; "
                                f"torch {torch.backends.cpu.get_cpu_capability()}; refimpl {isa.current_path()}")
    assert cell["threads"] == torch.get_num_threads()  # one job: the cell trained in this process
    from importlib import metadata  # and which code trained it

    assert cell["code"].startswith(metadata.version("bnn-measure-search"))
    md = (root / "results.md").read_text()
    assert "family-wise 95% interval (Bonferroni: 97.50% each)" in md and "| family-wise CI |" in md


def test_a_cell_trained_on_a_gpu_is_of_the_gpus_kind_not_the_hosts_cpu():
    # The host's CPU did none of the arithmetic: two H200 cells on different host CPUs pair, and a GPU
    # cell never pairs with a CPU cell of the same host.
    from bnn.evidence import report
    from bnn.train.host import cpu_kind

    cpu = {"cpu": "Intel(R) Xeon(R) Processor @ 2.50GHz", "torch_cpu_capability": "AVX512", "kernel_path": "avx512bw",
           "torch": "2.11.0+cu130"}
    gpu = {**cpu, "gpu": "NVIDIA H200", "cuda": "13.0"}
    assert cpu_kind(gpu) == "NVIDIA H200; torch 2.11.0+cu130; cuda 13.0"
    assert cpu_kind(cpu) == XEON
    other_host = cpu_kind({**gpu, "cpu": "AMD EPYC 7B13", "kernel_path": "avx2"})
    assert report.same_kind({"cpu_kind": cpu_kind(gpu)}, {"cpu_kind": other_host})
    assert not report.same_kind({"cpu_kind": cpu_kind(gpu)}, {"cpu_kind": cpu_kind(cpu)})


def test_the_plot_draws_the_family_wise_interval_the_verdict_reads():
    # The plot's whiskers in points: the 95% interval, and with --family the wider interval of the verdict.
    rng = np.random.default_rng(9)
    x, y = rng.normal(0.88, 0.004, 12), rng.normal(0.878, 0.004, 12)
    entries = [_cell("baseline", s, float(v), XEON) for s, v in enumerate(y)]
    entries += [_cell("M1", s, float(v), XEON) for s, v in enumerate(x)]
    d = 100 * (x - y)
    want = [("95%", *scipy_stats.t.interval(0.95, 11, loc=d.mean(), scale=scipy_stats.sem(d))),
            ("family-wise", *scipy_stats.t.interval(1 - 0.05 / 2, 11, loc=d.mean(), scale=scipy_stats.sem(d)))]
    got = evidence.report.difference_bars(_rows(entries, 2)["M1"])
    assert [b[0] for b in got] == ["95%", "family-wise"]
    for (kind, mean, lo, hi), (_, wlo, whi) in zip(got, want):
        assert (mean, lo, hi) == (pytest.approx(d.mean(), abs=1e-9), pytest.approx(wlo, abs=1e-9),
                                  pytest.approx(whi, abs=1e-9)), kind
    assert [b[0] for b in evidence.report.difference_bars(_rows(entries)["M1"])] == ["95%"]
    assert evidence.report.difference_bars(_rows(entries, 2)["baseline"]) == []
    pytest.importorskip("matplotlib")
    png = evidence.report.plot_png(list(_rows(entries, 2).values()), "digits")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_grid_without_xnor_on_raw_counts_says_how_to_add_it():
    entries = [_cell("M1", 0, 0.90, XEON), _cell("M1", 1, 0.91, XEON)]
    results = {"protocol": {"dataset": "digits", "model": "digits_net", "epochs": 1, "batch_size": 8, "lr": 0.1},
               "wall_s": {"cells": 1.0, "this_run": 1.0}, "cells_done": 2, "cells_ran_on": ["h"], "host": {},
               "rows": list(_rows(entries).values())}
    assert results["rows"][0]["verdict"] == "no baseline"
    text = evidence.report.markdown(results)
    assert "No XNOR cells (baseline on raw counts) with binary downsampling in this root" in text
    assert "--counts raw --measures baseline" in text
    results["rows"] = list(_rows(entries + [_cell("baseline", 0, 0.8, XEON)]).values())
    assert "No XNOR cells" not in evidence.report.markdown(results)


@pytest.mark.parametrize("epochs, milestones, said", [
    (1, [22], "after epochs: 22 (none within the 1 epoch)."),
    (6, [6], "after epochs: 6 (none within the 6 epochs)."),  # after the last epoch: never applied
    (6, [4, 5], "after epochs: 4, 5."),
    (6, [5, 9], "after epochs: 5, 9."),  # one applies
    (6, [], "after epochs: none."),
])
def test_the_protocol_says_when_no_milestone_falls_within_the_epochs(epochs, milestones, said):
    p = {"dataset": "digits", "model": "digits_net", "epochs": epochs, "batch_size": 8, "lr": 0.1,
         "milestones": milestones}
    assert said in evidence.report.protocol_sentence(p)
