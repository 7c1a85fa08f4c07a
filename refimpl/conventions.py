"""Count conventions: what enters the measure graph in place of a count (docs/design.md section 2).

The paper calls a, b, c, d "frequencies" but writes them as popcounts and shows no code, so how a
count reaches the unary operators is a reading, and every reading is named here, once, for all
paths: ``refimpl.measure``, the engine's generated epilogue (``refimpl/codegen``), the torch path
(``bnn/nn/measure.py``) and ``verify/`` each evaluate the same ``formula`` in the measure's dtype.

Each formula is a function of one count ``x`` and the window's size ``n = a + b + c + d`` (its
in-bounds taps times the input channels; padded taps count in none). Both are integers below
2**24, exact in float32, and every formula is at most one addition to each of them, exact too,
then one IEEE division: correctly rounded, so the converted count has the same bits in NumPy,
Numba and torch, scalar or vector, whatever the path.

A convention is part of a model's identity: it is recorded in checkpoints, ``.bnn`` files
(files written before conventions existed read as ``raw``), search journals and evidence
protocols, and a run resumed under another convention is refused.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass


@dataclass(frozen=True)
class CountConvention:
    """One reading of the counts: its name, its formula in ``x`` (a count) and ``n``, and why it exists."""
    name: str
    formula: str  # a Python expression over x and n, using + and / and integer constants only
    meaning: str


CONVENTIONS: tuple[CountConvention, ...] = (
    CountConvention("raw", "x", "the counts as they are: the paper's equations (the default)"),
    CountConvention("freq", "x / n", "relative frequencies a/n, b/n, c/n, d/n of the window"),
    # Motivated by the diagnosis (docs/design.md section 2): blank image regions make windows
    # with a = c = 0, where raw and freq counts put zeros into divisors (M9's atan(c)) and
    # cubes; add-one smoothing keeps every converted count in (0, 1), never 0 or 1.
    CountConvention("laplace", "(x + 1) / (n + 4)",
                    "add-one (Laplace) smoothed frequencies (a+1)/(n+4), ...: never 0, never 1"),
)
BY_NAME = {c.name: c for c in CONVENTIONS}
# One function per row, compiled from its formula text (operators only, no names bound), so the
# NumPy and torch paths run the table's text and the Numba generator emits the same text.
_FUNCTIONS = {c.name: eval(compile(f"lambda x, n: {c.formula}", f"<counts {c.name}>", "eval"), {"__builtins__": {}})
              for c in CONVENTIONS}
NAMES = tuple(BY_NAME)
DEFAULT = "raw"


def check_counts(name) -> str:
    """``name`` if it names a count convention, else ValueError naming the valid set."""
    if not isinstance(name, str) or name not in BY_NAME:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise ValueError(f"unknown count convention {shown}; choose one of {', '.join(NAMES)}")
    return name


def convert(name: str, x, n):
    """The converted count of ``x`` in a window of size ``n``, in their own arithmetic.

    ``x`` and ``n`` are NumPy arrays or torch tensors of the measure's float dtype (or broadcast
    against one): the integer constants of the formula stay weak scalars in both libraries, so
    float32 stays float32 and each step is one IEEE operation."""
    return _FUNCTIONS[check_counts(name)](x, n)


def affine(name: str) -> tuple[int, int, int]:
    """``(p, q, r)`` with the convention equal to ``(x + p) / (n * q + r)``, operation for operation in
    IEEE arithmetic: generated kernels take the three as run-time numbers, so one compiled kernel
    serves every convention. Each extra step is exact (``x + 0``, ``n * 1``, ``n * 0 + 1``, ``x / 1``)
    and the one rounding is the formula's own division. ValueError for a formula of another shape."""
    tree = ast.parse(BY_NAME[check_counts(name)].formula, mode="eval").body

    def shifted(node, var):  # var, or var + k: k
        if isinstance(node, ast.Name) and node.id == var:
            return 0
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Name) \
                and node.left.id == var and isinstance(node.right, ast.Constant) and type(node.right.value) is int:
            return node.right.value
        return None

    if shifted(tree, "x") is not None:
        return shifted(tree, "x"), 0, 1
    if isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.Div):
        p, r = shifted(tree.left, "x"), shifted(tree.right, "n")
        if p is not None and r is not None:
            return p, 1, r
    raise ValueError(f"count convention {name!r}: {BY_NAME[name].formula!r} is not (x + p) / (n + r); "
                     "the generated kernels take only that shape as run-time numbers")
