"""bnn: the PyTorch path. Differentiable counts, the measure graph, binary layers.

One package per layer, each importing only those below it (tests/test_layers.py): ``common``
(run-folder lock, journals, worker liveness, statistics), ``nn`` (the differentiable path),
``train``, then ``search`` and ``evidence``, then ``diagnose``; beside them ``settings``,
``data`` and ``paper_results`` at the bottom, ``export`` and ``reproduce`` at the top. The
paths modules had before (``bnn.layers``, ...) still import, with a DeprecationWarning
(``bnn/_moved.py``).

The public names below are imported on first use: ``import bnn`` checks that torch is installed
but does not import it, so a process that never trains (a search's synthetic fitness and its
workers, a command's ``--help`` or its refused arguments: tests/test_old_paths.py) does not pay
torch's import (3-7 s of CPU).
"""
import importlib
import sys

from . import (
    _moved,
    _requires,  # noqa: F401  (first: without torch, one line saying what to install)
)

# public name -> the module that defines it
PUBLIC = {
    "BinaryConv2d": "bnn.nn.layers",
    "BinaryLinear": "bnn.nn.layers",
    "counts_conv2d": "bnn.nn.counts",
    "counts_dense": "bnn.nn.counts",
    "measure": "bnn.nn.measure",
    "sign": "bnn.nn.layers",
    "ste_sign": "bnn.nn.layers",
}

_moved.install(sys.modules[__name__])


def __getattr__(name: str):
    if name in PUBLIC:
        value = getattr(importlib.import_module(PUBLIC[name]), name)
        globals()[name] = value  # once: later lookups find it without this function
        return value
    return _moved.attribute(name)


def __dir__():
    return sorted(set(globals()) | set(PUBLIC))


__all__ = sorted(PUBLIC)
