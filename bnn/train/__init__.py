"""Training: ``python -m bnn.train`` and ``train_model(TrainConfig(...))`` (the search's and the
evidence grid's trainings too).

``cli`` (the command line; its docstring: the run folder and exact resume), ``config``
(TrainConfig, TrainResult, devices), ``loop`` (train_model, evaluate), ``files`` (checkpoint,
metrics, summary). Every name ``bnn.train`` had when it was one module stays importable from it,
loaded on first use, as ``bnn``'s: ``python -m bnn.train --help`` and a refused argument import no
torch.
"""
import importlib

from ..settings import ADAM_BETAS, DEFAULT_MODEL, DEFAULT_PRESET, FITNESS, PRESETS, STEPS  # noqa: F401

# name -> the module of this package that defines it
_LAZY = {
    **dict.fromkeys(("RESUME_FIXED", "_parser", "config_from_args", "main"), "cli"),  # _parser: as bnn.train had it
    **dict.fromkeys(("DEVICES", "TrainConfig", "TrainResult", "check_settings", "resolve_device", "resolve_step"),
                    "config"),
    **dict.fromkeys(("CHECKPOINT", "METRICS", "RUN_FILES", "STATUSES", "SUMMARY", "finished_result",
                     "load_checkpoint", "run_finished"), "files"),
    **dict.fromkeys(("CUDA_FINITE_CHECK_EVERY", "EVAL_BATCH", "evaluate", "setup_backend", "train_model",
                     "_setup_backend"), "loop"),
}
_RENAMED = {"_setup_backend": "setup_backend"}  # its name when it lived in bnn.train

__all__ = [
    "ADAM_BETAS", "CHECKPOINT", "CUDA_FINITE_CHECK_EVERY", "DEFAULT_MODEL", "DEFAULT_PRESET", "DEVICES", "EVAL_BATCH",
    "FITNESS", "METRICS", "PRESETS", "RESUME_FIXED", "RUN_FILES", "STATUSES", "STEPS", "SUMMARY", "TrainConfig",
    "TrainResult", "check_settings", "config_from_args", "evaluate", "finished_result", "load_checkpoint", "main",
    "resolve_device", "resolve_step", "run_finished", "setup_backend", "train_model",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), _RENAMED.get(name, name))
        globals()[name] = value  # once: later lookups find it without this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
