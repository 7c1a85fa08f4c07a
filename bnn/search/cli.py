"""``python -m bnn.search``: the paper's GA search over similarity measures (see --help)."""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import fields
from pathlib import Path

from refimpl.cli import (
    OneLineParser,
    fraction,
    nonnegative_int,
    one_line,
    positive_float,
    positive_int,
    refuse_with,
    seed_int,
)
from refimpl.conventions import NAMES as COUNT_CONVENTIONS
from refimpl.datasets import DATASETS, canonical_name, dataset_arg

from ..common.runlock import hold_run_dir
from ..settings import DEFAULT_MODEL, FITNESS, MEASURE_IMPLS, PAPER_POPULATION, STEPS
from . import journal as jr
from .fitness import fitness_config, parse_fitness_spec
from .ga import Thresholds
from .ladder import parse_rungs
from .loop import SEARCH_FIELDS, Search, SearchConfig
from .report import prepare_outputs

# Presets. "digits" (no arguments) is sized to finish in under 10 minutes on 2 CPU cores with
# the digits network; "paper" is the paper's setting (docs/design.md section 7).
PRESETS = {
    "digits": dict(dataset="digits", model="digits_net", epochs=3, population=6,
                   # On digits almost every random measure scores the majority-class rate of the
                   # validation split (~0.14) after one epoch, so a threshold above it would keep
                   # initialization going for most of the budget. T = 0 keeps any random measure
                   # that learns anything for the first 8 evaluations (initialization), then 0.15
                   # rejects the ones stuck at the majority class after one epoch.
                   thresholds=[0.0, 0.15], threshold_steps=[0, 8], max_evaluations=150, max_trainings=60,
                   max_minutes=6.0, patience=None),
    "paper": dict(dataset="cifar10", model=DEFAULT_MODEL["cifar10"], epochs=FITNESS.epochs,
                  population=PAPER_POPULATION, thresholds=list(FITNESS.thresholds),
                  threshold_steps=list(FITNESS.threshold_steps), max_evaluations=None, max_trainings=None, max_minutes=None, patience=200),
}
# Flags that only steer the run (allowed to change on --resume); the rest define the search.
RUN_CONTROL = ("max_evaluations", "max_trainings", "patience", "max_minutes", "workers", "workers_per_device", "backend",
               "ray_address",
               "data_dir", "device", "step")


class CliError(Exception):
    """A refused command line: reported as one ``error:`` line with exit status 2."""


class _Parser(OneLineParser):
    def error(self, message):  # one line, exit 2, as argparse does, but without the usage block
        raise CliError(f"{message}{self._suggestion(message)}")


def _floats(text):
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


_positive = positive_int


def _rungs(text):
    try:
        return parse_rungs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--rungs: ")) from None


def _preset_limit(key: str) -> str:
    # " (digits preset: 150, paper preset: none)": what each preset sets, read from PRESETS.
    parts = [f"{name} preset: {'none' if p.get(key) is None else f'{p[key]:g}'}" for name, p in sorted(PRESETS.items())]
    return " (" + ", ".join(parts) + ")"


def _csv(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
# Flags that start or shape a new search, which --resume takes from the journal's folder instead.
NEW_RUN_ONLY = ("run_dir", "preset")


def _add_training_flags(t) -> None:
    """The flags of the fitness trainings (the parser's "fitness training" group ``t``)."""
    t.add_argument("--dataset", type=dataset_arg, metavar="{" + ",".join(DATASETS) + "}",
                   help="data set of the fitness trainings (default: the preset's)")
    t.add_argument("--data-dir", help="folder holding the data files (default: $BNN_DATA_DIR or ./data)")
    t.add_argument("--download", action="store_true",
                   help="download the data set if it is missing (MNISTs: official files, SHA-256 checked; CIFAR: torchvision)")
    t.add_argument("--model", help="digits_net, mnist_net, resnet18, resnet34, vgg13, nin (default: the data set's)")
    t.add_argument("--downsample", choices=("binary", "real"),
                   help="shortcut of units that change size or width (docs/design.md section 6): binary (default, the paper's text) "
                        "or real (Bi-Real: average pool, full-precision 1x1 conv)")
    t.add_argument("--counts", choices=COUNT_CONVENTIONS,
                   help="count convention of every candidate (docs/design.md section 2): raw (default, the paper's "
                        "equations), freq (a/n, ...) or laplace ((a+1)/(n+4), ...)")
    t.add_argument("--measure-impl", choices=MEASURE_IMPLS,
                   help="how the measure runs in a fitness training (bnn.train --measure-impl): eager (the search's "
                        "default) or fused (each new genome's kernels compile first, about 1 s: 1.21x the default "
                        "search's time, 0.74x eager's for 15-epoch trainings under raw counts; "
                        "bench/bench_search_measure.py); fixed by the journal on --resume")
    t.add_argument("--epochs", type=_positive, help=f"epochs of a full fitness training (digits preset: {PRESETS['digits']['epochs']}, "
                                                    f"paper: {FITNESS.epochs})")
    t.add_argument("--batch-size", type=_positive, help=f"batch size (default {FITNESS.batch_size})")
    t.add_argument("--lr", type=positive_float, help=f"Adam learning rate, constant, a finite number > 0 (default {FITNESS.lr:g})")
    t.add_argument("--val-size", type=nonnegative_int,
                   help="validation images held out of the training set, 0..(training images - 1) "
                        "(default: 10%% for digits, else 5000)")
    t.add_argument("--train-size", type=_positive,
                   help="training images per fitness training, a seeded subset of the training split (default: all)")
    t.add_argument("--train-seed", type=seed_int, help="seed of every fitness training, 0..2**63-1 (default 0)")
    t.add_argument("--device", help="auto, cpu, cuda or cuda:N (default auto)")
    t.add_argument("--step", choices=STEPS,
                   help="how a fitness training step runs (bnn.train --step): eager, compiled (one compiled graph for "
                        "every genome), graphs (CUDA graphs, a compile per genome); default auto: compiled on CUDA, "
                        "eager on the CPU")
    t.add_argument("--fitness", help=argparse.SUPPRESS)  # testing: synthetic:SEED[,delay=S][,die_once=PATH]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m bnn.search`` (flags in the groups search, fitness training, running)."""
    p = _Parser(
        prog="python -m bnn.search",
        description="Search similarity measures for BNNs with the paper's genetic algorithm (Algorithm 1). "
                    "With no arguments: a small search on the embedded digits data set (a few minutes on a CPU).",
    )
    a = p.add_argument
    a("--preset", choices=sorted(PRESETS),
      help=f"digits (default): small CPU search; paper: CIFAR-10, ResNet-18, S={PAPER_POPULATION}, "
           f"{FITNESS.epochs} epochs, the paper's thresholds, all GPUs")
    g = p.add_argument_group("search")
    g.add_argument("--population", type=_positive, help=f"population size S (digits preset: {PRESETS['digits']['population']}, paper: {PAPER_POPULATION})")
    g.add_argument("--seed", type=seed_int, help="GA seed, 0..2**63-1 (default 0)")
    g.add_argument("--thresholds", type=_floats, help=f"early-rejection thresholds T as fractions, e.g. {_csv(FITNESS.thresholds)} (the paper's)")
    g.add_argument("--threshold-steps", type=_ints,
                   help=f"evaluation index at which each threshold takes over, e.g. {_csv(FITNESS.threshold_steps)}")
    g.add_argument("--max-evaluations", type=_positive, help=f"stop after this many candidates (cache hits count){_preset_limit('max_evaluations')}")
    g.add_argument("--max-trainings", type=_positive, help=f"stop after this many trainings{_preset_limit('max_trainings')}")
    g.add_argument("--max-minutes", type=positive_float,
                   help="stop proposing after this many minutes, a finite number > 0 (running trainings finish; "
                        f"--resume continues){_preset_limit('max_minutes')}")
    g.add_argument("--patience", type=_positive,
                   help=f"stop after K consecutive children fail to enter the population{_preset_limit('patience')}")
    g.add_argument("--paper-faithful", action="store_true",
                   help="Algorithm 1 as written: no cache, no functional equivalence, no screening (every "
                        "candidate is trained), and a genome already in the population may enter again")
    f = p.add_argument_group("fitness design (bnn/search/ladder.py; default: Algorithm 1's one training)")
    f.add_argument("--rungs", type=_rungs, metavar="E:N[:K],...",
                   help="multi-fidelity fitness: every candidate trains E epochs on N images (or 'all') with K seeds "
                        "on the first rung; the best --promote fraction climbs to the next, dearer rung; the GA "
                        "ranks by the rung reached, then the score there. Replaces --epochs and --train-size")
    f.add_argument("--paired", action="store_true", default=None,
                   help="score = validation accuracy minus XNOR's on the same seed, images and epochs (XNOR trained "
                        "once per rung and seed)")
    f.add_argument("--promote", type=fraction, help="fraction of each rung promoted to the next, in (0, 1] (default 1/3)")
    g.add_argument("--no-cache", action="store_true", help="train genomes seen before again")
    g.add_argument("--no-equivalence", action="store_true", help="do not reuse fitness of functionally equal measures")
    g.add_argument("--no-screening", action="store_true", help="train constant and mostly non-finite measures too")
    g.add_argument("--reuse", action="append", metavar="RUN_DIR", default=None,
                   help="reuse trainings journaled by an earlier run of the same training setting (repeatable)")
    _add_training_flags(p.add_argument_group("fitness training"))
    r = p.add_argument_group("running")
    r.add_argument("--workers", type=_positive, help="parallel workers (one per GPU; default: GPUs for --preset paper, else 1)")
    r.add_argument("--workers-per-device", type=_positive, metavar="K",
                   help="K workers on each CUDA device the fitness trains on (all visible ones for --device auto or "
                        "cuda, the one named by cuda:N), each pinned to its device: K x devices in all, trainings "
                        "sharing a GPU at once (ray: K actors per GPU, num_gpus=1/K each). Where the fitness trains "
                        "on the CPU (--device cpu, no CUDA, digits), the CPU is the one device: K CPU workers sharing "
                        "its cores. Implies --backend local unless ray; not with --workers")
    r.add_argument("--backend", choices=("serial", "local", "ray"),
                   help="serial (in process; the default with one worker), local (worker processes; the default "
                        "with --workers above 1), ray (actors; needs the [ray] extra)")
    r.add_argument("--ray-address", help="address of an existing Ray cluster (default: start a local one)")
    r.add_argument("--run-dir", help="where the journal and results go (default runs/search-DATASET-MODEL-TIME)")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue the search journaled in RUN_DIR (with its settings; "
                                                       "not with --run-dir or --preset)")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object on the last stdout line")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _config_from_args(args) -> tuple[SearchConfig, Path, bool]:
    if args.workers_per_device and args.backend == "serial":
        raise CliError("--workers-per-device starts worker processes; --backend serial trains in this process "
                       "(use --backend local or ray, or drop --backend)")
    explicit = {f.name: getattr(args, f.name) for f in fields(SearchConfig)
                if getattr(args, f.name, None) is not None}
    ladder = [f"--{k}" for k in ("rungs", "paired", "promote") if getattr(args, k, None)]
    if ladder and args.paper_faithful:
        raise CliError(f"--paper-faithful is Algorithm 1's one training per candidate; drop {ladder[0]}")
    if args.rungs and {"epochs", "train_size"} & set(explicit):
        raise CliError("--rungs sets each rung's epochs and images; drop --epochs and --train-size")
    if ladder and args.reuse:
        raise CliError(f"--reuse reads one-training journals; it cannot feed {ladder[0]}")
    if args.rungs:  # the first rung is the search's own budget (what its threshold T judges)
        explicit.update(epochs=args.rungs[0]["epochs"], train_size=args.rungs[0]["train_size"])
    if args.paper_faithful:
        explicit.update(cache=False, equivalence=False, screening=False, unique_members=False)
    for flag, key in (("no_cache", "cache"), ("no_equivalence", "equivalence"), ("no_screening", "screening")):
        if getattr(args, flag):
            explicit[key] = False
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / jr.JOURNAL).exists():
            raise CliError(f"--resume {run_dir}: no {jr.JOURNAL} there")
        stored = Search.config_from_journal(run_dir)
        for k, v in explicit.items():
            if k in SEARCH_FIELDS and k in stored and stored[k] != v:
                raise CliError(f"--resume: {k} is {stored[k]!r} in the journal; it cannot change to {v!r} "
                               "(only run-control flags may: " + ", ".join(RUN_CONTROL) + ")")
        base = {**stored, **{k: v for k, v in explicit.items() if k in RUN_CONTROL}}
        if "workers" in explicit:
            base["workers_per_device"] = None  # --workers now replaces a journaled --workers-per-device
        try:  # a key this version has no setting for is refused, not dropped
            return SearchConfig.from_mapping(base), run_dir, True
        except ValueError as exc:
            raise CliError(f"--resume {run_dir}: {exc}") from None
    args.preset = args.preset or "digits"
    preset = dict(PRESETS[args.preset])
    if "dataset" in explicit and "model" not in explicit and explicit["dataset"] != preset["dataset"]:
        # Another data set without a model: the network the training code pairs with it.
        explicit["model"] = DEFAULT_MODEL[explicit["dataset"]]
    base = {**preset, **explicit}
    if args.preset == "paper" and "workers" not in explicit:
        from .loop import visible_gpus

        base["workers"] = max(1, len(visible_gpus()))
    cfg = SearchConfig.from_mapping(base)
    if "threshold_steps" not in explicit and "thresholds" in explicit:
        # New thresholds without steps: spread as the preset's steps if the count matches.
        steps = preset.get("threshold_steps", [0])
        cfg.threshold_steps = steps if len(steps) == len(cfg.thresholds) else (
            [0] if len(cfg.thresholds) == 1 else None)
        if cfg.threshold_steps is None:
            raise CliError(f"--thresholds has {len(cfg.thresholds)} values; give --threshold-steps too")
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        run_dir = Path("runs") / f"search-{cfg.dataset}-{cfg.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (run_dir / jr.JOURNAL).exists():
        hold_run_dir(run_dir, create=False).release()  # a running search's folder: say that first
        raise CliError(f"--run-dir {run_dir} already holds a search journal; use --resume {run_dir} to continue it")
    return cfg, run_dir, False


def _validate(cfg: SearchConfig, download: bool = False) -> None:
    Thresholds(cfg.thresholds, cfg.threshold_steps)
    if cfg.max_minutes is not None and not cfg.max_minutes > 0:
        raise CliError(f"--max-minutes must be positive, got {cfg.max_minutes}")
    if cfg.population < 2:
        raise CliError(f"--population must be at least 2, got {cfg.population}")
    spec = parse_fitness_spec(cfg.fitness)
    if cfg.backend == "serial" and (cfg.workers > 1 or cfg.workers_per_device):
        cfg.backend = "local"  # --workers N or --workers-per-device K alone means local worker processes
    if cfg.backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise CliError("--backend ray needs Ray: pip install 'bnn-measure-search[ray]'") from None
    if not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", cfg.device):
        raise CliError(f"--device {cfg.device!r}: expected auto, cpu, cuda or cuda:N")
    for d in cfg.reuse:
        if not (Path(d) / jr.JOURNAL).exists():
            raise CliError(f"--reuse {d}: no {jr.JOURNAL} there")
    if spec["kind"] == "train":
        _validate_training(cfg, download)


def _validate_training(cfg: SearchConfig, download: bool = False) -> None:
    """Fail on a bad model, data set or data directory before any file is written; download
    a missing data set first if asked."""
    try:
        from bnn.data import check_split_sizes, read_arrays
    except ImportError as exc:
        raise CliError(f"the training code (bnn.train) is not available: {exc}") from None
    try:
        key = canonical_name(cfg.dataset)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        # Every fitness training's settings (seed range, lr, the device) are checked here, once.
        fitness_config(cfg.train_dict(), "baseline").validate()
        # A missing or corrupt data set, or a split it cannot hold, fails here, not in a worker.
        train_y = read_arrays(key, cfg.data_dir, download)[1]
        for size in {cfg.train_size, *(r["train_size"] for r in cfg.rungs or ())}:  # every rung's subset
            check_split_sizes(key, len(train_y), cfg.val_size, size)
    except Exception as exc:  # noqa: BLE001 - any of them is a bad input, reported in one line
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(msg) from None


def _lock_resumed(args):
    """--resume: lock the run folder before its journal is read, so replay sees a stable file."""
    if not args.resume:
        return None
    run_dir = Path(args.resume)
    if not (run_dir / jr.JOURNAL).exists():
        raise CliError(f"--resume {run_dir}: no {jr.JOURNAL} there")
    return hold_run_dir(run_dir, create=False)


def _lock_new(run_dir: Path):
    """A new run: locked after validation (a bad setting leaves no folder), then checked again
    under the lock, since another search may have started in it meanwhile."""
    lock = hold_run_dir(run_dir)
    if (run_dir / jr.JOURNAL).exists():
        lock.release()
        raise CliError(f"--run-dir {run_dir} already holds a search journal; use --resume {run_dir} to continue it")
    return lock


def main(argv=None) -> int:
    """Run ``python -m bnn.search`` with ``argv``; returns the exit status (0, 2 for refused input, 130 for Ctrl-C)."""
    prog = "bnn.search"
    lock = None
    try:
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            refuse_with(parser.given(argv), "workers_per_device", ("workers",),
                        "--workers-per-device sets the number of workers (K x devices)")
            refuse_with(parser.given(argv), "resume", NEW_RUN_ONLY,
                        "--resume continues the search in its own folder with the journal's settings")
            lock = _lock_resumed(args)
            cfg, run_dir, resuming = _config_from_args(args)
            _validate(cfg, download=args.download)
            search = Search(cfg, run_dir, progress=not args.no_progress and not args.json)
            search.load_reuse()  # before the folder is made: a refused --reuse leaves nothing behind
            lock = lock or _lock_new(run_dir)
            prepare_outputs(run_dir)
            if resuming:
                search.resume()
            else:
                search.start_new()
        except (CliError, ValueError, jr.JournalError, OSError) as exc:
            print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"{prog}: interrupted (Ctrl-C) before the first evaluation", file=sys.stderr)
            return 130
        code = 0
        try:
            search.run()
        except KeyboardInterrupt:
            search.stop_reason = "interrupted (Ctrl-C); continue with --resume " + str(run_dir)
            code = 130
        except OSError as exc:  # a journal write failed (a full disk): what is journaled stays resumable
            print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
            return 2
        try:
            return _report(search, args, code)
        except OSError as exc:  # results.json or search.png could not be written; the old ones are intact
            print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # a second Ctrl-C: the journal already holds every result
            print(f"{prog}: interrupted while writing the report; continue with --resume {run_dir}", file=sys.stderr)
            return 130
    finally:
        if lock is not None:
            lock.release()  # held until results.json is written: one writer per run folder


def _report(search: Search, args, code: int) -> int:
    from .report import leaderboard_text, next_steps, write_plot, write_results

    print(leaderboard_text(search), flush=True)
    print(f"stopped: {search.stop_reason}", file=sys.stderr)
    path = write_results(search)
    print(f"wrote {path}", file=sys.stderr)
    print(write_plot(search), file=sys.stderr)
    if code == 0:  # a finished search; an interrupted one is told how to resume
        for line in next_steps(search):
            print(line, file=sys.stderr)
    if args.json:
        print(json.dumps(search.summary(), separators=(",", ":")), flush=True)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
