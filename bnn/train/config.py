"""What one training run is: ``TrainConfig`` (its settings, checked by ``validate``), ``TrainResult``
(its outcome) and ``resolve_device``. The hyperparameters themselves come from ``bnn.settings``."""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from refimpl.cli import SEED_MAX
from refimpl.genome import Genome

from ..data import canonical_name, check_split_sizes, read_arrays
from ..gpu.require import triton_problem
from ..nn.layers import check_measure_grad_clip, check_measure_impl
from ..nn.models import MODELS, check_counts, check_downsample
from ..settings import PRESETS, STEPS, from_mapping

_DIGITS = PRESETS["digits"]


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
    compile: bool = False  # torch.compile the model: the same as step="compiled"
    step: str = "auto"  # how a training step runs: auto | eager | compiled | graphs (STEPS, resolve_step)
    resume: bool = False  # continue from out_dir/checkpoint.pt if it exists
    download: bool = False
    downsample: str = "binary"  # binary | real shortcut of a unit that changes size or width (docs/design.md section 6)
    counts: str = "raw"  # the count convention of every binary layer (refimpl/conventions.py, docs/design.md section 2)
    # Training option (docs/design.md section 6): the gradients reaching the measure's inputs a, b, c, d
    # clipped to [-C, C], NaN to 0; None = off (and what a checkpoint without it trained with).
    measure_grad_clip: float | None = None
    # How the measure runs in training (docs/design.md section 6): "fused" (bnn/nn/measure_fused.py: one Numba
    # pass forward and one backward, where it applies: float32 CPU counts, not compiled, not CUDA) or
    # "eager" (torch operators). A checkpoint, protocol or journal without the key trained eager
    # (bnn.settings.MEASURE_IMPL_BEFORE), not with this default.
    measure_impl: str = "fused"

    def __post_init__(self) -> None:
        self.milestones = tuple(int(m) for m in self.milestones)

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> "TrainConfig":
        """A config with the preset's hyperparameters, then ``overrides`` on top."""
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        return cls.from_mapping({**PRESETS[preset], **overrides})

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> "TrainConfig":
        """A config from a mapping of settings; a key that is not a setting is a one-line ValueError naming it."""
        return from_mapping(cls, mapping)

    def validate(self) -> None:
        """Check every setting (one-line ValueError naming the bad one); canonicalizes measure and dataset."""
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        self.measure = str(Genome.parse(self.measure))
        check_downsample(self.downsample)
        check_counts(self.counts)
        check_measure_grad_clip(self.measure_grad_clip)
        check_measure_impl(self.measure_impl)
        _check_int("epochs", self.epochs, 1)
        for m in self.milestones:  # epochs after which lr *= gamma: an epoch number, 1 or more
            if m < 1:
                raise ValueError(f"milestones must be epochs of 1 or more, got {m} in {list(self.milestones)}")
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
        device = resolve_device(self.device, self.dataset)  # an unknown or absent device: one line, nothing run
        resolve_step(self, device)
        if self.measure_impl == "triton" and triton_problem(device.type):
            raise ValueError(triton_problem(device.type))

    def to_dict(self) -> dict:
        """The settings as JSON values (milestones as a list), as checkpoints and summaries record them."""
        return {**asdict(self), "milestones": list(self.milestones)}


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


DEVICES = "auto, cpu, cuda or cuda:N"



def resolve_step(cfg: "TrainConfig", device: torch.device) -> str:
    """The step kind ``cfg`` runs on ``device`` (STEPS without auto); a one-line ValueError for an
    unknown kind, for ``compile`` with another kind, and for CUDA graphs without CUDA."""
    if cfg.step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, got {cfg.step!r}")
    if cfg.compile and cfg.step not in ("auto", "compiled"):
        raise ValueError(f"compile=True is step='compiled'; it clashes with step={cfg.step!r}")
    if cfg.step == "graphs" and device.type != "cuda":
        raise ValueError(f"step 'graphs' captures CUDA graphs and needs a CUDA device, not {device.type}; "
                         "use step 'compiled' or 'eager'")
    if cfg.step != "auto":
        return cfg.step
    if device.type == "cuda" and cfg.measure_impl == "triton" and not cfg.compile:
        return "graphs"  # one CUDA graph per step: 3.3x the compiled step with the CPU-side operator (H200)
    return "compiled" if cfg.compile or device.type == "cuda" else "eager"


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
