"""Fused epilogues of binary layers, generated per genome: counts -> measure -> BN -> residual -> bits.

For one binary unit the engine has ``a`` from the popcount GEMM and the window sums ``px``,
``pw``, ``n`` (``counts.py`` derives them). One pass over ``a`` then computes, per output,

    b = pw - a,  c = px - a,  d = (n - pw) - px + a         (docs/design.md section 1; exact integers)
    m = B3(B1(U1(a), U2(d)), B2(U3(b), U4(c)))              (float32, every op rounded to float32)
    y = fma(m, scale, shift)  [+ residual]                  (folded BatchNorm as torch computes it,
                                                             bnn/export.py, refimpl/_fma.py)

writes ``y`` (float32, channels last: (N, H*W, C); the next residual needs the real value) and, when the next layer is
binary, ``sign(y)`` packed straight into that layer's zero-padded (N, Hp, Wp, K) word buffer, so
no separate binarize pass reads the activation again.

Two forms per residual mode: ``epilogue_<mode>`` reads ``a`` and ``px`` that the GEMM left in
memory; ``fused_<mode>`` runs the GEMM itself, one tile of pixels at a time
(``refimpl._tiles.tile_16x8_nhwc``), and consumes the tile's counts while they are in L1, in
one parallel region per layer instead of two per group of images (faster than the two passes
together: docs/performance.md).

Why generate: ``refimpl.measure`` dispatches on the operator codes per element (an ``if`` chain
of 18 + 14 branches, called 7 times); here the genome's formula is composed once from the
operator table (``formula.substitute``, as ``Genome.formula()`` does) and emitted as straight-line
Numba code with float32 constants, so LLVM sees one expression and the baseline measure is just
integer arithmetic. The source goes to a file in a cache directory and the module is executed
from the generated text with that file's name (never imported, so no ``.pyc`` is consulted):
Numba's ``cache=True`` only works for functions that live in a real file, and a file per genome
keeps the compiled epilogue across processes (the second run of ``refimpl.infer`` does not
compile). The text carries the stamp of every refimpl source (``sources_stamp``), so a change
to any code the kernels inline gives a new file name and a fresh compile, never stale code.

Compiled with LLVM's loop vectorizer on (``jit(loop_vectorize=True)``), which refimpl/_jit.py
leaves off for the popcount tiles: the epilogue is a long elementwise loop (int -> float32
conversions, arithmetic, fma, sign bits) that runs ~4x faster in AVX-512 vectors. Vectorizing
does not change a float32 result: no reassociation without fastmath, and without SVML the libm
calls of transcendental measures stay scalar calls (tests compare with refimpl.measure bit for
bit).

Cache directory: ``$BNN_MEASURE_CACHE``, else ``$XDG_CACHE_HOME/bnn-measure``, else
``~/.cache/bnn-measure``; created with mode 700, and used only while it is this user's and not
writable by group or others (Numba's cache entries there are pickles): otherwise a fresh private
temp folder serves the process, with a one-line warning.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import types

from . import _jit
from .blocked import TILE_CHANNELS, TILE_PIXELS, tile_function_name
from .codegen import to_numba
from .genome import Genome


def sources_stamp() -> str:
    """The stamp of every refimpl source, written into each generated module: the kernels inline
    code from other files (``bits.sign_word``, ``_fma.fma32``, ``nan_max``, the tile of
    ``_tiles.py``) and Numba's cache of the module watches only the module's own file, so any
    change to the package (this generator included) gives new text, a new file and a compile."""
    return _jit.package_stamp().hex()


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
    tree = Genome.parse(genome).expression([f"al{slot}" for slot in range(4)])
    return to_numba(tree)


# Explicit signatures: the kernels compile when the module is imported (see ``load``), and the
# engine always passes C-contiguous arrays.
# a (N, P, O) int32; px (N, P); pw, npw (P, O); alpha (4, O); scale, shift (O,)
_COMMON = "i4[:, :, ::1], f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[::1], f4[::1]"
_TAIL = "f4[:, :, ::1], u8[:, :, :, ::1], b1, i8, i8, i8, i8"
# The fused kernels: GEMM operands (flat padded input words, weight panels, K, tap offsets,
# window origins; a second set of weights/taps/origins for the shortcut), then per-thread
# scratch: im2col (T, L), edge block (T, Q, P), counts block (T, P*O) int32.
_GEMM = "u8[::1], u8[::1], i8, i8[::1], i8[::1]"
_GEMM2 = "u8[::1], i8[::1], i8[::1]"
_SCRATCH = "u8[:, ::1], u8[:, :, ::1], i4[:, ::1]"
_PX_SCRATCH = "f4[:, ::1]"  # (T, P) px of the tile's pixels; (T, 2P) with the shortcut's
_EPI = "f4[:, ::1], f4[:, ::1], f4[:, ::1], f4[::1], f4[::1]"  # pw, npw, alpha, scale, shift
_FUSED_TAIL = "f4[:, :, ::1], u8[:, :, :, ::1], b1, i8, i8, i8"
_FUSED_SIGNATURES = {
    # identity takes what none takes: its residual is ``out`` itself (see _MODES)
    "none": f"void({_GEMM}, {_SCRATCH}, {_PX_SCRATCH}, {_EPI}, {_FUSED_TAIL})",
    "identity": f"void({_GEMM}, {_SCRATCH}, {_PX_SCRATCH}, {_EPI}, {_FUSED_TAIL})",
    "down": f"void({_GEMM}, {_GEMM2}, {_SCRATCH}, i4[:, ::1], {_PX_SCRATCH}, {_EPI}, {_EPI}, {_FUSED_TAIL})",
}
_TILE = tile_function_name(TILE_PIXELS, TILE_CHANNELS)

_SIGNATURES = {
    "none": f"void({_COMMON}, {_TAIL})",
    "identity": f"void({_COMMON}, {_TAIL})",
    "down": f"void({_COMMON}, {_COMMON}, {_TAIL})",
}

_MODES = {
    # residual mode -> (extra parameters, how y is formed)
    "none": ("", "fma32(m, scale[o], shift[o])"),
    # In place: ``out`` holds the residual (the previous layer's output) on entry. Each output
    # reads only its own residual, so overwriting it is safe, and the store then hits a cache
    # line just read instead of fetching a fresh one (a separate output buffer cost a
    # read-for-ownership of 16 MB per 64-channel layer at batch 64).
    "identity": ("", "fma32(m, scale[o], shift[o]) + outrow[o]"),
    "down": (", a2, px2, pw2, npw2, alpha2, scale2, shift2",
             "fma32(m, scale[o], shift[o]) + fma32(m2, scale2[o], shift2[o])"),
}


def _counts(suffix: str) -> list[str]:
    # The window sums arrive as float32: px (N, P), pw and npw = n - pw (P, O). Every value and
    # every intermediate below is an integer of magnitude < 2**24, so float32 arithmetic is
    # exact and gives the same a, b, c, d as the int64 identities (docs/design.md section 1).
    s = suffix
    return [
        f"A{s} = F(arow{s}[o])",
        f"B{s} = pwrow{s}[o] - A{s}",
        f"C{s} = pxv{s} - A{s}",
        f"D{s} = (npwrow{s}[o] - pxv{s}) + A{s}",
    ]


def _rows(suffix: str, fused: bool) -> list[str]:
    # 1-D row views, indexed below with an unsigned o: Numba adds a negative-index wraparound
    # select to every signed index, which hides the unit stride from LLVM's loop vectorizer.
    s = suffix
    px = (f"pxt[q + {TILE_PIXELS}]" if s else "pxt[q]") if fused else f"px{s}[i, p]"
    return [f"pxv{s} = {px}", f"pwrow{s} = pw{s}[p]", f"npwrow{s} = npw{s}[p]"]


def _pixel(mode: str, form: str, fused: bool = False) -> list[str]:
    """The epilogue of pixel p of image i, all channels, given its counts row ``arow`` (and
    ``arow2`` for the shortcut convolution)."""
    lines = _rows("", fused)
    if mode == "down":
        lines += _rows("2", fused)
    lines += [
        "outrow = out[i, p]",
        "yy = p // width",
        "xx = p - yy * width",
        "for o in range(np.uint64(n_out)):",
    ]
    lines += [f"    {line}" for line in _counts("")]
    lines += ["    m = measure(A, B, C, D, al0[o], al1[o], al2[o], al3[o])"]
    if mode == "down":
        lines += [f"    {line}" for line in _counts("2")]
        lines += ["    m2 = measure(A2, B2, C2, D2, al02[o], al12[o], al22[o], al32[o])"]
    lines += [
        f"    y = {form}",
        "    outrow[o] = y",
        # The sign bits from the row just written (in L1), by ``sign_word``'s vector compares;
        # built inside the loop above they were per-lane shifts and an or-reduction, and made
        # LLVM run the loop 8 lanes wide instead of 16.
        "if pack:",
        "    for word in range(n_words):",
        "        o0 = word * 64",
        "        if o0 + 64 <= n_out:",
        "            acc = sign_word(outrow, o0)",
        "        else:",
        "            acc = np.uint64(0)",
        "            for o in range(o0, n_out):",
        "                # sign(0) = +1; NaN is not >= 0, so it binarizes to -1 as in torch.",
        "                acc |= np.uint64(outrow[o] >= F(0.0)) << np.uint64(o - o0)",
        "        bits[i, yy + pad_h, xx + pad_w, word] = acc",
    ]
    return lines


def _alphas(suffix: str) -> list[str]:
    src = "alpha" + suffix
    return [f"al{k}{suffix} = {src}[{k}]" for k in range(4)]


def generate(genome) -> str:
    """Source of the epilogue module for ``genome``."""
    g = Genome.parse(genome)
    expr = measure_expression(g)
    out = [
        f'"""GENERATED by refimpl.epilogue for genome {g}: do not edit.',
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
        "from refimpl._jit import jit",
        "from refimpl._numba_ops import nan_max, nan_min",
        "from refimpl.bits import sign_word",
        f"from refimpl._tiles import {_TILE}",
        f"# refimpl sources {sources_stamp()}: any change to them recompiles this module",
        "",
        "F = np.float32",
        f"GENOME = {str(g)!r}",
        "",
        "",
        "@jit(loop_vectorize=True)",
        "def measure(a, b, c, d, al0, al1, al2, al3):",
        f"    return {expr}",
        "",
        "",
        '@jit("void(f4[:, :, ::1], f4[:, :, ::1], f4[:, :, ::1], f4[:, :, ::1], f4[:, ::1], f4[:, :, ::1])",',
        "     parallel=True, loop_vectorize=True)",
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
            f'@jit("{_SIGNATURES[mode]}", parallel=True, loop_vectorize=True)',
            f"def epilogue_{mode}(a, px, pw, npw, alpha, scale, shift{extra}, out, bits, pack, width, pad_h, pad_w, chunk):",
            "    # Channels last: a (N, P, O) int32; px (N, P), pw and npw = n - pw (P, O) float32;",
            "    # out (N, P, O); bits (N, Hp, Wp, K) uint64 with zero borders, written when pack is True.",
            "    # A task owns one image and ``chunk`` pixels, all their channels: it alone writes",
            "    # their words. The channel loop is the vectorized one: contiguous in every array.",
            "    n_img, positions, n_out = a.shape",
            "    n_words = (n_out + 63) // 64",
            "    chunks = (positions + chunk - 1) // chunk",
        ]
        body += [f"    {line}" for line in _alphas("")]
        if mode == "down":
            body += [f"    {line}" for line in _alphas("2")]
        body += [
            "    for task in prange(n_img * chunks):",
            "        i = task // chunks",
            "        p0 = (task - i * chunks) * chunk",
            "        for p in range(p0, min(positions, p0 + chunk)):",
            "            arow = a[i, p]",
        ]
        if mode == "down":
            body += ["            arow2 = a2[i, p]"]
        body += [f"            {line}" for line in _pixel(mode, form)]
        out += body
    for mode, (extra, form) in _MODES.items():
        gemm_args = "xflat, wflat, k_words, taps_off, bases" + (", wflat2, taps_off2, bases2" if mode == "down" else "")
        scratch = "xscratch, bscratch, ascratch" + (", ascratch2" if mode == "down" else "") + ", pxscratch"
        tile_call = "{tile}(xflat, {w}, k_words, {taps}, {bases}, n_out, n_pixels, first, 0, n_panels, xscratch[tid], bscratch[tid], {a}, first, {px})"
        body = [
            "",
            "",
            # No signature: compiled on first use by ``fused_kernel`` (3-5 s each, and a
            # model that never runs fused, or has no shortcut, does not pay for them).
            "@jit(parallel=True, loop_vectorize=True)",
            f"def fused_{mode}({gemm_args}, {scratch}, pw, npw, alpha, scale, shift{extra.replace(', a2, px2', '')}, out, bits, pack, width, pad_h, pad_w):",
            "    # The popcount GEMM and the epilogue in one parallel loop: a task is one tile of",
            f"    # {TILE_PIXELS} pixels with all their channels; its int32 ``a`` rows go to a per-thread block",
            "    # (ascratch, a few KB, in L1) and are consumed at once, never written to memory.",
            "    n_img, positions, n_out = out.shape",
            "    n_pixels = n_img * positions",
            f"    n_panels = (n_out + {TILE_CHANNELS - 1}) // {TILE_CHANNELS}",
            "    n_words = (n_out + 63) // 64",
        ]
        body += [f"    {line}" for line in _alphas("")]
        if mode == "down":
            body += [f"    {line}" for line in _alphas("2")]
        body += [
            f"    for tile in prange((n_pixels + {TILE_PIXELS - 1}) // {TILE_PIXELS}):",
            "        tid = numba.get_thread_id()",
            f"        first = tile * {TILE_PIXELS}",
            "        at = ascratch[tid]",
            "        pxt = pxscratch[tid]",
            "        " + tile_call.format(tile=_TILE, w="wflat", taps="taps_off", bases="bases", a="at",
                                          px=f"pxt[:{TILE_PIXELS}]"),
        ]
        if mode == "down":
            body += [
                "        at2 = ascratch2[tid]",
                "        " + tile_call.format(tile=_TILE, w="wflat2", taps="taps_off2", bases="bases2", a="at2",
                                              px=f"pxt[{TILE_PIXELS}:]"),
            ]
        body += [
            f"        for q in range(min({TILE_PIXELS}, n_pixels - first)):",
            "            i = (first + q) // positions",
            "            p = first + q - i * positions",
            "            arow = at[q * n_out:(q + 1) * n_out]",
        ]
        if mode == "down":
            body += ["            arow2 = at2[q * n_out:(q + 1) * n_out]"]
        body += [f"            {line}" for line in _pixel(mode, form, fused=True)]
        out += body
    return "\n".join(out) + "\n"


def fused_kernel(module, mode: str):
    """``module.fused_<mode>``, compiled (or loaded from Numba's cache) for its one signature
    on first use, with the loop vectorizer on like the rest of the module. Further compiles are
    disabled, so arguments of other types raise instead of compiling a slow variant."""
    kernel = getattr(module, f"fused_{mode}")
    if not kernel.signatures:
        kernel.compile(_FUSED_SIGNATURES[mode])
        kernel.disable_compile()
    return kernel


_LOADED: dict[str, object] = {}
_FALLBACK: list[str] = []  # this process's private temp folder, once the cache folder was refused


def _unsafe(path: str) -> str | None:
    """Why ``path`` must not hold code this process runs, or None. Whoever can write there can
    plant a module or a Numba cache entry (pickles), so it must be ours and closed to others.
    POSIX only: Windows folders under the user's profile are private by their ACLs."""
    if not hasattr(os, "geteuid"):
        return None
    st = os.stat(path)
    if not os.path.isdir(path):
        return f"{path} is not a folder"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {st.st_mode & 0o777:o})"
    return None


def private_cache_dir() -> str:
    """``cache_dir()``, created with mode 700, if it (and its ``__pycache__``, where Numba keeps
    its cache) is private to this user; else a fresh private temp folder, with a one-line warning."""
    directory = cache_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    pycache = os.path.join(directory, "__pycache__")
    problem = _unsafe(directory) or (_unsafe(pycache) if os.path.lexists(pycache) else None)
    if problem is None:
        return directory
    if not _FALLBACK:
        _FALLBACK.append(tempfile.mkdtemp(prefix="bnn-measure-"))  # mode 700
        print(f"refimpl: warning: not using the measure cache: {problem}; compiling into {_FALLBACK[0]} "
              "for this process (fix: chmod go-w the folder, or set BNN_MEASURE_CACHE to a private one)",
              file=sys.stderr)
    return _FALLBACK[0]


def module_name(genome) -> tuple[str, str]:
    """(the module's name, which is also its file's stem, and its generated text)."""
    g = Genome.parse(genome)
    text = generate(g)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"bnn_measure_epilogue_{str(g).replace('-', '_')}_{digest}", text


def load(genome):
    """The compiled epilogue module for ``genome`` (generated into the cache directory once).

    The module runs from the text generated here, compiled with ``compile()``: never from what
    the folder holds, so a planted ``.py`` or ``__pycache__/*.pyc`` is never executed. The file
    is still written (and rewritten when it differs): Numba's cache is keyed by a real source
    file, and its line numbers point into it."""
    key, text = module_name(genome)
    if key in _LOADED:
        return _LOADED[key]
    directory = private_cache_dir()
    path = os.path.join(directory, f"{key}.py")
    current = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            current = f.read()
    if current != text:
        # Atomic, so a concurrent process never reads a half-written file.
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    code = compile(text, path, "exec", dont_inherit=True)
    module = types.ModuleType(key)
    module.__file__ = path  # Numba's cache locates and stamps the kernels by this file
    sys.modules[key] = module  # Numba's cache and pickling find functions by module name
    try:
        exec(code, module.__dict__)  # noqa: S102 - our generated text; compiles (or loads from Numba's cache) the kernels
    except BaseException:
        sys.modules.pop(key, None)
        raise
    _LOADED[key] = module
    return module
