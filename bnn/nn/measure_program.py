"""The measure as straight-line Numba statements, forward and reverse: what the fused training
kernels inline (``bnn/nn/measure_fused.py`` per genome, ``bnn/nn/measure_generic.py`` per operator).

``Program`` turns an expression of the operator table's formulas into one statement per node and
its reverse pass, node by node with the formulas torch's autograd uses for each operation
(``tools/autograd/derivatives.yaml``: ``pow``: ``grad * (k * x**(k-1))``, ``div``: ``grad / y`` and
``-grad * x / (y * y)``, ``atan``: ``grad / (x*x + 1)``, ``maximum`` splits a tie in halves...), in
float32, powers by 2 and 3 as torch computes them (``x*x``, ``x*x*x``).
"""
from __future__ import annotations

import ast
import math

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_CALLS = {"exp": "math.exp", "log": "math.log", "sqrt": "math.sqrt", "sin": "math.sin", "cos": "math.cos",
          "tan": "math.tan", "atan": "math.atan", "erf": "math.erf", "erfc": "math.erfc", "abs": "abs",
          "max": "nan_max", "min": "nan_min"}
_TWO_OVER_SQRT_PI = repr(2.0 / math.sqrt(math.pi))


class Program:
    """The measure as straight-line code: one statement per node, and its reverse pass."""

    def __init__(self, tree: ast.expr, prefix: str = "v"):
        self.prefix = prefix
        self.lines: list[str] = []  # forward statements
        self.deps: dict[str, set] = {}  # value name -> the variables it depends on
        self.nodes: list[tuple] = []  # (value, kind, operands) in evaluation order
        self.root = self._emit(tree)

    def _value(self, kind, operands, text) -> str:
        name = f"{self.prefix}{len(self.nodes)}"
        self.lines.append(f"{name} = {text}")
        self.nodes.append((name, kind, operands))
        self.deps[name] = set().union(*(self.deps.get(x, set()) for x in operands if isinstance(x, str)))
        return name

    def _emit(self, node) -> str:
        if isinstance(node, ast.Name):
            self.deps.setdefault(node.id, {node.id})
            return node.id
        if isinstance(node, ast.Constant):
            return f"F({float(node.value)!r})"
        if isinstance(node, ast.UnaryOp):  # USub only, in the table
            x = self._emit(node.operand)
            return self._value("neg", (x,), f"-{x}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            x, k = self._emit(node.left), float(node.right.value)
            # torch's pow by 2 and 3 is x*x and x*x*x (bit for bit); glibc's powf is a slow call
            text = {2.0: f"{x} * {x}", 3.0: f"{x} * {x} * {x}"}.get(k, f"{x} ** F({k!r})")
            return self._value("pow", (x, k), text)
        if isinstance(node, ast.BinOp):
            x, y = self._emit(node.left), self._emit(node.right)
            return self._value(type(node.op).__name__, (x, y), f"{x} {_OPS[type(node.op)]} {y}")
        name = node.func.id
        args = [self._emit(a) for a in node.args]
        return self._value(name, tuple(args), f"{_CALLS[name]}({', '.join(args)})")

    def reverse(self) -> tuple[list[str], set]:
        """(statements that set ``G_<name>`` for every variable the measure depends on, given
        ``G_<root>``, and that set of variables)."""
        lines, have = [], {self.root}

        def add(target, text):
            if target not in self.deps or not self.deps[target]:
                return  # a constant subtree: no gradient
            lines.append(f"G_{target} = G_{target} + ({text})" if target in have else f"G_{target} = {text}")
            have.add(target)

        for name, kind, ops in reversed(self.nodes):
            if name not in have:
                continue
            g = f"G_{name}"
            x = ops[0]
            y = ops[1] if len(ops) > 1 else None
            if kind == "Add":
                add(x, g)
                add(y, g)
            elif kind == "Sub":
                add(x, g)
                add(y, f"-{g}")
            elif kind == "Mult":
                add(x, f"{g} * {y}")
                add(y, f"{g} * {x}")
            elif kind == "Div":
                add(x, f"{g} / {y}")
                add(y, f"-{g} * {x} / ({y} * {y})")
            elif kind == "pow":
                add(x, f"{g} * (F({y!r}) * {x} ** F({y - 1.0!r}))")
            elif kind == "neg":
                add(x, f"-{g}")
            else:
                add(x, CALL_GRADIENT[kind](g, x, y, name))
                if kind in ("max", "min"):
                    add(y, CALL_GRADIENT[kind + "_y"](g, x, y, name))
        return lines, self.deps[self.root] if self.root in self.deps else set()


CALL_GRADIENT = {
    "exp": lambda g, x, y, v: f"{g} * {v}",
    "log": lambda g, x, y, v: f"{g} / {x}",
    "sqrt": lambda g, x, y, v: f"{g} / (F(2.0) * {v})",
    "sin": lambda g, x, y, v: f"{g} * math.cos({x})",
    "cos": lambda g, x, y, v: f"{g} * -math.sin({x})",
    "tan": lambda g, x, y, v: f"{g} * (F(1.0) + {v} * {v})",
    "atan": lambda g, x, y, v: f"{g} / ({x} * {x} + F(1.0))",
    "erf": lambda g, x, y, v: f"F({_TWO_OVER_SQRT_PI}) * math.exp(-({x} * {x})) * {g}",
    "erfc": lambda g, x, y, v: f"-F({_TWO_OVER_SQRT_PI}) * math.exp(-({x} * {x})) * {g}",
    "abs": lambda g, x, y, v: f"{g} * np.sign({x})",
    "max": lambda g, x, y, v: f"F(0.0) if {x} < {y} else ({g} / F(2.0) if {x} == {y} else {g})",
    "max_y": lambda g, x, y, v: f"F(0.0) if {x} > {y} else ({g} / F(2.0) if {x} == {y} else {g})",
    "min": lambda g, x, y, v: f"F(0.0) if {x} > {y} else ({g} / F(2.0) if {x} == {y} else {g})",
    "min_y": lambda g, x, y, v: f"F(0.0) if {x} < {y} else ({g} / F(2.0) if {x} == {y} else {g})",
}
