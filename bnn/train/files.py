"""A training run's folder: ``checkpoint.pt`` (with every RNG state, for exact resume),
``metrics.jsonl`` and ``summary.json``; and the result a finished run reports from them."""
from __future__ import annotations

import json
import math
import os
import random
import time
import warnings

import numpy as np
import torch

from refimpl.fileio import (
    OutputError,
    atomic_file,
    atomic_write_text,
    check_output,
    open_regular,
    remove_stale_temps,
    write_error,
)
from refimpl.genome import Genome

from .config import TrainConfig, TrainResult

STATUSES = ("ok", "rejected", "diverged")
CHECKPOINT, METRICS, SUMMARY = "checkpoint.pt", "metrics.jsonl", "summary.json"
RUN_FILES = (CHECKPOINT, METRICS, SUMMARY)


def rng_state(gen: torch.Generator) -> dict:
    """Every RNG state a training draws from (torch, NumPy, Python, the data stream ``gen``, CUDA)."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        # Stored as tensors and plain values so the checkpoint loads with weights_only=True.
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "python": random.getstate(),
        "data": gen.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, gen: torch.Generator) -> None:
    """Restore the RNG states ``rng_state`` recorded."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    gen.set_state(state["data"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path, model, optimizer, scheduler, gen, cfg, data, epoch, history, status, test) -> None:
    """Write the checkpoint atomically: model, optimizer, scheduler, RNG states, history, status."""
    ckpt = {
        "format": "bnn-train-checkpoint",
        "version": 1,
        "config": cfg.to_dict(),
        "model_config": dict(model.config),
        "data": data.describe(),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(gen),
        "epoch": epoch,
        "history": history,
        "status": status,  # "running" until the last epoch, then one of STATUSES
        "test": test,  # (top-1, top-5) once the run is done and the test set was evaluated
    }
    with atomic_file(path) as f:  # temp file, fsync, rename, fsync the folder; a full disk keeps the last one
        torch.save(ckpt, f)


def load_checkpoint(path: str, resumable: bool = True) -> dict:
    """Read a bnn.train checkpoint (weights_only); a missing or foreign file is a one-line error.
    ``resumable``: also its history, epoch and status, which resuming reads (an export reads
    only the model and its config)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}")
    try:
        with warnings.catch_warnings():  # a crafted file's torch warnings would print above the one error line
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a truncated or foreign file
        raise ValueError(f"{path} is not a readable checkpoint ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != "bnn-train-checkpoint":
        raise ValueError(f"{path} is not a bnn.train checkpoint")
    history, epoch = ckpt.get("history"), ckpt.get("epoch")
    # What resume and a finished run read, typed: a damaged or crafted one is one line, not a traceback.
    if resumable and not (isinstance(history, list) and all(isinstance(r, dict) for r in history)
            and isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0
            and isinstance(ckpt.get("status"), str) and isinstance(ckpt.get("config"), dict)):
        raise ValueError(f"{path} is a damaged bnn.train checkpoint (its config, history, epoch or status is not what "
                         "bnn.train writes); train again into another --out")
    problem = _contradiction(ckpt.get("config"), ckpt.get("model_config"))
    if problem:
        raise ValueError(f"{path} is a damaged bnn.train checkpoint: {problem}; export or resume would each trust "
                         "a different one: train again into another --out")
    return ckpt


# What the training settings (``config``) and the model (``model_config``) both record, and the
# value a checkpoint from before the key trained with: export reads the model's, resume the
# settings', so the two must agree.
_SHARED = (("measure", None), ("downsample", "binary"), ("counts", "raw"))


def _contradiction(config, model_config) -> str | None:
    """How a checkpoint's ``config`` and ``model_config`` disagree, or None. A checkpoint with only
    one of them (older ones, hand-made ones) has nothing to contradict: export checks the model's
    and resume the settings' in their turn."""
    if not (isinstance(config, dict) and isinstance(model_config, dict)):
        return None
    for key, default in _SHARED:
        a, b = config.get(key, default), model_config.get(key, default)
        if key == "measure":
            a, b = _canonical(a), _canonical(b)
        if a != b:
            return f"config.{key} is {str(a)[:40]!r} but model_config.{key} is {str(b)[:40]!r}"
    return None


def _canonical(measure):
    try:
        return str(Genome.parse(measure))
    except (ValueError, TypeError, AttributeError):
        return measure  # not a genome: build_model and TrainConfig each refuse it in their turn


def write_metrics(path: str, history: list[dict]) -> None:
    """Rewrite metrics.jsonl atomically from the history, one JSON line per epoch."""
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in history))


def append_metrics(path: str, row: dict) -> None:
    """Append one epoch's line to metrics.jsonl (a full disk is one line; resume rebuilds the file)."""
    try:
        with os.fdopen(open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a") as f:  # never through a link
            f.write(json.dumps(row) + "\n")
    except OutputError:
        raise
    except OSError as exc:
        raise write_error(path, exc) from None


def run_finished(ckpt: dict, epochs: int) -> bool:
    """A checkpoint whose run is over: a final status, and not an "ok" run given more epochs."""
    return ckpt["status"] in STATUSES and not (ckpt["status"] == "ok" and epochs > int(ckpt["epoch"]))


def finished_result(cfg: TrainConfig, ckpt: dict) -> TrainResult:
    """A finished run's result from its checkpoint, its figures as they were recorded (wall_s is
    the run's own); summary.json is written only where a kill left it missing, never rewritten."""
    history = list(ckpt["history"])
    wall = history[-1]["wall_s"] if history and history[-1].get("wall_s") is not None else 0.0
    summary = os.path.join(cfg.out_dir, SUMMARY) if cfg.out_dir else None
    write = summary is not None and not os.path.exists(summary)
    if not write and summary is not None:
        try:  # the summary's wall_s also counts the test evaluation and the last save
            with open(summary) as f:
                recorded = json.load(f).get("wall_s")
            wall = recorded if isinstance(recorded, (int, float)) else wall
        except (OSError, ValueError, AttributeError):
            pass  # unreadable: the last epoch's figure
    return finish(cfg, ckpt["status"], history, ckpt.get("test"), None, write=write, wall_s=wall)


def prepare_out_dir(out_dir: str) -> None:
    """Before any work: refuse outputs that are not regular files, remove temp files of killed writers."""
    for name in RUN_FILES:
        check_output(os.path.join(out_dir, name))
    remove_stale_temps(out_dir)


def start_fresh(out_dir: str) -> None:
    """Remove an earlier run's checkpoint and summary and start an empty metrics.jsonl."""
    # So a kill during the first epoch cannot leave the old checkpoint to be resumed or its
    # summary to be reported (the CLI refuses such a folder without --overwrite).
    for name in (CHECKPOINT, SUMMARY):
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    write_metrics(os.path.join(out_dir, METRICS), [])


def finish(cfg, status, history, test, t0, write: bool = True, wall_s: float | None = None) -> TrainResult:
    """The run's TrainResult; with ``write``, a run folder and a final status, also its summary.json."""
    test = test or (None, None)
    vals = [r["val_acc"] for r in history]
    result = TrainResult(
        status=status,
        val_acc=vals[-1] if vals else None,
        val_acc_per_epoch=vals,
        test_acc=test[0],
        epochs=len(history),
        wall_s=time.perf_counter() - t0 if wall_s is None else wall_s,
        test_top5=test[1],
        train_loss=history[-1]["train_loss"] if history else None,
        config=cfg.to_dict(),
    )
    if write and cfg.out_dir and status in STATUSES:
        atomic_write_text(os.path.join(cfg.out_dir, SUMMARY), json.dumps(json_safe(result.to_dict())) + "\n")
    return result


def json_safe(row: dict) -> dict:
    """The row with non-finite floats as None (JSON has no NaN)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
