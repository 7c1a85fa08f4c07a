"""The measure graph in PyTorch, derived from ``refimpl.operators`` (docs/design.md section 2).

There is no second operator table here: each row's formula text is compiled once and evaluated
with the names of ``refimpl.operators.FUNCTIONS`` bound to torch functions. IEEE semantics as
torch has them (``log(0) = -inf``, ``0/0 = nan``); nothing is clamped.
"""
from __future__ import annotations

import torch

from refimpl import default_alpha
from refimpl.conventions import DEFAULT, check_counts, convert
from refimpl.genome import Genome
from refimpl.operators import BINARY, FUNCTIONS, UNARY

# torch.maximum/minimum propagate NaN, as the Numba evaluator's nan_max/nan_min do.
TORCH_FUNCTIONS = {
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "atan": torch.atan,
    "erf": torch.erf,
    "erfc": torch.erfc,
    "abs": torch.abs,
    "max": torch.maximum,
    "min": torch.minimum,
}
if set(TORCH_FUNCTIONS) != set(FUNCTIONS):
    raise ImportError(
        f"bnn.measure binds {sorted(TORCH_FUNCTIONS)} but the operator table uses {sorted(FUNCTIONS)}"
    )

_GLOBALS = {"__builtins__": {}, **TORCH_FUNCTIONS}


def _function(op, args: str):
    # A real Python function per row (not eval() per call): cheap to call, and torch.compile
    # traces it like any other function.
    return eval(compile(f"lambda {args}: {op.formula}", f"<{op.name}: {op.formula}>", "eval"), _GLOBALS)


_UNARY_FN = tuple(_function(op, "x, alpha") for op in UNARY)
_BINARY_FN = tuple(_function(op, "x, y") for op in BINARY)


def unary(code: int, x: torch.Tensor, alpha: torch.Tensor | None = None) -> torch.Tensor:
    """Unary operator ``code`` on ``x``; ``alpha`` broadcasts against ``x`` (per channel)."""
    out = _UNARY_FN[code](x, alpha)
    # '0' and 'alpha' do not read x; the result still has x's shape and dtype (code 1 is a real
    # zero, so 0/0 downstream is NaN as in the Numba path).
    if not isinstance(out, torch.Tensor):
        return torch.full_like(x, out)
    if out.shape != x.shape or out.dtype != x.dtype:
        out = out.to(x.dtype).expand(x.shape)
    return out


def binary(code: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Binary operator ``code`` of the table applied elementwise to ``x`` and ``y``."""
    return _BINARY_FN[code](x, y)


def initial_alpha(genome, channels: int, dtype=None, device=None) -> torch.Tensor:
    """``refimpl.default_alpha`` as a tensor (torch's default dtype unless ``dtype``): each value
    rounded once, from float64, as the table's float is."""
    alpha = torch.from_numpy(default_alpha(Genome.parse(genome), channels))
    return alpha.to(dtype=dtype or torch.get_default_dtype(), device=device)


def convert_counts(counts: str, a, b, c, d, n=None):
    """The four counts as the convention ``counts`` has them enter the graph (``refimpl.conventions``).

    ``n``: the windows' sizes, broadcastable against the counts (a layer knows them from its
    geometry); None sums them from the counts. Either way ``n`` is a constant, detached: it
    does not depend on the inputs or weights, and its gradient through a + b + c + d would be
    zero up to rounding."""
    if check_counts(counts) == "raw":
        return a, b, c, d
    if n is None:
        n = a + b + c + d
    n = torch.as_tensor(n, device=a.device).to(a.dtype).detach()
    return tuple(convert(counts, v, n) for v in (a, b, c, d))


def measure(genome, a, b, c, d, alpha=None, counts=DEFAULT, n=None) -> torch.Tensor:
    """``B3(B1(U1(a'), U2(d')), B2(U3(b'), U4(c')))`` elementwise on counts of shape (N, C, ...).

    ``alpha``: (4, C), row i for slot U(i+1), broadcast over N and the spatial dims; None means
    the table's initial values. Counts are evaluated in a's dtype (torch's default float dtype
    if a is an integer tensor), converted by the count convention ``counts`` (``n``: see
    ``convert_counts``).
    """
    g = Genome.parse(genome)
    check_counts(counts)
    counts_in = [torch.as_tensor(v) for v in (a, b, c, d)]
    shape = counts_in[0].shape
    for name, v in zip("abcd", counts_in):
        if v.shape != shape:
            raise ValueError(f"count {name} has shape {tuple(v.shape)}, but a has {tuple(shape)}; all four must match")
    if len(shape) < 2:
        raise ValueError(f"counts need shape (N, C, ...), got {tuple(shape)}")
    dtype = counts_in[0].dtype if counts_in[0].dtype.is_floating_point else torch.get_default_dtype()
    a, b, c, d = convert_counts(counts, *(v.to(dtype) for v in counts_in), n)  # .to: no copy if the dtype matches
    channels = shape[1]
    if alpha is None:
        if any(g.uses_alpha()):
            alpha = initial_alpha(g, channels, dtype=a.dtype, device=a.device)
    elif tuple(torch.as_tensor(alpha).shape) != (4, channels):
        raise ValueError(f"alpha must have shape (4, {channels}) (one row per unary slot), got {tuple(alpha.shape)}")
    else:
        # Round alpha to the counts' dtype first, as refimpl does, so alpha*x is one rounding.
        alpha = torch.as_tensor(alpha).to(a.dtype)
    # Row i as (1, C, 1, ...) so it broadcasts over N and the spatial dims.
    per_channel = (1, channels) + (1,) * (len(shape) - 2)
    slots = []
    for slot, (code, count) in enumerate(zip(g.unary, (a, d, b, c))):
        row = alpha[slot].reshape(per_channel) if UNARY[code].uses_alpha else None
        slots.append(unary(code, count, row))
    a_, d_, b_, c_ = slots
    b1, b2, b3 = g.binary
    return binary(b3, binary(b1, a_, d_), binary(b2, b_, c_))
