"""Fused epilogues of binary layers, generated per genome: counts -> measure -> BN -> residual -> bits.

For one binary unit the engine has ``a`` from the popcount GEMM and the window sums ``px``,
``pw``, ``n`` (``counts.py`` derives them). One pass over ``a`` then computes, per output,

    b = pw - a,  c = px - a,  d = (n - pw) - px + a         (SPEC section 1; exact integers)
    m = B3(B1(U1(a), U2(d)), B2(U3(b), U4(c)))              (float32, every op rounded to float32)
    y = fma(m, scale, shift)  [+ residual]                  (folded BatchNorm as torch computes it,
                                                             bnn/export.py, refimpl/_fma.py)

writes ``y`` (float32, NCHW; the next residual needs the real value) and, when the next layer is
binary, ``sign(y)`` packed straight into that layer's zero-padded (N, Hp, Wp, K) word buffer, so
no separate binarize pass reads the activation again.

Why generate: ``refimpl.measure`` dispatches on the operator codes per element (an ``if`` chain
of 18 + 14 branches, called 7 times); here the genome's formula is composed once from the
operator table (``formula.substitute``, as ``Genome.formula()`` does) and emitted as straight-line
Numba code with float32 constants, so LLVM sees one expression and the baseline measure is just
integer arithmetic. The source goes to a file in a cache directory and is imported from there:
Numba's ``cache=True`` only works for functions that live in a real file, and a file per genome
keeps the compiled epilogue across processes (the second run of ``refimpl.infer`` does not
compile).

Cache directory: ``$BNN_MEASURE_CACHE``, else ``$XDG_CACHE_HOME/bnn-measure``, else
``~/.cache/bnn-measure``.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile

from . import formula as _formula
from .codegen import _HELPERS, _MATH
from .genome import Genome
from .operators import BINARY, UNARY, UNARY_SLOT_INPUTS

# Raise when the generated text changes meaning, so stale cached files are not reused (the hash
# of the text is in the file name anyway; this also invalidates Numba's cache entries).
GENERATOR_VERSION = 6
# Pixels per task of the epilogue's parallel loop: small enough to split a batch-1 layer over
# threads, large enough that the per-task word buffer and loop setup are noise.
PIXEL_CHUNK = 256


def cache_dir() -> str:
    if os.environ.get("BNN_MEASURE_CACHE"):
        return os.environ["BNN_MEASURE_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bnn-measure")


def measure_expression(genome) -> str:
    """The genome's measure as one Numba float32 expression in a, b, c, d and al0..al3.

    ``a``..``d`` are float32 counts, ``alK`` the float32 alpha of unary slot K (U1..U4).
    Each table formula is substituted into the graph unchanged, so the operations (and their
    float32 roundings) are the ones ``refimpl.measure(dtype=float32)`` performs.
    """
    g = Genome.parse(genome)
    slots = []
    for slot, (code, count) in enumerate(zip(g.unary, UNARY_SLOT_INPUTS)):
        tree = _formula.parse(UNARY[code].formula)
        slots.append(_formula.substitute(tree, {"x": ast.Name(count), "alpha": ast.Name(f"al{slot}")}))
    a_, d_, b_, c_ = slots
    b1, b2, b3 = (_formula.parse(BINARY[c].formula) for c in g.binary)
    left = _formula.substitute(b1, {"x": a_, "y": d_})
    right = _formula.substitute(b2, {"x": b_, "y": c_})
    tree = _formula.substitute(b3, {"x": left, "y": right})

    class _ToNumba(ast.NodeTransformer):
        # As codegen._numba_expr: constants in float32, table functions to math.* or the
        # NaN-propagating helpers of _numba_ops.
        def visit_Constant(self, node: ast.Constant) -> ast.expr:
            return ast.Call(ast.Name("F"), [ast.Constant(float(node.value))], [])

        def visit_Call(self, node: ast.Call) -> ast.expr:
            self.generic_visit(node)
            name = node.func.id
            node.func = ast.parse(f"math.{name}" if name in _MATH else _HELPERS[name], mode="eval").body
            return node

    # Re-parse first: substitution shares subtrees (x appears twice in x/(x+y)), and the
    # transformer must see each occurrence as its own node.
    tree = ast.parse(ast.unparse(tree), mode="eval").body
    return ast.unparse(ast.fix_missing_locations(_ToNumba().visit(tree)))


# Explicit signatures: the kernels compile when the module is imported, inside
# ``_loop_vectorizer()`` (see ``load``), and the engine always passes C-contiguous arrays.
_COMMON = "i8[:, :, ::1], f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[::1], f4[::1]"
_TAIL = "f4[:, :, ::1], u8[:, :, :, ::1], b1, i8, i8, i8"
_SIGNATURES = {
    "none": f"void({_COMMON}, {_TAIL})",
    "identity": f"void({_COMMON}, f4[:, :, ::1], {_TAIL})",
    "down": f"void({_COMMON}, {_COMMON}, {_TAIL})",
}

_MODES = {
    # residual mode -> (extra parameters, how y is formed)
    "none": ("", "fma32(m, sc, sh)"),
    "identity": (", res", "fma32(m, sc, sh) + resrow[p]"),
    "down": (", a2, px2, pw2, npw2, alpha2, scale2, shift2", "fma32(m, sc, sh) + fma32(m2, sc2, sh2)"),
}


def _counts(suffix: str, i: str = "i") -> list[str]:
    # The window sums arrive as float32: px (N, P), pw and npw = n - pw (O, P). Every value and
    # every intermediate below is an integer of magnitude < 2**24, so float32 arithmetic is
    # exact and gives the same a, b, c, d as the int64 identities (SPEC section 1); it saves
    # three int64 -> float32 conversions and half the bytes of pw per output.
    s = suffix
    return [
        f"A{s} = F(arow{s}[p])",
        f"pxv{s} = pxrow{s}[p]",
        f"B{s} = pwrow{s}[p] - A{s}",
        f"C{s} = pxv{s} - A{s}",
        f"D{s} = (npwrow{s}[p] - pxv{s}) + A{s}",
    ]


def _rows(suffix: str) -> list[str]:
    # 1-D row views, indexed below with an unsigned p: Numba adds a negative-index wraparound
    # select to every signed index, which hides the unit stride from LLVM's loop vectorizer.
    s = suffix
    return [f"arow{s} = a{s}[i, o]", f"pxrow{s} = px{s}[i]", f"pwrow{s} = pw{s}[o]", f"npwrow{s} = npw{s}[o]"]


def generate(genome) -> str:
    """Source of the epilogue module for ``genome``."""
    g = Genome.parse(genome)
    expr = measure_expression(g)
    out = [
        f'"""GENERATED by refimpl.epilogue (version {GENERATOR_VERSION}) for genome {g}: do not edit.',
        "",
        f"measure = {g.formula()}",
        '"""',
        "import math",
        "",
        "import numba",
        "import numpy as np",
        "from numba import prange",
        "",
        "from refimpl._fma import fma32",
        "from refimpl._jit import OPTIONS, jit",
        "from refimpl._numba_ops import nan_max, nan_min",
        "",
        "F = np.float32",
        f"GENOME = {str(g)!r}",
        f"CHUNK = {PIXEL_CHUNK}",
        "",
        "",
        "@jit",
        "def measure(a, b, c, d, al0, al1, al2, al3):",
        f"    return {expr}",
        "",
        "",
        '@numba.njit("void(f4[:, :, ::1], f4[:, :, ::1], f4[:, :, ::1], f4[:, :, ::1], f4[:, ::1], f4[:, :, ::1])",',
        "            parallel=True, **OPTIONS)",
        "def measure_array(a, b, c, d, alpha, out):",
        "    # (N, O, P) float32 counts -> out; the engine's measure alone, for tests.",
        "    n_img, n_out, size = a.shape",
        "    for r in prange(n_img * n_out):",
        "        i = r // n_out",
        "        o = r - i * n_out",
        "        for s in range(size):",
        "            out[i, o, s] = measure(a[i, o, s], b[i, o, s], c[i, o, s], d[i, o, s],",
        "                                   alpha[0, o], alpha[1, o], alpha[2, o], alpha[3, o])",
    ]
    for mode, (extra, form) in _MODES.items():
        body = [
            "",
            "",
            f'@numba.njit("{_SIGNATURES[mode]}", parallel=True, **OPTIONS)',
            f"def epilogue_{mode}(a, px, pw, npw, alpha, scale, shift{extra}, out, bits, pack, width, pad_h, pad_w):",
            "    # a (N, O, P) int64; px (N, P), pw (O, P), npw = n - pw (O, P) float32; out (N, O, P);",
            "    # bits (N, Hp, Wp, K) uint64 with zero borders, written when pack is True.",
            "    # A task owns one image, one word of 64 channels and one chunk of pixels: it alone",
            "    # writes those words, so threads never share a word.",
            "    n_img, n_out, positions = a.shape",
            "    n_words = (n_out + 63) // 64",
            "    chunks = (positions + CHUNK - 1) // CHUNK",
            "    for task in prange(n_img * n_words * chunks):",
            "        i = task // (n_words * chunks)",
            "        rest = task - i * n_words * chunks",
            "        word = rest // chunks",
            "        p0 = (rest - word * chunks) * CHUNK",
            "        p1 = min(positions, p0 + CHUNK)",
            "        acc = np.zeros(CHUNK, dtype=np.uint64)",
            "        for o in range(word * 64, min(n_out, word * 64 + 64)):",
            "            shift_bit = np.uint64(o - word * 64)",
            "            al0 = alpha[0, o]",
            "            al1 = alpha[1, o]",
            "            al2 = alpha[2, o]",
            "            al3 = alpha[3, o]",
            "            sc = scale[o]",
            "            sh = shift[o]",
        ]
        if mode == "down":
            body += [
                "            bl0 = alpha2[0, o]",
                "            bl1 = alpha2[1, o]",
                "            bl2 = alpha2[2, o]",
                "            bl3 = alpha2[3, o]",
                "            sc2 = scale2[o]",
                "            sh2 = shift2[o]",
            ]
        body += [f"            {line}" for line in _rows("")]
        if mode == "down":
            body += [f"            {line}" for line in _rows("2")]
        if mode == "identity":
            body += ["            resrow = res[i, o]"]
        body += [
            "            outrow = out[i, o]",
            "            for p in range(np.uint64(p0), np.uint64(p1)):",
        ]
        body += [f"                {line}" for line in _counts("")]
        body += ["                m = measure(A, B, C, D, al0, al1, al2, al3)"]
        if mode == "down":
            body += [f"                {line}" for line in _counts("2")]
            body += ["                m2 = measure(A2, B2, C2, D2, bl0, bl1, bl2, bl3)"]
        body += [
            f"                y = {form}",
            "                outrow[p] = y",
            "                # sign(0) = +1; NaN is not >= 0, so it binarizes to -1 as in torch. Branch-free:",
            "                # the signs are data, and a mispredicted branch per output cost 10x the rest.",
            "                acc[p - np.uint64(p0)] |= np.uint64(y >= F(0.0)) << shift_bit",
            "        if pack:",
            "            for p in range(p0, p1):",
            "                yy = p // width",
            "                bits[i, yy + pad_h, p - yy * width + pad_w, word] = acc[p - p0]",
        ]
        out += body
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def _loop_vectorizer():
    """LLVM's loop vectorizer on while the epilogue compiles.

    refimpl/_jit.py turns it off for the whole package because it wrecks the popcount tile; the
    epilogue is the opposite case: a long elementwise loop (int64 -> float32 conversions,
    arithmetic, fma, sign bits) that runs ~4x faster in AVX-512 vectors. Vectorizing does not
    change a float32 result: no reassociation without fastmath, and without SVML the libm calls
    of transcendental measures stay scalar calls (tests compare with refimpl.measure bit for bit).
    A user's NUMBA_LOOP_VECTORIZE setting wins.
    """
    import numba

    if "NUMBA_LOOP_VECTORIZE" in os.environ:
        yield
        return
    saved = numba.config.LOOP_VECTORIZE
    numba.config.LOOP_VECTORIZE = 1
    try:
        yield
    finally:
        numba.config.LOOP_VECTORIZE = saved


_LOADED: dict[str, object] = {}


def load(genome):
    """The compiled epilogue module for ``genome`` (generated into the cache directory once)."""
    g = Genome.parse(genome)
    text = generate(g)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    key = f"bnn_measure_epilogue_{str(g).replace('-', '_')}_{digest}"
    if key in _LOADED:
        return _LOADED[key]
    directory = cache_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{key}.py")
    current = None
    if os.path.isfile(path):
        with open(path) as f:
            current = f.read()
    if current != text:
        # Atomic, so a concurrent process never imports a half-written file.
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # Numba's cache and pickling find functions by module name
    with _loop_vectorizer():
        spec.loader.exec_module(module)  # compiles (or loads from Numba's cache) the kernels
    _LOADED[key] = module
    return module
