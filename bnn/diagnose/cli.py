"""Why does a measure diverge? ``python -m bnn.diagnose`` (docs/design.md section 6, diagnosis).

It trains the first ``--steps`` optimizer steps exactly as ``python -m bnn.train`` does with the
same settings (the same TrainConfig, initialization, Adam, data order, augmentation and lr schedule;
the eager step; no validation between epochs, which changes nothing in training), with every
binary layer instrumented (``bnn/diagnose/probe.py``), and reports per binary layer: degenerate
windows (input bits all 0 or all 1; zero, subnormal or infinite divisors of the measure's
division nodes), the range of the measure's values and their non-finite share, the per-channel
variance entering BatchNorm, and the largest gradient norms reaching the layer's input bits,
weights, alpha and the measure's inputs a, b, c, d; then the first step, layer and operator
(U1..U4, B1..B3, the count convention, the counts' backward, BatchNorm) where a value (forward)
or a gradient (backward) stops being finite, with the numbers at the first such element. Training
goes on after it, as ``bnn.train`` would, until the loss is not finite (``bnn.train``'s
``diverged``) or the steps are done.
"""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from refimpl.cli import OneLineParser, nonnegative_int, positive_float, positive_int, seed_int
from refimpl.conventions import NAMES as COUNT_CONVENTIONS
from refimpl.conventions import check_counts
from refimpl.datasets import DATASETS, canonical_name, dataset_arg
from refimpl.engine.format import DOWNSAMPLE_KINDS
from refimpl.genome import Genome

from ..evidence.protocol import PROTOCOLS
from ..settings import DEFAULT_MODEL, DEFAULT_PRESET, MODEL_NAMES, PRESETS

if TYPE_CHECKING:  # annotations only: the module imports no torch
    from ..train.config import TrainConfig

# The instrumented training (bnn/diagnose/run.py) and torch load once the arguments are parsed:
# ``--help`` and a refused argument import no torch.

# Defaults: the evidence grid's protocol (bnn.evidence.PROTOCOLS: for Fashion-MNIST 8,000 images, batch
# 128, lr 5e-3, x0.2 after epoch 2) and its epochs as steps (3 x 63 = 189), where a cell diverges or not;
# a data set without a protocol takes bnn.train's preset and DEFAULT_STEPS.
DEFAULT_STEPS = 200


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m bnn.diagnose",
                      description="Train the first steps of a BNN instrumented, and say where and why a measure "
                                  "stops being finite (docs/design.md section 6).")
    p.add_argument("--measure", default="baseline",
                   help="comma-separated genomes: names (baseline, M1..M10) or codes ('3-0-3-0-0-1-6'); default baseline")
    p.add_argument("--counts", default="raw",
                   help=f"comma-separated count conventions ({', '.join(COUNT_CONVENTIONS)}); default raw")
    p.add_argument("--dataset", default="fashion-mnist", type=dataset_arg, metavar="{" + ",".join(DATASETS) + "}",
                   help="data set (default fashion-mnist)")
    p.add_argument("--data-dir", help="folder holding the data files (default: $BNN_DATA_DIR or ./data)")
    p.add_argument("--download", action="store_true", help="download the data set if it is missing, as bnn.train")
    p.add_argument("--model", choices=MODEL_NAMES, help="model (default: the data set's, as bnn.train: mnist_net for fashion-mnist)")
    p.add_argument("--downsample", choices=DOWNSAMPLE_KINDS, default="binary", help="downsampling shortcut (default binary)")
    p.add_argument("--steps", type=positive_int,
                   help="optimizer steps (default: the evidence protocol's epochs, 189 for fashion-mnist; "
                        f"{DEFAULT_STEPS} for a data set without one)")
    p.add_argument("--train-size", type=positive_int,
                   help="seeded subset of training images, as bnn.train (default: the evidence protocol's, 8000)")
    p.add_argument("--val-size", type=nonnegative_int, help="validation images held out, as bnn.train (default its own)")
    p.add_argument("--batch-size", type=positive_int, help="batch size (default: the evidence protocol's, 128)")
    p.add_argument("--lr", type=positive_float, help="Adam learning rate (default: the evidence protocol's, 5e-3)")
    p.add_argument("--milestones", help="comma-separated epochs after which lr *= 0.2 (default: the evidence "
                                        "protocol's, 2)")
    p.add_argument("--measure-grad-clip", type=positive_float,
                   help="train with the measure's input gradients clipped to [-C, C] (bnn.train --measure-grad-clip)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of initialization and data order (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _configs(args) -> tuple[list[TrainConfig], int]:
    # One TrainConfig per (measure, convention), built as bnn.train builds its own, and the steps.
    from ..train.config import TrainConfig

    dataset = canonical_name(args.dataset)
    measures = [str(Genome.parse(m.strip())) for m in args.measure.split(",")]
    conventions = [check_counts(c.strip()) for c in args.counts.split(",")]
    protocol = dict(PROTOCOLS.get(dataset, {}))
    epochs = protocol.pop("epochs", None)
    settings = {**PRESETS[DEFAULT_PRESET[dataset]], **protocol}
    settings.update({k: v for k, v in (("batch_size", args.batch_size), ("lr", args.lr), ("train_size", args.train_size))
                     if v is not None})
    if args.milestones is not None:
        try:
            settings["milestones"] = tuple(int(v) for v in args.milestones.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"--milestones must be comma-separated integers, got {args.milestones!r}") from None
    if args.measure_grad_clip is not None:
        settings["measure_grad_clip"] = args.measure_grad_clip
    configs = [TrainConfig.from_mapping({**settings, "model": args.model or DEFAULT_MODEL[dataset], "dataset": dataset,
                                         "measure": m, "counts": c, "downsample": args.downsample, "seed": args.seed,
                                         "device": args.device, "data_dir": args.data_dir, "val_size": args.val_size, "download": args.download,
                                         # instrumented node by node: the eager measure, whatever the default
                                         "step": "eager", "measure_impl": "eager"})
               for m in measures for c in conventions]
    return configs, args.steps or (epochs * _images_steps(configs[0]) if epochs else DEFAULT_STEPS)


def _images_steps(cfg: TrainConfig) -> int:
    # Steps in one epoch of cfg's training subset (its size from the data set's files when not given).
    from ..train.loop import steps_per_epoch

    images = cfg.train_size
    if images is None:
        from ..data import check_split_sizes, read_arrays

        n = len(read_arrays(cfg.dataset, cfg.data_dir, cfg.download)[1])
        images = n - check_split_sizes(cfg.dataset, n, cfg.val_size, None)
    return steps_per_epoch(images, cfg.batch_size, "eager")


def _settings(cfg: TrainConfig, steps: int) -> dict:
    keys = ("dataset", "model", "downsample", "train_size", "val_size", "batch_size", "lr", "milestones", "gamma", "seed",
            "device")
    return {"steps": steps, **{k: cfg.to_dict()[k] for k in keys}}


def main(argv=None) -> int:
    """Run ``python -m bnn.diagnose`` with ``argv``; 0, or 2 for refused input (one ``error:`` line)."""
    args, code = _parser().parse(argv)
    if args is None:
        return code
    from ..data import load_dataset
    from ..train.config import check_settings, resolve_device
    from .report import render
    from .run import diagnose

    try:
        configs, steps = _configs(args)
        for cfg in configs:
            check_settings(cfg, data_sizes=cfg is configs[0])
        cfg0 = configs[0]
        device = resolve_device(cfg0.device, cfg0.dataset)
        data = load_dataset(cfg0.dataset, cfg0.data_dir, cfg0.val_size, cfg0.split_seed, device, cfg0.download,
                            cfg0.train_size)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    runs = [diagnose(cfg, steps, data, progress=not args.no_progress) for cfg in configs]
    report = {"command": "python -m bnn.diagnose", "settings": _settings(cfg0, steps), "runs": runs}
    if args.json:
        print(json.dumps(report, allow_nan=False, default=_json_default))
    else:
        print(render(report))
    return 0


def _json_default(value):
    raise TypeError(f"not JSON: {type(value).__name__}")


if __name__ == "__main__":
    sys.exit(main())
