"""Reproduce the paper's evaluation tables: ``python -m bnn.reproduce``.

Each cell (dataset, model, measure) is one ``bnn.train`` run with the paper-eval preset in its own
folder ``ROOT/DATASET/MODEL/MEASURE``. A cell whose folder holds ``summary.json`` is finished and
skipped; one with only a checkpoint is resumed; so the command can be killed and rerun at will.
After the runs (or with ``--table-only``) it writes ``ROOT/results.md``: our test accuracy beside
the paper's number in every cell.

    python -m bnn.reproduce --data-dir data --list
    python -m bnn.reproduce --data-dir data --cells 'cifar10/resnet18/*'
    python -m bnn.reproduce --data-dir data --cells cifar10/nin/baseline --epochs 2   # smoke run
"""
from __future__ import annotations

import fnmatch
import json
import os
import sys

from refimpl.cli import OneLineParser, nonnegative_int, one_line, positive_int, seed_int
from refimpl.conventions import NAMES as COUNT_CONVENTIONS
from refimpl.datasets import DATASETS, canonical_name, dataset_arg
from refimpl.fileio import atomic_write_text

from .paper_results import CIFAR10_MODELS, CIFAR100_MODELS, GRID, MEASURES, PAPER
from .settings import MEASURE_IMPLS


def cell_name(cell) -> str:
    """'dataset/model/measure' of a cell."""
    return "/".join(cell)


def select_cells(patterns: str | None, dataset: str | None = None):
    """Cells matching any comma-separated glob pattern over 'dataset/model/measure' (and ``dataset``)."""
    grid = list(GRID)
    if dataset is not None:
        key = canonical_name(dataset)
        grid = [c for c in GRID if c[0] == key]
        if not grid:
            raise ValueError(f"the paper's tables are on cifar10 and cifar100 only, it reports nothing on {key}; "
                             f"train {key} with python -m bnn.train --dataset {key}, or compare measures on it "
                             f"with python -m bnn.evidence --dataset {key}")
    if not patterns:
        return grid
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    chosen = [c for c in grid if any(fnmatch.fnmatchcase(cell_name(c), p) for p in pats)]
    if not chosen:
        raise ValueError(f"--cells {patterns!r} matches no cell; cells look like 'cifar10/resnet18/M1' (see --list)")
    return chosen


def default_root(epochs: int | None, counts: str = "raw") -> str:
    """Where the grid's runs go: ``runs/reproduce``, or ``runs/reproduce-<N>ep`` for a shortened run,
    with ``-<counts>`` for a count convention other than raw."""
    # A shortened run (or another convention) must never be mistaken for (or skip) a full raw cell.
    name = "reproduce" + ("" if epochs is None else f"-{epochs}ep") + ("" if counts == "raw" else f"-{counts}")
    return os.path.join("runs", name)


def _counts_of(summary: dict) -> str:
    # summaries written before conventions existed trained on raw counts
    config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
    return config.get("counts", "raw")


def read_summary(root: str, cell) -> dict | None:
    """The ``summary.json`` of a finished cell, or None when the cell has not finished."""
    path = os.path.join(root, *cell, "summary.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def run_cells(cells, root, data_dir=None, device="auto", epochs=None, val_size=None, seed=0,
              progress=True, compile=False, log=print, download=False, counts="raw", measure_impl=None):
    """Train every cell that has no summary yet (resuming an interrupted one), one data set in memory at a time.

    Every cell's settings are checked before the first one trains (ValueError). ``measure_impl``:
    bnn.train's --measure-impl; None: a started cell's own (eager if its checkpoint predates the
    setting), else the default.
    """
    from .data import load_dataset  # torch only when something is trained
    from .settings import MEASURE_IMPL_BEFORE
    from .train import TrainConfig, resolve_device, train_model
    from .train.files import load_checkpoint

    overrides = {} if epochs is None else {"epochs": epochs}
    configs = {}
    for cell in cells:  # every cell's settings (device, seed, epochs) before the first one trains
        dataset, model, measure = cell
        impl, ckpt = measure_impl, os.path.join(root, *cell, "checkpoint.pt")
        if impl is None and os.path.isfile(ckpt) and read_summary(root, cell) is None:
            impl = load_checkpoint(ckpt)["config"].get("measure_impl", MEASURE_IMPL_BEFORE)
        configs[cell] = TrainConfig.from_preset(
            "paper-eval", model=model, dataset=dataset, measure=measure, seed=seed, counts=counts,
            device=str(resolve_device(device, dataset)), data_dir=data_dir, val_size=val_size,
            out_dir=os.path.join(root, *cell), resume=True, compile=compile, **overrides,
            **({} if impl is None else {"measure_impl": impl}),
        )
        configs[cell].validate()
    loaded = {}
    for cell in cells:
        dataset = cell[0]
        out = os.path.join(root, *cell)
        done = read_summary(root, cell)
        if done is not None:
            if _counts_of(done) != counts:
                raise ValueError(f"{out} finished with {_counts_of(done)} counts, not {counts}; use another --root")
            log(f"{cell_name(cell)}: finished ({done['status']}), skipped")
            continue
        cfg = configs[cell]
        if dataset not in loaded:  # one data set in memory
            loaded = {dataset: load_dataset(dataset, data_dir, val_size, 0, resolve_device(cfg.device), download)}
        resuming = os.path.isfile(os.path.join(out, "checkpoint.pt"))
        log(f"{cell_name(cell)}: {'resuming' if resuming else 'training'} ({cfg.epochs} epochs)")
        r = train_model(cfg, data=loaded[dataset], progress=progress)
        test = "n/a" if r.test_acc is None else f"{100 * r.test_acc:.2f}%"
        log(f"{cell_name(cell)}: {r.status}, test {test}, {r.wall_s:.0f} s")


def _fmt(summary, key):
    if summary is None:
        return "-"
    if summary.get("status") != "ok":
        return summary.get("status", "?")
    v = summary.get(key)
    return "-" if v is None else f"{100 * v:.2f}"


def _table(root: str, title: str, dataset: str, models, cell) -> list[str]:
    """A markdown table: one row per measure, one column per model, ``cell(our summary, paper's row)``."""
    lines = ["", f"## {title}", "", "| measure | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for m in MEASURES:
        cells = [cell(read_summary(root, (dataset, model, m)), PAPER[(dataset, model, m)]) for model in models]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def markdown_table(root: str) -> str:
    """The markdown report: per data set, one row per measure, ours / the paper's accuracy per model."""
    lines = [
        "# Reproduction of the paper's evaluation tables",
        "",
        "Each cell: ours / paper, top-1 accuracy in percent. Ours is the test accuracy after the "
        "run in `" + root + "`; the paper's is its Table value. `-`: not run yet.",
        "",
        "Count convention of our cells (docs/design.md section 2): " + _conventions(root) + ".",
    ]
    lines += _table(root, "CIFAR-10, top-1", "cifar10", CIFAR10_MODELS,
                    lambda s, p: f"{_fmt(s, 'test_acc')} / {p['top1']:.2f}")
    lines += _table(root, "CIFAR-100, top-1 / top-5", "cifar100", CIFAR100_MODELS,
                    lambda s, p: f"{_fmt(s, 'test_acc')}/{_fmt(s, 'test_top5')} / {p['top1']:.2f}/{p['top5']:.2f}")
    return "\n".join(lines) + "\n"


def _conventions(root: str) -> str:
    found = sorted({_counts_of(s) for c in GRID if (s := read_summary(root, c)) is not None})
    return ", ".join(found) if found else "none finished yet"


def write_table(root: str) -> str:
    """Write ``markdown_table(root)`` atomically to ``root/results.md``; its path."""
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, "results.md")
    atomic_write_text(path, markdown_table(root))  # temp file, fsync, rename, fsync the folder
    return path


def main(argv=None) -> int:
    """``python -m bnn.reproduce``: 0, or 2 with one ``error:`` line for a refused setting."""
    p = OneLineParser(prog="python -m bnn.reproduce", description="Run the paper's evaluation grid and tabulate it beside the paper.")
    p.add_argument("--dataset", type=dataset_arg, metavar="{" + ",".join(DATASETS) + "}",
                   help="only this data set's cells (the paper's tables: cifar10, cifar100)")
    p.add_argument("--data-dir", help="folder with the CIFAR archives (default: $BNN_DATA_DIR or ./data)")
    p.add_argument("--download", action="store_true", help="download CIFAR with torchvision if it is missing")
    p.add_argument("--cells", help="comma-separated globs over dataset/model/measure, e.g. 'cifar10/*/M9,cifar100/nin/*'")
    p.add_argument("--epochs", type=positive_int, help="shorten every cell (smoke run); results go to a separate root")
    p.add_argument("--root", help="where the cell folders and results.md go (default: runs/reproduce)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--val-size", type=nonnegative_int, help="validation images held out, 0..49999 (default 5000)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of every cell's training, 0..2**63-1")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--counts", choices=COUNT_CONVENTIONS, default="raw",
                   help="count convention of every cell (docs/design.md section 2): raw (default, the paper's "
                        "equations), freq or laplace; other than raw, the default root says so")
    p.add_argument("--measure-impl", choices=MEASURE_IMPLS,
                   help="how the measure runs in training (bnn.train --measure-impl): fused (default; eager on CUDA "
                        "and compiled steps) or eager; a started cell continues with its own")
    p.add_argument("--list", action="store_true", help="print the selected cells and their state, run nothing")
    p.add_argument("--table-only", action="store_true", help="only rewrite results.md from finished cells")
    p.add_argument("--no-progress", action="store_true")
    args, code = p.parse(argv)
    if args is None:
        return code
    root = args.root or default_root(args.epochs, args.counts)
    try:
        cells = select_cells(args.cells, args.dataset)
        if args.list:
            for c in cells:
                s = read_summary(root, c)
                state = "finished" if s else ("started" if os.path.isfile(os.path.join(root, *c, "checkpoint.pt")) else "todo")
                print(f"{cell_name(c)}\t{state}")
            return 0
        if not args.table_only:
            run_cells(cells, root, args.data_dir, args.device, args.epochs, args.val_size, args.seed,
                      progress=not args.no_progress, compile=args.compile,
                      log=lambda s: print(s, file=sys.stderr, flush=True), download=args.download,
                      counts=args.counts, measure_impl=args.measure_impl)
        path = write_table(root)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(open(path).read())
    print(f"table written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
