"""Export a trained BNN for the CPU engine: ``python -m bnn.export CHECKPOINT -o MODEL.bnn``.

``model_file`` turns a ``bnn.nn.models.BNNet`` into the records of refimpl's ``.bnn`` format
(``refimpl/engine/format.py`` documents them), folding every BatchNorm as torch computes it and
packing the binary weights, and has the engine's reader check the result
(``refimpl/engine/model_file.py``) before anything is written, so it never writes a file the engine
refuses; ``cli`` is the command line. Every name ``bnn.export`` had as one module imports from it,
loaded on first use: the command's ``--help`` imports no torch.
"""
import importlib

_LAZY = {"main": "cli"}
__all__ = ["export_checkpoint", "export_model", "fold_batchnorm", "main", "sha256_file"]


def __getattr__(name: str):
    # A dunder Python looks up, or a submodule not imported yet (``from bnn.export import cli``
    # asks here first): not a name of model_file, and asking it would import torch for nothing.
    if name.startswith("__") or name in ("cli", "model_file"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY.get(name, 'model_file')}"), name)  # or AttributeError
    globals()[name] = value  # once: later lookups find it without this function
    return value
