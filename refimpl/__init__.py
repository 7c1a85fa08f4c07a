"""refimpl: the CPU golden reference (NumPy + Numba; it never imports torch).

The measure algebra lives at the top (``operators``, ``genome``, ``formula``, ``measure`` and
the generated ``_numba_ops``), beside what every layer shares (``_jit``, ``isa``, ``cli``,
``fileio``, ``datasets``, ``info``). Below it, one subpackage per layer:

* ``refimpl.kernels``: bit-packed popcount kernels for the contingency counts a, b, c, d of
  dense and convolution layers;
* ``refimpl.engine``: CPU inference of exported ``.bnn`` models (``python -m refimpl.infer``);
* ``refimpl.codegen``: the templates of the generated kernel files (``python -m refimpl.codegen``).
"""
from . import _environment

_environment.check()  # before Numba is imported: it reads NUMBA_NUM_THREADS then

from .genome import CLASSIC_MEASURES, PAPER_MEASURES, REGISTERED, Genome  # noqa: E402
from .kernels.bits import pack_bits, unpack_bits  # noqa: E402
from .kernels.counts import counts_conv2d, counts_dense  # noqa: E402
from .measure import default_alpha, measure  # noqa: E402
from .operators import BINARY, UNARY, Operator  # noqa: E402

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
