"""bnn: the PyTorch path. Differentiable counts, the measure graph, binary layers.

One package per layer, each importing only those below it (tests/test_layers.py): ``common``
(run-folder lock, journals, worker liveness, statistics), ``nn`` (the differentiable path),
``train``, then ``search`` and ``evidence``, then ``diagnose``; beside them ``settings``,
``data`` and ``paper_results`` at the bottom, ``export`` and ``reproduce`` at the top. The
paths modules had before (``bnn.layers``, ...) still import, with a DeprecationWarning
(``bnn/_moved.py``).
"""
import sys

from . import (
    _moved,
    _requires,  # noqa: F401  (before anything imports torch: without it, one line saying what to install)
)
from .nn.counts import counts_conv2d, counts_dense
from .nn.layers import BinaryConv2d, BinaryLinear, sign, ste_sign
from .nn.measure import measure

_moved.install(sys.modules[__name__])


def __getattr__(name: str):
    return _moved.attribute(name)


__all__ = [
    "BinaryConv2d",
    "BinaryLinear",
    "counts_conv2d",
    "counts_dense",
    "measure",
    "sign",
    "ste_sign",
]
