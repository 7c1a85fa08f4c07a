"""Train a BNN: ``python -m bnn.train`` and ``train_model(TrainConfig(...))`` for the search.

The command line lives here; the rest, all importable from ``bnn.train`` too, lives in
``bnn.settings`` (hyperparameters, presets), ``bnn.train.config`` (TrainConfig, TrainResult,
devices), ``bnn.train.loop`` (train_model, evaluate) and ``bnn.train.files`` (the run folder).

Accuracies are fractions in 0..1 everywhere (API, metrics.jsonl, JSON output).

Resume is exact on CPU: every random draw of an epoch comes from one CPU ``torch.Generator``
whose state, with the model, optimizer, scheduler and global RNG states, is in the checkpoint
written after every epoch; the metrics history is in the checkpoint too, and ``metrics.jsonl`` is
rewritten from it on resume, so a kill between the two writes cannot duplicate or drop a line.

Run folder: ``metrics.jsonl`` (one JSON object per epoch: epoch, train_loss, train_acc, val_acc,
lr, images_per_s, wall_s, cpu_s, status), ``checkpoint.pt`` and, once finished, ``summary.json``.
``checkpoint.pt`` loads with ``torch.load(path, weights_only=True)`` and holds what export needs:
``model_config`` (arch, measure, num_classes, input_shape, downsample, counts:
``bnn.nn.models.build_model(**...)`` rebuilds the model; a checkpoint without downsample is binary,
one without counts is raw),
``model`` (the state_dict, CPU tensors), ``data`` (class_names, and mean/std in raw pixel units:
the input is ``(pixel - mean[c]) / std[c]``), ``config`` (the TrainConfig), ``status``
("running" or a final status), ``test`` ((top-1, top-5) once done), and for resume ``optimizer``,
``scheduler``, ``rng``, ``epoch``, ``history``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from refimpl.cli import OneLineParser, nonnegative_int, one_line, positive_float, positive_int, refuse_with, seed_int
from refimpl.conventions import NAMES as COUNT_CONVENTIONS
from refimpl.datasets import DATASETS, canonical_name, dataset_arg
from refimpl.engine.format import DOWNSAMPLE_KINDS
from refimpl.genome import Genome

from ..common.runlock import hold_run_dir
from ..settings import (
    DEFAULT_MODEL,
    DEFAULT_PRESET,
    MEASURE_IMPL_BEFORE,
    MEASURE_IMPLS,
    MODEL_NAMES,
    PRESETS,
    STEPS,
)

if TYPE_CHECKING:  # annotations only: the module imports no torch
    from .config import TrainConfig

# torch (3-7 s of CPU to import) loads only once the arguments are parsed and checked: ``--help``
# and a refused argument never pay it. The run's modules are imported where they are used.

# =============================================================================================
# Command line


def _per_dataset(choice: dict) -> str:
    # "digits_net for digits, mnist_net for mnist and fashion-mnist, ...", from the settings' table.
    by_value: dict[str, list[str]] = {}
    for dataset, value in choice.items():
        by_value.setdefault(value, []).append(dataset)
    return ", ".join(f"{value} for {' and '.join(names)}" for value, names in by_value.items())


def _per_preset(key: str) -> str:
    # "digits 30, mnist 6, ...": each preset's value, read from bnn.settings.PRESETS.
    def text(v):
        if isinstance(v, tuple):
            return ",".join(map(str, v)) or "none"
        return f"{v:g}" if isinstance(v, float) else str(v)

    return ", ".join(f"{name} {text(values[key])}" for name, values in PRESETS.items())


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m bnn.train", description="Train a binarized network with a searched similarity measure.")
    p.add_argument("--model", help=f"one of {', '.join(MODEL_NAMES)} (default: {_per_dataset(DEFAULT_MODEL)})")
    p.add_argument("--dataset", default="digits", type=dataset_arg, metavar="{" + ",".join(DATASETS) + "}",
                   help="digits (default, embedded), mnist, fashion-mnist (IDX files), cifar10 or cifar100")
    p.add_argument("--data-dir", help="folder holding the data files (default: $BNN_DATA_DIR or ./data)")
    p.add_argument("--download", action="store_true",
                   help="download the data set if it is missing (MNISTs: the official files, SHA-256 checked; "
                        "CIFAR: with torchvision)")
    p.add_argument("--measure", default="baseline", help="genome: a name (baseline, M1..M10), '0-0-0-0-0-0-1' or '0000001'")
    p.add_argument("--downsample", choices=DOWNSAMPLE_KINDS, default="binary",
                   help="shortcut of the units that change size or width (docs/design.md section 6): binary (default, the paper's "
                        "text: a binary 1x1 conv) or real (Bi-Real: 2x2 average pool, full-precision 1x1 conv)")
    p.add_argument("--counts", choices=COUNT_CONVENTIONS, default="raw",
                   help="count convention: how a, b, c, d enter the measure (docs/design.md section 2): raw (default, "
                        "the paper's equations), freq (a/n, ...), laplace ((a+1)/(n+4), ...)")
    p.add_argument("--measure-grad-clip", type=positive_float, metavar="C",
                   help="clip the gradients reaching every binary layer's measure inputs a, b, c, d to [-C, C] (NaN to "
                        "0) in training; the forward is unchanged (docs/design.md section 6; default: off)")
    p.add_argument("--measure-impl", choices=MEASURE_IMPLS,
                   help="how the measure runs in training (docs/design.md section 6): fused (default: one Numba pass "
                        "forward and one backward, bnn/nn/measure_fused.py, on float32 CPU counts; eager elsewhere: "
                        "CUDA, --step compiled) or eager (torch operators, one pass each; what a run recorded before "
                        "this option trained with); the two agree to float32 rounding, not to the bit")
    p.add_argument("--preset", help=f"one of {', '.join(PRESETS)} (default: {_per_dataset(DEFAULT_PRESET)})")
    p.add_argument("--epochs", type=positive_int, help=f"epochs (default: the preset's: {_per_preset('epochs')})")
    p.add_argument("--batch-size", type=positive_int, help=f"batch size (default: the preset's: {_per_preset('batch_size')})")
    p.add_argument("--lr", type=positive_float,
                   help=f"Adam learning rate, a finite number > 0 (default: the preset's: {_per_preset('lr')})")
    p.add_argument("--milestones", help="comma-separated epochs after which the lr is multiplied by gamma "
                                        f"(default: the preset's: {_per_preset('milestones')})")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the initialization and data order, 0..2**63-1")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (CUDA if available; CPU for digits)")
    p.add_argument("--out", help="run folder for metrics.jsonl, checkpoint.pt, summary.json (default: runs/DATASET-MODEL-MEASURE-sSEED)")
    p.add_argument("--val-size", type=nonnegative_int,
                   help="validation images held out of train, 0..(training images - 1) (default: 10%% digits, else 5000)")
    p.add_argument("--train-size", type=positive_int, help="train on a seeded subset of this many of the remaining images")
    p.add_argument("--resume", metavar="OUT", help="continue the run in folder OUT from its checkpoint; a finished "
                                                   "run is reported as it is (exit 0), not retrained or rewritten "
                                                   "(--epochs above its epochs extends an ok run)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in --out (without it such a folder is refused)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line of stdout")
    p.add_argument("--step", choices=STEPS, default="auto",
                   help="how a training step runs: eager; compiled (torch.compile, the measure as one operator so a "
                        "new genome needs no recompile, full batches, fused Adam on CUDA); graphs (the same with "
                        "CUDA graphs, the genome compiled in); auto = compiled on CUDA, eager on the CPU (default)")
    p.add_argument("--compile", action="store_true", help="the same as --step compiled")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or per-epoch lines on stderr")
    return p


def config_from_args(args, ckpt: dict | None = None) -> TrainConfig:
    """The TrainConfig of parsed command-line ``args``: a preset with overrides, or the resumed run's own."""
    from .config import TrainConfig
    from .files import CHECKPOINT, load_checkpoint

    if args.resume:
        ckpt = ckpt or load_checkpoint(os.path.join(args.resume, CHECKPOINT))
        saved = dict(ckpt["config"])
        saved.update(out_dir=args.resume, resume=True)
        saved.setdefault("measure_impl", MEASURE_IMPL_BEFORE)  # written before the setting: trained eager
        if args.epochs is not None:
            saved["epochs"] = args.epochs  # extending a finished run is allowed
        if args.device != "auto":
            saved["device"] = args.device
        try:  # a key this version has no setting for is refused, not dropped
            return TrainConfig.from_mapping(saved)
        except ValueError as exc:
            raise ValueError(f"{args.resume}/{CHECKPOINT}: {exc}") from None
    dataset = canonical_name(args.dataset)
    preset = args.preset or DEFAULT_PRESET.get(dataset)
    if preset is None:
        raise ValueError(f"no default preset for {dataset}; pass --preset (one of {', '.join(PRESETS)})")
    model = args.model or DEFAULT_MODEL[dataset]
    measure = str(Genome.parse(args.measure))
    overrides = {k: v for k, v in (("epochs", args.epochs), ("batch_size", args.batch_size), ("lr", args.lr)) if v is not None}
    if args.milestones is not None:
        try:
            overrides["milestones"] = tuple(int(v) for v in args.milestones.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"--milestones must be comma-separated integers, got {args.milestones!r}") from None
    name = Genome.parse(measure).name or measure
    kind = ("" if args.downsample == "binary" else f"-{args.downsample}") + ("" if args.counts == "raw" else f"-{args.counts}")
    out = args.out or os.path.join("runs", f"{dataset}-{model}-{name}{kind}-s{args.seed}")
    return TrainConfig.from_preset(
        preset, model=model, dataset=dataset, measure=measure, downsample=args.downsample, counts=args.counts,
        measure_grad_clip=args.measure_grad_clip, seed=args.seed,
        device=args.device, **({} if args.measure_impl is None else {"measure_impl": args.measure_impl}),
        data_dir=args.data_dir, val_size=args.val_size, train_size=args.train_size, out_dir=out,
        compile=args.compile, step=args.step, download=args.download, **overrides,
    )


def _refuse_existing_run(out_dir: str) -> None:
    # The default --out is the same for the same data set, model, measure and seed: a rerun with
    # other settings would silently replace the first run.
    from .files import CHECKPOINT, SUMMARY

    if os.path.exists(os.path.join(out_dir, SUMMARY)):
        raise ValueError(f"{out_dir} holds a finished run ({SUMMARY}); pass --overwrite to replace it, "
                         "or choose another --out")
    if os.path.exists(os.path.join(out_dir, CHECKPOINT)):
        raise ValueError(f"{out_dir} holds an unfinished run ({CHECKPOINT}); continue it with --resume {out_dir}, "
                         "or pass --overwrite to start it over")


# What --resume takes from the checkpoint: given with it, they would be ignored, so they are refused.
RESUME_FIXED = ("out", "model", "dataset", "data_dir", "download", "measure", "downsample", "counts", "measure_grad_clip",
                "measure_impl", "preset",
                "batch_size", "lr",
                "milestones", "seed", "val_size", "train_size", "compile", "step")


# Tests set this to simulate a kill: the process exits abruptly right after that epoch's
# checkpoint, so a second process must resume from the files alone.
_KILL_ENV = "BNN_TRAIN_KILL_AFTER_EPOCH"


def main(argv=None) -> int:
    """Run ``python -m bnn.train`` with ``argv``; returns the exit status (0, or 2 for refused input)."""
    parser = _parser()
    args, code = parser.parse(argv)
    if args is None:
        return code
    kill_after = int(os.environ[_KILL_ENV]) if os.environ.get(_KILL_ENV) else None
    from .config import check_settings
    from .files import CHECKPOINT, json_safe, load_checkpoint, run_finished
    from .loop import train_model

    lock = None
    try:
        refuse_with(parser.given(argv), "resume", RESUME_FIXED,
                    "--resume continues OUT with the settings it started with (--epochs and --device may change)")
        # One writer per run folder: --resume locks before the checkpoint is read, --out once the
        # settings are valid (a bad setting leaves no folder); held until the process ends.
        lock = hold_run_dir(args.resume, create=False) if args.resume and os.path.isdir(args.resume) else None
        if args.overwrite and args.resume:
            raise ValueError("--overwrite starts the run in --out over and --resume continues one; pass one of them")
        ckpt = load_checkpoint(os.path.join(args.resume, CHECKPOINT)) if args.resume else None
        cfg = config_from_args(args, ckpt)
        check_settings(cfg, data_sizes=not args.resume)  # a resumed run's sizes were checked at its start
        if lock is None and cfg.out_dir:
            lock = hold_run_dir(cfg.out_dir)
            if not args.overwrite:
                _refuse_existing_run(cfg.out_dir)
        if ckpt is not None and run_finished(ckpt, cfg.epochs):
            print(f"{args.resume} is a finished run ({ckpt['status']}, {ckpt['epoch']} epochs): nothing was trained "
                  "or rewritten; pass --epochs N above its epochs to extend an ok run", file=sys.stderr)
        result = train_model(cfg, progress=not args.no_progress, _stop_after_epoch=kill_after)
        if result.status == "running":
            sys.stdout.flush()
            os._exit(137)
    except (ValueError, FileNotFoundError, OSError) as exc:
        if lock is not None:
            lock.release()
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    if lock is not None:
        lock.release()  # the run's files are all written
    summary = {k: result.to_dict()[k] for k in ("status", "epochs", "val_acc", "test_acc", "test_top5", "wall_s")}
    summary.update(model=cfg.model, dataset=cfg.dataset, measure=cfg.measure, downsample=cfg.downsample, counts=cfg.counts,
                   measure_grad_clip=cfg.measure_grad_clip, measure_impl=cfg.measure_impl, seed=cfg.seed, out=cfg.out_dir)
    if args.json:
        print(json.dumps(json_safe(summary)))
    else:
        test = "n/a" if result.test_acc is None else f"{100 * result.test_acc:.2f}%"
        print(f"{result.status}: {cfg.model} on {cfg.dataset} with {cfg.measure} ({cfg.downsample} downsampling, "
              f"{cfg.counts} counts{'' if cfg.measure_grad_clip is None else f', measure-grad-clip {cfg.measure_grad_clip:g}'}), "
              f"{result.epochs} epochs, "
              f"test accuracy {test}, {result.wall_s:.1f} s; run folder {cfg.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
