"""Lookup tables of the measure's one-count subtrees, for the engine's generated epilogue.

A count is an integer in ``[0, n]`` (``n`` the window's size), so a subtree of the measure's
expression that reads exactly one count and no alpha (``a**3``, ``atan(c)``, ``exp(-d**2)``, the
``1 + exp(-c)`` of binary operator 10) takes at most ``n + 1`` values in a layer: the epilogue
looks them up by the integer count instead of calling ``powf``, ``expf``, ``erff``... per output.

Bit-identity: each table entry is computed by the subtree's own Numba float32 text (``to_numba``
of the same tree the untabled measure inlines), on the count converted by the same statements
(``refimpl/conventions.py``), compiled scalar without fastmath as ``refimpl.measure`` is; the
epilogue then feeds the entry where the subtree stood, so every rounding is the one it was.
Under ``freq`` and ``laplace`` a converted count depends on ``n`` too, which is smaller at
border pixels: one table row per distinct ``n`` of the layer, chosen per pixel by a row offset
(``raw``: one row, offset 0). Subtrees that are plain arithmetic (a count, ``alpha * x``,
``alpha + x``, constants) stay as they are, as do operators of two counts.

Cubes of raw counts: ``x**3`` is ``powf(x, 3)``, which is not the correctly rounded cube at some
integers (ties of the rounding: 261 is the first under glibc), so it needs its table in general;
below the first such integer, ``exact_cube_limit()``, it equals ``(x * x) * x`` bit for bit. The
epilogue takes a pixel's cubes as products when every cubed count of the pixel is below that
limit (most pixels of a 64-channel layer, whose window has 576 bits) and looks them up otherwise.
The limit is measured at generation time on the reference's own float32 cube
(``refimpl._numba_ops.unary_f32``), so another libm gives another limit, never other bits.

Constant tails: under raw counts a saturating table (``erf(c)``, ``exp(-d**2)``, ``1 + exp(-c)``)
takes one float32 value from some count on (``erf(c)`` is 1.0 from c = 4, ``exp(-d**2)`` 0.0 from
d = 11). The plan finds where each layer's table becomes constant, bit for bit
(``refimpl/engine/plan.py``'s ``measure_tables``), and a pixel whose counts all lie in those tails
takes the value instead of a gather. Which tables to treat so is a guess made here from the
subtree's value at large counts (``tail_candidate``); a wrong guess only costs a pixel its fast
path, never a bit, since the tail itself is read from the table.
"""
from __future__ import annotations

import ast
import functools
import math

import numpy as np

from .._jit import jit
from .._numba_ops import unary_f32
from ..conventions import BY_NAME as CONVENTIONS
from ..conventions import DEFAULT as DEFAULT_COUNTS
from ..formula import substitute
from .ops_template import to_numba

COUNT_NAMES = ("a", "b", "c", "d")
CUBE_CODE = 3  # refimpl/operators.py: the unary operator x**3
# Counts are < 2**24; the search for the first inexact cube stops here (a count at or above the
# limit only means its pixel looks its cubes up).
CUBE_SEARCH_END = 1 << 16


def _variables(node: ast.expr) -> set[str]:
    # Names a subtree reads, functions aside (a Call's func is a Name too).
    funcs = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in funcs}


def _costly(node: ast.expr) -> bool:
    # A libm call or a power other than a square: what a table saves per output. Numba lowers
    # x**2.0 to x*x (exact) and plain arithmetic costs less than the gather of a lookup.
    def squared(n):
        return isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and isinstance(n.right, ast.Constant) \
            and n.right.value == 2
    return any(isinstance(n, ast.Call) or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and not squared(n))
               for n in ast.walk(node))


def split(tree: ast.expr) -> tuple[ast.expr, list[tuple[str, ast.expr]]]:
    """(the tree with each maximal costly one-count subtree replaced by a name ``T<k>``, and the
    list of (count, subtree) of ``T0``, ``T1``...). Identical subtrees share one table."""
    tree = ast.parse(ast.unparse(tree), mode="eval").body  # one node per occurrence
    found: dict[str, int] = {}
    tables: list[tuple[str, ast.expr]] = []

    class _Replace(ast.NodeTransformer):
        def visit(self, node):
            if isinstance(node, ast.expr):
                names = _variables(node)
                if len(names) == 1 and names <= set(COUNT_NAMES) and _costly(node):
                    text = ast.unparse(node)
                    if text not in found:
                        found[text] = len(tables)
                        tables.append((next(iter(names)), node))
                    return ast.Name(f"T{found[text]}", ast.Load())
            return self.generic_visit(node)

    return _Replace().visit(tree), tables


def cube_count(node: ast.expr, counts: str) -> str | None:
    """The count of a table that is the cube of a raw count (``b ** 3``), which the epilogue may
    compute as ``(b * b) * b`` (module docstring); None for any other table or convention."""
    if counts != DEFAULT_COUNTS:
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.left, ast.Name) \
            and node.left.id in COUNT_NAMES and isinstance(node.right, ast.Constant) and node.right.value == 3:
        return node.left.id
    return None


# math's functions under the names the operator table's formulas use (refimpl/operators.py).
_MATH = {name: getattr(math, name) for name in ("exp", "log", "sqrt", "sin", "cos", "tan", "atan", "erf", "erfc")} \
    | {"abs": abs, "max": max, "min": min}
_TAIL_PROBES = (1 << 12, 1 << 14, 1 << 16)


def tail_candidate(node: ast.expr, counts: str) -> bool:
    """Whether a raw-count table (not a cube) looks constant in float32 at large counts: the same
    float32 value of its subtree at counts 2**12, 2**14 and 2**16 (in double, then rounded)."""
    if counts != DEFAULT_COUNTS or cube_count(node, counts):
        return False
    (count,) = _variables(node)
    text = ast.unparse(node)
    values = set()
    for x in _TAIL_PROBES:
        try:
            v = eval(text, {"__builtins__": {}}, {**_MATH, count: float(x)})  # noqa: S307 - the operator table's own text
        except (ArithmeticError, ValueError):
            return False
        values.add(np.float32(v).tobytes())
    return len(values) == 1


@jit
def _first_inexact_cube(code, end):
    # The first integer x whose float32 cube, as the reference computes it, is not (x * x) * x.
    for x in range(end):
        v = np.float32(x)
        if unary_f32(code, v, np.float32(0.0)) != (v * v) * v:
            return x
    return end


@functools.lru_cache(maxsize=None)
def exact_cube_limit() -> int:
    """The smallest non-negative integer whose float32 ``x**3`` (``refimpl.measure``'s) differs
    from ``(x * x) * x``: every count below it cubes exactly as the product (261 with glibc)."""
    return int(_first_inexact_cube(CUBE_CODE, CUBE_SEARCH_END))


def convert_one(counts: str, x: str, n: str) -> str | None:
    """The convention's expression of one float32 count ``x`` in a window of size ``n`` (None for raw)."""
    if counts == DEFAULT_COUNTS:
        return None
    formula = ast.parse(CONVENTIONS[counts].formula, mode="eval").body
    return to_numba(substitute(formula, {"x": ast.Name(x), "n": ast.Name(n)}))


def table_functions(tables: list[tuple[str, ast.expr]], counts: str) -> list[str]:
    """Module lines: ``build_tables(ns, out)`` that fills ``out`` (K, R, L) float32 with
    ``out[k, r, x]`` = table k at count x in a window of size ``ns[r]``. Scalar (no loop
    vectorizer, no fastmath), as ``refimpl.measure`` evaluates. Each subtree's text is written
    inline with its count bound to the converted value (the same operations a function of its
    own would do: a jitted function per table cost a genome's first run 0.03-0.06 s each)."""
    lines = []
    convert = convert_one(counts, "X", "N")
    lines += [
        "",
        "",
        "@jit",
        "def build_tables(ns, out):",
        "    # out[k, r, x]: table k at the integer count x of a window of size ns[r] (built at plan time).",
        "    for r in range(ns.shape[0]):",
        "        N = F(ns[r])",
        "        for x in range(out.shape[2]):",
        "            X = F(x)",
    ]
    if convert is not None:
        lines.append(f"            X = {convert}")
    if tables:
        lines.append("            " + " = ".join(sorted({count for count, _ in tables})) + " = X")
    lines += [f"            out[{k}, r, x] = {to_numba(node)}" for k, (_, node) in enumerate(tables)]
    if not tables:
        lines.append("            pass")
    return lines


def lookup_arguments(tables: list[tuple[str, ast.expr]], row: str, index: str) -> str:
    """The ``T0, T1, ...`` arguments of ``measure_t``: ``row.format(k=k)[index.format(v=count)]``."""
    return "".join(f"{row.format(k=k)}[{index.format(v=count.upper())}], " for k, (count, _) in enumerate(tables))


# The two kinds of fast lookup (module docstring): cubes of raw counts as products, saturating
# tables as their constant tail. Each has its own per-pixel test in the epilogue.
FAST_KINDS = ("cube", "tail")


def fast_kind(node: ast.expr, counts: str) -> str | None:
    """The kind of FAST_KINDS a table is, or None (a table every pixel looks up)."""
    return "cube" if cube_count(node, counts) else "tail" if tail_candidate(node, counts) else None


def fast_constants(tables: list[tuple[str, ast.expr]], counts: str) -> list[str]:
    """Module lines: which tables are cubes and saturating, and the cube limit."""
    kinds = [fast_kind(node, counts) for _, node in tables]
    return [
        f"CUBE_TABLES = {tuple(k for k, kind in enumerate(kinds) if kind == 'cube')!r}"
        "  # tables of a raw count's cube: products below CUBE_EXACT",
        f"TAIL_TABLES = {tuple(k for k, kind in enumerate(kinds) if kind == 'tail')!r}"
        "  # tables whose constant tail replaces the lookup (tails: plan.py's measure_tables)",
        f"CUBE_EXACT = F({float(exact_cube_limit())!r})  # refimpl/codegen/measure_tables.py's exact_cube_limit()",
    ]


def fast_lookup_arguments(tables: list[tuple[str, ast.expr]], counts: str, fast: tuple) -> str:
    """The ``T0, T1, ...`` arguments of ``measure_t`` in the epilogue, for counts ``A``..: the
    kinds in ``fast`` without a gather (a cube as ``(V * V) * V``, a tail as its value ``tv<k>``),
    every other table looked up in its row ``trow<k>`` at the count's index ``I<V>``."""
    out = ""
    for k, (count, node) in enumerate(tables):
        v, kind = count.upper(), fast_kind(node, counts)
        if kind in fast and kind == "cube":
            out += f"(({v} * {v}) * {v}), "
        elif kind in fast and kind == "tail":
            out += f"tv{k}, "
        else:
            out += f"trow{k}[I{v}], "
    return out


def fast_checks(tables: list[tuple[str, ast.expr]], counts: str) -> tuple[list[str], list[str], dict]:
    """(per-pixel lines, the counts the tests read, each kind's conditions of a slow pixel) of the
    epilogue's fast paths: a cubed count at or above CUBE_EXACT, a count of a tail table short of
    its tail (``tails[k]``, whose value ``tv<k>`` the lines read)."""
    head, used, slow = [], set(), {}
    for k, (count, node) in enumerate(tables):
        v, kind = count.upper(), fast_kind(node, counts)
        if kind == "cube":
            slow.setdefault(kind, []).append(f"{v} >= CUBE_EXACT")
        elif kind == "tail":
            head += [f"tl{k} = F(tails[{k}])", f"tv{k} = trow{k}[tails[{k}]]"]
            slow.setdefault(kind, []).append(f"{v} < tl{k}")
        if kind:
            used.add(v)
    return head, [v for v in "ABCD" if v in used], slow
