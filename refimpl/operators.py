"""The operator table: the single source of truth for every measure in the project.

Each row's ``formula`` is the formula text of docs/design.md section 2 and, at the same time, a Python expression
over ``x`` (and ``y`` for binary operators, ``alpha`` for the learnable ones) using only the
function names in ``FUNCTIONS``. Both evaluators are derived from it:

* the Numba evaluator (``refimpl/_numba_ops.py``) is generated from these expressions by
  ``python -m refimpl.codegen`` and a test fails when the generated file is stale;
* the torch evaluator (``bnn/nn/measure.py``) evaluates the same expressions with torch functions.

The tests iterate these tuples, so a row added here is covered in both paths or the suite fails.
"""
from __future__ import annotations

from dataclasses import dataclass

# Function names a formula may call. Each backend binds every one of them.
# ``max``/``min`` propagate NaN in both paths (torch.maximum / np.maximum semantics).
FUNCTIONS = ("exp", "log", "sqrt", "sin", "cos", "tan", "atan", "erf", "erfc", "abs", "max", "min")


@dataclass(frozen=True)
class Operator:
    """One operator of the table: its code, name, formula text, arity and initial alpha."""
    code: int
    name: str  # identifier-safe, used for test ids and registries
    formula: str  # docs/design.md section 2's text; a Python expression over x[, y][, alpha]
    arity: int  # 1 or 2
    alpha_init: float | None = None  # initial value of the per-channel alpha, None if unused

    @property
    def uses_alpha(self) -> bool:
        """Whether the operator reads a learnable per-channel alpha."""
        return self.alpha_init is not None


def _unary(code: int, name: str, formula: str, alpha_init: float | None = None) -> Operator:
    return Operator(code, name, formula, 1, alpha_init)


def _binary(code: int, name: str, formula: str) -> Operator:
    return Operator(code, name, formula, 2)


UNARY: tuple[Operator, ...] = (
    _unary(0, "identity", "x"),
    _unary(1, "zero", "0"),
    _unary(2, "square", "x**2"),
    _unary(3, "cube", "x**3"),
    _unary(4, "sqrt", "sqrt(x)"),
    _unary(5, "log", "log(x)"),
    _unary(6, "sin", "sin(x)"),
    _unary(7, "cos", "cos(x)"),
    _unary(8, "sigmoid", "1/(1+exp(-x))"),
    _unary(9, "tan", "tan(x)"),
    _unary(10, "atan", "atan(x)"),
    _unary(11, "erf", "erf(x)"),
    _unary(12, "erfc", "erfc(x)"),
    _unary(13, "exp_neg", "exp(-x)"),
    _unary(14, "gauss", "exp(-x**2)"),
    _unary(15, "alpha", "alpha", alpha_init=1.0),
    _unary(16, "alpha_mul", "alpha*x", alpha_init=1.0),
    _unary(17, "alpha_add", "alpha+x", alpha_init=0.0),
)

BINARY: tuple[Operator, ...] = (
    _binary(0, "add", "x+y"),
    _binary(1, "sub", "x-y"),
    _binary(2, "rsub", "y-x"),
    _binary(3, "mul", "x*y"),
    _binary(4, "div", "x/y"),
    _binary(5, "left_share", "x/(x+y)"),
    _binary(6, "rdiv", "y/x"),
    _binary(7, "right_share", "y/(x+y)"),
    _binary(8, "max", "max(x,y)"),
    _binary(9, "min", "min(x,y)"),
    _binary(10, "x_gate_y", "x/(1+exp(-y))"),
    _binary(11, "y_gate_x", "y/(1+exp(-x))"),
    _binary(12, "laplace", "exp(-abs(x-y))"),
    _binary(13, "gauss_diff", "exp(-(x-y)**2)"),
)

N_UNARY = len(UNARY)
N_BINARY = len(BINARY)

# Genome slot layout (docs/design.md section 2): unary slots feed on these counts, in this order.
UNARY_SLOT_INPUTS = ("a", "d", "b", "c")


def _check_table() -> None:
    for table, arity in ((UNARY, 1), (BINARY, 2)):
        for i, op in enumerate(table):
            if op.code != i or op.arity != arity:
                raise AssertionError(f"operator table row {i} is out of order: {op}")


_check_table()
