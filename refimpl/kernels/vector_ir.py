"""Small LLVM IR and typing helpers shared by the hand-written vector intrinsics
(``byte_dot``, ``outer_product``, ``pack_lanes``, ``fma_tile``)."""
from __future__ import annotations

from llvmlite import ir
from numba import types

I32 = ir.IntType(32)
I64 = ir.IntType(64)


def as_i64(builder, value):
    """An integer argument widened to i64 (sign-extended), the type of every index."""
    return builder.sext(value, I64) if value.type.width < 64 else value


def broadcast(builder, value, vec: ir.VectorType):
    """``value`` in every lane of ``vec`` (insert into lane 0, then a zero shuffle)."""
    lane0 = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(lane0, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(I32, vec.count), [0] * vec.count))


def is_words(array) -> bool:
    """A C-contiguous 1-D uint64 array: packed words."""
    return isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C" and array.dtype == types.uint64


def is_counts_out(array) -> bool:
    """A C-contiguous 1-D int32, int64 or uint64 array: where a popcount tile stores its counts."""
    return (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
            and array.dtype in (types.int32, types.int64, types.uint64))
