"""The count convolution up to the window sums: ``a``, ``px``, ``pw`` (bnn/counts.py's algebra).

bnn/counts.py returns the four counts, three of them full-size passes (``b = pw - a``, ``c = px - a``,
``d = (n - pw) - c``). The Triton measure (bnn/gpu/measure_kernels.py) forms b, c, d per element
itself and returns the gradients of ``a``, ``px`` and ``pw`` directly, so this function stops
before those passes. Its backward is bnn/counts.py's, from dL/da, dL/dpx, dL/dpw:

    dL/dxb = conv_input(dL/da, wb) + broadcast_C(conv_input(dL/dpx, ones))
    dL/dwb = conv_weight(xb, dL/da) + broadcast_C(conv_weight(mask, dL/dpw))

and dL/dx = dL/dxb / 2, dL/dw = dL/dwb / 2 (the 1/2 folded into the small operands). The window
sizes ``n`` depend on the geometry only: ``bnn.counts.window_sizes``, computed once per layer.

An inexact convolution (Winograd, FFT; ``bnn.nn.counts.conv_may_be_inexact``) has px and pw rounded
here (small tensors) and ``a`` rounded inside the measure kernel (no pass of its own): the flag
comes back as the fourth result.
"""
from __future__ import annotations

import torch

from ..nn.counts import conv_may_be_inexact, no_autocast, window_sums_forward


class _CountSums(torch.autograd.Function):
    # Given xsum, x is the 0/1 relaxation xb (bnn/gpu/relax.py) and the gradients are dL/dxb and dL/dxsum;
    # else x holds +-1 values, and dL/dx = (dL/dxb + broadcast_C(dL/dxsum)) / 2 with the 1/2 in the small operands.
    @staticmethod
    def forward(ctx, x, w, stride, padding, dilation, xsum=None):
        a, px, pw, saved = window_sums_forward(x, w, stride, padding, dilation, xsum)
        if conv_may_be_inexact(a):
            px.round_()
            pw.round_()
        ctx.save_for_backward(*saved)
        ctx.conv = (stride, padding, dilation)
        ctx.in_dtypes = (x.dtype, w.dtype)
        ctx.relaxed = xsum is not None
        return a, px, pw

    @staticmethod
    def backward(ctx, g_a, g_px, g_pw):
        xb, wb, xsum, ones_k, mask, wsum = ctx.saved_tensors
        stride, padding, dilation = ctx.conv
        need_x, need_w, need_xsum = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[5]
        relaxed = ctx.relaxed
        conv_args = (list(stride), list(padding), list(dilation), False, [0, 0], 1)
        grad_x = grad_w = grad_xsum = None
        with no_autocast(xb.device):
            gx, gw, _ = torch.ops.aten.convolution_backward(g_a, xb, wb if relaxed else wb * 0.5, None, *conv_args,
                                                            [need_x, need_w, False])
            if need_x or need_xsum:
                gxs, _, _ = torch.ops.aten.convolution_backward(g_px, xsum, ones_k if relaxed else ones_k * 0.5, None,
                                                                *conv_args, [True, False, False])
                grad_x, grad_xsum = (gx, gxs) if relaxed else (gx.add_(gxs).to(ctx.in_dtypes[0]), None)
            if need_w:
                _, gws, _ = torch.ops.aten.convolution_backward(g_pw, mask, wsum, None, *conv_args,
                                                                [False, True, False])
                grad_w = gw.mul_(0.5).add_(gws.mul_(0.5)).to(ctx.in_dtypes[1])
        return grad_x, grad_w, None, None, None, grad_xsum


def count_sums(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, xsum: torch.Tensor | None = None):
    """(a, px, pw, round_a) of a binary convolution of +-1 tensors x (NCHW) and w (OIHW): ``a`` (N, O, Ho, Wo),
    px (N, 1, Ho, Wo), pw (1, O, Ho, Wo), and whether ``a`` still needs rounding (a Python bool). Given
    ``xsum``, ``x`` is already the 0/1 relaxation and ``xsum`` its channel sum (bnn/gpu/relax.py's ``relax``)."""
    a, px, pw = _CountSums.apply(x, w, stride, padding, dilation, xsum)
    return a, px, pw, conv_may_be_inexact(a)  # the forward's own test: it reads a's device and dtype only
