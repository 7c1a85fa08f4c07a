"""The measure as one opaque operator, so one compiled training step serves every genome (issue 16 item 1).

Under ``torch.compile`` a binary layer's genome is Python data: TorchDynamo traces the operator
table's formulas into the graph and guards on the genome's codes, so every new genome recompiles
the whole step (tens of seconds on a GPU), and after ``torch._dynamo.config.recompile_limit``
genomes in one process the layer silently runs eagerly.

``use_measure_op(model)`` routes every binary layer's measure through ``bnn::measure``, a custom
operator that takes the genome as an int64 CPU tensor. The compiled graph holds the operator, not
the formula, and TorchDynamo guards a tensor argument by its dtype, device and shape, never its
values, so a model built for another genome runs the graph already compiled. Inside, the operator
evaluates ``bnn.nn.measure.measure`` eagerly, the same code and order as the uncompiled layer; its
backward (``bnn::measure_backward``) recomputes those few elementwise operations under autograd.
What it costs: the measure is not fused with the counts' elementwise epilogue, and its backward
returns four full-size gradients (a zero tensor where the measure ignores a count) instead of
handing autograd's shared gradient objects to the counts' backward.

The codes tensor stays on the CPU (a plain attribute, not a buffer, so ``model.to(device)`` leaves
it there): reading it never waits for the GPU. A graph with a CPU input is not captured as a CUDA
graph by ``mode="reduce-overhead"``, which would otherwise replay the first genome's kernels.
"""
from __future__ import annotations

import functools
import types

import torch
from torch import Tensor

from refimpl.genome import Genome

from .layers import BinaryMeasureLayer
from .measure import measure

CODES_ATTR = "_measure_codes"  # the layer attribute holding the genome's codes


@functools.lru_cache(maxsize=1024)
def _genome(codes: tuple[int, ...]) -> Genome:
    return Genome(codes)


def _codes_genome(codes: Tensor) -> Genome:
    return _genome(tuple(codes.tolist()))


def _fresh(out: Tensor, like: Tensor, inputs) -> Tensor:
    """``out`` in ``like``'s dtype and strides, never sharing memory with ``inputs`` (a custom
    operator may not return an alias, and its outputs must have the strides its fake declares)."""
    ptr = out.untyped_storage().data_ptr()
    shares = any(t.untyped_storage().data_ptr() == ptr for t in inputs)
    if shares or out.dtype != like.dtype or out.shape != like.shape or out.stride() != like.stride():
        return torch.empty_like(like).copy_(out)
    return out


@torch.library.custom_op("bnn::measure", mutates_args=())
def measure_op(codes: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor, alpha: Tensor) -> Tensor:
    """``bnn.nn.measure.measure`` of the genome whose seven codes ``codes`` (int64, CPU) holds."""
    out = measure(_codes_genome(codes), a, b, c, d, alpha)
    return _fresh(out, a, (a, b, c, d, alpha))


@measure_op.register_fake
def _measure_fake(codes, a, b, c, d, alpha):
    return torch.empty_like(a)


_AUTOGRAD_KEYS = (torch._C.DispatchKey.AutogradFunctionality, torch._C.DispatchKey.AutogradOther,
                  torch._C.DispatchKey.AutogradNestedTensor)


def _autograd_on():
    """A guard that lets autograd record again: an operator's kernel runs with the autograd dispatch
    keys excluded (it is below autograd), so inside it no operation would build a graph to differentiate."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


@torch.library.custom_op("bnn::measure_backward", mutates_args=())
def measure_backward_op(codes: Tensor, grad: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor,
                        alpha: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``sum(grad * measure(a, b, c, d, alpha))`` with respect to a, b, c, d and alpha."""
    inputs = [t.detach().requires_grad_() for t in (a, b, c, d, alpha)]
    with _autograd_on(), torch.enable_grad():
        out = measure(_codes_genome(codes), *inputs)
        grads = torch.autograd.grad(out, inputs, grad, allow_unused=True) if out.requires_grad else [None] * 5
    result, seen = [], [grad, a, b, c, d, alpha]
    for g, like in zip(grads, (a, b, c, d, alpha)):
        # Autograd hands one tensor to both operands of x+y; outputs must not alias each other.
        g = torch.zeros_like(like) if g is None else _fresh(g, like, seen)
        seen.append(g)
        result.append(g)
    return tuple(result)


@measure_backward_op.register_fake
def _measure_backward_fake(codes, grad, a, b, c, d, alpha):
    return tuple(torch.empty_like(t) for t in (a, b, c, d, alpha))


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    codes, a, b, c, d, alpha = ctx.saved_tensors
    ga, gb, gc, gd, galpha = measure_backward_op(codes, grad, a, b, c, d, alpha)
    return None, ga, gb, gc, gd, galpha


measure_op.register_autograd(_backward, setup_context=_setup_context)


def _op_measure(self, a, b, c, d):
    # Replaces BinaryMeasureLayer._measure on one instance: the genome enters as a tensor.
    return measure_op(getattr(self, CODES_ATTR), a, b, c, d, self.alpha)


def use_measure_op(model: torch.nn.Module) -> torch.nn.Module:
    """Route every binary layer of ``model`` through ``bnn::measure`` (in place; returns ``model``).

    Same outputs and gradients as the layers' own measure (tests/test_measure_op.py); under
    ``torch.compile`` a model built for another genome reuses the compiled graphs."""
    for layer in model.modules():
        if isinstance(layer, BinaryMeasureLayer):
            setattr(layer, CODES_ATTR, torch.tensor(layer.genome.codes, dtype=torch.int64))
            layer._measure = types.MethodType(_op_measure, layer)
    return model
