"""What an exported model costs, layer by layer: ``python -m refimpl.infer MODEL.bnn --summary``.

As larq's model summary does for Keras, per layer: its output (C, H, W); its 1-bit
multiply-accumulates (a binary convolution's input-weight bit pairs, the XNOR/popcount work, the
same count for every measure); its 32-bit ones (the stem, Bi-Real shortcuts, the classifier);
its measure evaluations (one per output element of a binary convolution: where a searched
measure costs more than XNOR's ``(a+d)-(b+c)``); and its parameters' bytes as the file stores them
(weight bits packed 64 to a word, everything else float32). Read from the file's checked
description (``model_file.describe``): nothing is compiled or run.
"""
from __future__ import annotations

from .format import BinaryConv, BinaryUnit, Description, GlobalAvgPool, Linear, Pool, RealShortcut, Stem

_FIELDS = ("binary_macs", "float_macs", "measures", "bit_bytes", "float_bytes", "binary_weights", "float_weights")


def _conv_cost(conv, out_hw) -> int:
    """A convolution's multiply-accumulates: every (output element, input channel, tap)."""
    kh, kw = conv.kernel
    return conv.out_channels * out_hw[0] * out_hw[1] * conv.in_channels * kh * kw


def _binary(conv: BinaryConv, out_hw) -> dict:
    floats = conv.alpha.size + conv.scale.size + conv.shift.size
    return {"binary_macs": _conv_cost(conv, out_hw), "measures": conv.out_channels * out_hw[0] * out_hw[1],
            "bit_bytes": conv.bits.nbytes, "float_bytes": 4 * floats,
            "binary_weights": conv.out_channels * conv.in_channels * conv.kernel[0] * conv.kernel[1],
            "float_weights": floats}


def _floats(macs: int, *arrays) -> dict:
    n = sum(a.size for a in arrays)
    return {"float_macs": macs, "float_bytes": 4 * n, "float_weights": n}


def _add(*parts: dict) -> dict:
    return {k: sum(p.get(k, 0) for p in parts) for k in _FIELDS}


def _geometry(conv) -> str:
    kh, kw = conv.kernel
    stride = "" if tuple(conv.stride) == (1, 1) else f" /{conv.stride[0]}" if conv.stride[0] == conv.stride[1] \
        else f" /{tuple(conv.stride)}"
    return f"{kh}x{kw}{stride}"


def rows(d: Description) -> list[dict]:
    """One row per layer: name, kind, output (C, H, W) and the costs of ``_FIELDS``."""
    if d.shapes is None:  # an exporter's description, not yet through the reader
        raise ValueError("the layers' shapes come from reading the file: summarize model_file.describe(*read(path), path)")
    out = []
    for i, (layer, shape) in enumerate(zip(d.layers, d.shapes)):
        hw = shape[1:]
        if isinstance(layer, Stem):
            name, kind = layer.name, f"float conv {_geometry(layer)}"
            cost = _floats(_conv_cost(layer, hw), layer.weight, layer.scale, layer.shift)
        elif isinstance(layer, BinaryUnit):
            name, kind = layer.name, f"binary conv {_geometry(layer.conv)}"
            parts = [_binary(layer.conv, hw)]
            if layer.down is not None:
                kind += f" + binary {_geometry(layer.down)} shortcut"
                parts.append(_binary(layer.down, hw))
            elif layer.shortcut is not None:
                s: RealShortcut = layer.shortcut
                kind += f" + float 1x1 shortcut (avgpool {s.pool[0]}x{s.pool[1]})"
                parts.append(_floats(s.out_channels * hw[0] * hw[1] * s.in_channels, s.weight, s.scale, s.shift))
            elif layer.residual == "identity":
                kind += " + identity"
            cost = _add(*parts)
        elif isinstance(layer, Pool):
            name, kind, cost = f"layer{i}", f"{layer.op[:3]}pool {layer.kernel[0]}x{layer.kernel[1]}", {}
        elif isinstance(layer, GlobalAvgPool):
            name, kind, cost = f"layer{i}", "global avgpool", {}
        else:
            assert isinstance(layer, Linear)
            name, kind = layer.name, "float linear"
            cost = _floats(layer.in_features * layer.out_features, layer.weight, layer.bias)
        out.append({"name": name, "kind": kind, "output": list(shape), **_add(cost)})
    return out


def totals(table: list[dict]) -> dict:
    """The costs summed, the parameters' bytes, and what the same parameters take in float32."""
    t = _add(*table)
    t["bytes"] = t["bit_bytes"] + t["float_bytes"]
    t["float32_bytes"] = 4 * (t["binary_weights"] + t["float_weights"])
    return t


def _si(v: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:.2f} {unit}"
    return f"{v:.0f}"


def title(d: Description, where: str) -> str:
    """The summary's first line: the model, its measure and convention, its input and classes."""
    return (f"{d.arch or 'model'} ({d.genome}, {d.downsample} downsampling, {d.counts} counts), input "
            f"{'x'.join(map(str, d.input_shape))}, {d.num_classes} classes: {where}")


def text(d: Description, title: str) -> str:
    """The table a terminal shows, and the totals under it."""
    table = rows(d)
    head = ("layer", "kind", "output", "1-bit MACs", "32-bit MACs", "measures", "bits kB", "float32 kB")
    body = [(r["name"], r["kind"], "x".join(map(str, r["output"])), _si(r["binary_macs"]), _si(r["float_macs"]),
             _si(r["measures"]), f"{r['bit_bytes'] / 1e3:.2f}", f"{r['float_bytes'] / 1e3:.2f}") for r in table]
    width = [max(len(row[j]) for row in [head, *body]) for j in range(len(head))]
    line = lambda row: "  ".join(c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(row, width)))  # noqa: E731
    t = totals(table)
    return "\n".join([
        title, "", line(head), *map(line, body), "",
        f"Total: {_si(t['binary_macs'])} 1-bit MACs, {_si(t['float_macs'])} 32-bit MACs, {_si(t['measures'])} measure "
        f"evaluations ({d.genome.formula()}); parameters {t['bytes'] / 1e3:.1f} kB as stored ({t['bit_bytes'] / 1e3:.1f} kB "
        f"of packed weight bits, {t['float_bytes'] / 1e3:.1f} kB float32), {t['float32_bytes'] / 1e3:.1f} kB as float32 "
        f"({t['float32_bytes'] / t['bytes']:.1f}x smaller)",
    ]) + "\n"
