"""bench/probe_flag_check.py: the probe flag's check (docs/evidence.md section 5) draws what its plan
fixes and reads its cells as the plan says."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from _cli import run_main

from refimpl import Genome

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("probe_flag_check", ROOT / "bench" / "probe_flag_check.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


@pytest.fixture(scope="module")
def drawn():
    return check.plan()


def test_the_plan_draws_eight_new_screened_in_measures_each_side_of_the_flag_and_always_the_same(drawn):
    flag, clean = drawn
    assert len(flag) == len(clean) == 8 and len(set(flag + clean)) == 16
    assert check.plan() == drawn  # fixed: the seed, not the session, decides
    # What the plan fixed, written down once (docs/evidence.md section 5): the first of each group.
    assert (flag[0], clean[0]) == ("10-2-13-16-7-11-1", "7-16-15-8-5-4-9")


def test_the_flag_agrees_with_torchs_measure_on_the_probe_tuples(drawn):
    # The other path: bnn.nn.measure in float64 on the same probe tuples and alpha settings.
    from bnn.nn.measure import measure
    from bnn.search.fitness import PROBE_COUNTS, _probe_alpha

    flag, clean = drawn
    for genome in flag + clean:
        alpha = torch.from_numpy(_probe_alpha(Genome.parse(genome)))
        cols = alpha.shape[1]
        a, b, c, d = (torch.from_numpy(np.repeat(PROBE_COUNTS[:, i:i + 1], cols, axis=1)) for i in range(4))
        y = measure(genome, a, b, c, d, alpha=alpha, counts="raw")
        assert bool(torch.isfinite(y).all()) == (genome in clean), genome


PROTOCOL = {"model": "mnist_net", "dataset": "fashion-mnist", "epochs": 6, "batch_size": 128, "lr": 0.005,
            "val_size": None, "train_size": None, "milestones": [4, 5], "gamma": 0.2, "split_seed": 0,
            "measure_impl": "eager"}


def _journal(tmp_path, rows, protocol=PROTOCOL):
    line = json.dumps({"kind": "protocol", "version": 1, "protocol": protocol})
    (tmp_path / "journal.jsonl").write_text(line + "\n" + "".join(json.dumps(r) + "\n" for r in rows)
                                            + '{"key": "torn')  # a kill's torn last line
    return tmp_path


def _cell(genome, status, acc, kind="Some CPU; torch AVX2; refimpl avx2"):
    return {"key": f"{genome}/binary/s0", "measure": genome, "genome": genome, "downsample": "binary",
            "counts": "raw", "seed": 0, "status": status, "test_acc": acc, "val_acc": 0.0 if acc is None else acc,
            "cpu_kind": kind}


def test_read_counts_failures_and_gives_fishers_one_sided_test(tmp_path, drawn):
    flag, clean = drawn
    rows = [_cell(g, "diverged", None) for g in flag[:5]] + [_cell(g, "ok", 0.10) for g in flag[5:7]]
    rows += [_cell(flag[7], "ok", 0.85)]
    rows += [_cell(g, "ok", 0.80 + i / 100) for i, g in enumerate(clean[:6])] + [_cell(clean[6], "ok", 0.199)]
    rows += [_cell(clean[0], "ok", 0.05)]  # the same key again: its last line counts
    out = check.read(str(_journal(tmp_path, rows)))
    assert out["table"] == {"flagged": [7, 1], "not_flagged": [2, 5]}
    assert out["missing"] == [clean[7]]
    # Fisher's one-sided p by hand: P(X >= 7) for X ~ hypergeometric(15 cells, 9 failed, 8 flagged drawn).
    p = sum(math.comb(9, k) * math.comb(6, 8 - k) for k in range(7, 9)) / math.comb(15, 8)
    assert out["fisher_one_sided_p"] == pytest.approx(p, rel=1e-12)


def test_read_prints_each_cell_and_the_verdicts_numbers(tmp_path, drawn):
    flag, clean = drawn
    root = _journal(tmp_path, [_cell(flag[0], "diverged", None), _cell(clean[0], "ok", 0.8712)])
    r = run_main(check.main, "--read", root)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == [flag[0], "flagged", "diverged", "-", "failed"]
    assert lines[1].split() == [clean[0], "not", "flagged", "ok", "87.12%", "trained"]
    assert lines[2] == "flagged: 1 failed, 0 trained; not flagged: 0 failed, 1 trained; Fisher's exact test, one-sided: p = 0.5000"
    assert lines[3].startswith("not yet trained: 14 of 16: ")
    assert lines[4] == "cells: binary downsampling, raw counts, seed 0, the plan's recipe; CPU: Some CPU; torch AVX2; refimpl avx2"


def test_read_refuses_a_root_without_a_journal_in_one_line(tmp_path):
    r = run_main(check.main, "--read", tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().endswith(f"error: no journal.jsonl in {tmp_path}; give the root the plan's cells were trained in")


@pytest.mark.parametrize("rows, protocol, message", [
    ([], dict(PROTOCOL, epochs=2), "was trained with {'epochs': 2}, not the plan's recipe"),
    ([_cell("7-16-15-8-5-4-9", "ok", 0.8), _cell("12-2-2-16-1-2-9", "ok", 0.8, kind="Other CPU")], PROTOCOL,
     "holds the plan's cells from 2 CPU kinds (Other CPU, Some CPU; torch AVX2; refimpl avx2); the plan runs on one"),
    ([{"key": "7-16-15-8-5-4-9/binary/s0", "measure": "M1"}], PROTOCOL, "line 2 is not a cell of this grid"),
])
def test_read_refuses_another_recipe_two_cpu_kinds_or_a_bad_line_in_one_line(tmp_path, rows, protocol, message):
    r = run_main(check.main, "--read", _journal(tmp_path, rows, protocol))
    assert r.returncode == 2 and r.stdout == ""
    err = r.stderr.strip().splitlines()
    assert message in err[-1] and all("ignored a torn last line" in line for line in err[:-1]), r.stderr
