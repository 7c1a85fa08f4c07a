"""A binary convolution's input on the CPU in one pass each way: sign, 0/1 relaxation and channel sum forward,
the straight-through estimator backward (bnn/gpu/relax.py is the GPU's, with the same formulas).

With torch's operators ``ste_sign(x, 1.0)`` and the count convolution's relaxation cost a compare and a select
(``sign``), an add and a multiply (``(1 + s) / 2``) and a reduction (the channel sum) over the full-size
activation, and backward an add of the window-sum part, an ``abs``, a compare and a select, each a pass of its
own. One pass each way makes ``mnist_net``'s CPU training step 0.85-0.92x as long (``bench/bench_relax_cpu.py``,
docs/performance.md). Here, in Numba:

    xb = 1 if x >= 0 else 0        xsum = sum_C xb                 (NaN binarizes to 0, as ``sign`` to -1)
    dL/dx = (dL/dxb + dL/dxsum) / 2 where |x| <= 1, else 0        (dL/dxsum broadcast over the channels)

The values are exact; the gradient has the unfused path's bits (which fold the 1/2 into the convolution
operands before the add: halving commutes with rounding, barring subnormal gradients). Used for float32 CPU
tensors in NCHW outside ``torch.compile``; elsewhere the layers keep torch's operators.
"""
from __future__ import annotations

import numba
import numpy as np
import torch
from numba import prange

from .measure_fused import numba_threads

CLIP = 1.0  # the activations' straight-through window: BinaryConv2d's ste_sign(x, 1.0)


@numba.njit(parallel=True, cache=True, nogil=True)
def relax_forward(x, xb, xsum):  # pragma: no cover - compiled
    """xb = (x >= 0) and xsum = its sum over channels; x, xb (N, C, S) and xsum (N, S) float32, C-contiguous."""
    n_img, channels, size = x.shape
    for i in prange(n_img):
        for s in range(size):
            xsum[i, s] = np.float32(0.0)
        for c in range(channels):
            for s in range(size):
                v = np.float32(1.0) if x[i, c, s] >= np.float32(0.0) else np.float32(0.0)
                xb[i, c, s] = v
                xsum[i, s] += v


@numba.njit(parallel=True, cache=True, nogil=True)
def relax_backward(g, gs, x, clip, dx):  # pragma: no cover - compiled
    """dx = (g + gs) / 2 where |x| <= clip, else 0; g, x, dx (N, C, S) and gs (N, S) float32, C-contiguous."""
    n_img, channels, size = x.shape
    half, zero = np.float32(0.5), np.float32(0.0)
    for i in prange(n_img):
        for c in range(channels):
            for s in range(size):
                dx[i, c, s] = (g[i, c, s] + gs[i, s]) * half if abs(x[i, c, s]) <= clip else zero


def applies(x: torch.Tensor) -> bool:
    """Whether ``relax`` takes ``x``: a float32 NCHW CPU tensor, contiguous, not inside ``torch.compile``."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 4 and x.is_contiguous()
            and x.numel() > 0 and not torch.compiler.is_compiling())


def _flat(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy().reshape(t.shape[0], t.shape[1], -1)


class _Relax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        xb = torch.empty_like(x)
        xsum = x.new_empty((x.shape[0], 1, *x.shape[2:]))
        numba_threads()
        relax_forward(_flat(x), _flat(xb), _flat(xsum)[:, 0])
        ctx.save_for_backward(x)
        return xb, xsum

    @staticmethod
    def backward(ctx, g_xb, g_xsum):
        (x,) = ctx.saved_tensors
        g_xb = torch.zeros_like(x) if g_xb is None else g_xb.contiguous()
        g_xsum = x.new_zeros((x.shape[0], 1, *x.shape[2:])) if g_xsum is None else g_xsum.contiguous()
        dx = torch.empty_like(x)
        numba_threads()
        relax_backward(_flat(g_xb), _flat(g_xsum)[:, 0], _flat(x), np.float32(CLIP), _flat(dx))
        return dx


def relax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(xb, xsum) of ``x`` (see the module docstring), differentiable; ``x`` as ``applies`` takes it."""
    return _Relax.apply(x)
