"""A small valid .bnn file built by hand (NumPy, no torch), for tests of the engine's file reader.

Every layer kind the engine runs, with a dilation, an identity and a 1x1 shortcut. For side 8:

    0 stem C->8, 3x3 pad 1                                        8x8
    1 binary 8->8, 3x3 dilation 2 pad 2, identity shortcut        8x8
    2 maxpool 2x2 stride 2                                        4x4
    3 binary 8->16, 3x3 stride 2 pad 1, 1x1 stride 2 shortcut     2x2
    4 avgpool 3x3 stride 1 pad 1 (count_include_pad false)        2x2
    5 binary 16->16, 3x3 pad 1, no shortcut                       2x2
    6 global average pool, 7 linear 16->classes
"""
from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import save

from refimpl.engine.format import FORMAT
from refimpl.genome import Genome


def _conv_entry(prefix, i, o, k, s, p, d=1):
    return {"tensors": prefix, "in_channels": i, "out_channels": o, "kernel": [k, k], "stride": [s, s],
            "padding": [p, p], "dilation": [d, d]}


def _conv_tensors(rng, prefix, i, o, k):
    return {
        f"{prefix}.bits": rng.integers(0, 1 << i, (o, k, k, 1), dtype=np.uint64),  # i <= 63: one word, tail zero
        f"{prefix}.alpha": rng.uniform(0.5, 2.0, (4, o)).astype(np.float32),
        f"{prefix}.scale": rng.uniform(0.5, 2.0, o).astype(np.float32),
        f"{prefix}.shift": rng.normal(0.0, 1.0, o).astype(np.float32),
    }


def tiny_model(seed=0, channels=1, side=8, classes=3, real=False) -> tuple[dict, dict]:
    """(metadata, tensors) of the model drawn above, for (channels, side, side) inputs.

    ``real``: the file of a ``downsample="real"`` model, whose layer 3 has Bi-Real's shortcut
    (2x2 average pool, full-precision 1x1 convolution) instead of the binary 1x1 one.
    """
    rng = np.random.default_rng(seed)
    layers = [
        {"op": "stem", "tensors": "stem", "in_channels": channels, "out_channels": 8, "kernel": [3, 3],
         "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1]},
        {"op": "binary_unit", "name": "u1", "conv": _conv_entry("u1.conv", 8, 8, 3, 1, 2, 2), "residual": "identity"},
        {"op": "maxpool2d", "kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]},
        {"op": "binary_unit", "name": "u2", "conv": _conv_entry("u2.conv", 8, 16, 3, 2, 1), "residual": "down",
         "down": _conv_entry("u2.down", 8, 16, 1, 2, 0)},
        {"op": "avgpool2d", "kernel": [3, 3], "stride": [1, 1], "padding": [1, 1], "count_include_pad": False},
        {"op": "binary_unit", "name": "u3", "conv": _conv_entry("u3.conv", 16, 16, 3, 1, 1), "residual": "none"},
        {"op": "global_avgpool"},
        {"op": "linear", "tensors": "classifier", "in_features": 16, "out_features": classes},
    ]
    meta = {
        "format": FORMAT, "version": 1, "arch": "hand_built", "genome": str(Genome.parse("baseline")),
        "num_classes": classes, "input_shape": [channels, side, side],
        "input": {"mean": [8.0] * channels, "std": [4.0] * channels, "pixel_max": 16},
        "class_names": [f"class{i}" for i in range(classes)],
        "layers": layers,
    }
    tensors = {
        "stem.weight": rng.normal(0.0, 1.0, (8, channels, 3, 3)).astype(np.float32),
        "stem.scale": rng.uniform(0.5, 2.0, 8).astype(np.float32),
        "stem.shift": rng.normal(0.0, 1.0, 8).astype(np.float32),
        **_conv_tensors(rng, "u1.conv", 8, 8, 3),
        **_conv_tensors(rng, "u2.conv", 8, 16, 3),
        **_conv_tensors(rng, "u2.down", 8, 16, 1),
        **_conv_tensors(rng, "u3.conv", 16, 16, 3),
        "classifier.weight": rng.normal(0.0, 1.0, (classes, 16)).astype(np.float32),
        "classifier.bias": rng.normal(0.0, 1.0, classes).astype(np.float32),
    }
    if real:
        meta["downsample"] = "real"
        unit = meta["layers"][3]
        del unit["down"]
        unit["residual"] = "real"
        unit["shortcut"] = {"tensors": "u2.short", "in_channels": 8, "out_channels": 16, "pool": [2, 2]}
        for name in ("bits", "alpha", "scale", "shift"):
            del tensors[f"u2.down.{name}"]
        tensors["u2.short.weight"] = rng.normal(0.0, 1.0, (16, 8, 1, 1)).astype(np.float32)
        tensors["u2.short.scale"] = rng.uniform(0.5, 2.0, 16).astype(np.float32)
        tensors["u2.short.shift"] = rng.normal(0.0, 1.0, 16).astype(np.float32)
    return meta, tensors


def model_bytes(meta, tensors) -> bytes:
    return save(tensors, metadata={FORMAT: json.dumps(meta)})


def split(raw: bytes) -> tuple[dict, bytes]:
    """(safetensors header, tensor data) of a file's bytes."""
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def join(header, data: bytes) -> bytes:
    """A file's bytes from a header (a dict, or raw bytes) and tensor data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data
