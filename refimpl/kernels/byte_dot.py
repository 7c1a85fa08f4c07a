"""The popcount tile of the 256-bit paths without a vector popcount (``avx2``, ``portable``):
pixels in the 64-bit lanes of 256-bit vectors, weight words broadcast, byte-lane accumulators.

Per step (one word of every pixel's window) and channel: ``x AND broadcast(w)`` over 4 pixels,
``llvm.ctpop.v32i8`` (AVX2 lowers it to Muła's nibble lookup, two ``vpshufb``; AVX512-BITALG to
``vpopcntb``; ARM64 to ``cnt.16b``), and a byte add into the (pixels, channel) accumulator. A
byte holds at most 31 steps of 8 bits (248), so every 31 steps each 64-bit lane's bytes are
summed (``vpsadbw``), which leaves 4 pixels' counts. The outer product of the AVX-512 tile
(``_tiles.py``) keeps 8 channels' 64-bit counts per vector instead: without a vector popcount its
``ctpop.v4i64`` costs a ``vpsadbw`` per vector and its 16 x 8 accumulators need 32 ymm registers,
twice what AVX2 has (docs/performance.md).

The IR is generic but for ``vpsadbw``, which LLVM does not find in the generic form: the same
kernel is correct on any target LLVM has.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import isa
from .vector_ir import I32 as _I32
from .vector_ir import I64 as _I64
from .vector_ir import as_i64, broadcast, is_counts_out, is_words

# Paths that take this tile. The AVX-512 paths keep the outer-product tile of ``_tiles.py``: on
# ``avx512bw`` its 512-bit lookup measured faster than this 256-bit tile (docs/performance.md).
BYTE_LOOKUP = isa.current_path() in ("avx2", "portable")
# The AVX2 vpsadbw intrinsic where the target has it.
_PSADBW = isa.current_path() == "avx2"

LANES = 4          # 64-bit pixels per 256-bit vector
BYTE_STEPS = 31    # steps a byte lane can count before it could overflow (31 * 8 = 248)

# One call: LANE_GROUPS x 4 pixels by LANE_CHANNELS channels, 8 ymm accumulators, with 2 input
# vectors, a broadcast weight, the lookup table, the nibble mask and temporaries: the 16 AVX2
# registers without a spill. (Measured against dot products over 4 words of one pixel and
# channel, which need a scalar tail and a horizontal sum: faster on every ResNet-18 layer, most
# on 64 and 128 channels.)
LANE_GROUPS, LANE_CHANNELS = 2, 4

_V4 = ir.VectorType(_I64, LANES)
_V32 = ir.VectorType(ir.IntType(8), 32)
_V32_I16 = ir.VectorType(ir.IntType(16), 32)


def _lane_sums(builder, bytes_):
    """<4 x i64>: the sum of each 64-bit lane's 8 byte counts: ``vpsadbw`` against zero where the
    path has it (LLVM does not find it in the generic form: 8 shuffles and 7 adds a vector)."""
    if _PSADBW:
        psad = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V4, [_V32, _V32]), "llvm.x86.avx2.psad.bw")
        return builder.call(psad, [bytes_, ir.Constant(_V32, None)])
    wide = builder.zext(bytes_, _V32_I16)
    parts = [builder.shuffle_vector(wide, wide, ir.Constant(ir.VectorType(_I32, 4), [8 * lane + e for lane in range(4)]))
             for e in range(8)]
    while len(parts) > 1:
        parts = [builder.add(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return builder.zext(parts[0], _V4)


def _store_rows(builder, out, ooff, ps, value_of, G: int, Q: int):
    """Pixel by pixel, its Q counts as one vector store (channels contiguous: qs = 1), the
    4 x Q transpose of each group's accumulators done in registers."""
    element = out.type.pointee
    row_type = ir.VectorType(element, Q)
    for g in range(G):
        totals = [value_of(g, q) for q in range(Q)]
        for lane in range(LANES):
            row = ir.Constant(ir.VectorType(_I64, Q), ir.Undefined)
            for q in range(Q):
                count = builder.extract_element(totals[q], ir.Constant(_I32, lane))
                row = builder.insert_element(row, count, ir.Constant(_I32, q))
            row = builder.trunc(row, row_type) if element.width < 64 else row
            at = builder.add(ooff, builder.mul(ps, ir.Constant(_I64, LANES * g + lane)))
            builder.store(row, builder.bitcast(builder.gep(out, [at]), row_type.as_pointer()), align=element.width // 8)


def _lanes_block_codegen(G: int, Q: int, rows: bool = False):
    """The LLVM body of ``lanes_block`` for G groups of 4 pixels by Q channels (``rows``: of
    ``lanes_block_rows``)."""

    def codegen(context, builder, signature, args):
        x_ty, w_ty, out_ty = signature.args[0], signature.args[3], signature.args[8]
        x = context.make_array(x_ty)(context, builder, args[0]).data
        w = context.make_array(w_ty)(context, builder, args[3]).data
        out = context.make_array(out_ty)(context, builder, args[8]).data
        xoff, xstep, woff, wq, ws, steps, ooff, ps, qs = (
            as_i64(builder, args[i]) for i in (1, 2, 4, 5, 6, 7, 9, 10, 11))
        ctpop8 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V32, [_V32]), "llvm.ctpop.v32i8")

        def const(v):
            return ir.Constant(_I64, v)

        pairs = [(g, q) for g in range(G) for q in range(Q)]
        total = {gq: cgutils.alloca_once_value(builder, ir.Constant(_V4, None)) for gq in pairs}
        acc = {gq: cgutils.alloca_once(builder, _V32) for gq in pairs}
        n_blocks = builder.udiv(builder.add(steps, const(BYTE_STEPS - 1)), const(BYTE_STEPS))
        with cgutils.for_range(builder, n_blocks) as block:
            for gq in pairs:
                builder.store(ir.Constant(_V32, None), acc[gq])
            first = builder.mul(block.index, const(BYTE_STEPS))
            left = builder.sub(steps, first)
            count = builder.select(builder.icmp_unsigned("<", left, const(BYTE_STEPS)), left, const(BYTE_STEPS))
            with cgutils.for_range(builder, count) as step:
                s = builder.add(first, step.index)
                row = builder.gep(x, [builder.add(xoff, builder.mul(s, xstep))])
                xs = [builder.load(builder.bitcast(builder.gep(row, [const(LANES * g)]), _V4.as_pointer()), align=8)
                      for g in range(G)]
                wrow = builder.add(woff, builder.mul(s, ws))
                for q in range(Q):
                    wv = broadcast(builder, builder.load(builder.gep(w, [builder.add(wrow, builder.mul(wq, const(q)))])), _V4)
                    for g in range(G):
                        bytes_ = builder.call(ctpop8, [builder.bitcast(builder.and_(xs[g], wv), _V32)])
                        builder.store(builder.add(builder.load(acc[g, q]), bytes_), acc[g, q])
            for gq in pairs:
                builder.store(builder.add(builder.load(total[gq]), _lane_sums(builder, builder.load(acc[gq]))), total[gq])
        if rows:
            _store_rows(builder, out, ooff, ps, lambda g, q: builder.load(total[g, q]), G, Q)
            return context.get_dummy_value()
        element = out.type.pointee
        for g, q in pairs:
            value = builder.load(total[g, q])
            for lane in range(LANES):
                pixel_count = builder.extract_element(value, ir.Constant(_I32, lane))
                at = builder.add(ooff, builder.add(builder.mul(ps, const(LANES * g + lane)), builder.mul(qs, const(q))))
                builder.store(builder.trunc(pixel_count, element) if element.width < 64 else pixel_count,
                              builder.gep(out, [at]))
        return context.get_dummy_value()

    return codegen


def _make_lanes_block(G: int, Q: int, rows: bool = False):
    def lanes_block(typingctx, x, xoff, xstep, w, woff, wq, ws, steps, out, ooff, ps, qs):
        if not (is_words(x) and is_words(w) and is_counts_out(out)):
            return None
        return types.void(x, xoff, xstep, w, woff, wq, ws, steps, out, ooff, ps, qs), _lanes_block_codegen(G, Q, rows)

    lanes_block.__doc__ = f"""out[ooff + p*ps + q*qs] = sum over s < steps of popcount(x[xoff + s*xstep + p] AND
    w[woff + q*wq + s*ws]), for p < {LANES * G}, q < {Q}: a block of binary dot products with the
    pixels in vector lanes (``x`` tap-major: a step's pixels adjacent) and each weight word
    broadcast. ``x``, ``w``: C-contiguous uint64; ``out``: C-contiguous int32, int64 or uint64 (int32
    truncates: counts are below 2**31). The caller keeps every index in range."""
    return intrinsic(lanes_block)


lanes_block = _make_lanes_block(LANE_GROUPS, LANE_CHANNELS)
# The same with ``qs`` taken as 1 (ignored): each pixel's channels stored as one vector, for the
# engine's channels-last ``a`` (32 scalar stores a block otherwise).
lanes_block_rows = _make_lanes_block(LANE_GROUPS, LANE_CHANNELS, rows=True)
