"""Training: ``python -m bnn.train`` and ``train_model(TrainConfig(...))`` (the search's and the
evidence grid's trainings too).

``cli`` (the command line; its docstring: the run folder and exact resume), ``config``
(TrainConfig, TrainResult, devices), ``loop`` (train_model, evaluate), ``files`` (checkpoint,
metrics, summary). Every name ``bnn.train`` had when it was one module stays importable from it.
"""
from ..settings import ADAM_BETAS, DEFAULT_MODEL, DEFAULT_PRESET, FITNESS, PRESETS, STEPS
from .cli import RESUME_FIXED, _parser, config_from_args, main  # noqa: F401  (_parser: as bnn.train had it)
from .config import DEVICES, TrainConfig, TrainResult, check_settings, resolve_device, resolve_step
from .files import CHECKPOINT, METRICS, RUN_FILES, STATUSES, SUMMARY, finished_result, load_checkpoint, run_finished
from .loop import CUDA_FINITE_CHECK_EVERY, EVAL_BATCH, evaluate, setup_backend, train_model

_setup_backend = setup_backend  # its name when it lived in bnn.train
__all__ = [
    "ADAM_BETAS", "CHECKPOINT", "CUDA_FINITE_CHECK_EVERY", "DEFAULT_MODEL", "DEFAULT_PRESET", "DEVICES", "EVAL_BATCH",
    "FITNESS", "METRICS", "PRESETS", "RESUME_FIXED", "RUN_FILES", "STATUSES", "STEPS", "SUMMARY", "TrainConfig",
    "TrainResult", "check_settings", "config_from_args", "evaluate", "finished_result", "load_checkpoint", "main",
    "resolve_device", "resolve_step", "run_finished", "setup_backend", "train_model",
]
