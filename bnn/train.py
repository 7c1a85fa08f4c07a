"""Train a BNN: ``python -m bnn.train`` and ``train_model(TrainConfig(...))`` for the search.

Sections in execution order: hyperparameters, config and result, checkpoints, evaluation,
training, command line.

Accuracies are fractions in 0..1 everywhere (API, metrics.jsonl, JSON output).

Resume is exact on CPU: every random draw of an epoch comes from one CPU ``torch.Generator``
whose state, with the model, optimizer, scheduler and global RNG states, is in the checkpoint
written after every epoch; the metrics history is in the checkpoint too, and ``metrics.jsonl`` is
rewritten from it on resume, so a kill between the two writes cannot duplicate or drop a line.

Run folder: ``metrics.jsonl`` (one JSON object per epoch: epoch, train_loss, train_acc, val_acc,
lr, images_per_s, wall_s, status), ``checkpoint.pt`` and, once finished, ``summary.json``.
``checkpoint.pt`` loads with ``torch.load(path, weights_only=True)`` and holds what export needs:
``model_config`` (arch, measure, num_classes, input_shape, downsample:
``bnn.models.build_model(**...)`` rebuilds the model; a checkpoint without downsample is binary),
``model`` (the state_dict, CPU tensors), ``data`` (class_names, and mean/std in raw pixel units:
the input is ``(pixel - mean[c]) / std[c]``), ``config`` (the TrainConfig), ``status``
("running" or a final status), ``test`` ((top-1, top-5) once done), and for resume ``optimizer``,
``scheduler``, ``rng``, ``epoch``, ``history``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch
import torch.nn.functional as F

from refimpl.cli import SEED_MAX, OneLineParser, nonnegative_int, positive_float, positive_int, refuse_with, seed_int
from refimpl.fileio import atomic_file, atomic_write_text, check_output, remove_stale_temps, write_error
from refimpl.genome import Genome

from .data import DATASETS, Dataset, canonical_name, check_split_sizes, dataset_arg, load_dataset, read_arrays
from .models import DOWNSAMPLE_KINDS, MODELS, build_model, check_downsample
from .runlock import hold_run_dir

# =============================================================================================
# Hyperparameters: the only place they are set.
# Adam betas (0.9, 0.999) and no weight decay everywhere (the paper's setting).
PRESETS = {
    # The paper's evaluation tables: 300 epochs, lr 5e-3 divided by 5 at the milestones.
    "paper-eval": dict(epochs=300, batch_size=128, lr=5e-3, milestones=(80, 150, 200, 240, 270), gamma=0.2),
    # The paper's fitness: ResNet-18 on CIFAR-10, 15 epochs at a constant lr 5e-3.
    "fitness": dict(epochs=15, batch_size=128, lr=5e-3, milestones=(), gamma=0.2),
    # The embedded default: 1,293 training images, 11 steps an epoch. The last quarter at a fifth
    # of the lr settles BatchNorm statistics and the weights' signs (baseline, seed 0: 97.5% test at 30
    # epochs, 96.7% at 40 with the step at 30).
    "digits": dict(epochs=30, batch_size=128, lr=5e-3, milestones=(22,), gamma=0.2),
    # MNIST and Fashion-MNIST with mnist_net, sized for 10 minutes on 2 CPU cores: 4 epochs at
    # 5e-3, one at 1e-3, one at 2e-4 (Fashion-MNIST, baseline, seed 0: val 84.1% after epoch 4,
    # 87.8% after 6, test 87.0%; the two steps are worth 3.7 points).
    "mnist": dict(epochs=6, batch_size=128, lr=5e-3, milestones=(4, 5), gamma=0.2),
}
DEFAULT_PRESET = {"digits": "digits", "mnist": "mnist", "fashion-mnist": "mnist", "cifar10": "fitness",
                  "cifar100": "fitness"}
DEFAULT_MODEL = {"digits": "digits_net", "mnist": "mnist_net", "fashion-mnist": "mnist_net",
                 "cifar10": "resnet18", "cifar100": "resnet18"}
ADAM_BETAS = (0.9, 0.999)
EVAL_BATCH = 500  # images per evaluation forward pass; memory only, not accuracy
# On CUDA the loss is checked for NaN/inf every this many steps, not every step: each check
# waits for the GPU, and a diverged run loses at most these steps.
CUDA_FINITE_CHECK_EVERY = 16

STATUSES = ("ok", "rejected", "diverged")
CHECKPOINT, METRICS, SUMMARY = "checkpoint.pt", "metrics.jsonl", "summary.json"
RUN_FILES = (CHECKPOINT, METRICS, SUMMARY)
_DIGITS = PRESETS["digits"]


# =============================================================================================
# Config and result


@dataclass
class TrainConfig:
    """Every setting of one training run; ``validate()`` checks them all."""
    model: str = "digits_net"
    dataset: str = "digits"
    measure: str = "baseline"
    epochs: int = _DIGITS["epochs"]
    batch_size: int = _DIGITS["batch_size"]
    lr: float = _DIGITS["lr"]
    seed: int = 0
    device: str = "cpu"
    data_dir: str | None = None
    val_size: int | None = None  # None: 5000 for CIFAR and the MNISTs, 10% for digits
    train_size: int | None = None  # train on a seeded subset of this many images; None: all
    milestones: tuple[int, ...] = _DIGITS["milestones"]  # epochs after which lr *= gamma
    gamma: float = _DIGITS["gamma"]
    out_dir: str | None = None  # None: no files at all (the search's fitness runs)
    split_seed: int = 0  # chooses the validation split; fixed so every run shares one val set
    eval_test: bool = True  # evaluate the test set at the end of an "ok" run
    compile: bool = False  # torch.compile the model (CUDA)
    resume: bool = False  # continue from out_dir/checkpoint.pt if it exists
    download: bool = False
    downsample: str = "binary"  # binary | real shortcut of a unit that changes size or width (docs/design.md section 6)

    def __post_init__(self) -> None:
        self.milestones = tuple(int(m) for m in self.milestones)

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> "TrainConfig":
        """A config with the preset's hyperparameters, then ``overrides`` on top."""
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        return cls(**{**PRESETS[preset], **overrides})

    def validate(self) -> None:
        """Check every setting (one-line ValueError naming the bad one); canonicalizes measure and dataset."""
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        self.measure = str(Genome.parse(self.measure))
        check_downsample(self.downsample)
        _check_int("epochs", self.epochs, 1)
        _check_int("batch_size", self.batch_size, 1)
        _check_int("seed", self.seed, 0, SEED_MAX)
        _check_int("split_seed", self.split_seed, 0, SEED_MAX)
        for name in ("lr", "gamma"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        self.dataset = canonical_name(self.dataset)
        if self.val_size is not None:
            _check_int("val_size", self.val_size, 0)
        if self.train_size is not None:
            _check_int("train_size", self.train_size, 1)
        resolve_device(self.device, self.dataset)  # an unknown or absent device: one line, nothing run


def _check_int(name: str, value, lo: int, hi: int | None = None) -> None:
    # bool is an int to Python, and 1.7 would be truncated by range(): neither is a count or a seed.
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok or value < lo or (hi is not None and value > hi):
        valid = f">= {lo}" if hi is None else f"in {lo}..{'2**63-1' if hi == SEED_MAX else hi}"
        raise ValueError(f"{name} must be an integer {valid}, got {value!r}")


def check_settings(cfg: TrainConfig, data_sizes: bool = True) -> None:
    """Every setting before a run folder is made: a run that can never succeed is refused in one
    line, not started. ``data_sizes``: also read the data set (NumPy only, nothing on the device)
    to check val_size and train_size against its training split."""
    cfg.validate()
    if data_sizes:
        train_y = read_arrays(cfg.dataset, cfg.data_dir, cfg.download)[1]
        check_split_sizes(cfg.dataset, len(train_y), cfg.val_size, cfg.train_size)


@dataclass
class TrainResult:
    """Outcome of one training: status, validation accuracies, test accuracy, epochs and wall time."""
    status: str  # "ok" | "rejected" | "diverged"
    val_acc: float | None  # last epoch's; for "diverged" the accuracy at the moment it diverged
    val_acc_per_epoch: list[float] = field(default_factory=list)
    test_acc: float | None = None
    epochs: int = 0  # epochs trained; a diverged epoch counts
    wall_s: float = 0.0
    test_top5: float | None = None
    train_loss: float | None = None  # last epoch's mean training loss
    config: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The result as a plain dict (JSON-ready apart from non-finite floats)."""
        return asdict(self)


# =============================================================================================
# Devices, seeds, checkpoints


DEVICES = "auto, cpu, cuda or cuda:N"


def resolve_device(name: str, dataset: str = "digits") -> torch.device:
    """The torch device of ``name`` (auto, cpu, cuda, cuda:N), or a one-line ValueError for an
    unknown name or a CUDA device this machine does not have."""
    if name in (None, "auto"):
        # digits is too small to keep a GPU busy; its default is the CPU.
        name = "cuda" if torch.cuda.is_available() and dataset != "digits" else "cpu"
    m = re.fullmatch(r"cpu|cuda(?::([0-9]+))?", name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(f"device {name!r} is not one of {DEVICES}")
    if name.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"device {name!r}: CUDA is not available on this machine; use cpu or auto")
        if int(m.group(1) or 0) >= count:
            raise ValueError(f"device {name!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return torch.device(name)


def _rng_state(gen: torch.Generator) -> dict:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        # Stored as tensors and plain values so the checkpoint loads with weights_only=True.
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "python": random.getstate(),
        "data": gen.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    gen.set_state(state["data"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_checkpoint(path, model, optimizer, scheduler, gen, cfg, data, epoch, history, status, test):
    ckpt = {
        "format": "bnn-train-checkpoint",
        "version": 1,
        "config": {**asdict(cfg), "milestones": list(cfg.milestones)},
        "model_config": dict(model.config),
        "data": data.describe(),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": _rng_state(gen),
        "epoch": epoch,
        "history": history,
        "status": status,  # "running" until the last epoch, then one of STATUSES
        "test": test,  # (top-1, top-5) once the run is done and the test set was evaluated
    }
    with atomic_file(path) as f:  # temp file, fsync, rename, fsync the folder; a full disk keeps the last one
        torch.save(ckpt, f)


def load_checkpoint(path: str) -> dict:
    """Read a bnn.train checkpoint (weights_only); a missing or foreign file is a one-line error."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a truncated or foreign file
        raise ValueError(f"{path} is not a readable checkpoint ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != "bnn-train-checkpoint":
        raise ValueError(f"{path} is not a bnn.train checkpoint")
    return ckpt


def _write_metrics(path: str, history: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in history))


def _append_metrics(path: str, row: dict) -> None:
    try:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as exc:  # a full disk: one line; the checkpoint's history rebuilds the file on resume
        raise write_error(path, exc) from None


def run_finished(ckpt: dict, epochs: int) -> bool:
    """A checkpoint whose run is over: a final status, and not an "ok" run given more epochs."""
    return ckpt["status"] in STATUSES and not (ckpt["status"] == "ok" and epochs > int(ckpt["epoch"]))


def finished_result(cfg: TrainConfig, ckpt: dict) -> TrainResult:
    """A finished run's result from its checkpoint, its figures as they were recorded (wall_s is
    the run's own); summary.json is written only where a kill left it missing, never rewritten."""
    history = list(ckpt["history"])
    wall = history[-1]["wall_s"] if history and history[-1].get("wall_s") is not None else 0.0
    summary = os.path.join(cfg.out_dir, SUMMARY) if cfg.out_dir else None
    write = summary is not None and not os.path.exists(summary)
    if not write and summary is not None:
        try:  # the summary's wall_s also counts the test evaluation and the last save
            with open(summary) as f:
                recorded = json.load(f).get("wall_s")
            wall = recorded if isinstance(recorded, (int, float)) else wall
        except (OSError, ValueError, AttributeError):
            pass  # unreadable: the last epoch's figure
    return _finish(cfg, ckpt["status"], history, ckpt.get("test"), None, write=write, wall_s=wall)


def _prepare_out_dir(out_dir: str) -> None:
    """Before any work: refuse outputs that are not regular files, remove temp files of killed writers."""
    for name in RUN_FILES:
        check_output(os.path.join(out_dir, name))
    remove_stale_temps(out_dir)


def _start_fresh(out_dir: str) -> None:
    # An earlier run's files go (the CLI refuses them without --overwrite), so a kill during the
    # first epoch cannot leave the old checkpoint to be resumed or its summary to be reported.
    for name in (CHECKPOINT, SUMMARY):
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    _write_metrics(os.path.join(out_dir, METRICS), [])


# =============================================================================================
# Evaluation


@torch.no_grad()
def evaluate(model, data: Dataset, x: torch.Tensor, y: torch.Tensor) -> tuple[float | None, float | None]:
    """(top-1, top-5) accuracy as fractions; (None, None) for an empty split."""
    if len(y) == 0:
        return None, None
    was_training = model.training
    model.eval()
    k = min(5, data.num_classes)
    top1 = top5 = torch.zeros((), dtype=torch.int64, device=y.device)
    for i in range(0, len(y), EVAL_BATCH):
        logits = model(data.normalize(x[i:i + EVAL_BATCH]))
        target = y[i:i + EVAL_BATCH]
        # NaN logits count as wrong (argmax would pick the NaN's index, a random class).
        ok = torch.isfinite(logits).all(dim=1)
        best = logits.topk(k, dim=1).indices
        top1 = top1 + ((best[:, 0] == target) & ok).sum()
        top5 = top5 + ((best == target[:, None]).any(dim=1) & ok).sum()
    model.train(was_training)
    n = len(y)
    return top1.item() / n, top5.item() / n


# =============================================================================================
# Training


def _setup_backend(device: torch.device) -> None:
    if device.type == "cuda":
        # Counts are exact in TF32 (0/1 operands, float32 accumulation; docs/design.md section 1).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True


def _seed_everything(seed: int) -> torch.Generator:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    gen = torch.Generator()
    gen.manual_seed(seed + 1)  # the data stream differs from the init stream
    return gen


def train_model(cfg: TrainConfig, data: Dataset | None = None, reject_below: float | None = None,
                progress: bool = False, _stop_after_epoch: int | None = None) -> TrainResult:
    """Train one model; never raises for a diverging measure (status "diverged").

    ``data``: a preloaded ``bnn.data.load_dataset(...)`` result to share across runs.
    ``reject_below``: after epoch 1, a validation accuracy below it stops the run ("rejected").
    ``_stop_after_epoch``: for tests, return after that epoch's checkpoint as if killed.
    """
    t0 = time.perf_counter()
    cfg.validate()
    device = resolve_device(cfg.device, cfg.dataset)
    _setup_backend(device)
    ckpt_path = metrics_path = None
    if cfg.out_dir:
        os.makedirs(cfg.out_dir, exist_ok=True)
        ckpt_path = os.path.join(cfg.out_dir, CHECKPOINT)
        metrics_path = os.path.join(cfg.out_dir, METRICS)
    ckpt = load_checkpoint(ckpt_path) if cfg.resume and ckpt_path and os.path.isfile(ckpt_path) else None
    if cfg.out_dir:
        _prepare_out_dir(cfg.out_dir)
    if ckpt is not None:
        saved = ckpt["config"]
        for key in ("model", "dataset", "measure", "seed", "split_seed", "batch_size", "lr", "gamma", "train_size"):
            if saved.get(key) != getattr(cfg, key):
                raise ValueError(f"cannot resume {ckpt_path}: it was trained with {key}={saved.get(key)!r}, not {getattr(cfg, key)!r}")
        # A checkpoint written before the option has no key: it trained the binary kind.
        if saved.get("downsample", "binary") != cfg.downsample:
            raise ValueError(f"cannot resume {ckpt_path}: it was trained with "
                             f"downsample={saved.get('downsample', 'binary')!r}, not {cfg.downsample!r}")
        if run_finished(ckpt, cfg.epochs):
            return finished_result(cfg, ckpt)  # reported, not retrained: no data needed

    if data is None:
        data = load_dataset(cfg.dataset, cfg.data_dir, cfg.val_size, cfg.split_seed, device, cfg.download,
                            cfg.train_size)
    elif data.name != cfg.dataset or data.device.type != device.type:
        raise ValueError(f"preloaded data is {data.name} on {data.device}, config wants {cfg.dataset} on {device}")
    elif cfg.val_size is not None and cfg.val_size != data.val_size:
        raise ValueError(f"preloaded data holds out {data.val_size} validation images, config wants {cfg.val_size}")
    elif cfg.train_size != data.train_subset:
        raise ValueError(f"preloaded data has train_size={data.train_subset}, config wants {cfg.train_size}: "
                         "pass the same train_size to load_dataset")

    gen = _seed_everything(cfg.seed)
    model = build_model(cfg.model, cfg.measure, data.num_classes, data.input_shape,
                        downsample=cfg.downsample).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=ADAM_BETAS)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(cfg.milestones), gamma=cfg.gamma)
    history: list[dict] = []
    start_epoch = 0
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        _set_rng_state(ckpt["rng"], gen)
        history, start_epoch = list(ckpt["history"]), int(ckpt["epoch"])
        if metrics_path:
            _write_metrics(metrics_path, history)
    elif cfg.out_dir:
        _start_fresh(cfg.out_dir)
    forward = torch.compile(model) if cfg.compile else model

    status, test = "running", None
    wall_offset = history[-1]["wall_s"] if history else 0.0  # wall_s counts across resumes
    n_train = len(data.train_y)
    steps = math.ceil(n_train / cfg.batch_size)
    check_every = CUDA_FINITE_CHECK_EVERY if device.type == "cuda" else 1
    for epoch in range(start_epoch + 1, cfg.epochs + 1):
        model.train()
        t_epoch = time.perf_counter()
        plan = data.epoch_plan(gen)
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        finite = torch.ones((), dtype=torch.bool, device=device)
        seen = 0
        bar = _progress(steps, f"epoch {epoch}/{cfg.epochs}", progress)
        for step in range(steps):
            idx = plan["perm"][step * cfg.batch_size:(step + 1) * cfg.batch_size]
            x = data.augment(data.train_x[idx], plan["offsets"][idx], plan["flips"][idx])
            y = data.train_y[idx]
            logits = forward(data.normalize(x))
            loss = F.cross_entropy(logits, y)
            finite = finite & torch.isfinite(loss)
            if (step + 1) % check_every == 0 or step == steps - 1:
                if not finite.item():
                    status = "diverged"
                    break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach() * len(y)
            correct += (logits.detach().argmax(1) == y).sum()
            seen += len(y)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - t_epoch
        val_acc, _ = evaluate(model, data, data.val_x, data.val_y)
        row = {
            "epoch": epoch,
            "train_loss": loss_sum.item() / seen if seen else float("nan"),
            "train_acc": correct.item() / seen if seen else 0.0,
            "val_acc": val_acc,
            "lr": optimizer.param_groups[0]["lr"],
            "images_per_s": seen / train_s if train_s > 0 else None,
            "wall_s": wall_offset + time.perf_counter() - t0,
            "status": status if status == "diverged" else "ok",
        }
        if status == "diverged":
            row["train_loss"] = float("nan")  # the loss that ended the run was not finite
        else:
            scheduler.step()
        if status != "diverged" and epoch == 1 and reject_below is not None and val_acc is not None and val_acc < reject_below:
            status = row["status"] = "rejected"
        history.append(_json_safe(row))
        if status == "running" and epoch == cfg.epochs:
            status = "ok"
            if cfg.eval_test:
                test = evaluate(model, data, data.test_x, data.test_y)
        if metrics_path:
            _append_metrics(metrics_path, history[-1])
        if ckpt_path:
            _save_checkpoint(ckpt_path, model, optimizer, scheduler, gen, cfg, data, epoch, history, status, test)
        if progress:
            print(_epoch_line(history[-1]), file=sys.stderr, flush=True)
        if status != "running" or (_stop_after_epoch is not None and epoch >= _stop_after_epoch):
            break
    if status == "running" and start_epoch >= cfg.epochs:
        status = "ok"  # resumed a run whose epochs were all done
    return _finish(cfg, status, history, test, t0)


def _finish(cfg, status, history, test, t0, write: bool = True, wall_s: float | None = None) -> TrainResult:
    test = test or (None, None)
    vals = [r["val_acc"] for r in history]
    result = TrainResult(
        status=status,
        val_acc=vals[-1] if vals else None,
        val_acc_per_epoch=vals,
        test_acc=test[0],
        epochs=len(history),
        wall_s=time.perf_counter() - t0 if wall_s is None else wall_s,
        test_top5=test[1],
        train_loss=history[-1]["train_loss"] if history else None,
        config={**asdict(cfg), "milestones": list(cfg.milestones)},
    )
    if write and cfg.out_dir and status in STATUSES:
        atomic_write_text(os.path.join(cfg.out_dir, SUMMARY), json.dumps(_json_safe(result.to_dict())) + "\n")
    return result


def _json_safe(row: dict) -> dict:
    # JSON has no NaN; a non-finite number is written as null.
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)


def _epoch_line(row: dict) -> str:
    def pct(v):
        return "  n/a " if v is None else f"{100 * v:6.2f}"

    loss = "nan" if row["train_loss"] is None else f"{row['train_loss']:.4f}"
    return (f"epoch {row['epoch']:3d}  loss {loss}  train {pct(row['train_acc'])}%  val {pct(row['val_acc'])}%  "
            f"lr {row['lr']:.2e}  {row['images_per_s'] or 0:8.0f} img/s  {row['status']}")


# =============================================================================================
# Command line


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m bnn.train", description="Train a binarized network with a searched similarity measure.")
    p.add_argument("--model", help=f"one of {', '.join(MODELS)} (default: digits_net for digits, mnist_net for "
                                   "mnist and fashion-mnist, resnet18 for CIFAR)")
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
    p.add_argument("--preset", help=f"one of {', '.join(PRESETS)} (default: digits for digits, mnist for mnist and "
                                    "fashion-mnist, fitness for CIFAR)")
    p.add_argument("--epochs", type=positive_int)
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--lr", type=positive_float, help="Adam learning rate, a finite number > 0")
    p.add_argument("--milestones", help="comma-separated epochs after which the lr is multiplied by gamma")
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
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or per-epoch lines on stderr")
    return p


def config_from_args(args, ckpt: dict | None = None) -> TrainConfig:
    """The TrainConfig of parsed command-line ``args``: a preset with overrides, or the resumed run's own."""
    if args.resume:
        ckpt = ckpt or load_checkpoint(os.path.join(args.resume, CHECKPOINT))
        saved = dict(ckpt["config"])
        saved.update(out_dir=args.resume, resume=True)
        if args.epochs is not None:
            saved["epochs"] = args.epochs  # extending a finished run is allowed
        if args.device != "auto":
            saved["device"] = args.device
        known = {f.name for f in fields(TrainConfig)}
        return TrainConfig(**{k: v for k, v in saved.items() if k in known})
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
    kind = "" if args.downsample == "binary" else f"-{args.downsample}"
    out = args.out or os.path.join("runs", f"{dataset}-{model}-{name}{kind}-s{args.seed}")
    return TrainConfig.from_preset(
        preset, model=model, dataset=dataset, measure=measure, downsample=args.downsample, seed=args.seed,
        device=args.device,
        data_dir=args.data_dir, val_size=args.val_size, train_size=args.train_size, out_dir=out,
        compile=args.compile, download=args.download, **overrides,
    )


def _refuse_existing_run(out_dir: str) -> None:
    # The default --out is the same for the same data set, model, measure and seed: a rerun with
    # other settings would silently replace the first run.
    if os.path.exists(os.path.join(out_dir, SUMMARY)):
        raise ValueError(f"{out_dir} holds a finished run ({SUMMARY}); pass --overwrite to replace it, "
                         "or choose another --out")
    if os.path.exists(os.path.join(out_dir, CHECKPOINT)):
        raise ValueError(f"{out_dir} holds an unfinished run ({CHECKPOINT}); continue it with --resume {out_dir}, "
                         "or pass --overwrite to start it over")


# What --resume takes from the checkpoint: given with it, they would be ignored, so they are refused.
RESUME_FIXED = ("out", "model", "dataset", "data_dir", "download", "measure", "downsample", "preset", "batch_size", "lr",
                "milestones", "seed", "val_size", "train_size", "compile")


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
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    if lock is not None:
        lock.release()  # the run's files are all written
    summary = {k: result.to_dict()[k] for k in ("status", "epochs", "val_acc", "test_acc", "test_top5", "wall_s")}
    summary.update(model=cfg.model, dataset=cfg.dataset, measure=cfg.measure, downsample=cfg.downsample,
                   seed=cfg.seed, out=cfg.out_dir)
    if args.json:
        print(json.dumps(_json_safe(summary)))
    else:
        test = "n/a" if result.test_acc is None else f"{100 * result.test_acc:.2f}%"
        print(f"{result.status}: {cfg.model} on {cfg.dataset} with {cfg.measure} ({cfg.downsample} downsampling), "
              f"{result.epochs} epochs, "
              f"test accuracy {test}, {result.wall_s:.1f} s; run folder {cfg.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
