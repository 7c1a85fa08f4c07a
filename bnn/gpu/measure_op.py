"""One custom operator for every genome, and ``set_genome`` that changes a model's genome in place (issue 37 item 2).

``bnn_gpu::measure`` wraps the Triton kernels (bnn/gpu/measure_kernels.py). Everything that
depends on the genome is a tensor argument: the seven codes (int32, on the counts' device), alpha,
and the unary tables with their derivatives; TorchDynamo guards a tensor by its dtype, device and
shape, never its values, so ``torch.compile`` traces one graph that serves every genome. The
count convention, the gradient clip and the rounding flag are model settings, constant in a graph.

``use_triton_measure(model)`` routes every binary layer of a model through the operator: the
layer keeps, as non-persistent buffers (checkpoints are unchanged), its codes, its tables and its
window geometry (``n`` per pixel and each pixel's table row), built at the first forward for an
input size and reused by every later step. ``set_genome(model, genome)`` rewrites the codes, the
tables and alpha's initial values *in place*: the same storage, so a search worker keeps one
model, one compiled graph and one captured CUDA graph for all its candidates (resetting the other
parameters and the optimizer state is the worker's own in-place step).

What is saved for backward: ``a`` and the small tensors (px, pw, alpha, the geometry, the tables);
the backward kernel recomputes b, c, d and every node of the measure from them.
"""
from __future__ import annotations

import types
from typing import Optional

import torch
from torch import Tensor

from refimpl.genome import Genome
from refimpl.kernels.geometry import int_pair

from ..nn.counts import window_sizes
from ..nn.layers import BinaryConv2d, BinaryLinear, ste_sign
from ..nn.measure import initial_alpha
from . import measure_kernels as kernels
from .counts import count_sums
from .measure_tables import rows_of, unary_tables
from .relax import relax


@torch.library.custom_op("bnn_gpu::measure", mutates_args=())
def measure(a: Tensor, px: Tensor, pw: Tensor, nsz: Tensor, rows: Tensor, codes: Tensor, alpha: Tensor,
            tab: Tensor, dtab: Tensor, convention: int, clip: Optional[float], round_counts: bool) -> Tensor:
    """The measure of the counts (a, px, pw, window sizes ``nsz``) of the genome ``codes`` (7 int32, a's device)."""
    return kernels.forward(a, px, pw, nsz, rows, codes, alpha, tab, round_counts)


@measure.register_fake
def _measure_fake(a, px, pw, nsz, rows, codes, alpha, tab, dtab, convention, clip, round_counts):
    return torch.empty_like(a)


@torch.library.custom_op("bnn_gpu::measure_backward", mutates_args=())
def measure_backward(dy: Tensor, a: Tensor, px: Tensor, pw: Tensor, nsz: Tensor, rows: Tensor, codes: Tensor,
                     alpha: Tensor, tab: Tensor, dtab: Tensor, convention: int, clip: Optional[float],
                     round_counts: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dL/da, dL/dpx, dL/dpw, dL/dalpha) of ``sum(dy * measure(...))``, the clip applied inside."""
    return kernels.backward(dy, a, px, pw, nsz, rows, codes, alpha, tab, dtab, convention, clip, round_counts)


@measure_backward.register_fake
def _measure_backward_fake(dy, a, px, pw, nsz, rows, codes, alpha, tab, dtab, convention, clip, round_counts):
    return torch.empty_like(a), torch.empty_like(px), torch.empty_like(pw), torch.empty_like(alpha)


def _setup_context(ctx, inputs, output) -> None:
    a, px, pw, nsz, rows, codes, alpha, tab, dtab, convention, clip, round_counts = inputs
    ctx.save_for_backward(a, px, pw, nsz, rows, codes, alpha, tab, dtab)
    ctx.settings = (convention, clip, round_counts)


def _backward(ctx, dy):
    ga, gpx, gpw, galpha = measure_backward(dy, *ctx.saved_tensors, *ctx.settings)
    return ga, gpx, gpw, None, None, None, galpha, None, None, None, None, None


measure.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------------
# Layers: the buffers, their geometry, and the genome written in place.
# ----------------------------------------------------------------------------------------------
def _geometry(layer, x: Tensor, w: Tensor, geometry) -> None:
    # The window sizes of this input size, each pixel's table row, and the tables: built once per
    # input size (eagerly; under torch.compile the buffers must exist already).
    n = window_sizes(x[:1].detach(), w.detach(), *geometry).reshape(-1)
    ns, rows, length = rows_of(n.cpu().numpy(), layer.counts)
    layer._gpu_ns, layer._gpu_length, layer._gpu_hw = ns, length, tuple(x.shape[2:])
    device = layer.weight.device
    tab, dtab = unary_tables(layer.genome.codes[:4], layer.counts, ns, length)
    for name, value in (("_gpu_nsz", n.to(dtype=torch.float32)), ("_gpu_rows", torch.from_numpy(rows)),
                        ("_gpu_tab", torch.from_numpy(tab)), ("_gpu_dtab", torch.from_numpy(dtab))):
        layer.register_buffer(name, value.to(device).contiguous(), persistent=False)


def _as_convolution(layer, x: Tensor):
    """(x, w, (stride, padding, dilation)) of ``layer`` as a convolution: a dense layer is the 1x1 one of
    (N, K, 1, 1) inputs, whose single window has n = K."""
    if isinstance(layer, BinaryLinear):
        return x[:, :, None, None], layer.weight[:, :, None, None], ((1, 1), (0, 0), (1, 1))
    return x, layer.weight, tuple(int_pair(v, name) for v, name in
                                  ((layer.stride, "stride"), (layer.padding, "padding"), (layer.dilation, "dilation")))


def _triton_forward(self, x: Tensor) -> Tensor:
    # Replaces the layer's forward on one instance: counts up to the window sums, then bnn_gpu::measure.
    x4, w4, geometry = _as_convolution(self, x)
    if getattr(self, "_gpu_hw", None) != tuple(x4.shape[2:]):
        if torch.compiler.is_compiling():
            raise RuntimeError("bnn.gpu: run one eager forward of this input size before torch.compile "
                               "(it builds each layer's window geometry and tables)")
        _geometry(self, x4, w4, geometry)
    if self._gpu_relax:  # ste_sign(x4, 1.0)'s sign and its 0/1 relaxation in one pass, the backward in one
        xb, xsum = relax(x4)
        a, px, pw, round_counts = count_sums(xb, ste_sign(w4, None), *geometry, xsum=xsum)
    else:
        a, px, pw, round_counts = count_sums(ste_sign(x4, 1.0), ste_sign(w4, None), *geometry)
    y = measure(a, px, pw, self._gpu_nsz, self._gpu_rows, self._gpu_codes, self.alpha, self._gpu_tab,
                self._gpu_dtab, kernels.CONVENTION_CODES[self.counts], self.measure_grad_clip, round_counts)
    return y.view(y.shape[:2]) if x.dim() == 2 else y


def _layers(model: torch.nn.Module):
    return [m for m in model.modules() if isinstance(m, (BinaryConv2d, BinaryLinear))]


def use_triton_measure(model: torch.nn.Module, relax_in_one_pass: bool = True) -> torch.nn.Module:
    """Route every ``BinaryConv2d`` and ``BinaryLinear`` of ``model`` through ``bnn_gpu::measure`` (in place;
    returns ``model``). The counts must be float32 (the kernels' dtype). ``relax_in_one_pass=False`` binarizes
    the inputs with torch's operators instead of bnn/gpu/relax.py (the same bits; for timing the two)."""
    for layer in _layers(model):
        if layer.alpha.dtype != torch.float32:
            raise ValueError(f"bnn.gpu's measure runs in float32; this layer's alpha is {layer.alpha.dtype}")
        codes = torch.tensor(layer.genome.codes, dtype=torch.int32, device=layer.weight.device)
        layer.register_buffer("_gpu_codes", codes, persistent=False)
        layer._gpu_hw, layer._gpu_relax = None, relax_in_one_pass
        layer.forward = types.MethodType(_triton_forward, layer)
    return model


def prime_geometry(model: torch.nn.Module, input_shape: tuple[int, ...]) -> torch.nn.Module:
    """Build every routed layer's window geometry and tables for inputs of ``input_shape`` (C, H, W), before
    torch.compile or a CUDA graph capture needs them: one forward of one zero image in eval mode without
    gradients, which changes no parameter and no BatchNorm statistic. Returns ``model``."""
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        model(torch.zeros((1, *input_shape), device=device))
    model.train(was_training)
    return model


def set_genome(model: torch.nn.Module, genome, reset_alpha: bool = True) -> torch.nn.Module:
    """Give every binary layer of ``model`` (routed by ``use_triton_measure``) the genome ``genome``, in
    place: the codes, the unary tables and (``reset_alpha``) alpha's initial values are written into the
    tensors they already live in, so compiled and captured graphs replay unchanged. Returns ``model``."""
    g = Genome.parse(genome)
    for layer in _layers(model):
        if not hasattr(layer, "_gpu_codes"):
            raise ValueError("set_genome needs a model routed by bnn.gpu.use_triton_measure")
        layer.genome = g
        layer._gpu_codes.copy_(torch.tensor(g.codes, dtype=torch.int32))
        if layer._gpu_hw is not None:
            tab, dtab = unary_tables(g.codes[:4], layer.counts, layer._gpu_ns, layer._gpu_length)
            layer._gpu_tab.copy_(torch.from_numpy(tab))
            layer._gpu_dtab.copy_(torch.from_numpy(dtab))
        if reset_alpha:
            with torch.no_grad():
                layer.alpha.copy_(initial_alpha(g, layer.alpha.shape[1], dtype=layer.alpha.dtype))
    return model
