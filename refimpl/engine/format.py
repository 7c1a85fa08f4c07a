"""The ``.bnn`` file format, owned here: its name, its version and its typed layer records.

``bnn/export/model_file.py`` builds a ``Description`` of a trained model and writes ``metadata()`` and
``tensors()``; ``model_file.py`` reads a file back into the same records, checking every field
(the one place that validates a file; the exporter runs it too before writing), and the engine
runs them. docs/design.md section 10 describes the container, every metadata key and every
record; each record's ``entry()`` is its JSON entry in ``layers`` and ``tensors()`` its tensors,
named by the record's prefix (``name``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Union

import numpy as np

from ..conventions import DEFAULT as DEFAULT_COUNTS
from ..genome import Genome

FORMAT = "bnn-measure"
# Version 2 is a model whose count convention is not raw: an engine that reads only version 1
# ignores the "counts" key and would run the model on raw counts, so it must refuse the file.
# A raw model stays version 1 (older engines read it right).
VERSION = 1
COUNTS_VERSION = 2
SUPPORTED_VERSIONS = (VERSION, COUNTS_VERSION)
DOWNSAMPLE_KINDS = ("binary", "real")
RESIDUALS = ("none", "identity", "down", "real")
# The shortcut a file of each downsampling kind must not hold (docs/design.md section 6).
FOREIGN_SHORTCUT = {"binary": "real", "real": "down"}
POOLS = ("maxpool2d", "avgpool2d")

Pair = tuple[int, int]


def _ints(pair) -> list[int]:
    return [int(v) for v in pair]


@dataclass
class _Convolution:
    """What every convolution record holds: its tensors' prefix, channels and geometry."""

    name: str  # the prefix of its tensors
    in_channels: int
    out_channels: int
    kernel: Pair
    stride: Pair
    padding: Pair
    dilation: Pair

    def entry(self) -> dict:
        """The record's JSON entry in the file's ``layers`` (docs/design.md section 10)."""
        return {"tensors": self.name, "in_channels": int(self.in_channels), "out_channels": int(self.out_channels),
                "kernel": _ints(self.kernel), "stride": _ints(self.stride), "padding": _ints(self.padding),
                "dilation": _ints(self.dilation)}

    def tensors(self) -> dict:
        """The record's tensors, keyed by their names in the file (its prefix ``name``, then the tensor)."""
        return {f"{self.name}.{key}": getattr(self, key) for key in self._TENSORS}


@dataclass(kw_only=True)
class BinaryConv(_Convolution):
    """One binary convolution with its folded BatchNorm: a unit's ``conv`` or ``down``."""

    _TENSORS: ClassVar[tuple] = ("bits", "alpha", "scale", "shift")
    bits: np.ndarray  # (O, KH, KW, ceil(I/64)) uint64
    alpha: np.ndarray  # (4, O) float32
    scale: np.ndarray  # (O,) float32
    shift: np.ndarray  # (O,) float32
    taps: np.ndarray = field(default=None, repr=False)  # the reader's popcount of each (O, KH, KW) tap


@dataclass(kw_only=True)
class Stem(_Convolution):
    """The full-precision first convolution with its folded BatchNorm."""

    op: ClassVar[str] = "stem"
    _TENSORS: ClassVar[tuple] = ("weight", "scale", "shift")
    weight: np.ndarray  # (O, I, KH, KW) float32
    scale: np.ndarray  # (O,) float32
    shift: np.ndarray  # (O,) float32

    def entry(self) -> dict:
        """The record's JSON entry in the file's ``layers`` (docs/design.md section 10)."""
        return {"op": self.op, **super().entry()}


@dataclass
class RealShortcut:
    """Bi-Real's shortcut: average pool (kernel = stride = ``pool``, ceil mode), a full-precision
    1x1 convolution and its folded BatchNorm."""

    name: str
    in_channels: int
    out_channels: int
    pool: Pair
    weight: np.ndarray  # (O, I, 1, 1) float32
    scale: np.ndarray  # (O,) float32
    shift: np.ndarray  # (O,) float32

    def entry(self) -> dict:
        """The record's JSON entry in the file's ``layers`` (docs/design.md section 10)."""
        return {"tensors": self.name, "in_channels": int(self.in_channels), "out_channels": int(self.out_channels),
                "pool": _ints(self.pool)}

    def tensors(self) -> dict:
        """The record's tensors, keyed by their names in the file (its prefix ``name``, then the tensor)."""
        return {f"{self.name}.{key}": getattr(self, key) for key in ("weight", "scale", "shift")}


@dataclass
class BinaryUnit:
    """A binary convolution, its measure and BatchNorm, and its shortcut (``residual``)."""

    op: ClassVar[str] = "binary_unit"
    name: str
    conv: BinaryConv
    residual: str  # one of RESIDUALS
    down: BinaryConv | None = None  # residual "down"
    shortcut: RealShortcut | None = None  # residual "real"

    def entry(self) -> dict:
        """The record's JSON entry in the file's ``layers`` (docs/design.md section 10)."""
        entry = {"op": self.op, "name": self.name, "conv": self.conv.entry(), "residual": self.residual}
        if self.down is not None:
            entry["down"] = self.down.entry()
        if self.shortcut is not None:
            entry["shortcut"] = self.shortcut.entry()
        return entry

    def tensors(self) -> dict:
        """The record's tensors, keyed by their names in the file (its prefix ``name``, then the tensor)."""
        parts = [p for p in (self.conv, self.down, self.shortcut) if p is not None]
        return {name: t for p in parts for name, t in p.tensors().items()}


@dataclass
class Pool:
    """Max or average pooling (``op`` one of POOLS), float32, channels kept."""

    op: str
    kernel: Pair
    stride: Pair
    padding: Pair
    count_include_pad: bool = True  # average pooling only

    def entry(self) -> dict:
        """The record's JSON entry in the file's ``layers`` (docs/design.md section 10)."""
        entry = {"op": self.op, "kernel": _ints(self.kernel), "stride": _ints(self.stride),
                 "padding": _ints(self.padding)}
        if self.op == "avgpool2d":
            entry["count_include_pad"] = bool(self.count_include_pad)
        return entry

    def tensors(self) -> dict:
        """The record's tensors, keyed by their names in the file (its prefix ``name``, then the tensor)."""
        return {}


@dataclass
class GlobalAvgPool:
    """The mean over every position of each channel."""

    op: ClassVar[str] = "global_avgpool"

    def entry(self) -> dict:
        """The record's JSON entry in the file's ``layers`` (docs/design.md section 10)."""
        return {"op": self.op}

    def tensors(self) -> dict:
        """The record's tensors, keyed by their names in the file (its prefix ``name``, then the tensor)."""
        return {}


@dataclass
class Linear:
    """The full-precision classifier: ``weight @ x + bias``."""

    op: ClassVar[str] = "linear"
    name: str
    in_features: int
    out_features: int
    weight: np.ndarray  # (O, I) float32
    bias: np.ndarray  # (O,) float32

    def entry(self) -> dict:
        """The record's JSON entry in the file's ``layers`` (docs/design.md section 10)."""
        return {"op": self.op, "tensors": self.name, "in_features": int(self.in_features),
                "out_features": int(self.out_features)}

    def tensors(self) -> dict:
        """The record's tensors, keyed by their names in the file (its prefix ``name``, then the tensor)."""
        return {f"{self.name}.weight": self.weight, f"{self.name}.bias": self.bias}


Layer = Union[Stem, BinaryUnit, Pool, GlobalAvgPool, Linear]


@dataclass
class Description:
    """A whole model file: what the exporter writes, and what the reader gives the engine with
    every value checked (``mean`` and ``std`` then float32 arrays)."""

    genome: Genome
    input_shape: tuple[int, int, int]
    num_classes: int
    class_names: list[str]
    mean: np.ndarray  # (C,) raw pixel units
    std: np.ndarray  # (C,) positive
    pixel_max: float | None
    downsample: str  # one of DOWNSAMPLE_KINDS
    layers: list[Layer]
    counts: str = DEFAULT_COUNTS  # the count convention (refimpl/conventions.py)
    arch: str | None = None
    dataset: str | None = None
    source_sha256: str | None = None
    shapes: list | None = None  # each layer's output (C, H, W), from the reader; not written

    def metadata(self) -> dict:
        """The file's JSON document (stored under the metadata key ``FORMAT``)."""
        return {
            "format": FORMAT,
            "version": VERSION if self.counts == DEFAULT_COUNTS else COUNTS_VERSION,
            "arch": self.arch,
            "genome": str(self.genome),
            "num_classes": int(self.num_classes),
            "input_shape": _ints(self.input_shape),
            "downsample": self.downsample,
            "counts": self.counts,
            "input": {"mean": [float(v) for v in self.mean], "std": [float(v) for v in self.std],
                      "pixel_max": self.pixel_max, "normalization": "(pixel - mean[c]) / std[c], raw pixel units"},
            "dataset": self.dataset,
            "class_names": list(self.class_names),
            "source_sha256": self.source_sha256,
            "layers": [layer.entry() for layer in self.layers],
        }

    def tensors(self) -> dict:
        """The record's tensors, keyed by their names in the file (its prefix ``name``, then the tensor)."""
        """Every tensor the layers name, by name."""
        return {name: t for layer in self.layers for name, t in layer.tensors().items()}
