"""The template of the engine's epilogue of one genome: counts -> measure -> BN (generated at
run time into a cache folder by ``refimpl/engine/epilogue.py``), and the kernels around it that
add the residual and write the bits (``drivers_template.py``, the same for every genome).

For one binary unit the engine has ``a`` from the popcount GEMM and the window sums ``px``,
``pw``, ``n`` (``refimpl/kernels/window_sums.py`` derives them). One pass over ``a`` then
computes, per output,

    b = pw - a,  c = px - a,  d = (n - pw) - px + a         (docs/design.md section 1; exact integers)
    m = B3(B1(U1(a), U2(d)), B2(U3(b), U4(c)))              (float32, every op rounded to float32)
    y = fma(m, scale, shift)  [+ residual]                  (folded BatchNorm as torch computes it,
                                                             bnn/export/model_file.py, refimpl/kernels/fma.py)

writes ``y`` (float32, channels last: (N, H*W, C); the next residual needs the real value) and,
when the next layer is binary, ``sign(y)`` packed straight into that layer's zero-padded
(N, Hp, Wp, K) word buffer, so no separate binarize pass reads the activation again.

Two forms per residual mode: ``epilogue_<mode>`` reads ``a`` and ``px`` that the GEMM left in
memory; ``fused_<mode>`` runs the GEMM itself, one tile of pixels at a time
(``refimpl.kernels._tiles.tile_16x8_nhwc``), and consumes the tile's counts while they are in
L1, in one parallel region per layer instead of two per group of images (faster than the two
passes together: docs/performance.md). Both forms, in every mode, are serial tasks over a range
of tasks (``<kernel>_task``) under a parallel loop, all of them ``drivers_template.py``'s and
compiled once for every genome (``refimpl/engine/task_call.py`` says why). A genome module holds
one kernel, ``measure_rows`` (``ROWS_SIGNATURE``): y = fma(measure, scale, shift) for a block of
pixel rows, which every task calls at its address. When each genome had its own six tasks, their
scaffolding (tiles, residuals, bits) was compiled again per genome, 1-3 s per kernel.

Why generate: ``refimpl.measure`` dispatches on the operator codes per element (an ``if`` chain
of 18 + 14 branches, called 7 times); here the genome's formula is composed once from the
operator table (``formula.substitute``, as ``Genome.formula()`` does) and emitted as
straight-line Numba code with float32 constants, so LLVM sees one expression and the baseline
measure is just integer arithmetic. The text carries the stamp of every refimpl source
(``sources_stamp``), so a change to any code the kernels inline gives new text, a new cached
file and a fresh compile, never stale code.

Compiled with LLVM's loop vectorizer on (``jit(loop_vectorize=True)``), which refimpl/_jit.py
leaves off for the popcount tiles: the epilogue is a long elementwise loop (int -> float32
conversions, arithmetic, fma, sign bits) that runs ~4x faster in AVX-512 vectors. Vectorizing
does not change a float32 result: no reassociation without fastmath, and without SVML the libm
calls of transcendental measures stay scalar calls (tests compare with refimpl.measure bit for
bit).
"""
from __future__ import annotations

import ast
import itertools

from .. import _jit
from ..conventions import BY_NAME as CONVENTIONS
from ..conventions import DEFAULT as DEFAULT_COUNTS
from ..conventions import check_counts
from ..formula import substitute
from ..genome import Genome
from ..kernels.tiling import TILE_CHANNELS, TILE_PIXELS, fused_tile_function_name
from .measure_tables import (
    FAST_KINDS,
    fast_checks,
    fast_constants,
    fast_lookup_arguments,
    split,
    table_functions,
)
from .ops_template import to_numba


def sources_stamp() -> str:
    """The stamp of every refimpl source, written into each generated module: the kernels inline
    code from other files (``bits.sign_word``, ``fma.fma32``, ``nan_max``, the tile of
    ``_tiles.py``) and Numba's cache of the module watches only the module's own file, so any
    change to the package (this generator included) gives new text, a new file and a compile."""
    return _jit.package_stamp().hex()


def measure_module_imports() -> list[str]:
    """The lines every generated measure module starts its code with (after its docstring): the imports
    its formulas need and the refimpl sources stamp (``sources_stamp`` says why)."""
    return ["import math", "", "import numpy as np", "", "from refimpl._jit import jit",
            "from refimpl._numba_ops import nan_max, nan_min", f"# refimpl sources {sources_stamp()}: any change to "
            "them recompiles this module"]


def measure_expression(genome) -> str:
    """The genome's measure as one Numba float32 expression in a, b, c, d and al0..al3.

    ``a``..``d`` are float32 counts, ``alK`` the float32 alpha of unary slot K (U1..U4).
    Each table formula is substituted into the graph unchanged, so the operations (and their
    float32 roundings) are the ones ``refimpl.measure(dtype=float32)`` performs.
    """
    tree = Genome.parse(genome).expression([f"al{slot}" for slot in range(4)])
    return to_numba(tree)


def measure_tables(genome, tables: bool = True) -> tuple[str, list]:
    """(``measure_t``'s expression: the measure with its costly one-count subtrees as names
    ``T0``, ``T1``..., and their (count, subtree) list; refimpl/codegen/measure_tables.py says
    why). With ``tables=False`` the plain measure and no tables, for tests that compare the two."""
    tree = Genome.parse(genome).expression([f"al{slot}" for slot in range(4)])
    if not tables:
        return to_numba(tree), []
    tree, found = split(tree)
    return to_numba(tree), found


# The arguments of each kernel (its genome-free task in refimpl/engine/_drivers.py takes its range
# first, the driver the task's address and its number of parts). The engine always passes
# C-contiguous arrays.
# a (N, P, O) int32; px (N, P); pw, npw (P, O); alpha (4, O); scale, shift (O,)
# tab (K, R*L) the measure's lookup tables, toff (P,) each pixel's row offset (measure_tables.py)
_COMMON = "i4[:, :, ::1], f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[::1], f4[::1], f4[:, ::1], i8[::1], i8[::1]"
_TAIL = "f4[:, :, ::1], u8[:, :, :, ::1], b1, i8, i8, i8, i8"
# The fused kernels: GEMM operands (flat padded input words, weight panels, K, tap offsets,
# window origins; a second set of weights/taps/origins for the shortcut), then per-thread
# scratch: im2col (T, L), edge block (T, Q, P), counts block (T, P*O) int32.
_GEMM = "u8[::1], u8[::1], i8, i8[::1], i8[::1]"
_GEMM2 = "u8[::1], i8[::1], i8[::1]"
_SCRATCH = "u8[:, ::1], u8[:, :, ::1], i4[:, ::1]"
_PX_SCRATCH = "f4[:, ::1]"  # (T, P) px of the tile's pixels; (T, 2P) with the shortcut's
_Y_SCRATCH = "f4[:, ::1]"  # (T, Y) rows of the measure's outputs (plan.py's y_scratch_size)
_EPI = "f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[::1], f4[::1], f4[:, ::1], i8[::1], i8[::1]"  # pw, npw, alpha, scale, shift, tab, toff, tails
_FUSED_TAIL = "f4[:, :, ::1], u8[:, :, :, ::1], b1, i8, i8, i8"
# The one signature of each kernel, by name. The leading i8: the address of the genome's
# ``measure_rows`` (``ROWS_SIGNATURE``); the fused kernels take the popcount tile's before it.
SIGNATURES = {
    "epilogue_none": f"void(i8, {_COMMON}, {_Y_SCRATCH}, {_TAIL})",
    "epilogue_identity": f"void(i8, {_COMMON}, {_Y_SCRATCH}, {_TAIL})",
    "epilogue_down": f"void(i8, {_COMMON}, {_COMMON}, {_Y_SCRATCH}, {_TAIL})",
    # identity takes what none takes: its residual is ``out`` itself (see MODES)
    "fused_none": f"void(i8, i8, {_GEMM}, {_SCRATCH}, {_PX_SCRATCH}, {_Y_SCRATCH}, {_EPI}, {_FUSED_TAIL})",
    "fused_identity": f"void(i8, i8, {_GEMM}, {_SCRATCH}, {_PX_SCRATCH}, {_Y_SCRATCH}, {_EPI}, {_FUSED_TAIL})",
    "fused_down": f"void(i8, i8, {_GEMM}, {_GEMM2}, {_SCRATCH}, i4[:, ::1], {_PX_SCRATCH}, {_Y_SCRATCH}, {_EPI}, {_EPI}, {_FUSED_TAIL})",
}
# The one part of the epilogue that a genome changes, and so the one kernel of a genome's module:
# ``measure_rows(n_rows, first, positions, a, abase, px, pxbase, pw, npw, alpha, scale, shift, tab,
# toff, tails, y, ybase)`` writes y[ybase + q*O + o] = fma(measure, scale[o], shift[o]) for the rows
# q < n_rows of global pixels first + q (image-major; counts at a[abase + q*O + o], px at
# px[pxbase + q]). The tasks around it (tiles, residuals, sign bits) are refimpl/engine/_drivers.py's,
# compiled and cached once for every genome, and call it at its address: as a genome's own tasks
# they were most of a new genome's compile (docs/performance.md, compile time).
ROWS_SIGNATURE = ("void(i8, i8, i8, i4[::1], i8, f4[::1], i8, f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[::1], f4[::1],"
                  " f4[:, ::1], i8[::1], i8[::1], f4[::1], i8)")
# The popcount tile, the part of a fused kernel that no genome changes: refimpl/kernels/_tiles.py's
# copy for these tasks, compiled and cached once for every genome, and called by the fused tasks
# at its address (``tile_fn``, refimpl/engine/epilogue.py's ``tile_address``). Its one signature:
# (input words, weight panels, K, tap offsets, window origins, O, pixels, first pixel, first and
# end panel, im2col row, edge block, counts block, its first pixel, px of the tile).
FUSED_TILE = fused_tile_function_name(TILE_PIXELS, TILE_CHANNELS)
TILE_CALL_SIGNATURE = "void(u8[::1], u8[::1], i8, i8[::1], i8[::1], i8, i8, i8, i8, i8, u8[::1], u8[:, ::1], i4[::1], i8, f4[::1])"

# ``measure_rows`` is called only at its machine address, by the tasks (refimpl/engine/
# task_call.py), never from Python: Numba's Python wrapper, which unboxes each array, would only
# add to its compile (nor ``measure_t``'s, which only ``measure_rows`` calls).
_NO_WRAPPER = ", no_cpython_wrapper=True"

# residual mode -> the extra parameters of its kernels (the second convolution's, in down mode).
# none: out = y; identity: out = y + out, in place (``out`` holds the residual, the previous
# layer's output, on entry: each output reads only its own residual, and the store then hits a
# cache line just read instead of fetching a fresh one; a separate output buffer cost a
# read-for-ownership of 16 MB per 64-channel layer at batch 64); down: out = y + y2.
MODES = {
    "none": "",
    "identity": "",
    "down": ", a2, px2, pw2, npw2, alpha2, scale2, shift2, tab2, toff2, tails2",
}


def convert_lines(counts: str, n: str) -> list[str]:
    """Statements that replace the float32 counts ``A``..``D`` by the count convention's values,
    ``n`` the window's size (refimpl/conventions.py; none for ``raw``)."""
    if check_counts(counts) == DEFAULT_COUNTS:
        return []
    formula = ast.parse(CONVENTIONS[counts].formula, mode="eval").body
    lines = [f"N = {n}"]
    for v in "ABCD":
        tree = substitute(formula, {"x": ast.Name(v), "n": ast.Name("N")})
        lines.append(f"{v} = {to_numba(tree)}")
    return lines


def _counts(counts: str, tables: list) -> list[str]:
    # The window sums arrive as float32: px (N, P), pw and npw = n - pw (P, O). Every value and
    # every intermediate below is an integer of magnitude < 2**24, so float32 arithmetic is
    # exact and gives the same a, b, c, d (and n = pw + npw) as the int64 identities
    # (docs/design.md section 1); the convention then rounds once (refimpl/conventions.py).
    return [
        "A = F(arow[o])",
        "B = pwrow[o] - A",
        "C = pxv - A",
        "D = (npwrow[o] - pxv) + A",
    ] + _index_lines(tables) + convert_lines(counts, "pwrow[o] + npwrow[o]")


def _index_lines(tables: list) -> list[str]:
    # The integer count of each tabled count, before the convention converts it: a from the
    # GEMM's int32, b, c, d from their exact float32 values. Unsigned, so no wraparound select;
    # masked to 31 bits (counts are < 2**24), so LLVM gathers with 16 dword indices, not 2 x 8 qword.
    used = sorted({count.upper() for count, _ in tables})
    return [f"I{v} = np.uint32(arow[o]) & INDEX_MASK" if v == "A" else f"I{v} = np.uint32({v}) & INDEX_MASK"
            for v in used]


def _table_rows(tables: list) -> list[str]:
    # Pixel p's row of each table (the row of its window size: refimpl/codegen/measure_tables.py).
    return [f"trow{k} = tab[{k}, toff[p]:]" for k in range(len(tables))]


def _measure_call(tables: list, counts: str, fast: tuple = ()) -> str:
    # fast: the kinds of FAST_KINDS this loop takes without a gather (_channels says when).
    alphas = ", ".join(f"al{k}[o]" for k in range(4))
    return f"measure_t(A, B, C, D, {fast_lookup_arguments(tables, counts, fast)}{alphas})"


def _channels(counts: str, tables: list) -> list[str]:
    """The measure of one row (pixel p, all channels; ``arow``, ``pxv``, ``pwrow``, ``npwrow`` and
    the table rows set), written as y = fma(m, scale, shift) into ``outrow``."""
    lines = []

    def channel_loop(fast: tuple) -> list[str]:
        body = ["for o in range(np.uint64(n_out)):"]
        body += [f"    {line}" for line in _counts(counts, tables)]
        body += [f"    m = {_measure_call(tables, counts, fast)}"]
        return body + ["    outrow[o] = fma32(m, scale[o], shift[o])"]

    head, used, slow = fast_checks(tables, counts)
    kinds = [kind for kind in FAST_KINDS if kind in slow]
    if not kinds:
        return channel_loop(())
    # The fast paths: a pixel whose cubed counts are all below the exact limit takes its cubes as
    # products, one whose counts of saturating tables all lie in the constant tails takes the
    # tails' values, instead of gathers (measure_tables.py's module docstring says why both are
    # exact); any other pixel looks them up. One vectorized pass over the row tests both, and one
    # loop per combination runs the row.
    lines += head
    lines += [f"slow_{kind} = np.uint32(0)" for kind in kinds]
    lines += ["for o in range(np.uint64(n_out)):"]
    defined = _counts(counts, [])[:4]  # A, B, C, D in order; B, C, D read only A
    lines += [f"    {defined[0]}"] + [f"    {defined['ABCD'.index(v)]}" for v in used if v != "A"]
    lines += [f"    slow_{kind} |= np.uint32({c})" for kind in kinds for c in slow.get(kind, [])]
    combinations = [tuple(k for k, on in zip(kinds, bits) if on)
                    for bits in itertools.product((True, False), repeat=len(kinds))]
    for n, fast in enumerate(combinations):
        if n == len(combinations) - 1:
            lines += ["else:"]
        else:
            test = " and ".join(f"slow_{kind} == 0" if kind in fast else f"slow_{kind} != 0" for kind in kinds)
            lines += [f"{'if' if n == 0 else 'elif'} {test}:"]
        lines += [f"    {line}" for line in channel_loop(fast)]
    return lines


def _rows_function(counts: str, tables: list) -> list[str]:
    """``measure_rows``: the genome's measure, scaled and shifted, of a block of pixel rows
    (``ROWS_SIGNATURE`` says what it reads and writes)."""
    return [
        "",
        "",
        # noalias: y shares memory with no other argument (plan.py), and LLVM needs that promise
        # to vectorize the table lookups (refimpl/_jit.py's _noalias).
        f"@jit(loop_vectorize=True, noalias=True{_NO_WRAPPER})",
        "def measure_rows(n_rows, first, positions, a, abase, px, pxbase, pw, npw, alpha, scale, shift, tab, toff, tails, y, ybase):",
        "    # Channels last: counts row q at a[abase + q*O:], its px at px[pxbase + q], pw and",
        "    # npw = n - pw (P, O) float32 by pixel p; rows are pixels first + q of the image-major",
        "    # (N*P) order. The channel loop is the vectorized one: contiguous in every array.",
        "    n_out = pw.shape[1]",
        *[f"    al{k} = alpha[{k}]" for k in range(4)],
        "    for q in range(n_rows):",
        "        g = first + q",
        "        p = g - (g // positions) * positions",
        # 1-D row views, indexed with an unsigned o: Numba adds a negative-index wraparound
        # select to every signed index, which hides the unit stride from LLVM's loop vectorizer.
        "        arow = a[abase + q * n_out:abase + (q + 1) * n_out]",
        "        pxv = px[pxbase + q]",
        "        pwrow = pw[p]",
        "        npwrow = npw[p]",
        *[f"        {line}" for line in _table_rows(tables)],
        "        outrow = y[ybase + q * n_out:ybase + (q + 1) * n_out]",
        *[f"        {line}" for line in _channels(counts, tables)],
    ]


def _module_head(g: Genome, counts: str, tables: bool) -> list[str]:
    """The module's docstring, imports, and its measure alone (``measure``, ``measure_t``, ``build_tables``;
    over whole arrays, for tests: arrays_template.py's module, one for every convention)."""
    tabled, found = measure_tables(g, tables)
    t_params = "".join(f"T{k}, " for k in range(len(found)))
    return [
        f'"""GENERATED by refimpl/codegen/epilogue_template.py for genome {g}, {counts} counts: do not edit.',
        "",
        f"measure = {g.formula()}",
        f"counts: {counts} ({CONVENTIONS[counts].formula} for each count x of a window of size n)",
        '"""',
        "import math",
        "",
        "import numpy as np",
        "",
        "from refimpl._jit import jit",
        "from refimpl._numba_ops import nan_max, nan_min",
        "from refimpl.kernels.fma import fma32",
        f"# refimpl sources {sources_stamp()}: any change to them recompiles this module",
        "",
        "F = np.float32",
        f"GENOME = {str(g)!r}",
        f"COUNTS = {counts!r}",
        f"N_TABLES = {len(found)}",
        f"TABLE_COUNTS = {tuple(count for count, _ in found)!r}  # the count each table reads",
        *fast_constants(found, counts),
        "INDEX_MASK = np.uint32(0x7FFFFFFF)",
        "",
        "",
        "@jit(loop_vectorize=True)  # compiled on first call: tests only",
        "def measure(a, b, c, d, al0, al1, al2, al3):",
        f"    return {measure_expression(g)}",
        "",
        "",
        f"@jit(loop_vectorize=True{_NO_WRAPPER})  # called from the kernels only",
        f"def measure_t(a, b, c, d, {t_params}al0, al1, al2, al3):",
        "    # The measure with its one-count subtrees looked up (T<k> = table k at the count).",
        f"    return {tabled}",
        *table_functions(found, counts),
    ]


def epilogue_parameters(mode: str) -> str:
    """The parameters of ``epilogue_<mode>`` (its task and its driver take them after their own)."""
    return f"rows_fn, a, px, pw, npw, alpha, scale, shift, tab, toff, tails{MODES[mode]}, yscratch, out, bits, pack, width, pad_h, pad_w, chunk"


def fused_parameters(mode: str) -> str:
    """The parameters of ``fused_<mode>`` (its task and its driver take them after their own)."""
    gemm_args = "xflat, wflat, k_words, taps_off, bases" + (", wflat2, taps_off2, bases2" if mode == "down" else "")
    scratch = "xscratch, bscratch, ascratch" + (", ascratch2" if mode == "down" else "") + ", pxscratch, yscratch"
    return (f"tile_fn, rows_fn, {gemm_args}, {scratch}, pw, npw, alpha, scale, shift, tab, toff, tails{MODES[mode].replace(', a2, px2', '')}, out, bits,"
            " pack, width, pad_h, pad_w")


def task_signature(name: str) -> str:
    """The one signature of the task ``<name>_task`` of refimpl/engine/_drivers.py: the task
    range, then the kernel's arguments (``SIGNATURES``)."""
    return "void(i8, i8, " + SIGNATURES[name][len("void("):]


def driver_signature(name: str) -> str:
    """The one signature of the driver ``name`` of ``refimpl/engine/_drivers.py``: the task's
    address, the number of parts, then the kernel's arguments."""
    return "void(i8, i8, " + SIGNATURES[name][len("void("):]


def generate(genome, counts: str = DEFAULT_COUNTS, tables: bool = True) -> str:
    """Source of the epilogue module for ``genome`` under the count convention ``counts``; with
    ``tables=False`` the measure's one-count subtrees are computed per output (for tests)."""
    g = Genome.parse(genome)
    check_counts(counts)
    found = measure_tables(g, tables)[1]
    return "\n".join(_module_head(g, counts, tables) + _rows_function(counts, found)) + "\n"
