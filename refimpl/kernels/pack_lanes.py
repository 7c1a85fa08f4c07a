"""The packing step of ``bits.pack_nchw``, written as LLVM vectors: L pixels' words of one
channel word.

``outi[p + j, k] = OR over channels ch in [c0, c1) of (xi[ch, p + j] >= 0) << (ch - c0)`` for
j < L: per channel, one ``<L x float>`` load of the row, one ordered ``>=`` compare (NaN gives
0, -0.0 gives 1: ``bits.py``'s convention), and the channel's bit or-ed into the lanes the
compare selects. AVX-512 does it as ``vcmpps`` into mask registers and masked ``vporq``; other
targets blend. The L words then go to their rows of ``outi`` (K words apart).

The same step as L named scalar words left to LLVM's SLP vectorizer gave these instructions but
took 4-10 s of compile per process for the three widths (docs/performance.md, Compile time).
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .vector_ir import I32 as _I32
from .vector_ir import I64 as _I64
from .vector_ir import as_i64, broadcast

_F32 = ir.FloatType()


def _codegen(L: int):
    floats = ir.VectorType(_F32, L)
    words = ir.VectorType(_I64, L)

    def codegen(context, builder, signature, args):
        xi_ty, out_ty = signature.args[0], signature.args[4]
        xi = context.make_array(xi_ty)(context, builder, args[0])
        outi = context.make_array(out_ty)(context, builder, args[4])
        p, c0, c1, k = (as_i64(builder, args[i]) for i in (1, 2, 3, 5))
        x_row = cgutils.unpack_tuple(builder, xi.shape, 2)[1]
        out_row = cgutils.unpack_tuple(builder, outi.shape, 2)[1]
        acc = cgutils.alloca_once_value(builder, ir.Constant(words, None))
        zero = ir.Constant(floats, None)
        with cgutils.for_range(builder, builder.sub(c1, c0)) as loop:
            r = loop.index
            at = builder.add(builder.mul(builder.add(c0, r), x_row), p)
            values = builder.load(builder.bitcast(builder.gep(xi.data, [at]), floats.as_pointer()), align=4)
            bit = builder.shl(ir.Constant(_I64, 1), r)
            chosen = builder.select(builder.fcmp_ordered(">=", values, zero), broadcast(builder, bit, words),
                                    ir.Constant(words, None))
            builder.store(builder.or_(builder.load(acc), chosen), acc)
        value = builder.load(acc)
        for j in range(L):
            at = builder.add(builder.mul(builder.add(p, ir.Constant(_I64, j)), out_row), k)
            builder.store(builder.extract_element(value, ir.Constant(_I32, j)), builder.gep(outi.data, [at]))
        return context.get_dummy_value()

    return codegen


@functools.lru_cache(maxsize=None)
def pack_lanes(lanes: int):
    """The intrinsic ``step(xi, p, c0, c1, outi, k)`` for ``lanes`` pixels: ``xi`` (C, P) float32
    and ``outi`` (P, K) uint64, both C-contiguous; 0 <= c1 - c0 <= 64 channels; the caller keeps
    pixels p .. p + lanes - 1 in range."""

    @intrinsic
    def step(typingctx, xi, p, c0, c1, outi, k):
        if not (isinstance(xi, types.Array) and xi.dtype == types.float32 and xi.ndim == 2 and xi.layout == "C"):
            return None
        if not (isinstance(outi, types.Array) and outi.dtype == types.uint64 and outi.ndim == 2 and outi.layout == "C"):
            return None
        if not all(isinstance(t, types.Integer) for t in (p, c0, c1, k)):
            return None
        return types.void(xi, p, c0, c1, outi, k), _codegen(lanes)

    return step
