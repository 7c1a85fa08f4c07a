"""The fused training measure for every genome from one compiled module: the genome as data.

``bnn/nn/measure_fused.py`` generates and compiles two Numba kernels per genome (about 2.5 s of CPU
each time a search or a test meets a new one). Here one module, generated once from the operator
table (``refimpl/operators.py``), takes the genome's seven codes as an array: each unary slot is
either looked up in a per-layer table or computed inline, and each binary node runs the branch of
its code over a block of elements, the branch outside the loop so that each stays a plain
vectorizable loop.

Bits: the same as the per-genome kernels, tabled and untabled, for every genome this module takes
(``plan`` says which; untabled, every genome). Every branch's statements, forward and reverse, are
``measure_program.Program``'s for the operator's own formula, the statements the per-genome kernels
inline; the tables are built from the same subtrees, where ``refimpl``'s ``split`` tables a slot's
operator (``sin(c)``) or a gate's ``1 + exp(-U(c))`` of binary operators 10 and 11 (the node is then
a division by the table, operator 4 or 6, as the per-genome code divides); and the backward replays
the order in which the per-genome Program adds gradients (``steps``): an operand used twice
(``x / (x + y)``) is a copy of its subtree in that Program, each copy reversed on its own. A genome
whose constant slots (operator 1, zero) merge a one-count subtree across a binary node (``sin(a) +
0`` becomes one table, its derivative rounded once) is not taken tabled: ``plan`` returns None.

Speed: one pass per stage over blocks of CHUNK elements costs more than the per-genome kernels' one
fused pass (the training step of ``mnist_net`` 2.3-2.6x theirs, slower than eager torch:
``bench/bench_measure_generic.py``), so training keeps each genome's own kernels and the untabled
kernels, which only tests run, come from here.
"""
from __future__ import annotations

import ast
import hashlib
import threading

import numpy as np

from refimpl import formula as _formula
from refimpl.codegen.epilogue_template import measure_module_imports
from refimpl.codegen.measure_tables import split
from refimpl.engine.epilogue import compile_module
from refimpl.engine.task_call import run_tasks, task_address
from refimpl.genome import Genome
from refimpl.operators import BINARY, UNARY, UNARY_SLOT_INPUTS

from .measure_program import Program

INLINE_CODES = (0, 1, 2, 15, 16, 17)  # unary operators without a call or a power above 2: never tabled
GATES = {10: 1, 11: 0}  # binary operator -> the operand whose 1 + exp(-operand) split tables
GATED_CODE = {10: 4, 11: 6}  # the node once its gate is a table: x / T, or y / T
CHUNK = 2048  # elements per stage: the stages' buffers (26 of them, 52 KB) stay near L1
# plan: [mode of slots 0..3 (1: table), their unary codes, B1, B2, B3 codes as the kernels run them,
# converted (1: freq, laplace)]
PLAN_SIZE = 12
# The backward's row buffers: U0..U3 the slots' values, B1, B2, G the upstream gradient, three for the
# occurrences of B3's operands and three for a B node's, then each slot's leaf and alpha gradient.
U_BUF, B1_BUF, B2_BUF, G_BUF, OCC3_BUF, OCC_BUF, ACCX, ACCA, DENB, ALB, N_BUFFERS = 0, 4, 5, 6, 7, 10, 13, 17, 21, 22, 26


def _program(formula: str, prefix: str) -> Program:
    tree = _formula.substitute(_formula.parse(formula), {"x": ast.Name("x"), "y": ast.Name("y"),
                                                          "alpha": ast.Name("al")})
    return Program(ast.parse(ast.unparse(tree), mode="eval").body, prefix)


def _gate_formula(code: int) -> str:
    return f"1+exp(-({UNARY[code].formula}))"


def _indent(lines, depth):
    return [" " * (4 * depth) + line for line in lines]


def _reverse(prog: Program, names) -> tuple[list[str], dict[str, str]]:
    """(the reverse statements given ``G_<root>``, each of ``names``' gradient expression: ``F(0.0)``
    where none reaches it, ``G_<root>`` where the root is that name)."""
    lines, _ = prog.reverse()
    grads = {}
    for name in names:
        if prog.root == name:
            grads[name] = "G_ROOT"
        elif any(line.startswith(f"G_{name} =") for line in lines):
            grads[name] = f"G_{name}"
        else:
            grads[name] = "F(0.0)"
    root = f"G_{prog.root}" if prog.root in {n for n, _, _ in prog.nodes} else None
    return ([f"{root} = G_ROOT"] if root else []) + lines, grads


def _value(prog: Program) -> str:
    return prog.root  # a node, a name (x, al) or a constant F(...)


def _builder() -> list[str]:
    # build(ns, cv, codes, gated, out, dout): slot k's table (its operator, or its gate 1 + exp(-U))
    # at every integer count x of a window of size ns[r], as measure_fused's table builder computes it.
    lines = ["", "", "@jit", "def build(ns, cv, codes, gated, out, dout):", "    CP = cv[0]", "    CQ = cv[1]",
             "    CR = cv[2]", "    for k in range(4):", "        code = codes[k]", "        gate = gated[k]",
             "        for r in range(out.shape[1]):", "            N = F(ns[r])", "            DEN = N * CQ + CR",
             "            for i in range(out.shape[2]):", "                x = (F(i) + CP) / DEN",
             "                if False:", "                    pass"]
    for code, op in enumerate(UNARY):
        if code in INLINE_CODES and code not in (0, 2):
            continue
        for gate in (0, 1):
            if gate == 0 and code in INLINE_CODES:
                continue
            prog = _program(_gate_formula(code) if gate else op.formula, "t")
            reverse, grads = _reverse(prog, ("x",))
            lines += [f"                elif code == {code} and gate == {gate}:",
                      *_indent(prog.lines, 5), f"                    out[k, r, i] = {_value(prog)}",
                      "                    G_ROOT = F(1.0)", *_indent(reverse, 5),
                      f"                    dout[k, r, i] = {grads['x']}"]
    return lines


def _occurrences(formula: str) -> tuple[Program, list[str]]:
    """The operator's Program with each occurrence of x and y its own name (``x1``, ``x2``, ``y1``...),
    and those names in the order the Program emits them (its evaluation order)."""
    tree = ast.parse(ast.unparse(_formula.parse(formula)), mode="eval").body
    names: list[str] = []

    def rename(node):  # the order Program._emit visits nodes
        if isinstance(node, ast.Name) and node.id in ("x", "y"):
            names.append(f"{node.id}{sum(n[0] == node.id for n in names) + 1}")
            return ast.Name(names[-1])
        if isinstance(node, ast.BinOp):
            node.left, node.right = rename(node.left), rename(node.right)
        elif isinstance(node, ast.UnaryOp):
            node.operand = rename(node.operand)
        elif isinstance(node, ast.Call):
            node.args = [rename(a) for a in node.args]
        return node

    return Program(rename(tree), "v"), names


def occurrence_orders(code: int) -> tuple[list[str], list[int]]:
    """(binary operator ``code``'s operand occurrences, ``x`` or ``y``, in evaluation order; their
    indices in the order its reverse pass adds to them): what the Program of a whole genome does
    with an operand used twice (``x / (x + y)``), which ``steps`` replays."""
    prog, names = _occurrences(BINARY[code].formula)
    lines, _ = prog.reverse()
    first = {name: next(i for i, line in enumerate(lines) if line.startswith(f"G_{name} =")) for name in names}
    return [n[0] for n in names], sorted(range(len(names)), key=lambda j: first[names[j]])


def _binary_functions() -> list[str]:
    # binary_rows: the node's value; binary_grads: the gradient reaching each occurrence of its operands
    # (GO0, GO1, GO2 in evaluation order), kept apart as the per-genome Program keeps them.
    forward = ["", "", "@jit(loop_vectorize=True, noalias=True)", "def binary_rows(code, X, Y, OUT, m):"]
    backward = ["", "", "@jit(loop_vectorize=True, noalias=True)",
                "def binary_grads(code, X, Y, G, GO0, GO1, GO2, m):"]
    for code, op in enumerate(BINARY):
        prog = _program(op.formula, "v")
        head = f"    {'if' if code == 0 else 'elif'} code == {code}:"
        forward += [head, "        for s in range(m):", "            x = X[s]", "            y = Y[s]",
                    *_indent(prog.lines, 3), f"            OUT[s] = {_value(prog)}"]
        occ, names = _occurrences(op.formula)
        reverse, grads = _reverse(occ, names)
        backward += [head, "        for s in range(m):", *[f"            {n} = {n[0].upper()}[s]" for n in names],
                     "            G_ROOT = G[s]", *_indent(occ.lines + reverse, 3),
                     *[f"            GO{j}[s] = {grads[n]}" for j, n in enumerate(names)]]
    return forward + backward


# The converted count of element e of the block at e0 (raw: the count as counted), as measure_fused's
# kernels load it; DENB holds each element's N * CQ + CR, ROWB its table row's offset, AL its alpha.
_LOAD = {False: ["x = XC[e0 + e]"], True: ["DEN = DENB[e]", "x = (XC[e0 + e] + CP) / DEN"]}
_INDEX = "tab_k[ROWB[e] + (np.uint32(XC[e0 + e]) & INDEX_MASK)]"
_CLIP = "G_X = (F(0.0) if G_X != G_X else min(max(G_X, -limit), limit)) if clip else G_X"
_BRANCHES = [(True, "if conv:"), (False, "else:")]


def _slot_functions() -> list[str]:
    # Over elements e0 .. e0+m-1 of the flattened (image, channel, position) counts: slot_values: a
    # slot's values; slot_accumulate: one occurrence's gradient G added where the per-genome Program
    # adds it (ACCX: the slot's leaf, its table entry or count; ACCA: its alpha); slot_finish: the
    # leaf's gradient through the table's derivative, clipped and converted back to the count as
    # counted, written to GC.
    forward = ["", "", "@jit(loop_vectorize=True, noalias=True)",
               "def slot_values(mode, code, conv, XC, e0, m, DENB, ROWB, CP, AL, tab_k, U):",
               "    if mode == 1:", "        for e in range(m):", f"            U[e] = {_INDEX}", "        return"]
    accumulate = ["", "", "@jit(loop_vectorize=True, noalias=True)",
                  "def slot_accumulate(mode, code, conv, XC, e0, m, DENB, CP, AL, G, ACCX, ACCA):",
                  "    if mode == 1 or code == 0:", "        for e in range(m):", "            ACCX[e] = ACCX[e] + G[e]",
                  "    elif code == 15:", "        for e in range(m):", "            ACCA[e] = ACCA[e] + G[e]"]
    for code, op in enumerate(UNARY):  # untabled (mode 0): every operator inline
        prog = _program(op.formula, "u")
        alpha = ["al = AL[e]"] if op.uses_alpha else []
        forward += [f"    elif code == {code}:"]
        for conv, branch in _BRANCHES:
            forward += [f"        {branch}", "            for e in range(m):",
                        *_indent(_LOAD[conv] + alpha + prog.lines, 4), f"                U[e] = {_value(prog)}"]
        if code in (0, 1, 15):  # a name or a constant: added above, or nothing to add
            continue
        reverse, grads = _reverse(prog, ("x", "al"))
        adds = [f"                ACC{v.upper()}[e] = ACC{v.upper()}[e] + ({grads[n]})"
                for v, n in (("x", "x"), ("a", "al")) if grads[n] != "F(0.0)"]
        accumulate += [f"    elif code == {code}:"]
        for conv, branch in _BRANCHES:
            accumulate += [f"        {branch}", "            for e in range(m):",
                           *_indent(_LOAD[conv] + alpha + prog.lines, 4), "                G_ROOT = G[e]",
                           *_indent(reverse, 4), *adds]
    finish = ["", "", "@jit(loop_vectorize=True, noalias=True)",
              "def slot_finish(mode, conv, XC, e0, m, DENB, ROWB, dtab_k, ACCX, clip, limit, GC):"]
    for tabled in (True, False):
        for conv in (True, False):
            finish += [f"    {'el' if not (tabled and conv) else ''}if mode {'==' if tabled else '!='} 1 and "
                       f"{'' if conv else 'not '}conv:", "        for e in range(m):",
                       f"            G_X = ACCX[e]{f' * d{_INDEX}' if tabled else ''}", f"            {_CLIP}",
                       f"            GC[e0 + e] = {'G_X / DENB[e]' if conv else 'G_X'}"]
    return forward + accumulate + finish


def _tasks() -> list[str]:
    # Each task takes rows first .. last-1 of (image, channel), flattened with their positions into
    # one run of elements, in blocks of CHUNK: a block spans rows where the rows are short (a 7x7
    # layer's 49 positions), so a stage's call covers CHUNK elements, not one row's.
    args = "ca, cb, cc, cd, nsize, rows, cv, alpha, tab, plan"
    head = ["    n_img, channels, size = ca.shape", "    CP = cv[0]", "    CQ = cv[1]", "    CR = cv[2]",
            "    conv = plan[11] == 1", "    BUF = np.empty((N_BUFFERS, CHUNK), F)", "    ROWB = np.empty(CHUNK, np.uint32)",
            "    XS = (ca.reshape(ca.size), cd.reshape(cd.size), cb.reshape(cb.size), cc.reshape(cc.size))",
            "    DENS = np.empty(size, F)", "    for s in range(size):", "        DENS[s] = nsize[s] * CQ + CR",
            "    end = last * size", "    for e0 in range(first * size, end, CHUNK):", "        m = min(CHUNK, end - e0)",
            "        prepare(e0, m, size, channels, DENS, rows, alpha, plan, BUF, ROWB)",
            "        for k in range(4):",
            "            slot_values(plan[k], plan[4 + k], conv, XS[k], e0, m, BUF[DENB], ROWB, CP, BUF[ALB + k], "
            "tab[k], BUF[k])",
            "        binary_rows(plan[8], BUF[0], BUF[1], BUF[B1_BUF], m)",
            "        binary_rows(plan[9], BUF[2], BUF[3], BUF[B2_BUF], m)"]
    forward = ["", "", "@jit(loop_vectorize=True, noalias=True, no_cpython_wrapper=True)  # called by run_tasks only",
               f"def forward_task(first, last, {args}, out):", *head,
               "        binary_rows(plan[10], BUF[B1_BUF], BUF[B2_BUF], out.reshape(out.size)[e0:], m)"]
    backward = ["", "", "@jit(loop_vectorize=True, noalias=True, no_cpython_wrapper=True)  # called by run_tasks only",
                f"def backward_task(first, last, grad, {args}, steps, dtab, clip, limit, used, ga, gb, gc, gd, galpha):",
                *head,
                "        BUF[G_BUF, :m] = grad.reshape(grad.size)[e0:e0 + m]",
                "        BUF[ACCX:ACCA + 4, :m] = F(-0.0)  # -0.0 + g is g, as the Program's first assignment",
                "        for t in range(steps.shape[0]):", "            if steps[t, 0] == 0:",
                "                base = steps[t, 5]",
                "                binary_grads(steps[t, 1], BUF[steps[t, 2]], BUF[steps[t, 3]], BUF[steps[t, 4]], "
                "BUF[base], BUF[base + 1], BUF[base + 2], m)",
                "            else:", "                k = steps[t, 1]",
                "                slot_accumulate(plan[k], plan[4 + k], conv, XS[k], e0, m, BUF[DENB], CP, BUF[ALB + k], "
                "BUF[steps[t, 2]], BUF[ACCX + k], BUF[ACCA + k])",
                "        for k in range(4):", "            if used[k]:",
                "                slot_finish(plan[k], conv, XS[k], e0, m, BUF[DENB], ROWB, dtab[k], BUF[ACCX + k], clip, "
                "limit, (ga, gd, gb, gc)[k].reshape(ca.size))",
                "            if plan[4 + k] >= ALPHA_CODE:",
                "                alpha_sums(e0, m, size, BUF[ACCA + k], galpha[:, k], first)",
                "    for k in range(4):", "        if plan[4 + k] < ALPHA_CODE:",
                "            galpha[first:last, k] = F(0.0)"]
    prepare = ["", "", "@jit(loop_vectorize=True, noalias=True)",
               "def prepare(e0, m, size, channels, DENS, rows, alpha, plan, BUF, ROWB):",
               "    # Each element's window term N * CQ + CR (DENS, per position), table row and alphas, copied",
               "    # a row's run of positions at a time.",
               "    s = e0 % size", "    o = (e0 // size) % channels", "    e = 0", "    while e < m:",
               "        run = min(size - s, m - e)", "        BUF[DENB, e:e + run] = DENS[s:s + run]",
               "        ROWB[e:e + run] = rows[s:s + run]", "        for k in range(4):",
               "            if plan[4 + k] >= ALPHA_CODE:", "                BUF[ALB + k, e:e + run] = alpha[k, o]",
               "        e += run", "        s = 0", "        o = o + 1 if o + 1 < channels else 0"]
    sums = ["", "", "@jit", "def alpha_sums(e0, m, size, ACCA, column, first):",
            "    # Each row's serial sum of its alpha gradients (no reassociation, as the per-genome kernels add",
            "    # them), carried in column[row] across blocks: a row's first element starts it at 0.",
            "    s = e0 % size", "    row = e0 // size", "    acc = column[row] if s else F(0.0)", "    for e in range(m):",
            "        acc += ACCA[e]", "        s += 1", "        if s == size:", "            column[row] = acc",
            "            acc = F(0.0)", "            s = 0", "            row += 1",
            "    if s:", "        column[row] = acc"]
    return prepare + sums + forward + backward


def generate() -> str:
    """The module's text: the table builder, the binary nodes' and slots' stages, the two tasks."""
    head = ['"""GENERATED by bnn/nn/measure_generic.py from refimpl/operators.py for every genome: do not edit."""',
            *measure_module_imports(), "", "F = np.float32", "INDEX_MASK = np.uint32(0x7FFFFFFF)", f"CHUNK = {CHUNK}",
            f"N_BUFFERS = {N_BUFFERS}", f"ACCX = {ACCX}", f"ACCA = {ACCA}", f"DENB = {DENB}", f"ALB = {ALB}",
            f"B1_BUF = {B1_BUF}", f"B2_BUF = {B2_BUF}", f"G_BUF = {G_BUF}",
            f"ALPHA_CODE = {min(op.code for op in UNARY if op.uses_alpha)}  # codes from here on read alpha"]
    return "\n".join(head + _builder() + _binary_functions() + _slot_functions() + _tasks()) + "\n"


def _gated(codes, slot: int) -> bool:
    parent = codes[4 + slot // 2]
    return GATES.get(parent) == slot % 2 and codes[slot] not in (1, 15, 16, 17)


def plan(genome, counts_converted: bool, tabled: bool = True) -> np.ndarray | None:
    """The kernels' plan of ``genome`` (int32 (PLAN_SIZE,)): tabled, as the per-genome tabled kernels
    table it, or None where they table a subtree the slots do not (module docstring); untabled,
    every slot and gate computed inline, as the per-genome untabled kernels compute them."""
    g = Genome.parse(genome)
    codes = g.codes
    if not tabled:
        out = np.array([0, 0, 0, 0, *codes, int(counts_converted)], dtype=np.int32)
        out.setflags(write=False)
        return out
    alphas = [f"al{k}" for k in range(4)]
    tree = ast.parse(ast.unparse(g.expression(alphas)), mode="eval").body
    found = {ast.unparse(node) for _, node in split(tree)[1]}
    expected, modes = set(), []
    for slot, (code, count) in enumerate(zip(codes[:4], UNARY_SLOT_INPUTS)):
        text = _gate_formula(code) if _gated(codes, slot) else UNARY[code].formula
        tabled = _gated(codes, slot) or code not in INLINE_CODES
        if tabled:
            sub = _formula.substitute(_formula.parse(text), {"x": ast.Name(count), "alpha": ast.Name(alphas[slot])})
            expected.add(ast.unparse(ast.parse(ast.unparse(sub), mode="eval").body))
        modes.append(int(tabled))
    if found != expected:
        return None
    binary = [GATED_CODE[c] if any(_gated(codes, s) for s in (2 * j, 2 * j + 1)) else c
              for j, c in enumerate(codes[4:6])] + [codes[6]]
    out = np.array([*modes, *codes[:4], *binary, int(counts_converted)], dtype=np.int32)
    out.setflags(write=False)
    return out


def _name_like(plan_, slot: int) -> bool:
    # A slot the Program names (a table entry, the count, alpha) or a constant, not an expression node.
    return plan_[slot] == 1 or plan_[4 + slot] in (0, 1, 15)


def steps(plan_) -> np.ndarray:
    """The backward's steps (int32 (S, 6)) in the order the per-genome Program adds gradients: rows
    ``(0, code, x, y, upstream, out)`` run a binary node's reverse from buffers (``out``: the first of
    its occurrences' buffers), rows ``(1, slot, g, 0, 0, 0)`` add an occurrence's gradient to a slot.
    B3's operands are nodes, each of their occurrences a copy reversed in reverse evaluation order
    after the node; a slot the Program names gets its occurrences in the node's own reverse order."""
    rows = [[0, plan_[10], B1_BUF, B2_BUF, G_BUF, OCC3_BUF]]
    occ3, _ = occurrence_orders(int(plan_[10]))
    for j in reversed(range(len(occ3))):
        node = 0 if occ3[j] == "x" else 1
        code = int(plan_[8 + node])
        rows.append([0, code, U_BUF + 2 * node, U_BUF + 2 * node + 1, OCC3_BUF + j, OCC_BUF])
        occ, order = occurrence_orders(code)
        slot = [2 * node + (0 if o == "x" else 1) for o in occ]
        rows += [[1, slot[jj], OCC_BUF + jj, 0, 0, 0] for jj in order if _name_like(plan_, slot[jj])]
        rows += [[1, slot[jj], OCC_BUF + jj, 0, 0, 0] for jj in reversed(range(len(occ)))
                 if not _name_like(plan_, slot[jj])]
    out = np.array(rows, dtype=np.int32)
    out.setflags(write=False)
    return out


def gated(genome) -> np.ndarray:
    """(4,) int32: 1 where a slot's table is its gate ``1 + exp(-U)``."""
    codes = Genome.parse(genome).codes
    return np.array([int(_gated(codes, k)) for k in range(4)], dtype=np.int32)


_MODULE: list = []
_TASKS: dict[str, int] = {}
_LOCK = threading.Lock()
_C3 = "float32[:, :, ::1]"
_COMMON = (f"{_C3}, {_C3}, {_C3}, {_C3}, float32[::1], uint32[::1], float32[::1], float32[:, ::1], "
           "float32[:, ::1], int32[::1]")
SIGNATURES = {
    "forward": f"void(i8, i8, {_COMMON}, {_C3})",
    "backward": f"void(i8, i8, {_C3}, {_COMMON}, int32[:, ::1], float32[:, ::1], boolean, float32, boolean[::1], "
                f"{_C3}, {_C3}, {_C3}, {_C3}, float32[:, ::1])",
}


class GenomeKernels:
    """The one module's kernels bound to a genome's plan, with what ``measure_fused`` reads of a
    per-genome module: ``build`` (its tables), ``N_TABLES``, ``USED``, ``__name__``."""

    def __init__(self, genome, plans: dict, tabled: bool):
        g = Genome.parse(genome)
        self.__name__ = f"bnn_measure_generic:{g}{':tabled' if tabled else ''}"
        self.N_TABLES = 4 if tabled else 0
        self.plans = plans  # by variant, raw and converted
        self.steps = steps(plans["raw"])
        self.codes = np.array(g.codes[:4], dtype=np.int32)
        self.gated = gated(g) if tabled else np.zeros(4, dtype=np.int32)
        self.used = np.array([c not in (1, 15) for c in g.codes[:4]], dtype=np.bool_)  # slot reads its count
        counts = {count for count, u in zip(UNARY_SLOT_INPUTS, self.used) if u}
        alphas = {f"al{k}" for k, c in enumerate(g.codes[:4]) if UNARY[c].uses_alpha}
        self.USED = tuple(sorted(counts | alphas))
        self._no_tables = np.zeros((4, 1), dtype=np.float32)

    def build(self, ns, cv, out, dout):
        """The slots' tables (4, R, L) and derivatives at windows of sizes ``ns`` (``measure_fused.tables``)."""
        module().build(ns, cv, self.codes, self.gated, out, dout)

    def run(self, name: str, parts: int, rows: int, *args) -> None:
        """``run_tasks`` of the task ``name`` (``forward_raw``, ``backward_converted``...) with the
        per-genome task's arguments ``args``, the plan (and in the backward the used counts) added."""
        kind, variant = name.split("_")
        plan = self.plans[variant]
        args = list(args)
        tab_at = 8 if kind == "forward" else 9  # after the counts, sizes, rows, cv, alpha
        for at in (tab_at, tab_at + 1) if kind == "backward" else (tab_at,):
            if args[at].shape[0] < 4:  # a genome without tables: _geometry's placeholder
                args[at] = self._no_tables
        args.insert(tab_at + 1, plan)
        if kind == "backward":
            args.insert(tab_at + 2, self.steps)
            args.insert(tab_at + 6, self.used)  # after dtab, clip, limit
        run_tasks(task(kind), parts, rows, *args)


def kernels(genome, tabled: bool = True) -> GenomeKernels | None:
    """The generic kernels for ``genome``, or None where its per-genome tabled kernels table more (``plan``)."""
    raw = plan(genome, False, tabled)
    if raw is None:
        return None
    return GenomeKernels(genome, {"raw": raw, "converted": plan(genome, True, tabled)}, tabled)


def module():
    """The one compiled module (generated into the engine's cache folder on first use)."""
    with _LOCK:
        if not _MODULE:
            text = generate()
            digest = hashlib.sha256(text.encode()).hexdigest()[:16]
            _MODULE.append(compile_module(f"bnn_measure_generic_{digest}", text))
    return _MODULE[0]


def task(name: str) -> int:
    """The address of the module's ``<name>_task`` (``forward``, ``backward``) for ``run_tasks``."""
    if name not in _TASKS:
        mod = module()
        with _LOCK:
            if name not in _TASKS:
                _TASKS[name] = task_address(getattr(mod, f"{name}_task"), SIGNATURES[name])
    return _TASKS[name]
