"""The LLVM intrinsic that writes one row of the four counts from a row of ``a``, and the fence
after streaming stores (``fused.py`` calls both).

``identity_row(s, s0, pw, w0, px, x0, n, n0, a, b, c, d, o0, count, lead_a, lead_b, lead_c,
lead_d, skip_head, pair_next, next_s, next_w)`` writes, for i < count,

    a[o0+i] = s[s0+i]             b[o0+i] = pw[w0+i] - s[s0+i]
    c[o0+i] = px[x0+i] - s[s0+i]  d[o0+i] = n[n0+i] - px[x0+i] - pw[w0+i] + s[s0+i]

spelled as ``<8 x i64>`` IR over each output's 64-byte lines: ``lead_k`` is how many words of
output k's first line precede its element o0. Partial first and last lines use masked loads and
stores; whole lines, plain vectors (streaming stores in ``identity_row_streamed``). Rows of a
whole-image unit follow each other in the outputs, so the line where one row ends and the next
begins would take two masked stores, each of which reads the line first (7x7 and 5x5 maps wrote
at 25 GB/s against 45 with whole lines): with ``pair_next`` the last partial line is completed
from the next row's first elements (its inputs ``next_s`` and ``next_w`` words further on in
``s`` and ``pw``, the same in ``px`` and ``n``) and written whole, and that row is then written
with ``skip_head``. Outputs that share a lead (fresh ones do) are written in one loop; otherwise
(four ``np.empty`` arrays start at four different offsets) one after the other, so that no
vector store straddles two lines: that is two stores, and a streaming store to part of a line
is a partial write (the 128-channel layer ran 1.6x slower so). Not Numba loops: LLVM's loop
vectorizer is off here (``refimpl/_jit.py``), and with it on, these arrays need more runtime
alias checks than it allows.
"""
from __future__ import annotations

import inspect

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import isa

# Masked vector loads and stores for the partial lines, where the target has them (AVX2
# vpmaskmovq, AVX-512 masks). Without them (the portable path: SSE2, ARM64 NEON) LLVM expands
# every masked access into 8 branches; there a partial line is a loop over its 8 words (the
# fused counts kernel's compile 18.5 -> 14.6 s on that path; 5 s on AVX2).
MASKED_MOVES = isa.current_path() != "portable"

_ARRAY = types.Array(types.int64, 1, "C")
_I64 = types.int64
# The intrinsic's parameters, by name, with their Numba types.
PARAMETERS = (
    ("s", _ARRAY), ("s0", _I64), ("pw", _ARRAY), ("w0", _I64), ("px", _ARRAY), ("x0", _I64), ("n", _ARRAY),
    ("n0", _I64), ("a", _ARRAY), ("b", _ARRAY), ("c", _ARRAY), ("d", _ARRAY), ("o0", _I64), ("count", _I64),
    ("lead_a", _I64), ("lead_b", _I64), ("lead_c", _I64), ("lead_d", _I64), ("skip_head", types.boolean),
    ("pair_next", types.boolean), ("next_s", _I64), ("next_w", _I64),
)
# Input -> (its offset parameter, the parameter saying how far on the next row's first element is;
# None: the same place, px and n being shared by the rows of a unit).
_INPUTS = {"s": ("s0", "next_s"), "pw": ("w0", "next_w"), "px": ("x0", None), "n": ("n0", None)}
# Output -> (the inputs it reads, how it combines their values v with the builder b).
_OUTPUTS = {
    "a": (("s",), lambda b, v: v["s"]),
    "b": (("s", "pw"), lambda b, v: b.sub(v["pw"], v["s"])),
    "c": (("s", "px"), lambda b, v: b.sub(v["px"], v["s"])),
    "d": (("s", "pw", "px", "n"), lambda b, v: b.add(b.sub(b.sub(v["n"], v["px"]), v["pw"]), v["s"])),
}


class _RowWriter:
    """The IR of one ``identity_row`` call: ``args`` by parameter name."""

    def __init__(self, context, builder, args, nontemporal: bool):
        self.context, self.builder, self.nontemporal = context, builder, nontemporal
        self.arg = dict(zip((name for name, _ in PARAMETERS), args))
        self.word, self.vec = ir.IntType(64), ir.VectorType(ir.IntType(64), 8)
        self.i32 = ir.IntType(32)
        mask_type, vptr = ir.VectorType(ir.IntType(1), 8), self.vec.as_pointer()
        self.vptr = vptr
        module = builder.module
        # typed-pointer names (LLVM 14); newer LLVMs upgrade them to their opaque form
        self.masked_load = cgutils.get_or_insert_function(
            module, ir.FunctionType(self.vec, [vptr, self.i32, mask_type, self.vec]), "llvm.masked.load.v8i64.p0v8i64")
        self.masked_store = cgutils.get_or_insert_function(
            module, ir.FunctionType(ir.VoidType(), [self.vec, vptr, self.i32, mask_type]),
            "llvm.masked.store.v8i64.p0v8i64")
        self.streaming = module.add_metadata([ir.Constant(self.i32, 1)])
        self.lanes = ir.Constant(self.vec, list(range(8)))

    def data(self, name: str):
        return self.context.make_array(_ARRAY)(self.context, self.builder, self.arg[name]).data

    def splat(self, value):
        b = self.builder
        one = b.insert_element(ir.Constant(self.vec, ir.Undefined), value, ir.Constant(self.i32, 0))
        return b.shuffle_vector(one, ir.Constant(self.vec, ir.Undefined),
                                ir.Constant(ir.VectorType(self.i32, 8), [0] * 8))

    def write(self):
        """Every output's row: in one loop when the four share a lead, else one loop each."""
        b = self.builder
        leads = [self.arg[f"lead_{k}"] for k in "abcd"]
        shared = b.and_(b.and_(b.icmp_signed("==", leads[0], leads[1]), b.icmp_signed("==", leads[0], leads[2])),
                        b.icmp_signed("==", leads[0], leads[3]))
        with b.if_else(shared) as (then, otherwise):
            with then:  # one loop for all four (fresh outputs, or arrays at one offset)
                self.lines(leads[0], "abcd")
            with otherwise:
                for k, lead in zip("abcd", leads):
                    self.lines(lead, k)

    def lines(self, lead, outputs: str):
        """One loop over the lines that start ``lead`` words before element o0 of ``outputs``
        (all of which have that lead), reading each input once."""
        b, arg = self.builder, self.arg
        total = b.add(lead, arg["count"])
        inputs = [name for name in _INPUTS if any(name in _OUTPUTS[k][0] for k in outputs)]
        # element ``offset - lead`` of each array: where the first line begins
        starts = {i: b.gep(self.data(i), [b.sub(arg[_INPUTS[i][0]], lead)]) for i in inputs}
        # the next row's element e sits at its start + e; line element j of this row holds the
        # next row's element j - total
        nexts = {}
        for i in inputs:
            offset, further = _INPUTS[i]
            delta = arg[further] if further else ir.Constant(self.word, 0)
            nexts[i] = b.gep(self.data(i), [b.sub(b.add(arg[offset], delta), total)])
        outs = {k: b.gep(self.data(k), [b.sub(arg["o0"], lead)]) for k in outputs}
        n_lines = b.lshr(b.add(total, ir.Constant(self.word, 7)), ir.Constant(self.word, 3))
        with cgutils.for_range(b, n_lines) as loop:
            self.line(b.mul(loop.index, ir.Constant(self.word, 8)), lead, total, starts, nexts, outs)

    def line(self, j0, lead, total, starts, nexts, outs):
        """Line ``j0`` (its first word) of every output in ``outs``: whole, paired with the next
        row's first elements, masked, or skipped (a head the previous row wrote)."""
        b, arg = self.builder, self.arg
        eight, zero = ir.Constant(self.word, 8), ir.Constant(self.vec, [0] * 8)

        def at(ptr):
            return b.bitcast(b.gep(ptr, [j0]), self.vptr)

        def masked_loads(mask, fallback):
            return {i: b.call(self.masked_load, [at(p), ir.Constant(self.i32, 8), mask, fallback[i]])
                    for i, p in starts.items()}

        head = b.icmp_signed("<", j0, lead)
        tail = b.icmp_signed(">", b.add(j0, eight), total)
        whole = b.not_(b.or_(head, tail))
        paired = b.and_(b.and_(tail, b.not_(head)), arg["pair_next"])
        skipped = b.and_(head, arg["skip_head"])
        with b.if_else(whole) as (then, otherwise):
            with then:
                self.store_line({i: b.load(at(p), align=8) for i, p in starts.items()}, outs, at)
            with otherwise:
                if not MASKED_MOVES:
                    self.partial_line_by_words(j0, lead, total, starts, nexts, outs, at, paired, skipped)
                    return
                j = b.add(self.lanes, self.splat(j0))
                mine = b.and_(b.icmp_signed(">=", j, self.splat(lead)), b.icmp_signed("<", j, self.splat(total)))
                with b.if_else(paired) as (pair, single):
                    with pair:  # this row's last elements, then the next row's first
                        theirs = b.icmp_signed(">=", j, self.splat(total))
                        follow = {i: b.call(self.masked_load, [at(nexts[i]), ir.Constant(self.i32, 8), theirs, zero])
                                  for i in starts}
                        self.store_line(masked_loads(mine, follow), outs, at)
                    with single:
                        with b.if_then(b.not_(skipped)):
                            values = masked_loads(mine, dict.fromkeys(starts, zero))
                            for k, ptr in outs.items():
                                b.call(self.masked_store, [_OUTPUTS[k][1](b, values), at(ptr), ir.Constant(self.i32, 8),
                                                           mine])

    def partial_line_by_words(self, j0, lead, total, starts, nexts, outs, at, paired, skipped):
        """``line``'s partial cases without masked moves: a paired line gathered word by word
        (this row's words, then the next row's; a pair is never a head, so every word is one of
        the two) and stored whole; otherwise this row's words stored one by one."""
        b = self.builder
        eight = ir.Constant(self.word, 8)
        with b.if_else(paired) as (pair, single):
            with pair:
                gathered = {i: cgutils.alloca_once(b, self.vec) for i in starts}
                with cgutils.for_range(b, eight) as word:
                    j = b.add(j0, word.index)
                    mine = b.icmp_signed("<", j, total)
                    for i, p in starts.items():
                        value = b.load(b.select(mine, b.gep(p, [j]), b.gep(nexts[i], [j])))
                        b.store(b.insert_element(b.load(gathered[i]), value, word.index), gathered[i])
                self.store_line({i: b.load(v) for i, v in gathered.items()}, outs, at)
            with single:
                with b.if_then(b.not_(skipped)):
                    with cgutils.for_range(b, eight) as word:
                        j = b.add(j0, word.index)
                        with b.if_then(b.and_(b.icmp_signed(">=", j, lead), b.icmp_signed("<", j, total))):
                            values = {i: b.load(b.gep(p, [j])) for i, p in starts.items()}
                            for k, ptr in outs.items():
                                b.store(_OUTPUTS[k][1](b, values), b.gep(ptr, [j]))

    def store_line(self, values, outs, at):
        for k, ptr in outs.items():
            # a whole line starts on 64 bytes (streaming needs it said: LLVM splits an
            # under-aligned streaming vector into eight movnti)
            store = self.builder.store(_OUTPUTS[k][1](self.builder, values), at(ptr),
                                       align=64 if self.nontemporal else 8)
            if self.nontemporal:
                store.set_metadata("nontemporal", self.streaming)


def _identity_row_intrinsic(nontemporal: bool):
    """The intrinsic of the module docstring, its whole lines streamed when ``nontemporal``."""
    signature = types.void(*(t for _, t in PARAMETERS))

    # Numba lowers an intrinsic's parameters one by one (no *args): they are spelled out here,
    # in PARAMETERS' order (checked below), and the code generator reads them by name.
    def identity_row(typingctx, s, s0, pw, w0, px, x0, n, n0, a, b, c, d, o0, count, lead_a, lead_b, lead_c, lead_d,
                     skip_head, pair_next, next_s, next_w):
        given = (s, s0, pw, w0, px, x0, n, n0, a, b, c, d, o0, count, lead_a, lead_b, lead_c, lead_d, skip_head,
                 pair_next, next_s, next_w)
        if given != signature.args:
            return None

        def codegen(context, builder, sig, args):
            _RowWriter(context, builder, args, nontemporal).write()
            return context.get_dummy_value()

        return signature, codegen

    if tuple(inspect.signature(identity_row).parameters)[1:] != tuple(name for name, _ in PARAMETERS):
        raise AssertionError("identity_row's parameters and PARAMETERS differ")
    return intrinsic(identity_row)


identity_row = _identity_row_intrinsic(False)
identity_row_streamed = _identity_row_intrinsic(True)


@intrinsic
def store_fence(typingctx):
    """A full fence: streaming stores are weakly ordered, and must be visible before the
    parallel region hands the arrays back (``mfence`` on x86)."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen
