"""The paper's tables as data, and the resumable evaluation grid."""
import json
import os
import re

import pytest
from _tiny_cifar import make_cifar

from bnn import reproduce
from bnn.paper_results import GRID, MEASURES, PAPER

PAPER_TEX = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "seeds", "000_eb250697b49d937a.txt")


def test_grid_is_the_papers_77_cells():
    assert len(GRID) == 11 * 4 + 11 * 3 == len(set(GRID))
    assert set(GRID) == set(PAPER)


def test_spot_values_of_the_tables():
    assert PAPER[("cifar10", "resnet18", "baseline")]["top1"] == 90.51
    assert PAPER[("cifar10", "vgg13", "M9")]["top1"] == 89.38
    assert PAPER[("cifar100", "resnet34", "M9")] == {"top1": 64.96, "top5": 88.07}
    assert PAPER[("cifar100", "vgg13", "M5")] == {"top1": 58.95, "top5": 84.44}


def _table_numbers(tex, label):
    start = tex.index(r"\label{" + label + "}")
    body = tex[start:tex.index(r"\end{table}", start)]
    rows = [line for line in body.splitlines() if "&" in line and "textbf{Measure" not in line]
    return [[float(v) for v in re.findall(r"\d+\.\d+", row.split("&", 1)[1])] for row in rows]


def test_tables_match_the_papers_latex_number_for_number():
    if not os.path.isfile(PAPER_TEX):
        pytest.skip("the paper's LaTeX is not beside this checkout")
    tex = open(PAPER_TEX).read()
    c10, c100 = _table_numbers(tex, "M_cifar10"), _table_numbers(tex, "M_cifar100")
    assert len(c10) == len(c100) == len(MEASURES)
    for m, row10, row100 in zip(MEASURES, c10, c100):
        assert row10 == [PAPER[("cifar10", a, m)]["top1"] for a in ("resnet18", "resnet34", "nin", "vgg13")]
        assert row100 == [PAPER[("cifar100", a, m)][k] for a in ("resnet34", "nin", "vgg13") for k in ("top1", "top5")]


def test_cell_selection_by_glob():
    assert len(reproduce.select_cells("cifar10/*/M9")) == 4
    assert len(reproduce.select_cells("cifar100/nin/*,cifar10/nin/baseline")) == 12
    assert reproduce.select_cells(None) == list(GRID)
    with pytest.raises(ValueError, match="matches no cell"):
        reproduce.select_cells("cifar10/resnet50/*")


def test_smoke_run_trains_a_cell_skips_it_when_finished_and_tabulates(tmp_path, capsys):
    data = make_cifar(tmp_path / "data", "cifar10", per_batch=4)
    root = str(tmp_path / "runs")
    args = ["--data-dir", data, "--cells", "cifar10/nin/baseline", "--epochs", "1", "--root", root,
            "--val-size", "4", "--device", "cpu", "--no-progress"]
    assert reproduce.main(args) == 0
    summary = json.load(open(os.path.join(root, "cifar10", "nin", "baseline", "summary.json")))
    assert summary["status"] == "ok" and summary["epochs"] == 1
    ckpt = os.path.join(root, "cifar10", "nin", "baseline", "checkpoint.pt")
    mtime = os.stat(ckpt).st_mtime_ns
    capsys.readouterr()
    assert reproduce.main(args) == 0
    assert "skipped" in capsys.readouterr().err and os.stat(ckpt).st_mtime_ns == mtime
    table = open(os.path.join(root, "results.md")).read()
    ours = f"{100 * summary['test_acc']:.2f}"
    assert re.search(r"\| baseline \| - / 90\.51 \| - / 91\.00 \| " + re.escape(ours) + r" / 86\.46 \| - / 88\.83 \|", table)
    assert "| M9 | - / 64.96/88.07" not in table and "-/- / 64.96/88.07" in table


def test_a_root_finished_under_one_convention_is_refused_under_another(tmp_path, capsys):
    data = make_cifar(tmp_path / "data", "cifar10", per_batch=4)
    root = str(tmp_path / "runs")
    args = ["--data-dir", data, "--cells", "cifar10/nin/baseline", "--epochs", "1", "--root", root,
            "--val-size", "4", "--device", "cpu", "--no-progress"]
    assert reproduce.main([*args, "--counts", "freq"]) == 0
    summary = json.load(open(os.path.join(root, "cifar10", "nin", "baseline", "summary.json")))
    assert summary["config"]["counts"] == "freq"
    assert "Count convention of our cells (docs/design.md section 2): freq." in open(os.path.join(root, "results.md")).read()
    capsys.readouterr()
    assert reproduce.main(args) == 2  # raw asked, freq finished there
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "finished with freq counts, not raw; use another --root" in err
    assert reproduce.default_root(None, "laplace") == os.path.join("runs", "reproduce-laplace")
    assert reproduce.default_root(None) == os.path.join("runs", "reproduce")


def test_a_started_cell_recorded_before_measure_impl_continues_eager(tmp_path, capsys):
    import torch

    data = make_cifar(tmp_path / "data", "cifar10", per_batch=4)
    root = str(tmp_path / "runs")
    args = ["--data-dir", data, "--cells", "cifar10/nin/baseline", "--root", root, "--val-size", "4", "--device", "cpu",
            "--no-progress"]
    assert reproduce.main([*args, "--epochs", "1"]) == 0
    cell = os.path.join(root, "cifar10", "nin", "baseline")
    assert json.load(open(os.path.join(cell, "summary.json")))["config"]["measure_impl"] == "fused"
    os.remove(os.path.join(cell, "summary.json"))  # started, not finished
    ckpt = torch.load(os.path.join(cell, "checkpoint.pt"), weights_only=True)
    del ckpt["config"]["measure_impl"]  # as a cell started before the setting: trained eager
    torch.save(ckpt, os.path.join(cell, "checkpoint.pt"))
    assert reproduce.main([*args, "--epochs", "2"]) == 0  # resumed, not refused
    summary = json.load(open(os.path.join(cell, "summary.json")))
    assert summary["epochs"] == 2 and summary["config"]["measure_impl"] == "eager"


def test_bad_cells_are_one_line_errors(capsys):
    assert reproduce.main(["--cells", "nothing/here", "--list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matches no cell" in err[0]
