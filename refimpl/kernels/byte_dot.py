"""The popcount tile of the paths without a vector popcount (``avx2``, ``avx512bw``, ``portable``):
binary dot products over 256-bit vectors with byte-lane accumulators.

Per 256 bits of one (pixel, channel) pair: ``x AND w``, ``llvm.ctpop.v32i8`` (AVX2 lowers it to
Muła's nibble lookup, two ``vpshufb``; AVX512-BITALG to ``vpopcntb``; ARM64 to ``cnt.16b``),
and a byte add into the pair's accumulator. A byte holds at most 31 steps of 8 bits (248), so
every 31 vectors the bytes are summed into a 64-bit total (``vpsadbw`` on x86). The outer
product of the AVX-512 tile (``_tiles.py``) keeps 8 channels' 64-bit counts per vector instead:
without a vector popcount its ``ctpop.v4i64`` costs a ``vpsadbw`` per vector and its 16 x 8
accumulators need 32 ymm registers, twice what AVX2 has (docs/performance.md).

Everything here is generic LLVM IR: the same kernel is correct on any target LLVM has.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import isa

# Paths that take this tile; ``avx512-vpopcntdq`` keeps the outer-product tile of ``_tiles.py``.
BYTE_LOOKUP = isa.current_path() != "avx512-vpopcntdq"

VECTOR_WORDS = 4   # 64-bit words per 256-bit vector
BYTE_STEPS = 31    # vectors a byte lane can count before it could overflow (31 * 8 = 248)

# One call: BLOCK_PIXELS x BLOCK_CHANNELS accumulators. 2 x 4 = 8 ymm, with 2 input vectors,
# the lookup table, the nibble mask and the temporaries: the 16 AVX2 registers, no spills.
BLOCK_PIXELS, BLOCK_CHANNELS = 2, 4

_I64 = ir.IntType(64)
_V4 = ir.VectorType(_I64, VECTOR_WORDS)
_V32 = ir.VectorType(ir.IntType(8), 32)
_V32_I16 = ir.VectorType(ir.IntType(16), 32)


def _as_i64(builder, value):
    return builder.sext(value, _I64) if value.type.width < 64 else value


def _dot_block_codegen(P: int, Q: int):
    """The LLVM body of a P x Q block: see ``dot_block``."""

    def codegen(context, builder, signature, args):
        x_ty, _, _, w_ty, _, _, _, out_ty, _, _, _ = signature.args
        x = context.make_array(x_ty)(context, builder, args[0]).data
        w = context.make_array(w_ty)(context, builder, args[3]).data
        out = context.make_array(out_ty)(context, builder, args[7]).data
        xoff, xstride, woff, wstride, steps, ooff, ps, qs = (
            _as_i64(builder, args[i]) for i in (1, 2, 4, 5, 6, 8, 9, 10))
        module = builder.module
        ctpop8 = cgutils.get_or_insert_function(module, ir.FunctionType(_V32, [_V32]), "llvm.ctpop.v32i8")
        ctpop64 = cgutils.get_or_insert_function(module, ir.FunctionType(_I64, [_I64]), "llvm.ctpop.i64")
        reduce16 = cgutils.get_or_insert_function(
            module, ir.FunctionType(ir.IntType(16), [_V32_I16]), "llvm.vector.reduce.add.v32i16")

        def const(v):
            return ir.Constant(_I64, v)

        xrow = [builder.gep(x, [builder.add(xoff, builder.mul(xstride, const(p)))]) for p in range(P)]
        wrow = [builder.gep(w, [builder.add(woff, builder.mul(wstride, const(q)))]) for q in range(Q)]
        pairs = [(p, q) for p in range(P) for q in range(Q)]
        total = {pq: cgutils.alloca_once_value(builder, const(0)) for pq in pairs}
        acc = {pq: cgutils.alloca_once(builder, _V32) for pq in pairs}
        n_vectors = builder.udiv(steps, const(VECTOR_WORDS))
        n_blocks = builder.udiv(builder.add(n_vectors, const(BYTE_STEPS - 1)), const(BYTE_STEPS))
        with cgutils.for_range(builder, n_blocks) as block:
            for pq in pairs:
                builder.store(ir.Constant(_V32, None), acc[pq])
            first = builder.mul(block.index, const(BYTE_STEPS))
            left = builder.sub(n_vectors, first)
            count = builder.select(builder.icmp_unsigned("<", left, const(BYTE_STEPS)), left, const(BYTE_STEPS))
            with cgutils.for_range(builder, count) as vec:
                word = builder.mul(builder.add(first, vec.index), const(VECTOR_WORDS))

                def load(row):
                    return builder.load(builder.bitcast(builder.gep(row, [word]), _V4.as_pointer()), align=8)

                xs = [load(r) for r in xrow]
                ws = [load(r) for r in wrow]
                for p, q in pairs:
                    bytes_ = builder.call(ctpop8, [builder.bitcast(builder.and_(xs[p], ws[q]), _V32)])
                    builder.store(builder.add(builder.load(acc[p, q]), bytes_), acc[p, q])
            for pq in pairs:
                summed = builder.call(reduce16, [builder.zext(builder.load(acc[pq]), _V32_I16)])
                builder.store(builder.add(builder.load(total[pq]), builder.zext(summed, _I64)), total[pq])
        # The last steps % 4 words, one 64-bit popcount each: 64-channel 3x3 layers have 9 words.
        with cgutils.for_range(builder, builder.urem(steps, const(VECTOR_WORDS))) as tail:
            word = builder.add(builder.mul(n_vectors, const(VECTOR_WORDS)), tail.index)
            xs = [builder.load(builder.gep(r, [word])) for r in xrow]
            ws = [builder.load(builder.gep(r, [word])) for r in wrow]
            for p, q in pairs:
                bits = builder.call(ctpop64, [builder.and_(xs[p], ws[q])])
                builder.store(builder.add(builder.load(total[p, q]), bits), total[p, q])
        element = out.type.pointee
        for p, q in pairs:
            at = builder.add(ooff, builder.add(builder.mul(ps, const(p)), builder.mul(qs, const(q))))
            value = builder.load(total[p, q])
            builder.store(builder.trunc(value, element) if element.width < 64 else value, builder.gep(out, [at]))
        return context.get_dummy_value()

    return codegen


def _is_words(array) -> bool:
    return isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C" and array.dtype == types.uint64


def _make_dot_block(P: int, Q: int):
    def dot_block(typingctx, x, xoff, xstride, w, woff, wstride, steps, out, ooff, ps, qs):
        if not (_is_words(x) and _is_words(w) and isinstance(out, types.Array) and out.ndim == 1
                and out.layout == "C" and out.dtype in (types.int32, types.int64, types.uint64)):
            return None
        sig = types.void(x, xoff, xstride, w, woff, wstride, steps, out, ooff, ps, qs)
        return sig, _dot_block_codegen(P, Q)

    dot_block.__doc__ = f"""out[ooff + p*ps + q*qs] = sum over s < steps of popcount(x[xoff + p*xstride + s] AND
    w[woff + q*wstride + s]), for p < {P}, q < {Q}: a {P} x {Q} block of binary dot products.
    ``x``, ``w``: C-contiguous uint64 words; ``out``: C-contiguous int32, int64 or uint64 (int32
    truncates: the caller's counts are below 2**31). The caller keeps every index in range."""
    return intrinsic(dot_block)


dot_block = _make_dot_block(BLOCK_PIXELS, BLOCK_CHANNELS)
