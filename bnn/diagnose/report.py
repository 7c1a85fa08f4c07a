"""What ``python -m bnn.diagnose`` reports: the evidence at the first non-finite element, per-layer
rows, and the readable table. Non-finite floats appear in JSON as the strings "nan", "inf", "-inf"."""
from __future__ import annotations

import math

import torch

from .probe import CONSUMER, NODES

COUNT_NAMES = "abcd"


def number(v):
    """A float for JSON: finite as is, non-finite as its name ("nan", "inf", "-inf")."""
    v = float(v)
    return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def _first_bad(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.nonzero(~torch.isfinite(t))[0])


def _at(t, index, shape):
    # The value of a node at one element of the layer's output; a node may broadcast against it.
    return number(torch.broadcast_to(t.detach(), shape)[index])


def _window(probe, index) -> dict:
    # The counts, converted counts and every node's value at one element of the layer's output.
    step = probe.step
    shape = step["nodes"]["B3"].shape
    out = {"index": list(index)}
    out.update({k: _at(t, index, shape) for k, t in zip(COUNT_NAMES, step["counts"])})
    if probe.layer.counts != "raw":
        out.update({f"{k}'": _at(t, index, shape) for k, t in zip(COUNT_NAMES, step["inputs"])})
    out.update({node: _at(step["nodes"][node], index, shape) for node in NODES})
    return out


def evidence_for_value(probe, operator: str) -> dict:
    """Where a forward value first stopped being finite: its share and the window at its first element."""
    step = probe.step
    if operator == "BatchNorm":
        y, out = step["nodes"]["B3"], step["bn_out"]
        var = y.detach().var(dim=[0] + list(range(2, y.dim())), unbiased=False)
        return {"nonfinite_share": float((~torch.isfinite(out)).float().mean()),
                "measure_max_abs": number(y.detach().abs().max()), "bn_input_var_max": number(var.max())}
    t = step["nodes"][operator].detach()
    return {"nonfinite_share": float((~torch.isfinite(t)).float().mean()), "window": _window(probe, _first_bad(t))}


def evidence_for_gradient(probe, event, recorder) -> dict:
    """Where a gradient first stopped being finite: the upstream gradient and operands at its first element."""
    grad, step = event.grad, probe.step
    out = {"nonfinite_share": float((~torch.isfinite(grad)).float().mean()),
           "nan": int(torch.isnan(grad).sum()), "inf": int(torch.isinf(grad).sum())}
    if event.made_by == "counts backward":
        out.update(_counts_backward(step, recorder))
        return out
    index = _first_bad(grad)
    out["grad_here"] = number(grad[index])
    if event.made_by in CONSUMER.values() and event.made_by in step["nodes"]:
        upstream = recorder.grads.get(id(step["nodes"][event.made_by]))
        out["upstream_grad_here"] = None if upstream is None else number(upstream[index])
    elif event.made_by == "BatchNorm" and "bn_out" in step:
        upstream = recorder.grads.get(id(step["bn_out"]))
        out["upstream_grad_norm"] = None if upstream is None else number(torch.linalg.vector_norm(upstream))
        out["measure_max_abs"] = number(step["nodes"]["B3"].detach().abs().max())
    if grad.shape == step["nodes"]["B3"].shape:
        out["window"] = _window(probe, index)
    return out


def _counts_backward(step, recorder) -> dict:
    # The counts' backward (bnn/nn/counts.py) forms dL/da = ga - gb - gc + gd, dL/dpx = sum_O (gc - gd) and
    # dL/dpw = sum_N (gb - gd), then convolves them with the 0/1 weight and input bits: an infinite
    # dL/da meets a 0 bit there, and inf * 0 is NaN.
    g = {k: recorder.grads.get(id(t)) for k, t in zip(COUNT_NAMES, step["counts"])}
    zero = next(v for v in g.values() if v is not None) * 0
    ga, gb, gc, gd = (v if v is not None else zero for v in g.values())
    parts = {"dL/da": ga - gb - gc + gd, "dL/dpx": (gc - gd).sum(1, keepdim=True), "dL/dpw": (gb - gd).sum(0, keepdim=True)}
    out = {f"max_abs_grad_{k}": (None if v is None else number(v.abs().max())) for k, v in g.items()}
    for name, t in parts.items():
        out[f"{name} nonfinite"] = int((~torch.isfinite(t)).sum())
        out[f"{name} inf"] = int(torch.isinf(t).sum())
    return out


def layer_rows(probes) -> list[dict]:
    """One JSON row per binary layer: degenerate windows, value ranges, BatchNorm variance, gradient norms."""
    rows = []
    for p in probes:
        s = p.stats
        windows, values = max(s["windows"], 1), max(s["values"], 1)
        dens = {node: {**{k: v for k, v in d.items() if k in ("operator", "values")},
                       **{f"{k}_share": d[k] / max(d["values"], 1) for k in ("zero", "subnormal", "overflow", "nan")}}
                for node, d in s["denominators"].items()}
        rows.append({
            "layer": p.name, "windows": s["windows"],
            "input_all_0_share": s["input_all_0"] / windows, "input_all_1_share": s["input_all_1"] / windows,
            "denominators": dens,
            "value_min_abs": number(s["min_abs"]), "value_max_abs": number(s["max_abs"]),
            "value_max_abs_first_step": None if s["first_max_abs"] is None else number(s["first_max_abs"]),
            "value_max_abs_last_step": None if s["last_max_abs"] is None else number(s["last_max_abs"]),
            "nonfinite_value_share": s["nonfinite_values"] / values,
            "bn_input_var_min": number(s["bn_var_min"]), "bn_input_var_max": number(s["bn_var_max"]),
            "grads": {k: {"max_norm": number(v["max_norm"]), "nonfinite_steps": v["nonfinite_steps"]}
                      for k, v in s["grads"].items()},
        })
    return rows


def _grad_of(row, name) -> str:
    # The largest norm of a row's gradient whose label names ``name`` (labels merge aliases with " = ").
    for label, g in row["grads"].items():
        if name in label.split(" = "):
            bad = f"!{g['nonfinite_steps']}" if g["nonfinite_steps"] else ""
            return _fmt(g["max_norm"]) + bad
    return "-"


def _fmt(v) -> str:
    return v if isinstance(v, str) else f"{v:.2g}"


def _pct(v) -> str:
    # Two significant digits, so a rare degenerate window (0.0057%) does not print as 0.00.
    return "0" if v == 0 else f"{100 * v:.2g}"


def _layer_table(rows) -> list[str]:
    head = ("layer", "all0%", "all1%", "den0%", "|y| min", "|y| max", "nonfin%", "BNvar max", "g in", "g w", "g alpha",
            "g a", "g b", "g c", "g d")
    lines = ["  " + f"{head[0]:<16} " + " ".join(f"{h:>10}" for h in head[1:])]
    for r in rows:
        den = max((d["zero_share"] + d["subnormal_share"] for d in r["denominators"].values()), default=None)
        inputs = [_grad_of(r, f"{k} (measure input)") for k in COUNT_NAMES]
        cells = (r["layer"], _pct(r["input_all_0_share"]), _pct(r["input_all_1_share"]),
                 "-" if den is None else _pct(den), _fmt(r["value_min_abs"]), _fmt(r["value_max_abs"]),
                 _pct(r["nonfinite_value_share"]), _fmt(r["bn_input_var_max"]), _grad_of(r, "input bits"),
                 _grad_of(r, "weight (parameter)"), _grad_of(r, "alpha (parameter)"), *inputs)
        lines.append("  " + f"{cells[0]:<16} " + " ".join(f"{c:>10}" for c in cells[1:]))
    return lines


def _verdict(run) -> str:
    f = run["first_nonfinite"]
    where = "every value and gradient stayed finite" if f is None else (
        f"first non-finite {f['kind']} at step {f['step']}, layer {f['layer']}, operator {f['operator']}"
        + (f" (gradient of {f['tensor']})" if f.get("tensor") else ""))
    div = "not diverged" if run["diverged_at_step"] is None else f"DIVERGED (non-finite loss) at step {run['diverged_at_step']}"
    params = run["first_nonfinite_parameter_grads"]
    reached = "" if params is None else (f"; non-finite parameter gradients from step {params['step']}: "
                                         + ", ".join(params["parameters"][:6]) + (" ..." if len(params["parameters"]) > 6 else ""))
    return f"{div}; {where}{reached}"


def render(report: dict) -> str:
    """The report as readable text: one block per run, its verdict, evidence and per-layer table."""
    s = report["settings"]
    lines = [f"bnn.diagnose: {s['model']} on {s['dataset']} ({s['train_size'] or 'all'} training images, batch {s['batch_size']}, "
             f"lr {s['lr']:g}, x{s['gamma']:g} after epochs {list(s['milestones'])}, seed {s['seed']}, {s['steps']} steps, "
             f"{s['downsample']} downsampling)"]
    for run in report["runs"]:
        clip = "" if run["measure_grad_clip"] is None else f", measure-grad-clip {run['measure_grad_clip']:g}"
        lines += ["", f"{run['measure']} = {run['formula']}  [{run['genome']}], counts {run['counts']}{clip}: "
                      f"{run['steps_run']} steps in {run['wall_s']:.1f} s, loss {_fmt(run['loss_first'])} -> "
                      f"{_fmt(run['loss_last'])}", "  " + _verdict(run)]
        f, g = run["first_nonfinite"], run["first_nonfinite_gradient"]
        for event in [e for e in (f, g if g != f else None) if e is not None]:
            if event is g and g != f:
                lines.append(f"  first non-finite gradient: step {g['step']}, layer {g['layer']}, made by {g['operator']} "
                             f"(gradient of {g['tensor']})")
            details = {k: v for k, v in event.items() if k not in ("step", "kind", "layer", "operator", "tensor")}
            lines += [f"  evidence: {k} = {v}" for k, v in details.items()]
        lines += _layer_table(run["layers"])
    lines += ["", "all0%/all1%: windows whose input bits are all 0 / all 1; den0%: zero or subnormal divisors of the "
                  "division nodes; |y|: the measure's values; g ...: largest gradient norm (!k: k steps not finite)"]
    return "\n".join(lines)
