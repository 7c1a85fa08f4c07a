"""docs/design.md section 5: how a torch result is compared with the refimpl result.

THE RULE (stated once; every torch-vs-refimpl comparison of measure values goes through
``check_genome``; the paper-table test compares against a reordered transcription and states
its own relative bound there):

1. Special values must match exactly: the same NaN positions, the same infinities with the
   same sign.
2. One operator on identical operands: |torch - refimpl| <= ULPS * ulp(refimpl) in the dtype.
   The two paths use different libm implementations (torch: SLEEF/vectorized, Numba: the
   system libm) that each round within about 1 ulp, and several table formulas are short
   compositions themselves (x**3 may be pow() in one path and x*x*x in the other; sigmoid is
   exp, add, divide), so a few ulps is the honest size of "the same operator". ULPS below is
   the smallest value measured to hold on the drawn inputs, with headroom.
3. A composed genome: the operands of a binary node already differ between the paths by
   (dx, dy), the errors of the nodes that produced them. The node's tolerance is its forward
   error under those perturbations, measured on the operator itself: the largest change of
   B over the box [x - dx, x + dx] x [y - dy, y + dy] (a 5 x 5 grid, evaluated in float64 at
   refimpl's operands), plus the operator's own rounding, once in each path: in float32, 2 R
   with R the largest |B_float32 - B_float64| on that grid (a formula like exp(-(x-y)**2)
   rounds x-y and the square inside, and exp amplifies that by (x-y)**2, so its own error is
   not a few ulps of the result once the operands differ), plus rule 2's ULPS * ulp. This is
   an operand-derived bound, not a blanket one: where the operands agree exactly, the box
   collapses to a point.
4. Relaxation: where that box reaches a non-finite value of B while B at the operands is
   finite (or the other way round), the element is within rounding of a singularity (a
   divisor that rounding can make zero, an overflow threshold); no finite tolerance is
   meaningful there, so that element alone is not checked, and neither is anything computed
   from it. Every such element is counted in RELAXED and reported at the end of the run.
   (The box is sampled on its grid: a pole strictly between grid points is not flagged; it
   shows up as a large change between neighbouring grid values, i.e. a wide bound for that
   element.)
5. Signed zeros: ``max``/``min`` of +0 and -0 have no defined sign in torch (``torch.maximum``
   returns the first operand in its scalar loop and the second in its vectorized one: on torch
   2.13 CPU, ``maximum(-0., 0.)`` is -0 for a 1-element tensor and +0 for a 64-element one),
   so an operand that is zero in both paths with different signs counts as differing
   operands under rule 4: a later ``y/x`` turns it into infinities of opposite sign.
   Found by hypothesis: genome 0-16-0-0-8-0-6, ``b+c / max(a, alpha*d)`` with a = d = 0.
"""
from __future__ import annotations

import numba
import numpy as np
import torch

import refimpl
from bnn.nn.measure import binary as torch_binary
from bnn.nn.measure import convert_counts
from bnn.nn.measure import measure as torch_measure
from bnn.nn.measure import unary as torch_unary

# Largest rule-2 deviation seen over the whole suite is 2 ulps (printed at the end of every
# run); 4 leaves room for other libm builds without hiding a wrong formula, which is off by
# far more (a swapped operand or a wrong alpha row is off by O(1) relative).
ULPS = 4

RELAXED = {"relaxed": 0, "elements": 0, "max_ulps": 0.0}  # max_ulps: largest rule-2 deviation seen

ZERO, SUB, RSUB = 1, 1, 2  # unary code 1 is a real zero; binary 1 is x-y, binary 2 is y-x


def ulp(values, dtype) -> np.ndarray:
    """The spacing of each value rounded to ``dtype`` (one ulp there), as float64."""
    return np.spacing(np.abs(np.asarray(values, dtype=dtype))).astype(np.float64)


def specials_match(t, r) -> np.ndarray:
    """Elementwise: both NaN, or both the same infinity, or both finite."""
    t_nan, r_nan = np.isnan(t), np.isnan(r)
    t_inf, r_inf = np.isinf(t), np.isinf(r)
    same_inf = np.where(t_inf & r_inf, np.sign(np.where(t_inf, t, 0)) == np.sign(np.where(r_inf, r, 0)), True)
    return (t_nan == r_nan) & (t_inf == r_inf) & same_inf


def zero_signs_differ(t, r) -> np.ndarray:
    """Elementwise: both zero, with different signs (rule 5)."""
    t, r = np.asarray(t), np.asarray(r)
    return (t == 0) & (r == 0) & (np.signbit(t) != np.signbit(r))


def violations(t, r, tol, skip=None) -> np.ndarray:
    """Mask of elements where t and r disagree under rules 1 and 2/3 (``skip``: relaxed)."""
    t, r = np.asarray(t, dtype=np.float64), np.asarray(r, dtype=np.float64)
    ok = specials_match(t, r)
    finite = np.isfinite(t) & np.isfinite(r)
    with np.errstate(invalid="ignore"):
        ok &= ~finite | (np.abs(t - r) <= tol)
    if skip is not None:
        ok |= skip
    return ~ok


def refimpl_nodes(codes, a, b, c, d, alpha, dtype, counts="raw") -> dict[str, np.ndarray]:
    """refimpl's value at every node of the graph, each through the public ``refimpl.measure``.

    A node is isolated by a genome that zeroes the other slots and passes the node through
    ``v - 0``, which is exact and keeps the sign of a zero (``v + 0`` would turn -0.0 into
    +0.0, and 1/-0.0 is -inf).
    """
    u1, u2, u3, u4, b1, b2, _ = codes
    genomes = {
        "U1": (u1, ZERO, ZERO, ZERO, SUB, SUB, SUB),  # (U1(a) - 0) - (0 - 0)
        "U2": (ZERO, u2, ZERO, ZERO, RSUB, SUB, SUB),  # (U2(d) - 0) - (0 - 0)
        "U3": (ZERO, ZERO, u3, ZERO, SUB, SUB, RSUB),  # (U3(b) - 0) - (0 - 0)
        "U4": (ZERO, ZERO, ZERO, u4, SUB, RSUB, RSUB),  # (U4(c) - 0) - (0 - 0)
        "B1": (u1, u2, ZERO, ZERO, b1, SUB, SUB),
        "B2": (ZERO, ZERO, u3, u4, SUB, b2, RSUB),
        "out": tuple(codes),
    }
    # One thread: these arrays are tiny, and on a loaded 2-core machine waking a parallel
    # region's threads costs milliseconds per call (x7 nodes x thousands of examples).
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with np.errstate(all="ignore"):
            return {
                k: refimpl.measure(refimpl.Genome(g), a, b, c, d, alpha=alpha, dtype=dtype, counts=counts)
                for k, g in genomes.items()
            }
    finally:
        numba.set_num_threads(threads)


def _box_bound(code, x, y, dx, dy, dtype):
    """Forward-error bound of binary ``code`` at (x, y) with operand errors (dx, dy).

    Returns (bound, singular). bound = max |B(g) - B(x, y)| over a 5x5 grid g of the box in
    float64 (the propagated operand error), plus twice the largest rounding error of B
    evaluated in ``dtype`` on that grid (each path rounds once more inside the operator, at
    operands somewhere in the box: 2 R). For float64 the second term is 0 (no wider reference
    here) and rule 2's ulps carry it.
    """
    steps = torch.linspace(-1, 1, 5, dtype=torch.float64)
    x, y, dx, dy = (torch.as_tensor(np.asarray(v, dtype=np.float64)) for v in (x, y, dx, dy))
    gx = (x[..., None, None] + steps[:, None] * dx[..., None, None]).expand(*x.shape, 5, 5)
    gy = (y[..., None, None] + steps[None, :] * dy[..., None, None]).expand(*x.shape, 5, 5)
    center = torch_binary(code, x, y)
    grid = torch_binary(code, gx, gy)
    finite_grid = torch.isfinite(grid).all(dim=(-1, -2))
    nonfinite_grid = (~torch.isfinite(grid)).all(dim=(-1, -2))
    singular = torch.where(torch.isfinite(center), ~finite_grid, ~nonfinite_grid)
    dev = (grid - center[..., None, None]).abs().nan_to_num(nan=0.0, posinf=0.0).amax(dim=(-1, -2))
    if dtype == np.float32:
        gx32, gy32 = gx.float(), gy.float()
        rounding = torch_binary(code, gx32, gy32).double() - torch_binary(code, gx32.double(), gy32.double())
        dev = dev + 2 * rounding.abs().nan_to_num(nan=0.0, posinf=0.0).amax(dim=(-1, -2))
    return dev.numpy(), singular.numpy()


def operand_error(t, r) -> np.ndarray:
    """|t - r| where both are finite, else 0 (matching specials carry no error)."""
    t, r = np.asarray(t, dtype=np.float64), np.asarray(r, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(t) & np.isfinite(r), np.abs(t - r), 0.0)


def _report(failures: list[str], stage, bad, t, r) -> None:
    """Append one line naming ``stage``, how many elements of ``bad`` disagree and the first of them."""
    if bad.any():
        i = np.flatnonzero(bad.reshape(-1))[0]
        failures.append(
            f"{stage}: {int(bad.sum())} of {bad.size} elements disagree; first: "
            f"torch {np.asarray(t).reshape(-1)[i]!r} vs refimpl {np.asarray(r).reshape(-1)[i]!r}"
        )


def _rule2(failures: list[str], stage, t, r, dtype) -> None:
    """Rule 2 on one node (identical operands in both paths); records the largest deviation seen in RELAXED."""
    tol = ULPS * ulp(r, dtype)
    finite = np.isfinite(t) & np.isfinite(r)
    if finite.any():
        with np.errstate(all="ignore"):
            seen = np.abs(np.asarray(t, np.float64) - r)[finite] / ulp(r, dtype)[finite]
        RELAXED["max_ulps"] = max(RELAXED["max_ulps"], float(np.nanmax(seen)))
    _report(failures, stage, violations(t, r, tol), t, r)


def _unary_nodes(codes, ref, counts_t, alpha_t, per_channel, dtype, failures: list[str]) -> dict[str, np.ndarray]:
    """The torch path's four unary nodes, each checked by rule 2 (identical operands: the counts and alpha)."""
    own = {}
    for slot, name in enumerate(("U1", "U2", "U3", "U4")):
        code = codes[slot]
        row = alpha_t[slot].reshape(per_channel)
        t = torch_unary(code, counts_t[slot], row).numpy()
        r = ref[name]
        _rule2(failures, f"{name} = unary {code} ({refimpl.UNARY[code].name})", t, r, dtype)
        own[name] = t
    return own


def _binary_nodes(codes, ref, own: dict, relaxed: dict, dtype, failures: list[str]) -> None:
    """The torch path's binary nodes into ``own``, each checked on refimpl's operands (rule 2), then on
    its own operands against their forward-error bound (rule 3); relaxed elements (rules 4, 5) into ``relaxed``."""

    def tensor(v):
        return torch.as_tensor(np.asarray(v, dtype=dtype))

    for name, code, (lx, rx) in (
        ("B1", codes[4], ("U1", "U2")),
        ("B2", codes[5], ("U3", "U4")),
        ("out", codes[6], ("B1", "B2")),
    ):
        op = f"{name} = binary {code} ({refimpl.BINARY[code].name})"
        r = ref[name]
        t_same = torch_binary(code, tensor(ref[lx]), tensor(ref[rx])).numpy()
        _rule2(failures, f"{op} on refimpl's operands", t_same, r, dtype)

        t_own = torch_binary(code, tensor(own[lx]), tensor(own[rx])).numpy()
        operands_differ = ~specials_match(own[lx], ref[lx]) | ~specials_match(own[rx], ref[rx])
        operands_differ |= zero_signs_differ(own[lx], ref[lx]) | zero_signs_differ(own[rx], ref[rx])
        dev, singular = _box_bound(
            code, ref[lx], ref[rx], operand_error(own[lx], ref[lx]), operand_error(own[rx], ref[rx]), dtype
        )
        relaxed[name] = relaxed[lx] | relaxed[rx] | singular | operands_differ
        _report(
            failures,
            f"{op} composed (forward-error bound)",
            violations(t_own, r, dev + ULPS * ulp(r, dtype), skip=relaxed[name]),
            t_own,
            r,
        )
        own[name] = t_own


def check_genome(codes, a, b, c, d, alpha, dtype, counts="raw") -> list[str]:
    """Compare the torch path with refimpl on one genome; return the failures (empty: agree).

    ``a, b, c, d``: float64 arrays of counts (N, C, ...); ``alpha``: (4, C) float64 exactly
    representable in ``dtype``; ``counts``: the count convention both paths apply first (its
    converted counts must be identical: one correctly rounded division, refimpl/conventions.py).
    """
    dtype = np.dtype(dtype)
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    ref = refimpl_nodes(codes, a, b, c, d, alpha, dtype, counts)
    raw_t = [torch.as_tensor(np.asarray(v, dtype=dtype)) for v in (a, b, c, d)]
    ca, cb, cc, cd = convert_counts(counts, *raw_t)
    counts_t = [ca, cd, cb, cc]  # slot order
    alpha_t = torch.as_tensor(np.asarray(alpha, dtype=dtype))
    per_channel = (1, a.shape[1]) + (1,) * (a.ndim - 2)
    failures = []

    own = _unary_nodes(codes, ref, counts_t, alpha_t, per_channel, dtype, failures)
    relaxed = {name: np.zeros(ref["out"].shape, dtype=bool) for name in own}
    _binary_nodes(codes, ref, own, relaxed, dtype, failures)

    # bnn.measure itself must be exactly the step-by-step torch evaluation (same wiring).
    whole = torch_measure(refimpl.Genome(tuple(codes)), *raw_t, alpha_t, counts=counts)
    assert whole.dtype == tdtype
    if not np.array_equal(whole.numpy(), own["out"], equal_nan=True):
        failures.append("bnn.measure differs from its own step-by-step evaluation")

    RELAXED["relaxed"] += int(relaxed["out"].sum())
    RELAXED["elements"] += relaxed["out"].size
    return failures
