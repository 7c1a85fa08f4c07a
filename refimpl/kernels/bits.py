"""Bit conventions, defined once for the whole project (docs/design.md section 1).

* ``sign(v) = +1 if v >= 0 else -1``: zero maps to +1.
* A ``+1`` (or ``True``) is the bit 1, a ``-1`` (or ``False``) the bit 0.
* Words are ``uint64``; element ``64*k + j`` of a packed axis is bit ``j`` (least significant
  first) of word ``k``.
* Tail bits past the end of the axis are 0. A 0 bit in a tail or padding word is harmless in
  ``popcount(x & w)`` (the only popcount the kernels take); b, c and d come from the identities,
  whose ``px``, ``pw`` and ``n`` are computed over real elements only.
"""
from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.extending import intrinsic

from .._jit import jit
from . import _pack

WORD_BITS = 64
WORD_DTYPE = np.uint64


@intrinsic
def popcount(typingctx, x):
    """``llvm.ctpop.i64``: LLVM turns it into ``popcnt``, or ``vpopcntq`` once SLP vectorizes."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])

    return types.uint64(types.uint64), codegen


@intrinsic
def sign_word(typingctx, row, start):
    """The packed word of 64 float32 values ``row[start:start+64]``: bit k is ``row[start+k] >= 0``.

    NaN is not >= 0 (bit 0), -0.0 is (bit 1), as ``sign`` above and torch have it. Written as
    vector compares whose ``<16 x i1>`` masks are bitcast to integers (``vcmpps`` into a mask
    register, ``kmovw``): an auto-vectorized loop can only build the word with per-lane shifts
    and an or-reduction across lanes, which cost more than the rest of the engine's epilogue.
    The caller guarantees 64 readable values from ``start``.
    """
    if not (isinstance(row, types.Array) and row.dtype == types.float32 and row.ndim == 1 and row.layout == "C"):
        return None
    if not isinstance(start, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir

        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = ir.IntType(64)
        vec = ir.VectorType(ir.FloatType(), 16)
        zero = ir.Constant(vec, [0.0] * 16)
        base = builder.gep(ary.data, [builder.sext(args[1], i64) if args[1].type.width < 64 else args[1]])
        word = ir.Constant(i64, 0)
        for quarter in range(4):
            ptr = builder.bitcast(builder.gep(base, [ir.Constant(i64, 16 * quarter)]), vec.as_pointer())
            values = builder.load(ptr, align=4)
            mask = builder.bitcast(builder.fcmp_ordered(">=", values, zero), ir.IntType(16))
            word = builder.or_(word, builder.shl(builder.zext(mask, i64), ir.Constant(i64, 16 * quarter)))
        return word

    return types.uint64(row, start), codegen


def n_words(length: int) -> int:
    """Words needed for ``length`` bits."""
    return (length + WORD_BITS - 1) // WORD_BITS


def to_bits(x) -> np.ndarray:
    """Boolean array of the bits of ``x``: booleans as they are, numbers by ``x >= 0``."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x
    if not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise ValueError(f"cannot binarize an array of dtype {x.dtype}; give numbers or booleans")
    return x >= 0


def pack_bits(x, axis: int = -1) -> np.ndarray:
    """Pack ``x`` (+-1 numbers or booleans) along ``axis`` into uint64 words, moved to the end.

    The result has shape ``x.shape`` without ``axis``, plus ``n_words(x.shape[axis])`` at the end.
    """
    bits = np.moveaxis(to_bits(x), axis, -1)
    length = bits.shape[-1]
    nbytes = n_words(length) * 8
    packed = np.packbits(bits, axis=-1, bitorder="little")
    if packed.shape[-1] != nbytes:
        pad = [(0, 0)] * (packed.ndim - 1) + [(0, nbytes - packed.shape[-1])]
        packed = np.pad(packed, pad)
    return np.ascontiguousarray(packed).view("<u8").astype(WORD_DTYPE, copy=False)


def unpack_bits(words, length: int) -> np.ndarray:
    """Inverse of ``pack_bits``: booleans of shape ``words.shape[:-1] + (length,)``."""
    words = np.ascontiguousarray(words, dtype="<u8")
    if length > words.shape[-1] * WORD_BITS:
        raise ValueError(f"{words.shape[-1]} words hold at most {words.shape[-1] * WORD_BITS} bits, asked for {length}")
    raw = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return raw[..., :length].astype(bool)


@jit(parallel=True)
def _pack_nchw_kernel(x, out):
    # x (N, C, P) with P = H*W, C-contiguous; out (N, P, K). One task per (image, word); channels
    # past C stay 0 (tail bits). Pixels go in steps of the widest of _pack.LANES that fits; when
    # it does not divide P, the last step overlaps the one before (those words are written twice,
    # identically).
    n_img, channels, pixels = x.shape
    k_words = out.shape[2]
    flat = x.reshape(-1)
    for task in prange(n_img * k_words):
        i = task // k_words
        k = task - i * k_words
        c0 = 64 * k
        c1 = min(channels, c0 + 64)
        if pixels >= 64:
            for step in range(-(-pixels // 64)):
                _pack.pack_64(x[i], min(64 * step, pixels - 64), c0, c1, out[i], k)
        elif pixels >= 32:
            for step in range(-(-pixels // 32)):
                _pack.pack_32(x[i], min(32 * step, pixels - 32), c0, c1, out[i], k)
        elif pixels >= 16:
            for step in range(-(-pixels // 16)):
                _pack.pack_16(x[i], min(16 * step, pixels - 16), c0, c1, out[i], k)
        else:  # 2 to 15 pixels (one pixel is _pack_rows_f32's)
            _pack.pack_short_16(flat, i * channels * pixels, pixels, c0, c1, out[i], k)


@jit(parallel=True)
def _pack_rows_f32(x, out):
    # x (N, C) float32, C-contiguous; out (N, K): channels are contiguous here (dense layers,
    # 1x1 maps), so a whole word is four 16-lane compares (sign_word).
    n_img, channels = x.shape
    k_words = out.shape[1]
    for task in prange(n_img * k_words):
        i = task // k_words
        k = task - i * k_words
        c0 = 64 * k
        c1 = min(channels, c0 + 64)
        if c1 - c0 == 64:
            out[i, k] = sign_word(x[i], c0)
        else:
            word = np.uint64(0)
            for ch in range(c0, c1):
                word |= np.uint64(x[i, ch] >= 0) << np.uint64(ch - c0)
            out[i, k] = word


def pack_nchw(x) -> np.ndarray:
    """Pack an NCHW activation (+-1 numbers or booleans) into NHWK words along channels."""
    x = np.asarray(x)
    if x.ndim != 4:
        raise ValueError(f"expected an NCHW array, got shape {x.shape}")
    n_img, channels, h, w = x.shape
    if x.dtype != np.float32:
        # One kernel specialization, float32, the engine's: any other dtype becomes its signs as
        # +-1.0 first (exact: the sign is taken in its own dtype). Each further dtype cost 9-13 s
        # of first-call compile for one extra pass over the input.
        x = np.where(to_bits(x), np.float32(1.0), np.float32(-1.0))
    out = np.empty((n_img, h * w, n_words(channels)), dtype=WORD_DTYPE)
    if h * w == 1:
        _pack_rows_f32(np.ascontiguousarray(x).reshape(n_img, channels), out.reshape(n_img, -1))
    else:
        _pack_nchw_kernel(np.ascontiguousarray(x).reshape(n_img, channels, h * w), out)
    return out.reshape(n_img, h, w, -1)
