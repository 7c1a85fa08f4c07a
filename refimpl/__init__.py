"""refimpl: the CPU golden reference (NumPy + Numba; it never imports torch).

Bit-packed popcount kernels for the contingency counts a, b, c, d of dense and convolution
layers, the operator table and genomes of the measure search, and the measure evaluator.
"""
from .bits import pack_bits, unpack_bits
from .counts import counts_conv2d, counts_dense
from .genome import CLASSIC_MEASURES, PAPER_MEASURES, REGISTERED, Genome
from .measure import default_alpha, measure
from .operators import BINARY, UNARY, Operator

__all__ = [
    "BINARY",
    "CLASSIC_MEASURES",
    "Genome",
    "Operator",
    "PAPER_MEASURES",
    "REGISTERED",
    "UNARY",
    "counts_conv2d",
    "counts_dense",
    "default_alpha",
    "measure",
    "pack_bits",
    "unpack_bits",
]
