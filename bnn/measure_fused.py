"""The measure's forward and backward as one Numba pass each, for float32 CPU training (issue 29 item 3).

Eager torch evaluates a measure as one pass over memory per operator, forward and backward: M5's
``(b - erf(c)) / (a**3 + exp(-d**2))`` is a dozen full-size passes and temporaries per layer.
``use_fused_measure(model)`` routes every binary layer's measure, when its counts are float32 CPU
tensors and nothing is being compiled, through two generated Numba kernels per genome: the forward
reads the four counts once and writes the measure; the backward recomputes the forward per
element and runs reverse-mode differentiation over the same expression, writing the gradients of
the counts (None for a count the measure ignores) and per-channel sums for alpha.

The reverse pass applies, node by node, the formulas torch's autograd uses for each operation
(``tools/autograd/derivatives.yaml``: ``pow``: ``grad * (k * x**(k-1))``, ``div``: ``grad / y``
and ``-grad * x / (y * y)``, ``atan``: ``grad / (x*x + 1)``, ``maximum`` splits a tie in halves,
...), in float32, and powers by 2 and 3 as torch computes them (``x*x``, ``x*x*x``). The values are
not bit-identical to eager torch: the transcendental functions are glibc's scalar ones (as
``refimpl.measure``'s), not torch's SLEEF vectors, and alpha's per-channel sums add in another
order (tests/test_measure_fused.py checks forward and gradients against eager torch and autograd).
Raw counts (the default convention) are integers in ``[0, n]``, so, as in the engine
(refimpl/codegen/measure_tables.py), the subtrees that read one count and no alpha (``a**3``,
``erf(c)``, ``exp(-d**2)``) and their derivatives come from tables built once per window size:
glibc's scalar calls per element were slower than torch's vectorized ones (M5 fused untabled:
1.56x the baseline's step against 1.19x eager; docs/performance.md). Opt-in
(``use_fused_measure``): the default path stays eager torch, whose values these are not to the bit.
"""
from __future__ import annotations

import ast
import math
import types

import numba
import torch

from refimpl.codegen.epilogue_template import sources_stamp
from refimpl.codegen.measure_tables import split
from refimpl.engine.epilogue import _make_module
from refimpl.genome import Genome

from .layers import _BinaryMeasureLayer

_COUNTS = ("a", "b", "c", "d")
_ALPHAS = ("al0", "al1", "al2", "al3")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_CALLS = {"exp": "math.exp", "log": "math.log", "sqrt": "math.sqrt", "sin": "math.sin", "cos": "math.cos",
          "tan": "math.tan", "atan": "math.atan", "erf": "math.erf", "erfc": "math.erfc", "abs": "abs",
          "max": "nan_max", "min": "nan_min"}
_TWO_OVER_SQRT_PI = repr(2.0 / math.sqrt(math.pi))


class _Program:
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
                add(x, _CALL_GRADIENT[kind](g, x, y, name))
                if kind in ("max", "min"):
                    add(y, _CALL_GRADIENT[kind + "_y"](g, x, y, name))
        return lines, self.deps[self.root] if self.root in self.deps else set()


_CALL_GRADIENT = {
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


def _table_builder(found) -> list[str]:
    # build(out, dout): each one-count subtree k and its derivative at every count x (raw counts).
    lines = ["", "", "@jit", "def build(out, dout):", "    for x in range(out.shape[1]):", "        X = F(x)"]
    for k, (count, node) in enumerate(found):
        sub = _Program(node, prefix=f"t{k}_")
        reverse, _ = sub.reverse()
        lines += [f"        {count} = X", *[f"        {line}" for line in sub.lines],
                  f"        out[{k}, x] = {sub.root}", f"        G_{sub.root} = F(1.0)",
                  *[f"        {line}" for line in reverse], f"        dout[{k}, x] = G_{count}"]
    return lines + (["        pass"] if not found else [])


def generate(genome, tabled: bool = False) -> str:
    """The Numba module of ``genome``'s fused forward and backward; ``tabled``: for raw (integer)
    counts, the one-count subtrees (``a**3``, ``erf(c)``...) and their derivatives looked up in
    tables that ``build`` fills once per window size (refimpl/codegen/measure_tables.py)."""
    g = Genome.parse(genome)
    tree = ast.parse(ast.unparse(g.expression(list(_ALPHAS))), mode="eval").body
    found = split(tree)[1] if tabled else []
    if tabled:
        tree = split(tree)[0]
    prog = _Program(tree)
    reverse, used = prog.reverse()
    looked = [k for k in range(len(found)) if f"T{k}" in used]
    counts_used = {v for v in _COUNTS if v in used} | {found[k][0] for k in looked}
    load = [f"{v} = c{v}[i, o, s]" for v in _COUNTS] + [f"{al} = alpha[{k}, o]" for k, al in enumerate(_ALPHAS)]
    # 31-bit unsigned indices: 16-lane dword gathers (refimpl/codegen/epilogue_template.py's reason)
    load += [line for k in looked for line in (f"I{k} = np.uint32({found[k][0]}) & INDEX_MASK", f"T{k} = tab[{k}, I{k}]")]
    chain, have = [], {v for v in _COUNTS if v in used}
    for k in looked:
        count = found[k][0]
        term = f"G_T{k} * dtab[{k}, I{k}]"
        chain.append(f"G_{count} = G_{count} + {term}" if count in have else f"G_{count} = {term}")
        have.add(count)
    root = prog.root if prog.root in {n for n, _, _ in prog.nodes} else f"F(0.0) + {prog.root}"
    head = [
        f'"""GENERATED by bnn/measure_fused.py for genome {g}{", tabled" if tabled else ""}: do not edit.',
        "",
        f"measure = {g.formula()}",
        '"""',
        "import math",
        "",
        "import numpy as np",
        "from numba import prange",
        "",
        "from refimpl._jit import jit",
        "from refimpl._numba_ops import nan_max, nan_min",
        f"# refimpl sources {sources_stamp()}",
        "",
        "F = np.float32",
        f"USED = {tuple(sorted(counts_used | (used & set(_ALPHAS))))!r}  # the counts and alphas the measure reads",
        f"N_TABLES = {len(found)}",
        "INDEX_MASK = np.uint32(0x7FFFFFFF)",
        *_table_builder(found),
        "",
        "",
        "@jit(parallel=True, loop_vectorize=True, noalias=True)",
        "def forward(ca, cb, cc, cd, alpha, tab, out):",
        "    n_img, channels, size = ca.shape",
        "    for r in prange(n_img * channels):",
        "        i = r // channels",
        "        o = r - i * channels",
        "        for s in range(size):",
        *[f"            {line}" for line in load + prog.lines],
        f"            out[i, o, s] = {root}",
    ]
    grads = [f"            g{v}[i, o, s] = G_{v}" for v in _COUNTS if v in counts_used]
    sums = [f"            acc{k} += G_{al}" for k, al in enumerate(_ALPHAS) if al in used]
    body = [
        "",
        "",
        "@jit(parallel=True, loop_vectorize=True, noalias=True)",
        "def backward(grad, ca, cb, cc, cd, alpha, tab, dtab, ga, gb, gc, gd, galpha):",
        "    # galpha (N*C, 4): each row's sum of the alpha gradients, added up per channel by the caller.",
        "    n_img, channels, size = ca.shape",
        "    for r in prange(n_img * channels):",
        "        i = r // channels",
        "        o = r - i * channels",
        *[f"        acc{k} = F(0.0)" for k in range(4)],
        "        for s in range(size):",
        *[f"            {line}" for line in load + prog.lines],
        f"            G_{prog.root} = grad[i, o, s]",
        *[f"            {line}" for line in reverse + chain],
        *grads,
        *sums,
        *[f"        galpha[r, {k}] = acc{k}" for k in range(4)],
    ]
    return "\n".join(head + body) + "\n"


_MODULES: dict[tuple, types.ModuleType] = {}
_TABLES: dict[tuple, tuple] = {}


def module(genome, tabled: bool = False):
    """The compiled module of ``genome`` (generated into the engine's epilogue cache folder)."""
    g = Genome.parse(genome)
    key = (str(g), tabled)
    if key not in _MODULES:
        import hashlib

        text = generate(g, tabled)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        kind = "_tabled" if tabled else ""
        _MODULES[key] = _make_module(f"bnn_measure_fused_{key[0].replace('-', '_')}{kind}_{digest}", text)
    return _MODULES[key]


def tables(mod, n_max: int) -> tuple:
    """(values, derivatives) (K, n_max + 1) float32 of ``mod``'s one-count subtrees at the counts
    0 .. n_max, built once per module and window size."""
    key = (mod.__name__, n_max)
    if key not in _TABLES:
        out, dout = (torch.empty((max(1, mod.N_TABLES), n_max + 1), dtype=torch.float32) for _ in range(2))
        mod.build(out.numpy(), dout.numpy())
        _TABLES[key] = (out, dout)
    return _TABLES[key]


class _FusedMeasure(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mod, tabs, a, b, c, d, alpha):
        n, ch = a.shape[0], a.shape[1]
        views = [t.detach().contiguous().view(n, ch, -1) for t in (a, b, c, d)]
        al = alpha.detach().contiguous()
        out = torch.empty_like(views[0])
        _threads()
        mod.forward(*(v.numpy() for v in views), al.numpy(), tabs[0].numpy(), out.numpy())
        ctx.mod, ctx.tabs, ctx.shape = mod, tabs, a.shape
        ctx.save_for_backward(*views, al)
        return out.view(a.shape)

    @staticmethod
    def backward(ctx, grad):
        mod = ctx.mod
        views = ctx.saved_tensors[:4]
        al = ctx.saved_tensors[4]
        n, ch = views[0].shape[:2]
        g = grad.contiguous().view(views[0].shape)
        outs = [torch.empty_like(views[0]) if v in mod.USED else _NONE for v in _COUNTS]
        galpha = torch.empty((n * ch, 4), dtype=torch.float32)
        _threads()
        mod.backward(g.numpy(), *(v.numpy() for v in views), al.numpy(), ctx.tabs[0].numpy(), ctx.tabs[1].numpy(),
                     *(o.numpy() for o in outs), galpha.numpy())
        counts = [o.view(ctx.shape) if v in mod.USED else None for o, v in zip(outs, _COUNTS)]
        alpha_grad = galpha.view(n, ch, 4).sum(0).t().contiguous() if set(_ALPHAS) & set(mod.USED) else None
        return (None, None, *counts, alpha_grad)


def apply(genome, a, b, c, d, alpha, n_max: int | None = None):
    """The fused measure of counts a..d (float32 CPU, (N, C, ...)); ``n_max``: the largest window
    size, given only for raw counts (integers in [0, n_max]), which then take the tabled kernels."""
    mod = module(genome, tabled=n_max is not None)
    tabs = tables(mod, n_max if n_max is not None else 0)
    return _FusedMeasure.apply(mod, tabs, a, b, c, d, alpha)


_NONE = torch.empty((1, 1, 1), dtype=torch.float32)


def _threads():
    # Numba's pool as wide as torch's, so the two do not oversubscribe the cores.
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))


def fused_applies(a, alpha) -> bool:
    """Whether the fused kernels take these counts: float32 CPU tensors of (N, C, ...), not inside
    ``torch.compile`` (which traces the eager formula instead)."""
    return (a.dtype == torch.float32 and a.device.type == "cpu" and a.dim() >= 2 and alpha.dtype == torch.float32
            and not torch.compiler.is_compiling())


def _fused_measure(self, a, b, c, d):
    # Replaces _BinaryMeasureLayer._measure on one instance (the counts arrive converted).
    if fused_applies(a, self.alpha):
        # raw counts are integers in [0, n] with n at most a window's size (C*KH*KW, or the inputs)
        n_max = self.weight[0].numel() if self.counts == "raw" else None
        return apply(self.genome, a, b, c, d, self.alpha, n_max)
    return type(self)._measure(self, a, b, c, d)


def use_fused_measure(model: torch.nn.Module) -> torch.nn.Module:
    """Route every binary layer of ``model`` through the fused kernels where they apply (in place;
    returns ``model``)."""
    for layer in model.modules():
        if isinstance(layer, _BinaryMeasureLayer):
            layer._measure = types.MethodType(_fused_measure, layer)
    return model
