"""The activations' sign and 0/1 relaxation in one pass, and their straight-through backward in one (issue 37).

A binary layer's input ``x`` reaches the count convolution as ``xb = (1 + sign(x)) / 2`` and its
channel sum ``xsum`` (the window sums ``px`` are a small convolution of it: bnn/nn/counts.py). Written
with torch's operators that is a compare-and-select, an add, a multiply and a reduction over the
full-size activation, and the backward an add of the window-sum part, an ``abs``, a compare and a
select: about ten passes over memory per layer, the "elementwise work around the binary layers" of
docs/performance.md's GPU profile. ``bnn_gpu::relax`` makes ``xb`` and ``xsum`` in one pass;
``bnn_gpu::relax_backward`` makes dL/dx in one:

    dL/dx = where(|x| <= 1, (dL/dxb + dL/dxsum) / 2, 0)      (dL/dxsum broadcast over the channels)

the straight-through estimator of ``ste_sign(x, 1.0)`` times d xb / d sign(x) = 1/2. Its bits are those of
the unfused path (bnn/gpu/counts.py's backward with ±1 inputs, then ``ste_sign``'s), which folds the 1/2
into the small convolution operands before the add: halving commutes with float rounding (barring
subnormal gradients). ``x >= 0`` is false for NaN,
so NaN binarizes to -1 (``xb = 0``) as ``bnn.nn.layers.sign`` does. Any strides (NCHW, channels_last).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .measure_kernels import INTERPRETED, NO_CONTRACTION, _sum, _wide, _wide_offsets

CLIP = 1.0  # the activations' straight-through window, as _triton_forward's ste_sign(x, 1.0)
BLOCK_C, BLOCK_P, WARPS = 32, 64, 4  # on a GPU; the interpreter takes the whole tensor in one program


@triton.jit
def relax_forward_kernel(x_ptr, xb_ptr, xsum_ptr, C, P, W, x_n, x_c, x_h, x_w, o_n, o_c, o_h, o_w,
                         BC: tl.constexpr, BP: tl.constexpr, I64: tl.constexpr):
    """One block of BP pixels of one image: xb for every channel, and the channel sum per pixel."""
    n = _wide(tl.program_id(1), I64)
    p = _wide(tl.program_id(0), I64) * BP + tl.arange(0, BP)
    mp = p < P
    h = p // W
    w = p - h * W
    xpix = n * x_n + h * x_h + w * x_w
    opix = n * o_n + h * o_h + w * o_w
    acc = tl.full((BP,), 0.0, tl.float32)
    for c0 in range(0, C, BC):
        c = _wide(c0 + tl.arange(0, BC), I64)
        m = (c < C)[:, None] & mp[None, :]
        x = tl.load(x_ptr + (c[:, None] * x_c + xpix[None, :]), mask=m, other=-1.0)
        xb = tl.where(x >= 0, 1.0, 0.0)
        tl.store(xb_ptr + (c[:, None] * o_c + opix[None, :]), xb, mask=m)
        acc += _sum(xb, axis=0)  # integers below 2**24: exact in any order
    tl.store(xsum_ptr + n * P + p, acc, mask=mp)


@triton.jit
def relax_backward_kernel(g_ptr, gs_ptr, x_ptr, dx_ptr, C, P, W, g_n, g_c, g_h, g_w, x_n, x_c, x_h, x_w, clip,
                          BC: tl.constexpr, BP: tl.constexpr, I64: tl.constexpr):
    """dL/dx = where(|x| <= clip, (dL/dxb + dL/dxsum) / 2, 0) for BP pixels of one image (dx: x's strides)."""
    n = _wide(tl.program_id(1), I64)
    p = _wide(tl.program_id(0), I64) * BP + tl.arange(0, BP)
    mp = p < P
    h = p // W
    w = p - h * W
    gpix = n * g_n + h * g_h + w * g_w
    xpix = n * x_n + h * x_h + w * x_w
    gs = tl.load(gs_ptr + n * P + p, mask=mp, other=0.0)
    for c0 in range(0, C, BC):
        c = _wide(c0 + tl.arange(0, BC), I64)
        m = (c < C)[:, None] & mp[None, :]
        g = tl.load(g_ptr + (c[:, None] * g_c + gpix[None, :]), mask=m, other=0.0)
        xoff = c[:, None] * x_c + xpix[None, :]
        x = tl.load(x_ptr + xoff, mask=m, other=0.0)
        tl.store(dx_ptr + xoff, tl.where(tl.abs(x) <= clip, (g + gs[None, :]) * 0.5, 0.0), mask=m)


def _blocks(c: int, p: int) -> tuple[int, int, int]:
    if INTERPRETED:  # its cost is per operation and per program, not per element
        return triton.next_power_of_2(max(c, 1)), triton.next_power_of_2(max(p, 1)), 1
    return BLOCK_C, min(BLOCK_P, triton.next_power_of_2(max(p, 1))), WARPS


def _check(x: Tensor) -> None:
    if x.dim() != 4 or x.dtype != torch.float32:
        raise ValueError(f"bnn_gpu::relax takes a float32 (N, C, H, W) tensor, got {x.dtype} of shape {tuple(x.shape)}")


@torch.library.custom_op("bnn_gpu::relax", mutates_args=())
def relax(x: Tensor) -> tuple[Tensor, Tensor]:
    """(xb, xsum): ``(1 + sign(x)) / 2`` with x's strides, and its sum over channels, (N, 1, H, W) contiguous."""
    _check(x)
    n, c, height, width = x.shape
    xb = torch.empty_like(x)
    xsum = torch.empty((n, 1, height, width), dtype=x.dtype, device=x.device)
    bc, bp, warps = _blocks(c, height * width)
    relax_forward_kernel[(triton.cdiv(height * width, bp), n)](
        x, xb, xsum, c, height * width, width, *x.stride(), *xb.stride(), BC=bc, BP=bp,
        I64=_wide_offsets(x, xb), num_warps=warps, **NO_CONTRACTION)
    return xb, xsum


@relax.register_fake
def _relax_fake(x):
    return torch.empty_like(x), x.new_empty((x.shape[0], 1, *x.shape[2:]))


@torch.library.custom_op("bnn_gpu::relax_backward", mutates_args=())
def relax_backward(g_xb: Tensor, g_xsum: Tensor, x: Tensor) -> Tensor:
    """dL/dx from dL/dxb (any strides) and dL/dxsum ((N, 1, H, W)), with x's strides."""
    n, c, height, width = x.shape
    dx = torch.empty_like(x)
    bc, bp, warps = _blocks(c, height * width)
    relax_backward_kernel[(triton.cdiv(height * width, bp), n)](
        g_xb, g_xsum.contiguous(), x, dx, c, height * width, width, *g_xb.stride(), *x.stride(), CLIP, BC=bc, BP=bp,
        I64=_wide_offsets(g_xb, x, dx), num_warps=warps, **NO_CONTRACTION)
    return dx


@relax_backward.register_fake
def _relax_backward_fake(g_xb, g_xsum, x):
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _backward(ctx, g_xb, g_xsum):
    (x,) = ctx.saved_tensors
    g_xb = torch.zeros_like(x) if g_xb is None else g_xb
    g_xsum = x.new_zeros((x.shape[0], 1, *x.shape[2:])) if g_xsum is None else g_xsum
    return relax_backward(g_xb, g_xsum, x)


relax.register_autograd(_backward, setup_context=_setup_context)
