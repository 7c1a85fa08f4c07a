"""Export a trained BNN for the CPU engine: ``python -m bnn.export CHECKPOINT -o MODEL.bnn``.

The file is a safetensors archive (``safetensors.numpy.load_file`` reads it without torch) whose
metadata holds one JSON document under the key ``"bnn-measure"`` (``FORMAT``):

* ``format`` (``"bnn-measure"``), ``version`` (``VERSION``);
* ``genome`` (canonical text) and ``arch``, ``num_classes``, ``input_shape``;
* ``downsample``: ``"binary"`` or ``"real"`` (docs/design.md section 6); a file without it is binary;
* ``input``: normalization ``(pixel - mean[c]) / std[c]`` in raw pixel units, ``pixel_max``;
* ``class_names``; ``source_sha256`` of the checkpoint it came from (or null);
* ``layers``: the network in execution order, each entry naming its tensors (see
  ``_describe``); ``refimpl.engine`` runs exactly this list.

Tensors: binary weights as uint64 words ``(O, KH, KW, ceil(I/64))`` (docs/design.md section 1: bit 1 is
``w >= 0``, channels packed along the last axis, the OHWI layout the popcount kernel reads);
``alpha`` float32 ``(4, O)``; every BatchNorm folded into float32 ``scale``/``shift`` per
channel; the full-precision stem weight and the classifier in float32.

A ``binary_unit``'s ``residual`` is ``none``, ``identity``, ``down`` (a binary 1x1 convolution
described like ``conv``) or ``real`` (Bi-Real): ``shortcut`` names ``pool`` ``[k, k]``, an average
pool of kernel and stride k in ceil mode, each window divided by its in-bounds pixels (``[1, 1]``:
none), then a full-precision 1x1 convolution, ``TENSORS.weight`` float32 ``(O, I, 1, 1)``, and its
folded BatchNorm, ``TENSORS.scale`` and ``TENSORS.shift``.

Binary weights in float would be 32 bits each; packed they are 1 bit, plus at most 63 bits of
tail per (output, tap) row.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import torch
from torch import nn

from refimpl._fma import fma
from refimpl.bits import pack_bits
from refimpl.cli import OneLineParser
from refimpl.fileio import atomic_write_bytes, check_output, refuse_non_regular
from refimpl.genome import Genome

from .layers import BinaryConv2d
from .models import BinaryUnit, build_model

FORMAT = "bnn-measure"
VERSION = 1


# ----------------------------------------------------------------------------------------------
# BatchNorm folding.
#
# In eval mode BatchNorm is an affine map per channel:
#
#     bn(y) = gamma * (y - mean) / sqrt(var + eps) + beta
#           = y * scale + shift,   scale = gamma / sqrt(var + eps),   shift = beta - mean * scale
#
# The float32 operations are the ones PyTorch's CPU kernel performs (measured on torch 2.13, see
# refimpl/_fma.py): invstd = 1 / sqrt(var + eps), scale = invstd * gamma, and with fused
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


def _pair(v) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(u) for u in v]


def _binary_conv(prefix: str, conv: BinaryConv2d, bn: nn.BatchNorm2d, tensors: dict) -> dict:
    w = conv.weight.detach().cpu().numpy()
    # OIHW -> OHWI, packed along I: (O, KH, KW, ceil(I/64)) uint64, bit 1 = w >= 0.
    tensors[f"{prefix}.bits"] = pack_bits(np.moveaxis(w, 1, -1))
    tensors[f"{prefix}.alpha"] = _f32(conv.alpha)
    scale, shift = fold_batchnorm(bn)
    tensors[f"{prefix}.scale"], tensors[f"{prefix}.shift"] = scale, shift
    return {
        "tensors": prefix,
        "in_channels": int(conv.in_channels),
        "out_channels": int(conv.out_channels),
        "kernel": _pair(conv.kernel_size),
        "stride": _pair(conv.stride),
        "padding": _pair(conv.padding),
        "dilation": _pair(conv.dilation),
    }


def _real_shortcut(prefix: str, unit: BinaryUnit, tensors: dict) -> dict:
    """The Bi-Real shortcut: avg-pool (parameter-free), full-precision 1x1 conv, folded BatchNorm."""
    conv, pool = unit.down_conv, unit.down_pool
    if (_pair(conv.kernel_size) != [1, 1] or _pair(conv.stride) != [1, 1] or _pair(conv.padding) != [0, 0]
            or conv.bias is not None or conv.groups != 1):
        raise ValueError(f"{prefix}: the real shortcut must be a bias-free 1x1 nn.Conv2d with stride 1 (bnn.models)")
    k = [1, 1]
    if pool is not None:
        k = _pair(pool.kernel_size)
        if (not isinstance(pool, nn.AvgPool2d) or _pair(pool.stride) != k or _pair(pool.padding) != [0, 0]
                or not pool.ceil_mode or pool.divisor_override is not None):
            raise ValueError(f"{prefix}: the real shortcut's pool must be AvgPool2d(k, k, ceil_mode=True) (bnn.models)")
    tensors[f"{prefix}.weight"] = _f32(conv.weight)
    tensors[f"{prefix}.scale"], tensors[f"{prefix}.shift"] = fold_batchnorm(unit.down_bn)
    return {"tensors": prefix, "in_channels": int(conv.in_channels), "out_channels": int(conv.out_channels),
            "pool": k}


def _pool(kind: str, m) -> dict:
    if getattr(m, "ceil_mode", False):
        raise ValueError(f"{kind} with ceil_mode=True is not supported by the engine")
    if kind == "maxpool2d" and _pair(m.dilation) != [1, 1]:
        raise ValueError("max-pool with dilation is not supported by the engine")
    if kind == "avgpool2d" and m.divisor_override is not None:
        raise ValueError("avg-pool with divisor_override is not supported by the engine")
    out = {"op": kind, "kernel": _pair(m.kernel_size),
           "stride": _pair(m.stride if m.stride is not None else m.kernel_size), "padding": _pair(m.padding)}
    if kind == "avgpool2d":
        out["count_include_pad"] = bool(m.count_include_pad)
    return out


def _describe(model: nn.Module) -> tuple[list[dict], dict[str, np.ndarray]]:
    """The layer list in execution order and the tensors it names (models.py's flat layout)."""
    tensors: dict[str, np.ndarray] = {}
    stem = model.stem
    if stem.bias is not None or stem.groups != 1:
        raise ValueError("the stem must be a bias-free, groups=1 nn.Conv2d (bnn.models layout)")
    tensors["stem.weight"] = _f32(stem.weight)
    tensors["stem.scale"], tensors["stem.shift"] = fold_batchnorm(model.stem_bn)
    layers = [{
        "op": "stem", "tensors": "stem",
        "in_channels": int(stem.in_channels), "out_channels": int(stem.out_channels),
        "kernel": _pair(stem.kernel_size), "stride": _pair(stem.stride),
        "padding": _pair(stem.padding), "dilation": _pair(stem.dilation),
    }]
    for i, m in enumerate(model.body):
        if isinstance(m, BinaryUnit):
            if not isinstance(m.conv, BinaryConv2d):
                raise ValueError(f"body.{i} is not binary (a float model cannot be exported to the binary engine)")
            unit = {"op": "binary_unit", "name": f"body.{i}", "conv": _binary_conv(f"body.{i}.conv", m.conv, m.bn, tensors)}
            if not m.residual:
                unit["residual"] = "none"
            elif m.down_conv is None:
                unit["residual"] = "identity"
            elif not isinstance(m.down_conv, BinaryConv2d):
                unit["residual"] = "real"
                unit["shortcut"] = _real_shortcut(f"body.{i}.down_conv", m, tensors)
            else:
                unit["residual"] = "down"
                unit["down"] = _binary_conv(f"body.{i}.down_conv", m.down_conv, m.down_bn, tensors)
            layers.append(unit)
        elif isinstance(m, nn.MaxPool2d):
            layers.append(_pool("maxpool2d", m))
        elif isinstance(m, nn.AvgPool2d):
            layers.append(_pool("avgpool2d", m))
        else:
            raise ValueError(f"body.{i} is a {type(m).__name__}; the engine runs BinaryUnit, MaxPool2d, AvgPool2d")
    cls = model.classifier
    tensors["classifier.weight"] = _f32(cls.weight)
    tensors["classifier.bias"] = _f32(cls.bias) if cls.bias is not None else np.zeros(cls.out_features, np.float32)
    layers.append({"op": "global_avgpool"})
    layers.append({"op": "linear", "tensors": "classifier",
                   "in_features": int(cls.in_features), "out_features": int(cls.out_features)})
    return layers, tensors


def export_model(model: nn.Module, path: str, *, mean=None, std=None, pixel_max=None, class_names=None,
                 source_sha256: str | None = None, dataset: str | None = None) -> dict:
    """Write ``model`` (a ``bnn.models.BNNet``) to ``path``; returns the metadata written.

    ``mean``/``std``: per-channel normalization in raw pixel units (default: identity).
    """
    from safetensors.numpy import save

    refuse_non_regular(path)  # before any work: never rename over a folder, FIFO or device
    config = dict(getattr(model, "config", {}))
    if "measure" not in config:
        raise ValueError("model has no .config with a measure; build it with bnn.models")
    genome = str(Genome.parse(config["measure"]))
    for m in model.modules():
        if isinstance(m, BinaryConv2d) and str(m.genome) != genome:
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
    layers, tensors = _describe(model)
    downsample = config.get("downsample", "binary")
    wrong = {"binary": "real", "real": "down"}.get(downsample, "?")
    if downsample not in ("binary", "real") or any(layer.get("residual") == wrong for layer in layers):
        raise ValueError(f"model.config says downsample={downsample!r}, which its shortcuts are not; "
                         "build the model with bnn.models and one downsample kind")
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "arch": config.get("arch"),
        "genome": genome,
        "num_classes": num_classes,
        "input_shape": [int(v) for v in config.get("input_shape", [in_ch, 0, 0])],
        "downsample": downsample,
        "input": {"mean": mean, "std": std, "pixel_max": pixel_max,
                  "normalization": "(pixel - mean[c]) / std[c], raw pixel units"},
        "dataset": dataset,
        "class_names": names,
        "source_sha256": source_sha256,
        "layers": layers,
    }
    check_engine_accepts(meta, tensors, path)  # before the file is written, not when the engine loads it
    # Atomic and durable: a reader never sees a half-written file; a full disk keeps the old one.
    atomic_write_bytes(path, save(tensors, metadata={FORMAT: json.dumps(meta)}))
    return meta


def check_engine_accepts(meta: dict, tensors: dict[str, np.ndarray], path: str) -> None:
    """ValueError, one line, for a model the engine would refuse or could only run into inf/NaN: its
    own reader (``refimpl.model_file.describe``) checks the metadata as the file will hold it (a
    zero or negative input shape, an input std of 0), and every float tensor must be finite (a
    BatchNorm whose running variance + eps is 0 folds to an infinite scale; a diverged run)."""
    from refimpl import model_file

    for name, t in tensors.items():
        if t.dtype.kind == "f" and not np.isfinite(t).all():
            what = "a folded BatchNorm: running_var + eps must be > 0 and finite" if name.endswith(
                (".scale", ".shift")) else "a diverged run's weights"
            raise ValueError(f"{path}: not written: tensor {name} holds non-finite values ({what})")
    try:
        model_file.describe(json.loads(json.dumps(meta)), tensors, path)  # the metadata as the file holds it
    except model_file.ModelFileError as exc:
        raise ValueError(f"{exc} (not written: the engine would refuse it)") from None


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_checkpoint(checkpoint: str, out: str) -> dict:
    from .train import load_checkpoint

    check_output(out, [checkpoint])  # -o CHECKPOINT would replace the checkpoint with the export
    ckpt = load_checkpoint(checkpoint)
    mc, data = ckpt.get("model_config") or {}, ckpt.get("data") or {}
    try:
        # A checkpoint written before the option has no downsample: it trained the binary kind.
        model = build_model(mc["arch"], mc["measure"], mc["num_classes"], tuple(mc["input_shape"]),
                            downsample=mc.get("downsample", "binary"))
        model.load_state_dict(ckpt["model"])
    except (KeyError, RuntimeError, TypeError) as exc:
        raise ValueError(f"{checkpoint}: model config or weights do not fit ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    model.eval()
    return export_model(
        model, out, mean=data.get("mean"), std=data.get("std"), pixel_max=data.get("pixel_max"),
        class_names=data.get("class_names"), source_sha256=sha256_file(checkpoint), dataset=data.get("name"),
    )


def main(argv=None) -> int:
    p = OneLineParser(prog="python -m bnn.export",
                description="Export a bnn.train checkpoint to a .bnn file for the CPU engine (python -m refimpl.infer).")
    p.add_argument("checkpoint", help="checkpoint.pt written by python -m bnn.train")
    p.add_argument("-o", "--out", required=True, help="output file, e.g. MODEL.bnn")
    args = p.parse_args(argv)
    try:
        meta = export_checkpoint(args.checkpoint, args.out)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {meta['arch']} with genome {meta['genome']}, {meta['downsample']} downsampling, "
          f"{size / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
