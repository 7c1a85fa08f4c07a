"""The popcount tile of the paths without a vector popcount (``avx512bw``, ``avx2``, ``portable``):
pixels in the 64-bit lanes of vectors (8 in 512 bits on ``avx512bw``, 4 in 256 bits elsewhere),
weight words broadcast, byte-lane accumulators.

Per step (one word of every pixel's window) and channel: ``x AND broadcast(w)`` over LANES
pixels, a byte popcount, and a byte add into the (pixels, channel) accumulator. A byte holds at
most 31 steps of 8 bits (248), so every 31 steps each 64-bit lane's bytes are summed
(``vpsadbw``), which leaves LANES pixels' counts. The outer product of the ``avx512-vpopcntdq``
tile (``_tiles.py``) keeps 8 channels' 64-bit counts per vector instead: without a vector
popcount its ``ctpop`` costs a ``vpsadbw`` and a 64-bit add per vector (9 instructions on
``avx512bw``, against 6 here; docs/performance.md).

On the x86 paths (``NIBBLE_SPLIT``) the lookup is written out (``vpshufb``, Muła's nibble method)
over inputs stored split into nibbles: the gather writes each input word's low nibbles and, ``P``
words later, its high nibbles shifted down, so a (pixels, channel) vector costs 2 ``vpand``, 2
``vpshufb`` and 2 ``vpaddb`` instead of LLVM's 8-instruction ``ctpop.v32i8`` (its shift and two
masks done once per input word, in the gather, instead of once per channel); ``vpsadbw`` is
called too, which LLVM does not find in the generic form. On ``portable`` the byte popcount is
LLVM's generic ``ctpop`` (the SSE2 bit-slice count on x86-64, ``cnt.16b`` on ARM64): correct on
any target LLVM has.
"""
from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import isa
from .._jit import jit
from .vector_ir import I32 as _I32
from .vector_ir import I64 as _I64
from .vector_ir import as_i64, broadcast, is_counts_out, is_words

_PATH = isa.current_path()
# Paths that take this tile. ``avx512-vpopcntdq`` keeps the outer-product tile of ``_tiles.py``
# (``vpopcntq``, one instruction a vector).
BYTE_LOOKUP = _PATH in ("avx512bw", "avx2", "portable")
# The x86 vpsadbw and vpshufb intrinsics of the paths that have them, by vector width.
_PSADBW = {"avx512bw": "llvm.x86.avx512.psad.bw.512", "avx2": "llvm.x86.avx2.psad.bw"}.get(_PATH)
_PSHUFB = {"avx512bw": "llvm.x86.avx512.pshuf.b.512", "avx2": "llvm.x86.avx2.pshuf.b"}.get(_PATH)
# Inputs stored split into nibbles, and the lookup as vpshufb (the module docstring): x86 only.
# ARM64's cnt.16b and the SSE2 bit-slice count take whole bytes, so the other paths store words.
NIBBLE_SPLIT = _PSHUFB is not None
NIBBLES = 2 if NIBBLE_SPLIT else 1  # words the gather stores per input word
_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_FOUR = np.uint64(4)

LANES = 8 if _PATH == "avx512bw" else 4  # 64-bit pixels per vector: 512 or 256 bits
BYTE_STEPS = 31    # steps a byte lane can count before it could overflow (31 * 8 = 248)

# One call: LANE_GROUPS x LANES pixels by LANE_CHANNELS channels. On 256 bits 8 ymm
# accumulators beside 4 input vectors (2 pixel groups' nibble halves), a weight's 2 broadcasts
# and the lookup table: 15 of the 16 AVX2 registers, no spill. (Measured against dot products
# over 4 words of one pixel and channel, which need a scalar tail and a horizontal sum: faster
# on every ResNet-18 layer, most on 64 and 128 channels.) On 512 bits a whole 16 x 8 tile: 16
# zmm accumulators and the same 7 vectors in the 32 AVX-512 registers.
LANE_GROUPS, LANE_CHANNELS = (2, 8) if LANES == 8 else (2, 4)

_V = ir.VectorType(_I64, LANES)
_VB = ir.VectorType(ir.IntType(8), 8 * LANES)
_VB_I16 = ir.VectorType(ir.IntType(16), 8 * LANES)
# Popcounts of 0..15, once per 128-bit lane (vpshufb looks up within lanes).
_NIBBLE_COUNTS = ir.Constant(_VB, [bin(i).count("1") for i in range(16)] * (LANES // 2))


@jit
def store_input_word(xt, at, half, word):
    """Store an input word where the tile reads it: ``xt[at]`` on paths that count whole bytes;
    with ``NIBBLE_SPLIT`` its low nibbles at ``xt[at]`` and its high nibbles, shifted down, at
    ``xt[at + half]``."""
    if NIBBLE_SPLIT:
        xt[at] = word & _LOW_NIBBLES
        xt[at + half] = (word >> _FOUR) & _LOW_NIBBLES
    else:
        xt[at] = word


@jit
def store_weight_word(panels, at, half, word):
    """Store a weight word where the tile reads it: ``panels[at]``, and with ``NIBBLE_SPLIT`` the
    word shifted down by 4 at ``panels[at + half]`` (its high nibbles, under the input's)."""
    panels[at] = word
    if NIBBLE_SPLIT:
        panels[at + half] = word >> _FOUR


def _byte_counts(builder, xs, w):
    """<8*LANES x i8>: the popcount of each byte of ``x AND w``. ``xs`` is the pixel vector, or with
    ``NIBBLE_SPLIT`` the pair (low nibbles, high nibbles shifted down) and ``w`` the pair
    (broadcast weight, the same shifted down by 4; ``store_weight_word``): two vpshufb lookups,
    no masks."""
    if not NIBBLE_SPLIT:
        ctpop8 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VB, [_VB]), f"llvm.ctpop.v{_VB.count}i8")
        return builder.call(ctpop8, [builder.bitcast(builder.and_(xs, w), _VB)])
    pshufb = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VB, [_VB, _VB]), _PSHUFB)
    low, high = (builder.call(pshufb, [_NIBBLE_COUNTS, builder.bitcast(builder.and_(x, v), _VB)])
                 for x, v in zip(xs, w))
    return builder.add(low, high)


def _lane_sums(builder, bytes_):
    """<LANES x i64>: the sum of each 64-bit lane's 8 byte counts: ``vpsadbw`` against zero where
    the path has it (LLVM does not find it in the generic form: 8 shuffles and 7 adds a vector)."""
    if _PSADBW:
        psad = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_VB, _VB]), _PSADBW)
        return builder.call(psad, [bytes_, ir.Constant(_VB, None)])
    wide = builder.zext(bytes_, _VB_I16)
    parts = [builder.shuffle_vector(wide, wide, ir.Constant(ir.VectorType(_I32, LANES), [8 * lane + e for lane in range(LANES)]))
             for e in range(8)]
    while len(parts) > 1:
        parts = [builder.add(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return builder.zext(parts[0], _V)


def _store_rows(builder, out, ooff, ps, value_of, G: int, Q: int):
    """Pixel by pixel, its Q counts as one vector store (channels contiguous: qs = 1), the
    LANES x Q transpose of each group's accumulators done in registers."""
    element = out.type.pointee
    row_type = ir.VectorType(element, Q)
    for g in range(G):
        totals = [value_of(g, q) for q in range(Q)]
        if element.width == 32 and Q in (4, 8) and sys.byteorder == "little":
            # int32 rows: channels 2j, 2j+1 of a pixel side by side in one 64-bit lane each
            # (counts are below 2**31), so a row is one shuffle of two vectors, not 7 instructions.
            shift = ir.Constant(_V, [32] * LANES)
            pairs = [builder.or_(totals[q], builder.shl(totals[q + 1], shift)) for q in range(0, Q, 2)]
            if Q == 8:
                # 4 x LANES -> LANES x 4 lanes of 64 bits: interleave pairs 0, 1 and 2, 3 (vpunpck*qdq),
                # then each row takes two adjacent lanes of either result (one 128-bit move each).
                def interleave(u, v, odd):
                    return builder.shuffle_vector(u, v, ir.Constant(ir.VectorType(_I32, LANES), [
                        i // 2 * 2 + odd + (LANES if i % 2 else 0) for i in range(LANES)]))
                halves = [(interleave(pairs[0], pairs[1], odd), interleave(pairs[2], pairs[3], odd)) for odd in (0, 1)]
            for lane in range(LANES):
                if Q == 8:
                    even = lane - lane % 2
                    row = builder.shuffle_vector(*halves[lane % 2], ir.Constant(ir.VectorType(_I32, 4), [
                        even, even + 1, LANES + even, LANES + even + 1]))
                else:
                    row = builder.shuffle_vector(pairs[0], pairs[1], ir.Constant(ir.VectorType(_I32, 2), [lane, LANES + lane]))
                at = builder.add(ooff, builder.mul(ps, ir.Constant(_I64, LANES * g + lane)))
                builder.store(builder.bitcast(row, row_type),
                              builder.bitcast(builder.gep(out, [at]), row_type.as_pointer()), align=4)
            continue
        for lane in range(LANES):
            row = ir.Constant(ir.VectorType(_I64, Q), ir.Undefined)
            for q in range(Q):
                count = builder.extract_element(totals[q], ir.Constant(_I32, lane))
                row = builder.insert_element(row, count, ir.Constant(_I32, q))
            row = builder.trunc(row, row_type) if element.width < 64 else row
            at = builder.add(ooff, builder.mul(ps, ir.Constant(_I64, LANES * g + lane)))
            builder.store(row, builder.bitcast(builder.gep(out, [at]), row_type.as_pointer()), align=element.width // 8)


def _lanes_block_codegen(G: int, Q: int, rows: bool = False):
    """The LLVM body of ``lanes_block`` for G groups of LANES pixels by Q channels (``rows``: of
    ``lanes_block_rows``)."""

    def codegen(context, builder, signature, args):
        x_ty, w_ty, out_ty = signature.args[0], signature.args[3], signature.args[8]
        x = context.make_array(x_ty)(context, builder, args[0]).data
        w = context.make_array(w_ty)(context, builder, args[3]).data
        out = context.make_array(out_ty)(context, builder, args[8]).data
        xoff, xstep, woff, wq, ws, steps, ooff, ps, qs = (
            as_i64(builder, args[i]) for i in (1, 2, 4, 5, 6, 7, 9, 10, 11))

        def const(v):
            return ir.Constant(_I64, v)

        pairs = [(g, q) for g in range(G) for q in range(Q)]
        acc = {gq: cgutils.alloca_once(builder, _VB) for gq in pairs}

        def block_sums(first, count):
            """Steps first .. first+count-1 (at most BYTE_STEPS) into byte accumulators, then
            each (pixels, channel)'s 4 lane sums."""
            for gq in pairs:
                builder.store(ir.Constant(_VB, None), acc[gq])
            with cgutils.for_range(builder, count) as step:
                s = builder.add(first, step.index)
                row = builder.gep(x, [builder.add(xoff, builder.mul(s, xstep))])

                def pixels(at):
                    return builder.load(builder.bitcast(builder.gep(row, [at]), _V.as_pointer()), align=8)

                xs = [pixels(const(LANES * g)) for g in range(G)]
                if NIBBLE_SPLIT:  # the high nibbles half a step further
                    half = builder.lshr(xstep, const(1))
                    xs = [(low, pixels(builder.add(half, const(LANES * g)))) for g, low in enumerate(xs)]
                wrow = builder.add(woff, builder.mul(s, ws))
                for q in range(Q):
                    at = builder.add(wrow, builder.mul(wq, const(q)))
                    wv = broadcast(builder, builder.load(builder.gep(w, [at])), _V)
                    if NIBBLE_SPLIT:  # the word shifted down by 4, half a step further
                        high = builder.load(builder.gep(w, [builder.add(at, builder.lshr(ws, const(1)))]))
                        wv = (wv, broadcast(builder, high, _V))
                    for g in range(G):
                        builder.store(builder.add(builder.load(acc[g, q]), _byte_counts(builder, xs[g], wv)), acc[g, q])
            return {gq: _lane_sums(builder, builder.load(acc[gq])) for gq in pairs}

        def at_most_a_block(n):
            return builder.select(builder.icmp_unsigned("<", n, const(BYTE_STEPS)), n, const(BYTE_STEPS))

        # The first block apart from the others: windows of up to 31 steps (every layer up to 128
        # channels, 3x3) keep no running totals, which would spill beside the 8 accumulators.
        total = {gq: cgutils.alloca_once(builder, _V) for gq in pairs}
        for gq, value in block_sums(const(0), at_most_a_block(steps)).items():
            builder.store(value, total[gq])
        # the blocks after the first: (steps - 1) // 31, none for 0 to 31 steps
        more = builder.udiv(builder.sub(builder.select(builder.icmp_unsigned(">", steps, const(0)), steps, const(1)),
                                        const(1)), const(BYTE_STEPS))
        with cgutils.for_range(builder, more) as block:
            first = builder.mul(builder.add(block.index, const(1)), const(BYTE_STEPS))
            for gq, value in block_sums(first, at_most_a_block(builder.sub(steps, first))).items():
                builder.store(builder.add(builder.load(total[gq]), value), total[gq])
        if rows:
            _store_rows(builder, out, ooff, ps, lambda g, q: builder.load(total[g, q]), G, Q)
            return context.get_dummy_value()
        element = out.type.pointee
        column_type = ir.VectorType(element, LANES)
        for g, q in pairs:  # pixels contiguous (ps = 1): each accumulator is one vector store
            value = builder.load(total[g, q])
            at = builder.add(ooff, builder.add(const(LANES * g), builder.mul(qs, const(q))))
            builder.store(builder.trunc(value, column_type) if element.width < 64 else value,
                          builder.bitcast(builder.gep(out, [at]), column_type.as_pointer()), align=element.width // 8)
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
    broadcast. ``ps`` is taken as 1 (ignored): a channel's pixels are contiguous, one vector store
    each (the nchw counts); ``lanes_block_rows`` below takes ``qs`` as 1. With ``NIBBLE_SPLIT``, x[xoff + s*xstep + p] holds the word's low nibbles and
    x[xoff + s*xstep + xstep/2 + p] its high nibbles shifted down (``store_input_word``), and
    w[woff + q*wq + s*ws + ws/2] the weight word shifted down by 4 (``store_weight_word``).
    ``x``, ``w``: C-contiguous uint64; ``out``: C-contiguous int32, int64 or uint64 (int32
    truncates: counts are below 2**31). The caller keeps every index in range."""
    return intrinsic(lanes_block)


lanes_block = _make_lanes_block(LANE_GROUPS, LANE_CHANNELS)
# The same with ``qs`` taken as 1 (ignored) instead of ``ps``: each pixel's channels stored as one
# vector, for the engine's channels-last ``a`` (LANES x Q scalar stores a block otherwise).
lanes_block_rows = _make_lanes_block(LANE_GROUPS, LANE_CHANNELS, rows=True)
