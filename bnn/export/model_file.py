"""A trained BNN as the CPU engine's ``.bnn`` file (``python -m bnn.export``: bnn/export/cli.py).

The file format, its name, version and layer records are refimpl's (``refimpl/engine/format.py``
documents them): this module turns a ``bnn.nn.models.BNNet`` into those records, folding every
BatchNorm as torch computes it and packing the binary weights, and has the engine's reader check
the result (``refimpl/engine/model_file.py``) before anything is written, so it never writes a
file the engine refuses.
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import torch
from torch import nn

from refimpl.conventions import DEFAULT as DEFAULT_COUNTS
from refimpl.engine import format as fmt
from refimpl.engine.model_file import ModelFileError, describe
from refimpl.fileio import atomic_write_bytes, check_output, refuse_non_regular
from refimpl.genome import Genome
from refimpl.kernels.bits import pack_bits
from refimpl.kernels.fma import fma
from refimpl.kernels.geometry import int_pair

from ..nn.layers import BinaryConv2d
from ..nn.models import BinaryUnit, build_model


# ----------------------------------------------------------------------------------------------
# BatchNorm folding.
#
# In eval mode BatchNorm is an affine map per channel:
#
#     bn(y) = gamma * (y - mean) / sqrt(var + eps) + beta
#           = y * scale + shift,   scale = gamma / sqrt(var + eps),   shift = beta - mean * scale
#
# The float32 operations are the ones PyTorch's CPU kernel performs (measured on torch 2.13, see
# refimpl/kernels/fma.py): invstd = 1 / sqrt(var + eps), scale = invstd * gamma, and with fused
# multiply-adds shift = fma(-mean, scale, beta), bn(y) = fma(y, scale, shift). Reproducing them
# keeps the engine's BatchNorm bit-identical to torch's. That matters beyond the 1e-4 logit
# tolerance: an activation one ulp on the other side of zero flips a sign bit, and then the next
# layer's counts differ.
# ----------------------------------------------------------------------------------------------
def fold_batchnorm(bn: nn.BatchNorm2d) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, shift)`` float32 with ``bn(y) == y * scale + shift`` in eval mode."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("BatchNorm without running statistics cannot be folded (track_running_stats=False)")
    f32 = np.float32
    var = bn.running_var.detach().cpu().numpy().astype(f32)
    mean = bn.running_mean.detach().cpu().numpy().astype(f32)
    channels = var.shape[0]
    gamma = bn.weight.detach().cpu().numpy().astype(f32) if bn.weight is not None else np.ones(channels, f32)
    beta = bn.bias.detach().cpu().numpy().astype(f32) if bn.bias is not None else np.zeros(channels, f32)
    with np.errstate(divide="ignore", invalid="ignore"):  # var + eps <= 0: export refuses it by name
        invstd = f32(1) / np.sqrt(var + f32(bn.eps))
    scale = (invstd * gamma).astype(f32)
    shift = fma(-mean, scale, beta)
    return scale, shift


def _f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32))


def _geometry(m) -> dict:
    """kernel, stride, padding, dilation of a torch convolution, as pairs."""
    return {key: int_pair(getattr(m, key if key != "kernel" else "kernel_size"), key)
            for key in ("kernel", "stride", "padding", "dilation")}


def _binary_conv(prefix: str, conv: BinaryConv2d, bn: nn.BatchNorm2d) -> fmt.BinaryConv:
    w = conv.weight.detach().cpu().numpy()
    scale, shift = fold_batchnorm(bn)
    # OIHW -> OHWI, packed along I: (O, KH, KW, ceil(I/64)) uint64, bit 1 = w >= 0.
    return fmt.BinaryConv(name=prefix, in_channels=int(conv.in_channels), out_channels=int(conv.out_channels),
                          **_geometry(conv), bits=pack_bits(np.moveaxis(w, 1, -1)), alpha=_f32(conv.alpha),
                          scale=scale, shift=shift)


def _real_shortcut(prefix: str, unit: BinaryUnit) -> fmt.RealShortcut:
    """The Bi-Real shortcut: avg-pool (parameter-free), full-precision 1x1 conv, folded BatchNorm."""
    conv, pool = unit.down_conv, unit.down_pool
    if (int_pair(conv.kernel_size, "kernel") != (1, 1) or int_pair(conv.stride, "stride") != (1, 1)
            or int_pair(conv.padding, "padding") != (0, 0) or conv.bias is not None or conv.groups != 1):
        raise ValueError(f"{prefix}: the real shortcut must be a bias-free 1x1 nn.Conv2d with stride 1 (bnn.nn.models)")
    k = (1, 1)
    if pool is not None:
        k = int_pair(pool.kernel_size, "kernel")
        if (not isinstance(pool, nn.AvgPool2d) or int_pair(pool.stride, "stride") != k
                or int_pair(pool.padding, "padding") != (0, 0) or not pool.ceil_mode or pool.divisor_override is not None):
            raise ValueError(f"{prefix}: the real shortcut's pool must be AvgPool2d(k, k, ceil_mode=True) (bnn.nn.models)")
    scale, shift = fold_batchnorm(unit.down_bn)
    return fmt.RealShortcut(name=prefix, in_channels=int(conv.in_channels), out_channels=int(conv.out_channels),
                            pool=k, weight=_f32(conv.weight), scale=scale, shift=shift)


def _pool(kind: str, m) -> fmt.Pool:
    if getattr(m, "ceil_mode", False):
        raise ValueError(f"{kind} with ceil_mode=True is not supported by the engine")
    if kind == "maxpool2d" and int_pair(m.dilation, "dilation") != (1, 1):
        raise ValueError("max-pool with dilation is not supported by the engine")
    if kind == "avgpool2d" and m.divisor_override is not None:
        raise ValueError("avg-pool with divisor_override is not supported by the engine")
    return fmt.Pool(op=kind, kernel=int_pair(m.kernel_size, "kernel"),
                    stride=int_pair(m.stride if m.stride is not None else m.kernel_size, "stride"),
                    padding=int_pair(m.padding, "padding"),
                    count_include_pad=bool(getattr(m, "count_include_pad", True)))


def _unit(i: int, m: BinaryUnit) -> fmt.BinaryUnit:
    if not isinstance(m.conv, BinaryConv2d):
        raise ValueError(f"body.{i} is not binary (a float model cannot be exported to the binary engine)")
    conv = _binary_conv(f"body.{i}.conv", m.conv, m.bn)
    if not m.residual:
        return fmt.BinaryUnit(name=f"body.{i}", conv=conv, residual="none")
    if m.down_conv is None:
        return fmt.BinaryUnit(name=f"body.{i}", conv=conv, residual="identity")
    if not isinstance(m.down_conv, BinaryConv2d):
        return fmt.BinaryUnit(name=f"body.{i}", conv=conv, residual="real",
                              shortcut=_real_shortcut(f"body.{i}.down_conv", m))
    return fmt.BinaryUnit(name=f"body.{i}", conv=conv, residual="down",
                          down=_binary_conv(f"body.{i}.down_conv", m.down_conv, m.down_bn))


def _layers(model: nn.Module) -> list:
    """The model's layer records in execution order (models.py's flat layout)."""
    stem = model.stem
    if stem.bias is not None or stem.groups != 1:
        raise ValueError("the stem must be a bias-free, groups=1 nn.Conv2d (bnn.nn.models layout)")
    scale, shift = fold_batchnorm(model.stem_bn)
    layers = [fmt.Stem(name="stem", in_channels=int(stem.in_channels), out_channels=int(stem.out_channels),
                       **_geometry(stem), weight=_f32(stem.weight), scale=scale, shift=shift)]
    for i, m in enumerate(model.body):
        if isinstance(m, BinaryUnit):
            layers.append(_unit(i, m))
        elif isinstance(m, nn.MaxPool2d):
            layers.append(_pool("maxpool2d", m))
        elif isinstance(m, nn.AvgPool2d):
            layers.append(_pool("avgpool2d", m))
        else:
            raise ValueError(f"body.{i} is a {type(m).__name__}; the engine runs BinaryUnit, MaxPool2d, AvgPool2d")
    cls = model.classifier
    bias = _f32(cls.bias) if cls.bias is not None else np.zeros(cls.out_features, np.float32)
    layers.append(fmt.GlobalAvgPool())
    layers.append(fmt.Linear(name="classifier", in_features=int(cls.in_features), out_features=int(cls.out_features),
                             weight=_f32(cls.weight), bias=bias))
    return layers


def export_model(model: nn.Module, path: str, *, mean=None, std=None, pixel_max=None, class_names=None,
                 source_sha256: str | None = None, dataset: str | None = None) -> dict:
    """Write ``model`` (a ``bnn.nn.models.BNNet``) to ``path``; returns the metadata written.

    ``mean``/``std``: per-channel normalization in raw pixel units (default: identity).
    """
    from safetensors.numpy import save

    refuse_non_regular(path)  # before any work: never rename over a folder, FIFO or device
    _refuse_non_finite(model, path)
    config = dict(getattr(model, "config", {}))
    if "measure" not in config:
        raise ValueError("model has no .config with a measure; build it with bnn.nn.models")
    genome = Genome.parse(config["measure"])
    for m in model.modules():
        if isinstance(m, BinaryConv2d) and str(m.genome) != str(genome):
            raise ValueError(f"binary layer has genome {m.genome}, model config says {genome}; one genome per network")
    in_ch = int(model.stem.in_channels)
    mean = [0.0] * in_ch if mean is None else [float(v) for v in mean]
    std = [1.0] * in_ch if std is None else [float(v) for v in std]
    if len(mean) != in_ch or len(std) != in_ch:
        raise ValueError(f"mean and std need {in_ch} values (input channels), got {len(mean)} and {len(std)}")
    num_classes = int(model.classifier.out_features)
    names = [str(i) for i in range(num_classes)] if class_names is None else [str(n) for n in class_names]
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} class names for {num_classes} classes")
    layers = _layers(model)
    downsample = config.get("downsample", "binary")
    wrong = fmt.FOREIGN_SHORTCUT.get(downsample)
    if downsample not in fmt.DOWNSAMPLE_KINDS or any(getattr(layer, "residual", None) == wrong for layer in layers):
        raise ValueError(f"model.config says downsample={downsample!r}, which its shortcuts are not; "
                         "build the model with bnn.nn.models and one downsample kind")
    counts = config.get("counts", DEFAULT_COUNTS)
    if any(m.counts != counts for m in model.modules() if isinstance(m, BinaryConv2d)):
        raise ValueError(f"model.config says counts={counts!r}, which its binary layers do not all use; "
                         "build the model with bnn.nn.models and one count convention")
    description = fmt.Description(
        genome=genome, input_shape=tuple(config.get("input_shape", [in_ch, 0, 0])), num_classes=num_classes,
        class_names=names, mean=mean, std=std, pixel_max=pixel_max, downsample=downsample, layers=layers,
        counts=counts, arch=config.get("arch"), dataset=dataset, source_sha256=source_sha256,
    )
    meta, tensors = description.metadata(), description.tensors()
    check_engine_accepts(meta, tensors, path)  # before the file is written, not when the engine loads it
    # Atomic and durable: a reader never sees a half-written file; a full disk keeps the old one.
    atomic_write_bytes(path, save(tensors, metadata={fmt.FORMAT: json.dumps(meta)}))
    return meta


def _refuse_non_finite(model: nn.Module, path: str) -> None:
    """ValueError, one line, for a model whose weights or BatchNorm statistics are not finite: a
    diverged run. Checked before folding, which hides some (running_var = inf folds to scale 0)."""
    for name, t in model.state_dict().items():
        if torch.is_floating_point(t) and not torch.isfinite(t).all():
            raise ValueError(f"{path}: not written: {name} holds inf or NaN (a diverged run); "
                             "export a model whose training stayed finite")


def check_engine_accepts(meta: dict, tensors: dict[str, np.ndarray], path: str) -> None:
    """ValueError, one line, for a model the engine would refuse or could only run into inf/NaN: its
    own reader (``refimpl.engine.model_file.describe``) checks the metadata as the file will hold it (a
    zero or negative input shape, an input std of 0), and every float tensor must be finite (a
    BatchNorm whose running variance + eps is 0 folds to an infinite scale; a diverged run)."""
    for name, t in tensors.items():
        if t.dtype.kind == "f" and not np.isfinite(t).all():
            what = "a folded BatchNorm: running_var + eps must be > 0 and finite" if name.endswith(
                (".scale", ".shift")) else "a diverged run's weights"
            raise ValueError(f"{path}: not written: tensor {name} holds non-finite values ({what})")
    try:
        describe(json.loads(json.dumps(meta)), tensors, path)  # the metadata as the file holds it
    except ModelFileError as exc:
        raise ValueError(f"{exc} (not written: the engine would refuse it)") from None


def sha256_file(path: str) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _data_problem(data) -> str | None:
    """What makes a checkpoint's ``data`` record (the data set's name, normalization and class
    names, ``Dataset.describe``) unfit for the file's metadata, or None."""
    if not isinstance(data, dict):
        return f"is {type(data).__name__}, not an object"
    for key in ("mean", "std"):
        v = data.get(key)
        if v is not None and not (isinstance(v, list) and all(_number(x) for x in v)):
            return f"has {key} {str(v)[:40]!r}, not a list of finite numbers"
    if data.get("pixel_max") is not None and not (_number(data["pixel_max"]) and data["pixel_max"] > 0):
        return f"has pixel_max {str(data['pixel_max'])[:40]!r}, not a number > 0"
    names = data.get("class_names")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        return f"has class_names {str(names)[:40]!r}, not a list of texts"
    if data.get("name") is not None and not isinstance(data["name"], str):
        return f"has name {str(data['name'])[:40]!r}, not a text"
    return None


def export_checkpoint(checkpoint: str, out: str) -> dict:
    """Export a ``bnn.train`` checkpoint to the ``.bnn`` file ``out``; its metadata.

    ValueError (one line) for a checkpoint whose config or weights do not fit, or an ``out``
    that is the checkpoint itself; nothing is written then.
    """
    from ..train import load_checkpoint

    check_output(out, [checkpoint])  # -o CHECKPOINT would replace the checkpoint with the export
    ckpt = load_checkpoint(checkpoint, resumable=False)
    if ckpt.get("status") == "diverged":  # its weights are what the last finite step left, or worse
        raise ValueError(f"{checkpoint}: the run diverged (status 'diverged'); nothing to export: "
                         "train again (a lower --lr) and export that run")
    mc, data = ckpt.get("model_config") or {}, ckpt.get("data") or {}
    problem = _data_problem(data)
    if problem:
        raise ValueError(f"{checkpoint}: its data record {problem}; not what bnn.train writes: train again")
    try:
        # A checkpoint written before the options has no downsample (binary) and no counts (raw).
        model = build_model(mc["arch"], mc["measure"], mc["num_classes"], tuple(mc["input_shape"]),
                            downsample=mc.get("downsample", "binary"), counts=mc.get("counts", DEFAULT_COUNTS))
        model.load_state_dict(ckpt["model"])
    except (KeyError, RuntimeError, TypeError, AttributeError) as exc:
        raise ValueError(f"{checkpoint}: model config or weights do not fit ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    model.eval()
    return export_model(
        model, out, mean=data.get("mean"), std=data.get("std"), pixel_max=data.get("pixel_max"),
        class_names=data.get("class_names"), source_sha256=sha256_file(checkpoint), dataset=data.get("name"),
    )
