"""The engine stem's float32 register tile, written as LLVM vectors: P pixels by Q channels.

For the pixels ``p0 + q*ps`` (q < P) and the channels ``o0 .. o0+Q-1``:
``y[pixel, o] = fma(col[K-1, pixel], wk[K-1, o], ... fma(col[0, pixel], wk[0, o], 0))``, the
inputs k in ascending order, one rounding per step: the order of the scalar loop it replaces,
so the results are bit for bit the same. Per k: one ``<Q x float>`` load of ``wk[k, o0:o0+Q]``,
per pixel one broadcast of ``col[k, pixel]`` and one ``llvm.fma`` into its accumulator. LLVM
splits ``<Q x float>`` into the target's registers (two zmm for Q = 32 on AVX-512, four ymm on
AVX2, eight xmm on SSE and ARM64 NEON) and, without hardware FMA, into ``fmaf`` calls: the same
rounding everywhere.

The same tile as 256 named scalar accumulators left LLVM's SLP vectorizer to find the vectors:
the same instructions, but 6-13 s of compile per process and per instruction set (the suite's
longest first compile); this form compiles in a fraction of a second.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .vector_ir import I64 as _I64
from .vector_ir import as_i64, broadcast

_F32 = ir.FloatType()


def _codegen(P: int, Q: int):
    vec = ir.VectorType(_F32, Q)

    def codegen(context, builder, signature, args):
        col_ty, wk_ty, y_ty = signature.args[0], signature.args[1], signature.args[5]
        col = context.make_array(col_ty)(context, builder, args[0])
        wk = context.make_array(wk_ty)(context, builder, args[1])
        y = context.make_array(y_ty)(context, builder, args[5])
        p0, ps, o0 = (as_i64(builder, args[i]) for i in (2, 3, 4))
        n_inputs = cgutils.unpack_tuple(builder, col.shape, 2)[0]
        col_row, wk_row, y_row = (cgutils.unpack_tuple(builder, a.shape, 2)[1] for a in (col, wk, y))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{Q}f32")
        pixels = [builder.add(p0, builder.mul(ps, ir.Constant(_I64, q))) for q in range(P)]
        acc = [cgutils.alloca_once_value(builder, ir.Constant(vec, None)) for _ in range(P)]
        with cgutils.for_range(builder, n_inputs) as loop:
            k = loop.index
            w_at = builder.gep(wk.data, [builder.add(builder.mul(k, wk_row), o0)])
            w = builder.load(builder.bitcast(w_at, vec.as_pointer()), align=4)
            col_k = builder.mul(k, col_row)
            for q in range(P):
                x = builder.load(builder.gep(col.data, [builder.add(col_k, pixels[q])]))
                builder.store(builder.call(fma, [broadcast(builder, x, vec), w, builder.load(acc[q])]), acc[q])
        for q in range(P):
            y_at = builder.gep(y.data, [builder.add(builder.mul(pixels[q], y_row), o0)])
            builder.store(builder.load(acc[q]), builder.bitcast(y_at, vec.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _float32_matrix(ty) -> bool:
    return isinstance(ty, types.Array) and ty.dtype == types.float32 and ty.ndim == 2 and ty.layout == "C"


@functools.lru_cache(maxsize=None)
def fma_tile(pixels: int, channels: int):
    """The intrinsic ``tile(col, wk, p0, ps, o0, y)`` for ``pixels`` x ``channels``: col (K, positions),
    wk (K, O) and y (positions, O) C-contiguous float32; the caller keeps every index in range."""

    @intrinsic
    def tile(typingctx, col, wk, p0, ps, o0, y):
        if not (_float32_matrix(col) and _float32_matrix(wk) and _float32_matrix(y)):
            return None
        if not all(isinstance(t, types.Integer) for t in (p0, ps, o0)):
            return None
        return types.void(col, wk, p0, ps, o0, y), _codegen(pixels, channels)

    return tile
