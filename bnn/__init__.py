"""bnn: the PyTorch path. Differentiable counts, the measure graph, binary layers."""
from . import _requires  # noqa: F401  (first: without torch, one line saying what to install)
from .counts import counts_conv2d, counts_dense
from .layers import BinaryConv2d, BinaryLinear, sign, ste_sign
from .measure import measure

__all__ = [
    "BinaryConv2d",
    "BinaryLinear",
    "counts_conv2d",
    "counts_dense",
    "measure",
    "sign",
    "ste_sign",
]
