"""The measure's forward and backward as one Numba pass each: float32 CPU training's default (issue 29 item 3).

Eager torch evaluates a measure as one pass over memory per operator, forward and backward: M5's
``(b - erf(c)) / (a**3 + exp(-d**2))`` is a dozen full-size passes and temporaries per layer, and
a count convention's conversion two more per count. With ``set_measure_impl(model, "fused")``
(``bnn.train``'s ``--measure-impl fused``, the default of ``TrainConfig``) every binary layer whose
counts are float32 CPU tensors, outside ``torch.compile``, runs two generated Numba kernels per
genome instead: the forward reads the four counts as counted once, converts them (every
convention of ``refimpl/conventions.py`` is ``(x + p) / (n * q + r)``, its ``affine`` numbers
taken at run time, so one compiled module serves all three; each step is exact but the formula's
one IEEE division, so the converted counts are eager torch's to the bit) and writes the measure;
the backward recomputes
the forward per element and runs reverse-mode differentiation over the same expression, then
``--measure-grad-clip`` (NaN to 0, clamp) and the conversion's backward, writing the gradients
of the counts (None for a count the measure ignores) and per-channel sums for alpha.

The reverse pass applies, node by node, the formulas torch's autograd uses for each operation
(``tools/autograd/derivatives.yaml``: ``pow``: ``grad * (k * x**(k-1))``, ``div``: ``grad / y``
and ``-grad * x / (y * y)``, ``atan``: ``grad / (x*x + 1)``, ``maximum`` splits a tie in halves,
...), in float32, and powers by 2 and 3 as torch computes them (``x*x``, ``x*x*x``). The values are
not bit-identical to eager torch: the transcendental functions are glibc's scalar ones (as
``refimpl.measure``'s), not torch's SLEEF vectors, and sums add in another order
(tests/test_measure_fused.py checks forward and gradients against eager torch and autograd).
The counts are integers in ``[0, n]``, so, as in the engine (refimpl/codegen/measure_tables.py),
the subtrees that read one count and no alpha (``a**3``, ``erf(c)``, ``exp(-d**2)``) and their
derivatives by the converted count come from tables, built once per layer geometry with the
very statements the untabled kernels run: one row per window size under freq and laplace (the
converted count depends on ``n``, smaller at border pixels), one row under raw. glibc's scalar
calls per element were slower than torch's vectorized ones (M5 fused untabled: 1.56x the
baseline's step against 1.19x eager; docs/performance.md).

Compile time: each kernel is a serial task over a range of (image, channel) rows, run in parallel
by refimpl's ``run_tasks``, the engine's own scheme (refimpl/engine/task_call.py): a Numba
parallel loop per genome compiled 2.5x longer than the serial task, and with one module per
genome and convention these compiles were most of the test suite's cold time (docs/performance.md).
"""
from __future__ import annotations

import ast
import math
import threading
import types

import numba
import numpy as np
import torch

from refimpl.codegen.epilogue_template import measure_module_imports
from refimpl.codegen.measure_tables import split
from refimpl.conventions import DEFAULT as DEFAULT_COUNTS
from refimpl.conventions import affine, check_counts
from refimpl.engine.epilogue import compile_module, convention_vector
from refimpl.engine.task_call import run_tasks, task_address
from refimpl.genome import Genome

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


# Every convention is (x + p) / (n * q + r) (refimpl.conventions.affine): the converted tasks take
# p, q, r as run-time numbers CP, CQ, CR, so one compiled task serves freq and laplace (compiles were
# the suite's cold time: docs/performance.md); DEN = N * CQ + CR per pixel, every step but the
# division exact. Raw counts have tasks of their own without the conversion: its divisions per count
# made raw training's measure 25-50% slower (docs/performance.md).
_DENOMINATOR = "DEN = N * CQ + CR"
_CONSTANTS = ["CP = cv[0]", "CQ = cv[1]", "CR = cv[2]"]
VARIANTS = ("raw", "converted")


def _conversion(count: str, raw: bool = False) -> tuple[list[str], list[str]]:
    """(forward statement that sets ``count`` from the raw count ``x_<count>`` and ``DEN``, reverse
    statement that sets ``G_x_<count>`` from ``G_<count>``): the convention's own operations, and the
    reverse as autograd takes it (``x / n``: ``grad / n``; ``(x + 1) / (n + 4)``: ``grad / (n + 4)``;
    ``raw``: the count and its gradient as they are)."""
    if raw:
        return [f"{count} = x_{count}"], [f"G_x_{count} = G_{count}"]
    return [f"{count} = (x_{count} + CP) / DEN"], [f"G_x_{count} = G_{count} / DEN"]


def _table_builder(found) -> list[str]:
    # build(ns, cv, out, dout): each one-count subtree k and its derivative (by the converted count) at
    # every integer count x of a window of size ns[r]: out[k, r, x], dout[k, r, x].
    lines = ["", "", "@jit", "def build(ns, cv, out, dout):", *[f"    {line}" for line in _CONSTANTS],
             "    for r in range(out.shape[1]):", "        N = F(ns[r])", f"        {_DENOMINATOR}",
             "        for x in range(out.shape[2]):"]
    for k, (count, node) in enumerate(found):
        sub = _Program(node, prefix=f"t{k}_")
        reverse, _ = sub.reverse()
        convert, _ = _conversion(count)
        lines += [f"            x_{count} = F(x)", *[f"            {line}" for line in convert],
                  *[f"            {line}" for line in sub.lines],
                  f"            out[{k}, r, x] = {sub.root}", f"            G_{sub.root} = F(1.0)",
                  *[f"            {line}" for line in reverse], f"            dout[{k}, r, x] = G_{count}"]
    return lines + (["            pass"] if not found else [])


def _per_element(used: set, found: list, raw: bool) -> dict:
    """The kernels' statements per element around the measure's own: loads, table lookups and the
    conversion (``load_forward``, ``load_backward``), the tables' derivatives (``chain``), the clip
    and the conversion's reverse (``to_raw``); ``counts_used``: the counts the measure reads."""
    looked = [k for k in range(len(found)) if f"T{k}" in used]
    direct = [v for v in _COUNTS if v in used]  # counts the measure reads as values, not through a table
    counts_used = set(direct) | {found[k][0] for k in looked}
    # Each pixel's window size N and its table row's offset ROW (one row per distinct size; raw: one row).
    load = [] if raw else ["N = nsize[s]", _DENOMINATOR, *(["ROW = rows[s]"] if looked else [])]
    load += [f"x_{v} = c{v}[i, o, s]" for v in _COUNTS if v in counts_used]
    load += [f"{al} = alpha[{k}, o]" for k, al in enumerate(_ALPHAS)]
    # 31-bit unsigned indices: 16-lane dword gathers (refimpl/codegen/epilogue_template.py's reason)
    index = "I{k}" if raw else "ROW + I{k}"
    load += [line for k in looked for line in (f"I{k} = np.uint32(x_{found[k][0]}) & INDEX_MASK",
                                               f"T{k} = tab[{k}, {index.format(k=k)}]")]
    # The converted counts: the forward needs those it reads as values, the backward every one whose
    # conversion it differentiates.
    load_forward = load + [line for v in direct for line in _conversion(v, raw)[0]]
    load_backward = load + [line for v in _COUNTS if v in counts_used for line in _conversion(v, raw)[0]]
    chain, have = [], set(direct)
    for k in looked:
        count = found[k][0]
        term = f"G_T{k} * dtab[{k}, {index.format(k=k)}]"
        chain.append(f"G_{count} = G_{count} + {term}" if count in have else f"G_{count} = {term}")
        have.add(count)
    # bnn.train --measure-grad-clip: NaN -> 0, then clamped to [-LIMIT, LIMIT] (as layers.clip_measure_grad).
    clip = [f"G_{v} = (F(0.0) if G_{v} != G_{v} else min(max(G_{v}, -limit), limit)) if clip else G_{v}"
            for v in _COUNTS if v in counts_used]
    to_raw = [line for v in _COUNTS if v in counts_used for line in _conversion(v, raw)[1]]
    return {"counts_used": counts_used, "load_forward": load_forward, "load_backward": load_backward,
            "chain": chain, "clip": clip, "to_raw": to_raw}


def generate(genome, tabled: bool = False) -> str:
    """The Numba module of ``genome``'s fused forward and backward on counts as counted, converted
    in the kernels by the convention whose ``affine`` numbers they take (``cv``, float32 (3,));
    ``tabled``: the one-count subtrees (``a**3``, ``erf(c)``...) and their derivatives looked up by
    the integer count in tables that ``build`` fills once per window size and convention
    (refimpl/codegen/measure_tables.py), so the counts must be integers."""
    g = Genome.parse(genome)
    tree = ast.parse(ast.unparse(g.expression(list(_ALPHAS))), mode="eval").body
    found = split(tree)[1] if tabled else []
    if tabled:
        tree = split(tree)[0]
    prog = _Program(tree)
    reverse, used = prog.reverse()
    counts_used = _per_element(used, found, True)["counts_used"]
    root = prog.root if prog.root in {n for n, _, _ in prog.nodes} else f"F(0.0) + {prog.root}"
    head = [
        f'"""GENERATED by bnn/nn/measure_fused.py for genome {g}{", tabled" if tabled else ""}, every count convention: do not edit.',
        "",
        f"measure = {g.formula()}",
        '"""',
        *measure_module_imports(),
        "",
        "F = np.float32",
        f"USED = {tuple(sorted(counts_used | (used & set(_ALPHAS))))!r}  # the counts and alphas the measure reads",
        f"N_TABLES = {len(found)}",
        "INDEX_MASK = np.uint32(0x7FFFFFFF)",
        *_table_builder(found),
    ]
    body = []
    for variant in VARIANTS:
        raw = variant == "raw"
        st = _per_element(used, found, raw)
        constants = [] if raw else [f"    {line}" for line in _CONSTANTS]
        grads = [f"            g{v}[i, o, s] = G_x_{v}" for v in _COUNTS if v in counts_used]
        sums = [f"            acc{k} += G_{al}" for k, al in enumerate(_ALPHAS) if al in used]
        body += [
            "",
            "",
            "@jit(loop_vectorize=True, noalias=True, no_cpython_wrapper=True)  # called by run_tasks only",
            f"def forward_{variant}_task(first, last, ca, cb, cc, cd, nsize, rows, cv, alpha, tab, out):",
            "    # Rows first .. last-1 of (image, channel). c* (N, C, S) the counts as counted; nsize (S,) float32",
            "    # the window sizes; rows (S,) uint32 the table rows' offsets into tab (K, R * L); cv (3,) float32",
            f"    # the convention's p, q, r{' (unused: raw counts)' if raw else ''}.",
            "    n_img, channels, size = ca.shape",
            *constants,
            "    for r in range(first, last):",
            "        i = r // channels",
            "        o = r - i * channels",
            "        for s in range(size):",
            *[f"            {line}" for line in st["load_forward"] + prog.lines],
            f"            out[i, o, s] = {root}",
            "",
            "",
            "@jit(loop_vectorize=True, noalias=True, no_cpython_wrapper=True)  # called by run_tasks only",
            f"def backward_{variant}_task(first, last, grad, ca, cb, cc, cd, nsize, rows, cv, alpha, tab, dtab, clip,",
            f"{' ' * len(f'def backward_{variant}_task(')}limit, ga, gb, gc, gd, galpha):",
            "    # g* the counts' gradients; galpha (N*C, 4): each row's sum of the alpha gradients, added up",
            "    # per channel by the caller; clip (bool) and limit (float32): --measure-grad-clip.",
            "    n_img, channels, size = ca.shape",
            *constants,
            "    for r in range(first, last):",
            "        i = r // channels",
            "        o = r - i * channels",
            *[f"        acc{k} = F(0.0)" for k in range(4)],
            "        for s in range(size):",
            *[f"            {line}" for line in st["load_backward"] + prog.lines],
            f"            G_{prog.root} = grad[i, o, s]",
            *[f"            {line}" for line in reverse + st["chain"] + st["clip"] + st["to_raw"]],
            *grads,
            *sums,
            *[f"        galpha[r, {k}] = acc{k}" for k in range(4)],
        ]
    return "\n".join(head + body) + "\n"


_MODULES: dict[tuple, types.ModuleType] = {}
_GEOMETRY: dict[tuple, tuple] = {}
# The tasks' one signature each (refimpl.engine.task_call: an address is only valid for the types it
# was compiled for, and further compiles are disabled, so other types raise).
_C3 = "float32[:, :, ::1]"
_SIGNATURES = {
    "forward": f"void(i8, i8, {_C3}, {_C3}, {_C3}, {_C3}, float32[::1], uint32[::1], float32[::1], float32[:, ::1], "
               f"float32[:, ::1], {_C3})",
    "backward": f"void(i8, i8, {_C3}, {_C3}, {_C3}, {_C3}, {_C3}, float32[::1], uint32[::1], float32[::1], "
                f"float32[:, ::1], float32[:, ::1], float32[:, ::1], boolean, float32, {_C3}, {_C3}, {_C3}, {_C3}, "
                "float32[:, ::1])",
}
# Runs of rows per thread: a few, so that a thread that finishes early takes another.
_PARTS_PER_THREAD = 4
_COMPILE_LOCK = threading.Lock()


def module(genome, tabled: bool = False):
    """The compiled module of ``genome``, for every count convention (generated into the engine's
    epilogue cache folder)."""
    g = Genome.parse(genome)
    key = (str(g), tabled)
    if key not in _MODULES:
        import hashlib

        text = generate(g, tabled)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        kind = "_tabled" if tabled else ""
        _MODULES[key] = compile_module(f"bnn_measure_fused_{key[0].replace('-', '_')}{kind}_{digest}", text)
    return _MODULES[key]


def _task(mod, name: str) -> int:
    """The address of ``mod``'s serial ``<name>_task`` (``forward_raw``...), compiled (or loaded from
    Numba's cache) on first use for its one signature. The parallel loop over rows is refimpl's ``run_tasks``, compiled once
    for every genome: a Numba parallel loop per genome cost 2.5x the compile of the serial task."""
    tasks = mod.__dict__.setdefault("_TASKS", {})
    if name not in tasks:
        with _COMPILE_LOCK:
            if name not in tasks:
                tasks[name] = task_address(getattr(mod, f"{name}_task"), _SIGNATURES[name.split("_")[0]])
    return tasks[name]


def _run(mod, name: str, rows: int, *args) -> None:
    threads = numba_threads()
    run_tasks(_task(mod, name), _PARTS_PER_THREAD * threads, rows, *args)


def tables(mod, ns, counts: str = DEFAULT_COUNTS) -> tuple:
    """(values, derivatives) (K, R, L) float32 of ``mod``'s one-count subtrees at the counts 0 .. L - 1,
    converted by ``counts``, in windows of the sizes ``ns`` (R distinct integers, L = max(ns) + 1), as
    ``mod.build`` fills them."""
    ns = np.asarray(ns, dtype=np.int64).reshape(-1)
    shape = (max(1, mod.N_TABLES), ns.shape[0], int(ns.max()) + 1)
    out, dout = np.empty(shape, dtype=np.float32), np.empty(shape, dtype=np.float32)
    mod.build(ns, convention_vector(counts), out, dout)
    return out, dout


def _geometry(mod, counts: str, n, size: int) -> tuple:
    """(nsize (S,) float32, rows (S,) uint32, cv (3,), tab, dtab (K, R * L), variant): what the kernels take for
    counts of S positions in windows of sizes ``n`` (an int, or a tensor broadcastable to (1, 1,
    spatial...)) under the convention ``counts``, built once per module, convention and window sizes.
    Raw counts need a size only for their tables: one row of ``max(n) + 1`` entries, which do not
    depend on a window's size. ``variant``: the tasks' (``VARIANTS``), raw where the conversion is the
    identity ``(x + 0) / (n * 0 + 1)``."""
    if n is None:
        values = np.zeros(1, dtype=np.float32)
    else:
        values = (n.detach().cpu().numpy() if isinstance(n, torch.Tensor) else np.asarray(n)).astype(np.float32)
    key = (mod.__name__, counts, values.shape, values.tobytes(), size)
    if key not in _GEOMETRY:
        cv = convention_vector(counts)
        nsize = np.ascontiguousarray(np.broadcast_to(values.reshape(-1), (size,)) if values.size == 1
                                     else values.reshape(-1))
        if nsize.shape[0] != size:
            raise ValueError(f"window sizes of shape {values.shape} do not match counts of {size} positions")
        rows = np.zeros(size, dtype=np.uint32)
        if mod.N_TABLES == 0:
            tab = dtab = np.zeros((1, 1), dtype=np.float32)
        else:
            if n is None:
                raise ValueError("the tabled kernels need the window sizes n (they bound the counts)")
            if cv[1] == 0:  # the converted count does not depend on n (raw)
                ns = np.array([int(nsize.max())])
            else:
                ns, inverse = np.unique(nsize, return_inverse=True)
                rows = (inverse.reshape(-1) * (int(ns.max()) + 1)).astype(np.uint32)
            out, dout = tables(mod, ns.astype(np.int64), counts)
            tab, dtab = (np.ascontiguousarray(t.reshape(t.shape[0], -1)) for t in (out, dout))
        variant = "raw" if affine(counts) == (0, 0, 1) else "converted"
        _GEOMETRY[key] = (nsize, rows, cv, tab, dtab, variant)
    return _GEOMETRY[key]


class _FusedMeasure(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mod, geometry, limit, a, b, c, d, alpha):
        n, ch = a.shape[0], a.shape[1]
        views = [t.detach().contiguous().view(n, ch, -1) for t in (a, b, c, d)]
        al = alpha.detach().contiguous()
        out = torch.empty_like(views[0])
        nsize, rows, cv, tab, _, variant = geometry
        _run(mod, f"forward_{variant}", n * ch, *(v.numpy() for v in views), nsize, rows, cv, al.numpy(), tab, out.numpy())
        ctx.mod, ctx.geometry, ctx.limit, ctx.shape = mod, geometry, limit, a.shape
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
        nsize, rows, cv, tab, dtab, variant = ctx.geometry
        clip = ctx.limit is not None
        # torch.nan_to_num sends +-inf to the largest finite float32 before the clamp: a limit above it is that.
        limit = np.float32(min(float(ctx.limit), float(np.finfo(np.float32).max)) if clip else 0.0)
        _run(mod, f"backward_{variant}", n * ch, g.numpy(), *(v.numpy() for v in views), nsize, rows, cv, al.numpy(), tab, dtab,
             clip, limit, *(o.numpy() for o in outs), galpha.numpy())
        counts = [o.view(ctx.shape) if v in mod.USED else None for o, v in zip(outs, _COUNTS)]
        alpha_grad = galpha.view(n, ch, 4).sum(0).t().contiguous() if set(_ALPHAS) & set(mod.USED) else None
        return (None, None, None, *counts, alpha_grad)


def apply(genome, a, b, c, d, alpha, counts: str = DEFAULT_COUNTS, n=None, tabled: bool = False,
          clip: float | None = None):
    """The fused measure of the counts a..d as counted (float32 CPU, (N, C, ...)), converted by the
    convention ``counts`` in windows of sizes ``n`` (an int, or a tensor broadcastable to the counts'
    spatial shape; needed by freq and laplace, and by ``tabled``, whose counts must be integers in
    [0, n]); ``clip``: the gradients reaching the converted counts with NaN as 0 and clamped to
    [-clip, clip] (bnn.nn.layers.clip_measure_grad), None: as they are."""
    check_counts(counts)
    if n is None and counts != DEFAULT_COUNTS:
        raise ValueError(f"{counts} counts need the window sizes n")
    mod = module(genome, tabled)
    size = a[0, 0].numel() if a.dim() >= 2 else 1
    return _FusedMeasure.apply(mod, _geometry(mod, counts, n, size), clip, a, b, c, d, alpha)


_NONE = torch.empty((1, 1, 1), dtype=torch.float32)


def numba_threads() -> int:
    """Numba's pool as wide as torch's, so the two do not oversubscribe the cores; returns its width."""
    torch_threads = torch.get_num_threads()
    threads = max(1, min(torch_threads, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(threads)
    # Numba's OpenMP pool, launched by its first use in a process, sets OpenMP's width to all of Numba's
    # threads, and torch reads its own width from OpenMP: a one-thread training went on with every core's
    # thread (other bits, and two such trainings oversubscribed two cores). Put torch's back.
    if torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)
    return threads


def fused_applies(a, alpha) -> bool:
    """Whether the fused kernels take these counts: float32 CPU tensors of (N, C, ...), not inside
    ``torch.compile`` (which traces the eager formula instead)."""
    return (a.dtype == torch.float32 and a.device.type == "cpu" and a.dim() >= 2 and alpha.dtype == torch.float32
            and not torch.compiler.is_compiling())


def measure_counts(layer, counts, n):
    """``layer``'s measure of its counts as counted, fused, or None where the fused kernels do not
    apply (bnn.nn.layers calls the eager path then). ``n``: the windows' sizes (None under raw)."""
    if not fused_applies(counts[0], layer.alpha):
        return None
    # The counts are integers in [0, n]: raw ones at most a whole window (C*KH*KW, or the inputs).
    sizes = layer.weight[0].numel() if layer.counts == DEFAULT_COUNTS else n
    return apply(layer.genome, *counts, layer.alpha, layer.counts, sizes, tabled=True, clip=layer.measure_grad_clip)

