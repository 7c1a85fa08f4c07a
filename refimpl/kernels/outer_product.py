"""The popcount tile of the AVX-512 paths, written as LLVM vectors: P pixels by Q channels.

``out = sum over s < steps of popcount(x[pixel p, step s] AND w[woff + s*Q + q])`` for p < P,
q < Q: the outer product of a step's P input words and Q weight words, one 64-bit count per
(pixel, channel). The weight panel is step-major (``w[woff + s*Q:][:Q]``, refimpl/kernels/blocked.py).

Two orientations, by the layout the counts are stored in:

* ``"channels"`` (the engine's nhwc tile): one ``<Q x i64>`` accumulator per pixel, the step's Q
  weights one vector load, the pixel's word broadcast; each pixel's Q counts stored as one vector
  (``x`` pixel-major: ``x[xoff + p*stride + s]``; ``out[ooff + p*orow + q]``).
* ``"pixels"`` (the counts API's nchw panel): one ``<P x i64>`` accumulator per channel, the
  step's P input words one vector load, the weight word broadcast; each channel's P counts stored
  as one vector (``x`` tap-major: ``x[xoff + s*stride + p]``; ``out[ooff + q*orow + p]``).

Per step and accumulator: ``and``, ``llvm.ctpop.v*i64`` (``vpopcntq`` on AVX-512 VPOPCNTDQ; LLVM
expands it to a byte lookup elsewhere) and an add. 16 x 8 is 16 zmm accumulators and one zmm of
operands, within the 32 AVX-512 registers.

The same tile as 128 named scalar accumulators left LLVM's SLP vectorizer to find these vectors:
the same instructions, but 3-11 s of compile per process, again inside every generated epilogue
that linked the tile in (docs/performance.md, Compile time; they now call one cached copy). Counts are integers: any form gives the
same bits.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .vector_ir import I64 as _I64
from .vector_ir import as_i64, broadcast, is_counts_out, is_words

ORIENTATIONS = ("channels", "pixels")


def _codegen(P: int, Q: int, orientation: str):
    # Accumulators: one per pixel over Q channel lanes, or one per channel over P pixel lanes,
    # each split into chunks of at most 8 lanes (one zmm).
    n_acc, lanes = (P, Q) if orientation == "channels" else (Q, P)
    width = min(lanes, 8)
    chunks = lanes // width
    vec = ir.VectorType(_I64, width)

    def codegen(context, builder, signature, args):
        x_ty, w_ty, out_ty = signature.args[0], signature.args[3], signature.args[6]
        x = context.make_array(x_ty)(context, builder, args[0]).data
        w = context.make_array(w_ty)(context, builder, args[3]).data
        out = context.make_array(out_ty)(context, builder, args[6]).data
        xoff, stride, woff, steps, ooff, orow = (as_i64(builder, args[i]) for i in (1, 2, 4, 5, 7, 8))
        ctpop = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec]), f"llvm.ctpop.v{width}i64")

        def const(v):
            return ir.Constant(_I64, v)

        def load_vector(ptr, at):
            return builder.load(builder.bitcast(builder.gep(ptr, [at]), vec.as_pointer()), align=8)

        acc = [[cgutils.alloca_once_value(builder, ir.Constant(vec, None)) for _ in range(chunks)] for _ in range(n_acc)]

        def accumulate(i, shared, word, chunk=None):
            for k in range(chunks) if chunk is None else (chunk,):
                counts = builder.call(ctpop, [builder.and_(shared[k], word)])
                builder.store(builder.add(builder.load(acc[i][k]), counts), acc[i][k])

        with cgutils.for_range(builder, steps) as loop:
            s = loop.index
            wrow = builder.add(woff, builder.mul(s, const(Q)))
            if orientation == "channels":
                # One weight vector; each pixel's word broadcast where it is used (16 broadcasts
                # held at once beside 16 accumulators would spill).
                shared = [load_vector(w, builder.add(wrow, const(width * k))) for k in range(chunks)]
                xrow = builder.add(xoff, s)
                for p in range(P):
                    word = builder.load(builder.gep(x, [builder.add(xrow, builder.mul(stride, const(p)))]))
                    accumulate(p, shared, broadcast(builder, word, vec))
            else:
                # The chunks of the step's input words, then chunk by chunk: a chunk meets every
                # channel in a row, each weight broadcast once (SLP's order when this was scalar
                # code, instruction for instruction; accumulator by accumulator measured 8-15%
                # slower).
                xrow = builder.add(xoff, builder.mul(s, stride))
                shared = [load_vector(x, builder.add(xrow, const(width * k))) for k in range(chunks)]
                words = []
                for k in range(chunks):
                    for q in range(Q):
                        if k == 0:  # each weight broadcast where the first chunk first needs it
                            words.append(broadcast(builder, builder.load(builder.gep(w, [builder.add(wrow, const(q))])), vec))
                        accumulate(q, shared, words[q], chunk=k)
        element = out.type.pointee
        row_type = ir.VectorType(element, width)
        for i in range(n_acc):
            for k in range(chunks):
                value = builder.load(acc[i][k])
                value = builder.trunc(value, row_type) if element.width < 64 else value
                at = builder.add(ooff, builder.add(builder.mul(orow, const(i)), const(width * k)))
                builder.store(value, builder.bitcast(builder.gep(out, [at]), row_type.as_pointer()), align=element.width // 8)
        return context.get_dummy_value()

    return codegen


@functools.lru_cache(maxsize=None)
def outer_product(pixels: int, channels: int, orientation: str):
    """The intrinsic ``tile(x, xoff, stride, w, woff, steps, out, ooff, orow)`` of ``pixels`` x
    ``channels`` counts in ``orientation`` (the module docstring gives the indexing). ``x``, ``w``:
    C-contiguous uint64; ``out``: C-contiguous int32, int64 or uint64 (int32 truncates: counts
    are below 2**31). The caller keeps every index in range."""
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    lanes = channels if orientation == "channels" else pixels
    if lanes > 8 and lanes % 8:
        raise ValueError(f"{lanes} lanes do not split into vectors of 8 words")

    @intrinsic
    def tile(typingctx, x, xoff, stride, w, woff, steps, out, ooff, orow):
        if not (is_words(x) and is_words(w) and is_counts_out(out)):
            return None
        if not all(isinstance(t, types.Integer) for t in (xoff, stride, woff, steps, ooff, orow)):
            return None
        return types.void(x, xoff, stride, w, woff, steps, out, ooff, orow), _codegen(pixels, channels, orientation)

    return tile
