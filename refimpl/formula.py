"""Formula expressions of the operator table: parsing, substitution and printing.

The table's formulas are Python expressions; this module turns them into ``ast`` trees so that
the genome can print itself in a, b, c, d and the code generator can emit Numba source.
"""
from __future__ import annotations

import ast

from .operators import FUNCTIONS

_VARIABLES = {"x", "y", "alpha"}


def parse(formula: str) -> ast.expr:
    """Parse one table formula, rejecting any name the backends do not bind."""
    tree = ast.parse(formula, mode="eval").body
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in _VARIABLES | set(FUNCTIONS):
            raise ValueError(f"formula {formula!r} uses unknown name {node.id!r}")
    return tree


def substitute(tree: ast.expr, bindings: dict[str, ast.expr]) -> ast.expr:
    """Return a copy of ``tree`` with variable names replaced by expressions."""

    class _Sub(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            return bindings.get(node.id, node)

    return _Sub().visit(ast.parse(ast.unparse(tree), mode="eval").body)


# Printing: '**' binds tight and is written without spaces, the arithmetic operators with one
# space each side, so M1 reads "(b**3 - c) / (a**3 + d)".
_PRECEDENCE = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2, ast.Pow: 4}
_SYMBOL = {ast.Add: " + ", ast.Sub: " - ", ast.Mult: " * ", ast.Div: " / ", ast.Pow: "**"}
_ATOM = 5
_UNARY_MINUS = 3


def _precedence(node: ast.expr) -> int:
    if isinstance(node, ast.BinOp):
        return _PRECEDENCE[type(node.op)]
    if isinstance(node, ast.UnaryOp):
        return _UNARY_MINUS
    return _ATOM


def render(node: ast.expr) -> str:
    """Print an expression with the fewest parentheses that keep its meaning."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Constant):
        return repr(node.value)
    if isinstance(node, ast.Call):
        return f"{node.func.id}({', '.join(render(a) for a in node.args)})"
    if isinstance(node, ast.UnaryOp):
        inner = render(node.operand)
        if _precedence(node.operand) < _UNARY_MINUS:
            inner = f"({inner})"
        return f"-{inner}"
    if isinstance(node, ast.BinOp):
        p = _precedence(node)
        right_assoc = isinstance(node.op, ast.Pow)
        left, right = render(node.left), render(node.right)
        # Left-associative: the right operand needs parentheses at equal precedence
        # (a - (b - c)); right-associative '**' needs them on the left.
        if _precedence(node.left) < p or (right_assoc and _precedence(node.left) == p):
            left = f"({left})"
        if _precedence(node.right) < p or (not right_assoc and _precedence(node.right) == p):
            right = f"({right})"
        return f"{left}{_SYMBOL[type(node.op)]}{right}"
    raise TypeError(f"cannot render {ast.dump(node)}")
