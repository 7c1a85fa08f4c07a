"""The instrumented training of ``python -m bnn.diagnose`` (bnn/diagnose/cli.py: the command line):
``diagnose(cfg, steps)`` trains the first steps exactly as ``bnn.train`` would, with a probe on
every binary layer, and reports where a value or a gradient first stops being finite."""
from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F

from refimpl.genome import Genome

from ..data import load_dataset
from ..train.config import TrainConfig, resolve_device
from ..train.loop import build_training, setup_backend, steps_per_epoch
from .probe import Recorder, attach
from .report import evidence_for_gradient, evidence_for_value, layer_rows, number


def _first_value_failure(probes, order, loss) -> dict | None:
    # In execution order, the first layer with a non-finite node (the first such node in evaluation
    # order has only finite operands, so it is the one that made it) or a non-finite BatchNorm output.
    by_name = {p.name: p for p in probes}
    for name in order:
        probe = by_name[name]
        bad = probe.step.get("nonfinite_nodes") or []
        if bad:
            return {"layer": name, "operator": bad[0], **evidence_for_value(probe, bad[0])}
        if probe.step.get("bn_out_finite") is False:
            return {"layer": name, "operator": "BatchNorm", **evidence_for_value(probe, "BatchNorm")}
    if not math.isfinite(loss):
        return {"layer": None, "operator": "outside the binary layers (stem, shortcuts, classifier or loss)"}
    return None


def _first_gradient_failure(probes, recorder) -> dict | None:
    for event in recorder.events:
        if not event.finite:
            probe = next(p for p in probes if p.name == event.layer)
            return {"layer": event.layer, "operator": event.made_by, "tensor": event.tensor,
                    **evidence_for_gradient(probe, event, recorder)}
    return None


def diagnose(cfg: TrainConfig, steps: int, data=None, progress: bool = False) -> dict:
    """Train ``steps`` steps of ``cfg`` instrumented; the report as a JSON-ready dict."""
    t0 = time.perf_counter()
    cfg.validate()
    device = resolve_device(cfg.device, cfg.dataset)
    setup_backend(device)
    if data is None:
        data = load_dataset(cfg.dataset, cfg.data_dir, cfg.val_size, cfg.split_seed, device, cfg.download, cfg.train_size)
    gen, model, optimizer, scheduler = build_training(cfg, data, device)
    recorder = Recorder()
    probes = attach(model, recorder)
    order: list[str] = []
    for p in probes:
        p.layer.register_forward_pre_hook(lambda m, args, name=p.name: order.append(name))
    model.train()
    per_epoch = steps_per_epoch(len(data.train_y), cfg.batch_size, "eager")
    losses, first, first_grad, diverged_at, step, params_bad = [], None, None, None, 0, None
    bar = _progress(steps, f"{Genome.parse(cfg.measure).name or cfg.measure} {cfg.counts}", progress)
    while step < steps and diverged_at is None:
        plan = data.epoch_plan(gen)
        for i in range(per_epoch):
            if step >= steps:
                break
            step += 1
            idx = plan["perm"][i * cfg.batch_size:(i + 1) * cfg.batch_size]
            x = data.augment(data.train_x[idx], plan["offsets"][idx], plan["flips"][idx])
            order.clear()
            recorder.reset()
            loss = F.cross_entropy(model(data.normalize(x)), data.train_y[idx])
            losses.append(float(loss.detach()))
            found = None if first else _first_value_failure(probes, order, losses[-1])
            if found:
                first = {"step": step, "kind": "value", **found}
            if not math.isfinite(losses[-1]):
                diverged_at = step  # bnn.train stops here, before the backward
                break
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            for p in probes:
                p.add_grad_stats(recorder.events)
            found = None if first_grad else _first_gradient_failure(probes, recorder)
            if found:
                first_grad = {"step": step, "kind": "gradient", **found}
                first = first or first_grad
            if params_bad is None:
                bad = _nonfinite_parameter_grads(model)
                params_bad = {"step": step, "parameters": bad} if bad else None
            optimizer.step()
            if bar is not None:
                bar.update(1)
        else:
            scheduler.step()  # an epoch ended: bnn.train steps its schedule here
    if bar is not None:
        bar.close()
    genome = Genome.parse(cfg.measure)
    return {"measure": genome.name or str(genome), "genome": str(genome), "formula": genome.formula(),
            "counts": cfg.counts, "measure_grad_clip": getattr(cfg, "measure_grad_clip", None), "steps_run": len(losses),
            "steps_per_epoch": per_epoch, "diverged_at_step": diverged_at, "first_nonfinite": first,
            "first_nonfinite_gradient": first_grad, "first_nonfinite_parameter_grads": params_bad,
            "loss_first": number(losses[0]) if losses else None, "loss_last": number(losses[-1]) if losses else None,
            "loss": [number(v) for v in losses], "layers": layer_rows(probes), "wall_s": time.perf_counter() - t0}


def _nonfinite_parameter_grads(model) -> list[str]:
    # What Adam would step with: a non-finite gradient here makes the parameter NaN at once.
    return [name for name, p in model.named_parameters()
            if p.grad is not None and not (math.isfinite(float(p.grad.sum())) or bool(torch.isfinite(p.grad).all()))]


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)
