"""The training loop: ``train_model`` (one seeded, resumable run), ``evaluate`` and their helpers."""
from __future__ import annotations

import math
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from ..data import Dataset, load_dataset
from ..nn.layers import set_measure_grad_clip, set_measure_impl
from ..nn.models import build_model
from ..settings import ADAM_BETAS, MEASURE_IMPL_BEFORE
from .config import TrainConfig, TrainResult, resolve_device, resolve_step
from .files import (
    CHECKPOINT,
    METRICS,
    append_metrics,
    finish,
    finished_result,
    json_safe,
    load_checkpoint,
    prepare_out_dir,
    run_finished,
    save_checkpoint,
    set_rng_state,
    start_fresh,
    write_metrics,
)
from .graph_step import GraphStep, graph_epoch

EVAL_BATCH = 500  # images per evaluation forward pass; memory only, not accuracy
# On CUDA the loss is checked for NaN/inf every this many steps, not every step: each check
# waits for the GPU, and a diverged run loses at most these steps.
CUDA_FINITE_CHECK_EVERY = 16
# What a resumed run must share with its checkpoint (downsample and counts are checked on their
# own: old checkpoints lack them).
RESUME_MUST_MATCH = ("model", "dataset", "measure", "seed", "split_seed", "batch_size", "lr", "gamma", "train_size")
# torch.compile's backend for the compiled and graphs steps (the tests take "aot_eager": TorchDynamo
# and AOTAutograd as on the GPU, without inductor's minutes of C++ on a 2-core CPU).
COMPILE_BACKEND = "inductor"


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


def setup_backend(device: torch.device) -> None:
    """Backend switches for ``device``: TF32 and cuDNN autotuning on CUDA, nothing on the CPU."""
    if device.type == "cuda":
        # Counts are exact in TF32 (0/1 operands, float32 accumulation; docs/design.md section 1).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True


def seed_everything(seed: int) -> torch.Generator:
    """Seed torch, NumPy and Python; returns the CPU generator of the data stream."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    gen = torch.Generator()
    gen.manual_seed(seed + 1)  # the data stream differs from the init stream
    return gen


def train_model(cfg: TrainConfig, data: Dataset | None = None, reject_below: float | None = None,
                progress: bool = False, _stop_after_epoch: int | None = None, keep: dict | None = None) -> TrainResult:
    """Train one model; never raises for a diverging measure (status "diverged").

    ``data``: a preloaded ``bnn.data.load_dataset(...)`` result to share across runs.
    ``reject_below``: after epoch 1, a validation accuracy below it stops the run ("rejected").
    ``_stop_after_epoch``: for tests, return after that epoch's checkpoint as if killed.
    ``keep``: a dict a caller holds across runs (a search worker): under measure_impl "triton" the model,
    its optimizer and its captured step are kept there and reset in place for the next genome.
    """
    t0, c0 = time.perf_counter(), time.process_time()
    cfg.validate()
    device = resolve_device(cfg.device, cfg.dataset)
    setup_backend(device)
    ckpt_path, metrics_path = _run_paths(cfg)
    ckpt = load_checkpoint(ckpt_path) if cfg.resume and ckpt_path and os.path.isfile(ckpt_path) else None
    if cfg.out_dir:
        prepare_out_dir(cfg.out_dir)
    if ckpt is not None:
        _check_resumable(cfg, ckpt, ckpt_path)
        if run_finished(ckpt, cfg.epochs):
            return finished_result(cfg, ckpt)  # reported, not retrained: no data needed
    data = _data_for(cfg, data, device)
    kind = resolve_step(cfg, device)
    gen, model, optimizer, scheduler, forward = _training_for(cfg, data, device, kind, keep)
    history, start_epoch = _restore(cfg, ckpt, model, optimizer, scheduler, gen, metrics_path)

    status, test = "running", None
    wall_offset = history[-1]["wall_s"] if history else 0.0  # wall_s counts across resumes
    cpu_offset = (history[-1].get("cpu_s") or 0.0) if history else 0.0  # and cpu_s (none in older checkpoints)
    for epoch in range(start_epoch + 1, cfg.epochs + 1):
        steps = _train_steps(cfg, data, device, model, forward, optimizer, gen, epoch, progress, kind)
        val_acc, _ = evaluate(model, data, data.val_x, data.val_y)
        row = _epoch_row(epoch, steps, val_acc, optimizer.param_groups[0]["lr"], wall_offset + time.perf_counter() - t0,
                         cpu_offset + time.process_time() - c0)
        if steps["diverged"]:
            status = "diverged"
        else:
            scheduler.step()
        if status != "diverged" and epoch == 1 and reject_below is not None and val_acc is not None and val_acc < reject_below:
            status = row["status"] = "rejected"
        history.append(json_safe(row))
        if status == "running" and epoch == cfg.epochs:
            status = "ok"
            if cfg.eval_test:
                test = evaluate(model, data, data.test_x, data.test_y)
        if metrics_path:
            append_metrics(metrics_path, history[-1])
        if ckpt_path:
            save_checkpoint(ckpt_path, model, optimizer, scheduler, gen, cfg, data, epoch, history, status, test)
        if progress:
            print(_epoch_line(history[-1]), file=sys.stderr, flush=True)
        if status != "running" or (_stop_after_epoch is not None and epoch >= _stop_after_epoch):
            break
    if status == "running" and start_epoch >= cfg.epochs:
        status = "ok"  # resumed a run whose epochs were all done
    return finish(cfg, status, history, test, t0)


def _run_paths(cfg: TrainConfig) -> tuple[str | None, str | None]:
    # No out_dir (the search's fitness runs): no files at all.
    if not cfg.out_dir:
        return None, None
    os.makedirs(cfg.out_dir, exist_ok=True)
    return os.path.join(cfg.out_dir, CHECKPOINT), os.path.join(cfg.out_dir, METRICS)


def _check_resumable(cfg: TrainConfig, ckpt: dict, ckpt_path: str) -> None:
    saved = ckpt["config"]
    for key in RESUME_MUST_MATCH:
        if saved.get(key) != getattr(cfg, key):
            raise ValueError(f"cannot resume {ckpt_path}: it was trained with {key}={saved.get(key)!r}, not {getattr(cfg, key)!r}")
    # A checkpoint written before the options has no key: it trained the binary kind, raw counts, no clip,
    # the eager measure.
    for key, default in (("downsample", "binary"), ("counts", "raw"), ("measure_grad_clip", None),
                         ("measure_impl", MEASURE_IMPL_BEFORE)):
        if saved.get(key, default) != getattr(cfg, key):
            raise ValueError(f"cannot resume {ckpt_path}: it was trained with "
                             f"{key}={saved.get(key, default)!r}, not {getattr(cfg, key)!r}")


def _data_for(cfg: TrainConfig, data: Dataset | None, device: torch.device) -> Dataset:
    # The preloaded data set if it is the one cfg asks for, else the one cfg names, loaded.
    if data is None:
        return load_dataset(cfg.dataset, cfg.data_dir, cfg.val_size, cfg.split_seed, device, cfg.download,
                            cfg.train_size)
    if data.name != cfg.dataset or data.device.type != device.type:
        raise ValueError(f"preloaded data is {data.name} on {data.device}, config wants {cfg.dataset} on {device}")
    if cfg.val_size is not None and cfg.val_size != data.val_size:
        raise ValueError(f"preloaded data holds out {data.val_size} validation images, config wants {cfg.val_size}")
    if cfg.train_size != data.train_subset:
        raise ValueError(f"preloaded data has train_size={data.train_subset}, config wants {cfg.train_size}: "
                         "pass the same train_size to load_dataset")
    return data


def build_training(cfg: TrainConfig, data: Dataset, device: torch.device, fused: bool = False,
                   capturable: bool = False):
    """(generator, model, optimizer, scheduler) of a run of ``cfg``, seeded as train_model seeds them
    (bnn.diagnose trains its first steps from the same)."""
    # Seeds first: the model's initialization draws from them. fused: Adam's one-kernel CUDA step;
    # capturable: its step inside a CUDA graph.
    gen = seed_everything(cfg.seed)
    model = build_model(cfg.model, cfg.measure, data.num_classes, data.input_shape,
                        downsample=cfg.downsample, counts=cfg.counts).to(device)
    set_measure_grad_clip(model, cfg.measure_grad_clip)
    set_measure_impl(model, cfg.measure_impl)  # fused applies on float32 CPU counts outside torch.compile
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    if cfg.measure_impl == "triton":
        from ..gpu.measure_op import prime_geometry, use_triton_measure

        prime_geometry(use_triton_measure(model), data.input_shape)
    adam = {"fused": True, **({"capturable": True} if capturable else {})} if fused else {}
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=ADAM_BETAS, **adam)
    return gen, model, optimizer, _scheduler(cfg, optimizer)


def _scheduler(cfg: TrainConfig, optimizer) -> torch.optim.lr_scheduler.MultiStepLR:
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(cfg.milestones), gamma=cfg.gamma)


def _keep_key(cfg: TrainConfig) -> tuple:
    # What a kept model, optimizer and captured step depend on; the genome, seed and schedule are reset in place.
    return (cfg.model, cfg.dataset, cfg.downsample, cfg.counts, cfg.measure_grad_clip, cfg.batch_size,
            cfg.device, cfg.step, cfg.compile)


def _training_for(cfg: TrainConfig, data: Dataset, device: torch.device, kind: str, keep: dict | None):
    """(generator, model, optimizer, scheduler, forward): built, or under measure_impl triton with ``keep``
    the kept ones for this setting, reset in place to what a fresh build of ``cfg`` starts from."""
    triton = cfg.measure_impl == "triton"
    key = _keep_key(cfg) if keep is not None and triton else None
    if key is not None and key in keep:
        model, optimizer, forward = keep[key]
        gen = reset_training(cfg, data, model, optimizer)
        return gen, model, optimizer, _scheduler(cfg, optimizer), forward
    graphs = kind == "graphs" and triton
    gen, model, optimizer, scheduler = build_training(cfg, data, device, fused=kind != "eager" and device.type == "cuda",
                                                      capturable=graphs)
    if graphs:
        forward = GraphStep(model, optimizer, cfg.batch_size, data.input_shape, device)
    else:
        forward = compiled_forward(model, kind, triton)
    if key is not None:
        keep[key] = (model, optimizer, forward)
    return gen, model, optimizer, scheduler, forward


def reset_training(cfg: TrainConfig, data: Dataset, model: torch.nn.Module, optimizer) -> torch.Generator:
    """Put a kept model (routed by bnn.gpu) and its Adam back to a fresh run of ``cfg``, in place (the same
    tensors, so compiled and captured graphs replay): the genome's codes and tables, the parameters and
    BatchNorm statistics a fresh build draws from cfg.seed, Adam's state zeroed (as before its first
    step), the lr cfg's. Returns the data generator, seeded as build_training seeds it."""
    from ..gpu.measure_op import set_genome

    gen = seed_everything(cfg.seed)
    fresh = build_model(cfg.model, cfg.measure, data.num_classes, data.input_shape,
                        downsample=cfg.downsample, counts=cfg.counts)  # the same draws as build_training's
    set_genome(model, cfg.measure, reset_alpha=False)  # alpha comes with the fresh parameters
    model.load_state_dict(fresh.state_dict())  # copy_ into the kept tensors
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                value.zero_()
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] = cfg.lr
    return gen


def _restore(cfg, ckpt, model, optimizer, scheduler, gen, metrics_path) -> tuple[list[dict], int]:
    # (history, epochs done): the checkpoint's, with metrics.jsonl rebuilt from it, or a fresh start.
    if ckpt is None:
        if cfg.out_dir:
            start_fresh(cfg.out_dir)
        return [], 0
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    set_rng_state(ckpt["rng"], gen)
    history = list(ckpt["history"])
    if metrics_path:
        write_metrics(metrics_path, history)
    return history, int(ckpt["epoch"])


def compiled_forward(model: torch.nn.Module, kind: str, triton: bool = False):
    """What a training step calls for the step kind ``kind`` (bnn.train.config.STEPS); ``triton``: the model's
    binary layers run bnn/gpu's operator, which takes the genome as data already."""
    if kind == "eager":
        return model
    if kind == "compiled":
        if not triton:
            from ..nn.measure_op import use_measure_op

            use_measure_op(model)  # the genome enters as a tensor: one compiled graph for every genome
        return torch.compile(model, backend=COMPILE_BACKEND)
    return torch.compile(model, backend=COMPILE_BACKEND, mode="reduce-overhead")


def steps_per_epoch(images: int, batch_size: int, kind: str) -> int:
    """Optimizer steps in an epoch of ``images``: the compiled kinds take full batches only (a
    ragged last batch is a second shape, so a second compile and CUDA graph), the eager one
    every image. Each epoch draws a new permutation, so the images left out differ by epoch."""
    if kind == "eager" or images < batch_size:
        return math.ceil(images / batch_size)
    return images // batch_size


def _train_steps(cfg, data, device, model, forward, optimizer, gen, epoch, progress, kind) -> dict:
    # One epoch's optimizer steps, stopped by the first non-finite loss (seen every step on the
    # CPU, every CUDA_FINITE_CHECK_EVERY steps on CUDA; by the captured step itself: graph_step.py).
    model.train()
    t_epoch = time.perf_counter()
    steps = steps_per_epoch(len(data.train_y), cfg.batch_size, kind)
    if isinstance(forward, GraphStep):  # the whole step replayed, no host check inside the epoch
        bar = _progress(steps, f"epoch {epoch}/{cfg.epochs}", progress)
        out = graph_epoch(forward, data, gen, steps, bar)
        if bar is not None:
            bar.close()
        return {**out, "train_s": time.perf_counter() - t_epoch}
    plan = data.epoch_plan(gen)
    check_every = CUDA_FINITE_CHECK_EVERY if device.type == "cuda" else 1
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    finite = torch.ones((), dtype=torch.bool, device=device)
    seen, diverged = 0, False
    bar = _progress(steps, f"epoch {epoch}/{cfg.epochs}", progress)
    for step in range(steps):
        idx = plan["perm"][step * cfg.batch_size:(step + 1) * cfg.batch_size]
        x = data.augment(data.train_x[idx], plan["offsets"][idx], plan["flips"][idx])
        y = data.train_y[idx]
        if kind == "graphs":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs are consumed
        logits = forward(data.normalize(x))
        loss = F.cross_entropy(logits, y)
        finite = finite & torch.isfinite(loss)
        if ((step + 1) % check_every == 0 or step == steps - 1) and not finite.item():
            diverged = True
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
    return {"loss_sum": loss_sum, "correct": correct, "seen": seen, "diverged": diverged,
            "train_s": time.perf_counter() - t_epoch}


def _epoch_row(epoch: int, steps: dict, val_acc, lr: float, wall_s: float, cpu_s: float) -> dict:
    # One line of metrics.jsonl, its keys in this order.
    seen, train_s = steps["seen"], steps["train_s"]
    return {
        "epoch": epoch,
        # The loss that ended a diverged run was not finite.
        "train_loss": float("nan") if steps["diverged"] or not seen else steps["loss_sum"].item() / seen,
        "train_acc": steps["correct"].item() / seen if seen else 0.0,
        "val_acc": val_acc,
        "lr": float(lr),
        "images_per_s": seen / train_s if train_s > 0 else None,
        "wall_s": wall_s,
        "cpu_s": cpu_s,  # this process's CPU seconds (every thread), counted across resumes as wall_s is
        "status": "diverged" if steps["diverged"] else "ok",
    }


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
