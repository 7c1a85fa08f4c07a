"""The instruments of ``python -m bnn.diagnose``: one ``LayerProbe`` per binary layer.

A probe replaces its layer's ``forward`` (on the instance, nothing else changes) by the same calls
the layer makes, except that the measure graph is evaluated node by node (``measure_nodes``, the
same ``bnn.nn.measure.unary``/``binary`` calls in the same order as ``bnn.nn.measure.measure``, so values
and gradients are bit-identical) and every node keeps its tensor. Forward, it accumulates the
statistics of docs/design.md section 6 (diagnosis); backward, a hook on each node's tensor records
the gradient's norm in the order autograd computes them, so the first non-finite gradient names
the backward operation that made it: the consumer of that tensor (``Event.made_by``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from refimpl.operators import BINARY, UNARY

from ..nn.counts import counts_conv2d, counts_dense, window_sizes
from ..nn.layers import BinaryConv2d, ste_sign
from ..nn.measure import binary, initial_alpha, unary

NODES = ("U1", "U2", "U3", "U4", "B1", "B2", "B3")
# The slot each count enters (docs/design.md section 2: unary slots read a, d, b, c).
SLOT_OF = {"a": "U1", "d": "U2", "b": "U3", "c": "U4"}
CONSUMER = {"U1": "B1", "U2": "B1", "U3": "B2", "U4": "B2", "B1": "B3", "B2": "B3", "B3": "BatchNorm"}
# The divisor of each binary operator that divides (refimpl/operators.py formulas), over its operands.
DENOMINATORS = {
    4: lambda x, y: y,
    5: lambda x, y: x + y,
    6: lambda x, y: x,
    7: lambda x, y: x + y,
    10: lambda x, y: 1 + torch.exp(-y),
    11: lambda x, y: 1 + torch.exp(-x),
}
TINY = torch.finfo(torch.float32).tiny  # below it a float32 divisor is subnormal: its reciprocal overflows


def measure_nodes(genome, a, b, c, d, alpha) -> dict:
    """``{node: tensor}`` of the measure graph on converted counts, as ``bnn.nn.measure.measure`` computes it."""
    channels = a.shape[1]
    per_channel = (1, channels) + (1,) * (a.dim() - 2)
    if alpha is None and any(genome.uses_alpha()):
        alpha = initial_alpha(genome, channels, dtype=a.dtype, device=a.device)
    elif alpha is not None:
        alpha = torch.as_tensor(alpha).to(a.dtype)
    nodes, rows = {}, {}
    for slot, (code, count) in enumerate(zip(genome.unary, (a, d, b, c))):
        row = alpha[slot].reshape(per_channel) if UNARY[code].uses_alpha else None
        if row is not None:
            rows[NODES[slot]] = row
        nodes[NODES[slot]] = unary(code, count, row)
    b1, b2, b3 = genome.binary
    nodes["B1"] = binary(b1, nodes["U1"], nodes["U2"])
    nodes["B2"] = binary(b2, nodes["U3"], nodes["U4"])
    nodes["B3"] = binary(b3, nodes["B1"], nodes["B2"])
    return {"nodes": nodes, "alpha_rows": rows}


def division_operands(genome, nodes: dict):
    """``[(node, code, x, y)]`` for each binary node whose operator divides."""
    operands = {"B1": ("U1", "U2"), "B2": ("U3", "U4"), "B3": ("B1", "B2")}
    out = []
    for name, code in zip(("B1", "B2", "B3"), genome.binary):
        if code in DENOMINATORS:
            left, right = operands[name]
            out.append((name, code, nodes[left], nodes[right]))
    return out


@dataclass
class Event:
    """One gradient, as autograd handed it to a hook: which tensor, which backward op made it, its norm."""
    seq: int
    layer: str
    tensor: str
    made_by: str
    norm: float
    finite: bool
    grad: torch.Tensor | None = None  # kept only when not finite, for the evidence


@dataclass
class Recorder:
    """The gradient events of one backward pass, in the order autograd computed them."""
    events: list = field(default_factory=list)
    grads: dict = field(default_factory=dict)  # id(tensor) -> its gradient, this step only (for the evidence)

    def reset(self) -> None:
        """Forget the last step's events and gradients."""
        self.events.clear()
        self.grads.clear()

    def hook(self, layer: str, label: str, made_by: str, key: int):
        """A tensor hook that records the gradient it sees (and returns None: the gradient is unchanged)."""
        def fn(grad):
            if grad is None:  # autograd hands None for a gradient it knows is zero
                return
            norm, finite = grad_norm(grad)
            self.events.append(Event(len(self.events), layer, label, made_by, norm, finite,
                                     None if finite else grad.detach()))
            self.grads[key] = grad.detach()
        return fn


def grad_norm(grad: torch.Tensor) -> tuple[float, bool]:
    """(L2 norm, every element finite); float32's norm can overflow on finite elements: then float64."""
    norm = float(torch.linalg.vector_norm(grad))
    if math.isfinite(norm):
        return norm, True
    finite = bool(torch.isfinite(grad).all())
    return (float(torch.linalg.vector_norm(grad, dtype=torch.float64)) if finite else norm), finite


def _new_stats() -> dict:
    return {"windows": 0, "input_all_0": 0, "input_all_1": 0, "values": 0, "nonfinite_values": 0,
            "min_abs": math.inf, "max_abs": 0.0, "bn_var_min": math.inf, "bn_var_max": 0.0,
            "denominators": {}, "grads": {}, "first_max_abs": None, "last_max_abs": None}


class LayerProbe:
    """Instruments one binary layer (see the module docstring); ``stats`` accumulates over steps."""

    def __init__(self, name: str, layer, bn, recorder: Recorder):
        self.name, self.layer, self.bn, self.recorder = name, layer, bn, recorder
        self.stats = _new_stats()
        self.step: dict = {}
        layer.forward = self.forward
        if bn is not None:
            bn.register_forward_pre_hook(self._bn_pre_hook)
            bn.register_forward_hook(self._bn_hook)

    def forward(self, x):
        """The layer's forward, node by node (bit-identical to ``layer.forward``), instrumented."""
        layer = self.layer
        xs, ws = ste_sign(x, 1.0), ste_sign(layer.weight, None)
        if isinstance(layer, BinaryConv2d):
            geometry = (layer.stride, layer.padding, layer.dilation)
            counts = counts_conv2d(xs, ws, *geometry)
            sizes = window_sizes(x, layer.weight, *geometry)
            n = sizes if layer.counts != "raw" else None
        else:
            counts = counts_dense(xs, ws)
            n = sizes = layer.in_features
        inputs = layer._converted(counts, n)
        graph = measure_nodes(layer.genome, *inputs, layer.alpha)
        self.step = {"counts": counts, "inputs": inputs, **graph}
        with torch.no_grad():
            self._forward_stats(counts, sizes, graph["nodes"])
        if torch.is_grad_enabled():
            self._register_hooks(xs, ws, counts, inputs, graph)
        return graph["nodes"]["B3"]

    def _forward_stats(self, counts, sizes, nodes) -> None:
        s, y = self.stats, nodes["B3"]
        a, b, c, d = counts
        px = a[:, :1] + c[:, :1]  # input bits set in each window: the same for every output channel
        s["windows"] += px.numel()
        s["input_all_0"] += int((px == 0).sum())
        s["input_all_1"] += int((px == torch.as_tensor(sizes, dtype=px.dtype)).sum())
        # One pass per node: a finite sum means every element is finite (a huge finite sum that overflows
        # is checked elementwise); a node that is a count passed through is finite.
        self.step["nonfinite_nodes"] = [k for k, v in nodes.items() if not any(v is t for t in counts)
                                        and not (math.isfinite(float(v.sum())) or bool(torch.isfinite(v).all()))]
        bad = 0
        if "B3" in self.step["nonfinite_nodes"]:
            finite = torch.isfinite(y)
            bad, y = int((~finite).sum()), y[finite]
        s["values"] += nodes["B3"].numel()
        s["nonfinite_values"] += bad
        if y.numel():
            lo, hi = torch.aminmax(y.abs())
            s["min_abs"], s["max_abs"] = min(s["min_abs"], float(lo)), max(s["max_abs"], float(hi))
            s["first_max_abs"] = float(hi) if s["first_max_abs"] is None else s["first_max_abs"]
            s["last_max_abs"] = float(hi)
        for node, code, left, right in division_operands(self.layer.genome, nodes):
            den = DENOMINATORS[code](left, right).abs()
            tally = s["denominators"].setdefault(node, {"operator": BINARY[code].name, "values": 0, "zero": 0,
                                                        "subnormal": 0, "overflow": 0, "nan": 0})
            tally["values"] += den.numel()
            lo, hi = torch.aminmax(den)
            if not (float(lo) >= TINY and math.isfinite(float(hi))):  # the tallies cost passes: only when needed
                tally["zero"] += int((den == 0).sum())
                tally["subnormal"] += int(((den > 0) & (den < TINY)).sum())
                tally["overflow"] += int(torch.isinf(den).sum())
                tally["nan"] += int(torch.isnan(den).sum())

    def _bn_pre_hook(self, module, inputs) -> None:
        self.step["running_var"] = None if module.running_var is None else module.running_var.clone()

    def _bn_variance(self, module, n: int) -> None:
        # The batch variance BatchNorm took, read back from its running average (no extra pass over the
        # values): running_var = (1 - m) old + m * unbiased batch variance; reported biased, as BN divides by.
        old, m = self.step.get("running_var"), module.momentum
        if old is None or not m or n < 2:
            return
        var = (module.running_var - (1 - m) * old) / m * ((n - 1) / n)
        s = self.stats
        s["bn_var_min"] = min(s["bn_var_min"], float(var.min()))
        s["bn_var_max"] = max(s["bn_var_max"], float(var.max()))

    def _bn_hook(self, module, inputs, output) -> None:
        self.step["bn_out_finite"] = math.isfinite(float(output.detach().sum())) or bool(torch.isfinite(output).all())
        if module.training:
            self._bn_variance(module, inputs[0].numel() // inputs[0].shape[1])
        if torch.is_grad_enabled() and output.requires_grad:
            self.step["bn_out"] = output
            output.register_hook(self.recorder.hook(self.name, "bn output", "downstream (after this layer's BatchNorm)",
                                                    id(output)))

    def _register_hooks(self, xs, ws, counts, inputs, graph) -> None:
        # (label, tensor, made_by) from upstream to downstream; a tensor listed twice (raw counts are the
        # measure's inputs, an identity slot passes its count through) keeps both labels and is made by
        # the consumer furthest downstream.
        nodes, converted = graph["nodes"], self.layer.counts != "raw" or inputs[0] is not counts[0]
        entries = [("input bits", xs, "counts backward"), ("weight bits", ws, "counts backward")]
        for name, t in zip("abcd", counts):
            entries.append((name, t, "counts convention" if converted else SLOT_OF[name]))
        for name, t in zip("abcd", inputs):
            entries.append((f"{name} (measure input)", t, SLOT_OF[name]))
        for node in NODES:
            entries.append((node, nodes[node], CONSUMER[node]))
        for slot, row in graph["alpha_rows"].items():
            entries.append((f"alpha {slot}", row, slot))
        merged: dict[int, list] = {}
        for label, t, made_by in entries:
            if not t.requires_grad:
                continue
            if id(t) in merged:
                merged[id(t)][0] += f" = {label}"
                merged[id(t)][2] = made_by
            else:
                merged[id(t)] = [label, t, made_by]
        for key, (label, t, made_by) in merged.items():
            t.register_hook(self.recorder.hook(self.name, label, made_by, key))
        self.step.update(xs=xs, ws=ws)

    def add_grad_stats(self, events) -> None:
        """Fold this step's gradient norms (of this layer) and its parameters' into ``stats``."""
        grads = self.stats["grads"]
        named = [(e.tensor, e.norm, e.finite) for e in events if e.layer == self.name]
        for pname, p in (("weight", self.layer.weight), ("alpha", self.layer.alpha)):
            if p.grad is not None:
                named.append((f"{pname} (parameter)", *grad_norm(p.grad)))
        for label, norm, finite in named:
            g = grads.setdefault(label, {"max_norm": 0.0, "nonfinite_steps": 0})
            if finite:
                g["max_norm"] = max(g["max_norm"], norm)
            else:
                g["nonfinite_steps"] += 1


def attach(model, recorder: Recorder) -> list[LayerProbe]:
    """A probe on every binary layer of ``model``, in module order, each with the BatchNorm that follows it."""
    from ..nn.layers import BinaryMeasureLayer

    modules = dict(model.named_modules())
    probes = []
    for name, module in model.named_modules():
        if isinstance(module, BinaryMeasureLayer):
            parent, _, leaf = name.rpartition(".")
            bn_name = (parent + "." if parent else "") + ("down_bn" if leaf == "down_conv" else "bn")
            probes.append(LayerProbe(name, module, modules.get(bn_name), recorder))
    return probes
