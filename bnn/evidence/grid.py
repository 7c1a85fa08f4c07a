"""The evidence grid: does a searched measure beat XNOR? ``python -m bnn.evidence``.

Trains every measure of the paper's table (baseline, M1..M10) over several seeds with the binary
downsampling path, and a few of them with the real-valued one, all under one fixed protocol,
then reports per measure the test accuracy (mean, sample std, diverged runs) and the paired
difference to the baseline of the same downsampling with a 95% t-interval. Each cell trains for
the protocol's epochs and reports its final model: nothing is selected on the test set.

Run folder (``--root``, default ``runs/evidence-DATASET``):
``journal.jsonl``: line 1 is the protocol, then one line per finished cell (status ok / diverged /
rejected / error, val and test accuracy, epochs, wall seconds), appended with one write, flushed
and fsynced. A rerun of the same command skips the finished cells ("error" cells are retried),
cuts off a torn last line, and refuses a different protocol. ``lock``: held (``bnn.common.runlock``) for the
whole run, so two runs cannot interleave in one root. ``results.json``, ``results.md`` and
``accuracy.png``: the report, rewritten atomically after every cell.

    python -m bnn.evidence --data-dir /work/data                 # the whole grid
    python -m bnn.evidence --measures baseline,3-0-3-0-0-1-6 --real-measures none
    python -m bnn.evidence --smoke --root /tmp/ev                # 2 measures x 2 seeds on digits
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

from refimpl.cli import SEED_MAX, OneLineParser, nonnegative_int, one_line, parse_int, positive_float, positive_int
from refimpl.conventions import DEFAULT as RAW
from refimpl.conventions import check_counts
from refimpl.fileio import read_regular
from refimpl.genome import Genome

from ..common.jsonl import append_line
from ..common.runlock import RunDirInUse, hold_run_dir
from ..paper_results import MEASURES
from ..settings import FITNESS, MEASURE_IMPL_BEFORE, MEASURE_IMPLS
from . import report
from .cells import cell_folder, check_cells, earlier_run, forget_cell
from .journal import GridError, read_journal, start_journal
from .protocol import PROTOCOLS, REAL_MEASURES, SEEDS, SMOKE, protocol_text

FINAL = ("ok", "diverged", "rejected")  # an "error" cell is trained again by a rerun
# Fields of TrainConfig that vary per cell or only say where/how to run: not part of the protocol.
_NOT_PROTOCOL = ("measure", "seed", "downsample", "counts", "device", "data_dir", "out_dir", "resume", "download",
                 "compile", "eval_test")


# =============================================================================================
# Cells and the protocol


def _train_fields() -> set[str]:
    from ..train import TrainConfig

    return {f.name for f in dataclasses.fields(TrainConfig)}


def measure_label(text: str) -> tuple[str, str]:
    """(label, genome): the registered name when it has one, else the canonical genome text."""
    g = Genome.parse(text.strip())
    return g.name or str(g), str(g)


def plan_cells(measures, seeds, real_measures, conventions=(RAW,)) -> list[dict]:
    """The grid's cells, one per (count convention, measure, downsampling kind, seed), each
    measure once: dicts with ``key``, ``measure`` (label), ``genome``, ``downsample``, ``counts``
    and ``seed``. A raw cell's key is the one it had before conventions existed, so older
    journals resume."""
    cells = []
    for counts in conventions:
        check_counts(counts)
        tag = "" if counts == RAW else f"{counts}/"
        for kind, names in (("binary", measures), ("real", real_measures)):
            for name in names:
                label, genome = measure_label(name)
                for seed in seeds:
                    cells.append({"key": f"{label}/{kind}/{tag}s{seed}", "measure": label, "genome": genome,
                                  "downsample": kind, "counts": counts, "seed": seed})
    return list({c["key"]: c for c in cells}.values())  # a measure named twice runs once


def base_config(dataset: str, model: str | None, protocol: dict, data_dir, device, download: bool = False):
    """The TrainConfig every cell shares: the data set's preset (its recipe), the protocol on top."""
    from ..train import DEFAULT_MODEL, DEFAULT_PRESET, PRESETS, TrainConfig

    known = _train_fields()
    for key, value in protocol.items():
        if value is not None and key not in known:
            raise GridError(f"this bnn.train has no {key} option; pass --{key.replace('_', '-')} 0 or update bnn")
    model = model or DEFAULT_MODEL.get(dataset)
    if model is None:
        raise GridError(f"{dataset} has no default model in bnn.train; pass --model")
    preset = PRESETS.get(DEFAULT_PRESET.get(dataset), {})
    overrides = {k: v for k, v in protocol.items() if v is not None}  # None: the config's default
    try:
        cfg = TrainConfig(**{**preset, "dataset": dataset, "model": model, "data_dir": data_dir, "device": device,
                             "download": download, **overrides})
        cfg.validate()
    except ValueError as exc:
        raise GridError(str(exc)) from None
    return cfg


def protocol_of(cfg) -> dict:
    """What makes two cells comparable: every training field but the per-cell ones."""
    d = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_PROTOCOL}
    return json.loads(json.dumps(d))  # tuples -> lists, as the journal holds them


def cell_config(base, cell: dict, root: str | None = None):
    """``base`` with the cell's genome, seed, downsampling kind and count convention; with ``root``, its
    run folder there (``cell_folder``), resumed from its last epoch's checkpoint if one is left."""
    folder = {"out_dir": cell_folder(root, cell["key"]), "resume": True} if root is not None else {}
    return dataclasses.replace(base, measure=cell["genome"], seed=cell["seed"], downsample=cell["downsample"],
                               counts=cell.get("counts", RAW), **folder)


# =============================================================================================
# Journal and lock


def journaled_measure_impl(root: str) -> str | None:
    """The measure implementation of the grid journaled in ``root`` (eager for a journal written before
    the setting existed), or None: no journal, or one the locked read will report on. Read without
    the lock, to choose a rerun's default; the locked run checks the protocol again."""

    try:
        first = read_regular(os.path.join(root, "journal.jsonl")).split(b"\n", 1)[0]
        protocol = json.loads(first)["protocol"]
        return protocol.get("measure_impl", MEASURE_IMPL_BEFORE)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def lock_root(root: str):
    """The run folder's lock (``bnn.common.runlock``), to hold in a ``with`` block; a held root is a GridError."""
    try:
        return hold_run_dir(root)
    except RunDirInUse as exc:
        who = f"pid {exc.pid}" if exc.pid is not None else "pid unknown"
        raise GridError(f"another bnn.evidence run holds {root} ({who}); "
                        "wait for it to finish or use another --root") from None


def check_protocol(saved: dict, wanted: dict, root: str) -> None:
    """GridError naming the first setting in which a journal's protocol differs from this run's.

    A setting that a journal's protocol lacks was added to bnn.train after that journal was
    written: the journal's cells trained with what bnn.train did then, which is what they are
    compared at: its default then (``measure_impl``: eager, though fused is the default now)."""
    from ..train import TrainConfig

    defaults = {**protocol_of(TrainConfig()), "measure_impl": MEASURE_IMPL_BEFORE}
    for key in sorted(set(saved) | set(wanted)):
        had = saved.get(key, defaults.get(key))
        if had != wanted.get(key):
            raise GridError(f"{root} holds a grid run with {key}={had!r}, not {wanted.get(key)!r}; "
                            "use another --root (or the same options)")


# =============================================================================================
# Running the grid


def _train_cell(cfg, data) -> dict:
    from ..train import train_model

    try:
        r = train_model(cfg, data=data, progress=False)
    except Exception as exc:  # noqa: BLE001  a cell that crashes must not stop the grid
        return {"status": "error", "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]}
    return {"status": r.status, "val_acc": r.val_acc, "test_acc": r.test_acc, "epochs": r.epochs}


def _timed_cell(cfg, data) -> dict:
    """A cell's result, its wall seconds and its process's CPU seconds: on a shared host a niced cell's
    wall time says what else ran, its CPU time what the cell cost. A resumed cell adds what its earlier
    runs spent up to its checkpoint."""
    wall0, cpu0 = earlier_run(cfg)
    t0, c0 = time.perf_counter(), time.process_time()
    row = _train_cell(cfg, data)
    return {**row, "wall_s": round(wall0 + time.perf_counter() - t0, 3),
            "cpu_s": round(cpu0 + time.process_time() - c0, 3)}


# One process per job, each with its own copy of the data set and cores // jobs torch threads:
# a small network uses two threads poorly, so two one-thread cells train faster than one after the
# other. A cell's result does not depend on which worker trained it (its seed fixes every draw).
_WORKER: dict = {}


def _worker_init(base, threads: int, parent_pid: int, alive) -> None:
    import signal

    import torch

    from ..common.liveness import die_with_parent

    die_with_parent(parent_pid, alive)  # a killed grid leaves no worker behind
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    torch.set_num_threads(threads)
    _WORKER["device"], _WORKER["data"] = _load(base)


def _worker_cell(cfg) -> dict:
    return _timed_cell(dataclasses.replace(cfg, device=_WORKER["device"]), _WORKER["data"])


def _worker_threads(jobs: int) -> int:
    """The torch threads of each of ``jobs`` worker processes: the cores shared among them."""
    return max(1, (os.cpu_count() or 1) // jobs)


def _results_in_parallel(base, todo, configs, jobs: int):
    """Yield (cell, row) as worker processes finish them, in completion order."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = mp.get_context("spawn")  # fork after torch/numba threads start is unsafe
    alive, keep = ctx.Pipe(duplex=False)
    threads = _worker_threads(jobs)
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_worker_init,
                             initargs=(base, threads, os.getpid(), alive)) as pool:
        pending = {pool.submit(_worker_cell, configs[c["key"]]): c for c in todo}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                yield pending.pop(future), future.result()
    keep.close()


def _results_in_order(base, todo, configs):
    device, data = _load(base)
    for cell in todo:
        yield cell, _timed_cell(dataclasses.replace(configs[cell["key"]], device=device), data)


def _cell_line(i: int, n: int, row: dict) -> str:
    def pct(v):
        return "n/a" if v is None else f"{100 * v:.2f}%"

    tail = f": {row['error']}" if row["status"] == "error" else ""
    return (f"[{i}/{n}] {row['key']}: {row['status']}, test {pct(row.get('test_acc'))}, val {pct(row.get('val_acc'))}, "
            f"{row['wall_s']:.0f} s{tail}")


def eta_text(done: dict[str, dict], left: int, jobs: int) -> str:
    """"; about 3 h 10 min left at ..." from the median wall time of the root's cells that finished ok
    ('' before the first): what a long grid has ahead of it, before its progress bar has a rate."""
    seconds = [r["wall_s"] for r in done.values() if r.get("status") == "ok" and r.get("wall_s")]
    if not seconds or left <= 0:
        return ""
    median = statistics.median(seconds)
    total = median * -(-left // jobs)  # rounds of `jobs` cells
    return (f"; about {f'{total:.0f} s' if total < 60 else report.duration(total)} left at the median "
            f"{median:,.0f} s of {len(seconds)} finished cell{'s' if len(seconds) > 1 else ''}, {jobs} at a time")


def run_grid(root: str, base, cells: list[dict], progress: bool = True, plot: bool = True, log=print,
             jobs: int = 1, family: int = 1) -> dict:
    """Train the cells not yet in the journal (``jobs`` at a time), then write the report; returns
    results.json's content."""
    t0 = time.perf_counter()
    protocol = protocol_of(base)
    journal = os.path.join(root, "journal.jsonl")
    configs = {c["key"]: cell_config(base, c, root) for c in cells}
    with lock_root(root):
        report.check_report_files(root)  # a folder named results.json: said now, not after every cell
        check_cells(root)
        saved, done = read_journal(journal, log)
        if saved is None:
            start_journal(journal, protocol)  # a torn protocol line is replaced, not appended to
        else:
            check_protocol(saved, protocol, root)
        todo = [c for c in cells if done.get(c["key"], {}).get("status") not in FINAL]
        jobs = min(jobs, len(todo))
        log(f"{root}: {len(cells) - len(todo)} of {len(cells)} cells already finished, {len(todo)} to train"
            + eta_text(done, len(todo), jobs))
        from ..train import host as machine
        from ..train import resolve_device

        try:
            device = str(resolve_device(base.device, base.dataset))
        except ValueError as exc:
            raise GridError(str(exc)) from None
        info = machine.host_info(device)
        host, kind = machine.host_label(info), machine.cpu_kind(info)
        from refimpl.info import project_version

        code = project_version()  # which code trained the cell: the version, and the commit of a checkout
        bar = _bar(len(todo), progress)
        # A CPU training's bits depend on its thread count too (not part of the kind, which old journals lack).
        threads = _worker_threads(jobs) if jobs > 1 else info["torch_threads"]
        rows = _results_in_parallel(base, todo, configs, jobs) if jobs > 1 else _results_in_order(base, todo, configs)
        for i, (cell, result) in enumerate(rows, 1):
            row = {**cell, **result, "device": device, "host": host, "cpu_kind": kind, "threads": threads, "code": code}
            append_line(journal, row)
            done[cell["key"]] = row
            forget_cell(root, cell["key"])
            if bar is not None:
                bar.write(_cell_line(i, len(todo), row), file=sys.stderr)  # above the bar, never on stdout
                bar.update(1)
            else:
                log(_cell_line(i, len(todo), row) + eta_text(done, len(todo) - i, jobs))
        if bar is not None:
            bar.close()
        results = build_results(saved or protocol, done, device, time.perf_counter() - t0, family)
        report.write_report(root, results, plot, log)
    return results


def build_results(protocol: dict, done: dict[str, dict], device: str, this_run_s: float, family: int = 1) -> dict:
    """The grid's report: protocol, host, wall time, cells done and one summary row per measure and kind
    (``family``: the number of comparisons a family-wise interval covers, report.summarize)."""
    from ..train import host

    entries = list(done.values())
    return {
        "protocol": protocol,
        "host": host.host_info(device),
        "cells_ran_on": sorted({e["host"] for e in entries if e.get("host")}),
        "wall_s": {"cells": round(sum(e.get("wall_s", 0.0) for e in entries), 1), "this_run": round(this_run_s, 1)},
        # Journals from before cpu_s lack it: counted, so a reader uses it only where it covers every cell.
        "cpu_s": {"cells": round(sum(e["cpu_s"] for e in entries if "cpu_s" in e), 1),
                  "cells_counted": sum("cpu_s" in e for e in entries)},
        "cells_done": len(entries),
        "family": family,
        "rows": report.summarize(entries, family=family),
    }


def _load(base):
    from ..data import load_dataset
    from ..train import resolve_device

    try:
        device = resolve_device(base.device, base.dataset)
        subset = {"train_size": base.train_size} if "train_size" in _train_fields() else {}
        data = load_dataset(base.dataset, base.data_dir, base.val_size, base.split_seed, device, base.download, **subset)
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise GridError(str(exc)) from None
    return str(device), data


def check_data(base) -> None:
    """The data set is readable and holds the protocol's validation and training sizes."""
    from ..train import check_settings

    try:
        check_settings(base)
    except (ValueError, FileNotFoundError, OSError) as exc:
        raise GridError(str(exc)) from None


def _bar(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="cells", unit="cell", file=sys.stderr, dynamic_ncols=True)


# =============================================================================================
# Command line


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m bnn.evidence",
                description="Train the paper's measures over seeds under one protocol and test whether any beats XNOR.")
    p.add_argument("--dataset", help="fashion-mnist (default), mnist, digits, cifar10 or cifar100 (the paper's "
                   "15-epoch fitness recipe on ResNet-18: GPU work)")
    p.add_argument("--model", help="network (default: the data set's default, mnist_net for MNIST-like sets)")
    p.add_argument("--data-dir", help="folder with the data set's files (default: $BNN_DATA_DIR or ./data)")
    p.add_argument("--download", action="store_true", help="download the data set if it is missing, before the first "
                   "cell, as bnn.train (MNISTs: the official files, SHA-256 checked; CIFAR: torchvision)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--root", help="run folder: journal, lock, results, and cells/ with the checkpoints of cells in "
                   "progress, from which a rerun continues them (default: runs/evidence-DATASET)")
    p.add_argument("--measures", help=f"comma-separated names or genomes, downsample=binary (default: {','.join(MEASURES)})")
    p.add_argument("--seeds", help=f"comma-separated seeds in 0..2**63-1 (default: {','.join(map(str, SEEDS))})")
    p.add_argument("--real-measures", help=f"measures also run with downsample=real, or 'none' (default: {','.join(REAL_MEASURES)})")
    p.add_argument("--counts", help="comma-separated count conventions, each a grid of its own cells (docs/design.md "
                                    "section 2): raw (default), freq, laplace")
    p.add_argument("--measure-impl", choices=MEASURE_IMPLS,
                   help="how the measure runs in training (bnn.train --measure-impl): fused (a new grid's default) or "
                        "eager; a rerun without it continues with its journal's (eager for a journal written before "
                        "the option)")
    p.add_argument("--epochs", type=positive_int, help=f"epochs per cell (default: {protocol_text('epochs')})")
    p.add_argument("--train-size", type=nonnegative_int,
                   help=f"training images per epoch; 0 = all (default: {protocol_text('train_size')})")
    p.add_argument("--batch-size", type=positive_int, help=f"images per step (default: {protocol_text('batch_size')})")
    p.add_argument("--lr", type=positive_float, help=f"Adam learning rate, a finite number > 0 (default: {protocol_text('lr')})")
    p.add_argument("--milestones", help=f"comma-separated epochs after which the lr is multiplied by {FITNESS.gamma:g} "
                                        f"(default: {protocol_text('milestones')})")
    p.add_argument("--val-size", type=nonnegative_int,
                   help="validation images held out of the training set, 0..(training images - 1)")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="cells trained at once, each in its own process with cores/jobs threads (default 1)")
    p.add_argument("--family", type=positive_int, default=1,
                   help="comparisons against XNOR that one conclusion rests on: the report adds each row's family-wise "
                        "95%% interval (Bonferroni, 1 - 0.05/FAMILY each) and reads the verdict from it (default 1)")
    p.add_argument("--smoke", action="store_true", help="a tiny grid on digits: baseline,M1 x seeds 0,1 x 1 epoch of 3 steps")
    p.add_argument("--table-only", action="store_true", help="rewrite the report from the journal, train nothing")
    p.add_argument("--json", action="store_true", help="print results.json's content as the last line of stdout")
    p.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True, help="write accuracy.png (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _int_list(text: str, what: str, lo: int = 0, hi: int | None = None) -> list[int]:
    try:
        return [parse_int(v, lo, hi) for v in text.split(",") if v.strip()]
    except argparse.ArgumentTypeError as exc:
        raise GridError(f"{what} must be comma-separated integers: {exc}") from None


def _names(text: str | None, default) -> list[str]:
    if text is None:
        return list(default)
    return [] if text.strip().lower() in ("", "none") else [v.strip() for v in text.split(",") if v.strip()]


def setup(args) -> tuple[str, object, list[dict]]:
    """(root, base config, cells) from the command line; GridError for bad input."""
    if args.smoke:  # the smoke grid's values stand where an option was not given
        for key, value in SMOKE.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    wanted = args.dataset or "fashion-mnist"
    dataset = {k.replace("-", ""): k for k in PROTOCOLS}.get(wanted.lower().replace("-", ""))
    if dataset is None:
        raise GridError(f"unknown dataset {wanted!r}; choose one of {', '.join(PROTOCOLS)}")
    protocol = dict(PROTOCOLS[dataset])
    protocol.update({k: getattr(args, k) for k in ("epochs", "batch_size", "lr", "val_size") if getattr(args, k) is not None})
    if args.train_size is not None:
        protocol["train_size"] = args.train_size or None
    if args.milestones is not None:
        protocol["milestones"] = tuple(_int_list(args.milestones, "--milestones"))
    root = args.root or os.path.join("runs", f"evidence-{dataset}")
    # A rerun continues its grid with the journal's measure implementation; a new grid takes the default.
    protocol["measure_impl"] = args.measure_impl or journaled_measure_impl(root)
    seeds = _int_list(args.seeds, "--seeds", 0, SEED_MAX) if args.seeds is not None else list(SEEDS)
    try:
        cells = plan_cells(_names(args.measures, MEASURES), seeds, _names(args.real_measures, REAL_MEASURES),
                           _names(args.counts, (RAW,)))
    except ValueError as exc:
        raise GridError(str(exc)) from None
    if not cells:
        raise GridError("no cells to run: give at least one measure and one seed")
    base = base_config(dataset, args.model, protocol, args.data_dir, args.device, args.download)
    return root, base, cells


def table_only(root: str, plot: bool, log, family: int = 1) -> dict:
    """Tabulate the cells a root's journal already holds (``--table-only``): write the report, return the results."""
    if not os.path.isfile(os.path.join(root, "journal.jsonl")):
        raise GridError(f"{root} has no journal to tabulate; run the grid first")
    with lock_root(root):
        saved, done = read_journal(os.path.join(root, "journal.jsonl"), log)
        if saved is None:
            raise GridError(f"{root} has no journal to tabulate; run the grid first")
        results = build_results(saved, done, "n/a", 0.0, family)
        report.write_report(root, results, plot, log)
    return results


def main(argv=None) -> int:
    """``python -m bnn.evidence``: 0, 1 when a cell crashed, 2 for a refused setting or a failed write."""
    args, code = _parser().parse(argv)
    if args is None:
        return code

    def log(line):
        print(line, file=sys.stderr, flush=True)

    try:
        root, base, cells = setup(args)
        if args.table_only:
            results = table_only(root, args.plot, log, args.family)
        else:
            check_data(base)  # a split the data set cannot hold is refused before the root is made
            results = run_grid(root, base, cells, progress=not args.no_progress, plot=args.plot, log=log,
                               jobs=args.jobs, family=args.family)
    except (GridError, OSError) as exc:  # OSError: a journal or report write failed (a full disk)
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results))
    else:
        print(report.markdown(results))
        print(f"report written to {root}/results.md, results.json" + (", accuracy.png" if args.plot else ""))
    return 1 if any(r["error"] for r in results["rows"]) else 0  # a crashed cell is not a result


if __name__ == "__main__":
    sys.exit(main())
