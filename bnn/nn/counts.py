"""Contingency counts a, b, c, d in PyTorch, differentiable (docs/design.md sections 1 and 6).

Public contract, as ``refimpl``: ``x`` and ``w`` hold +-1 values (the outputs of ``ste_sign``).
Inside, the counts are taken over the 0/1 relaxations ``xb = (1 + x) / 2`` and
``wb = (1 + w) / 2``, so they are bilinear in ``x`` and ``w`` and gradients flow through them;
``d counts / d x = (d counts / d xb) / 2``. Values other than +-1 give the bilinear extension,
not a binarization: binarize first.

Returns float tensors (N, O, Ho, Wo) for a convolution, (N, M) for a dense layer, in the
input's dtype (float32 when the input is float16/bfloat16: half precision would round counts
above 2048 or 256, docs/design.md section 1).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from refimpl.kernels.geometry import FLOAT32_EXACT_COUNT, int_pair, window_output_size

# ----------------------------------------------------------------------------------------------
# The algebra, for one output position of a convolution (a dense layer is the 1x1 case).
#
# Let T be the set of in-bounds taps of the window (padded taps excluded) and C the channels.
# Over the vectors xb[c, t], wb[c, t] for t in T:
#
#     a  = sum xb * wb                 = conv2d(xb, wb)        (zero padding: a padded tap has
#                                                               xb = 0 and adds nothing)
#     px = sum xb                      = conv2d(sum_c xb, ones(kh, kw))        shape (N, 1, Ho, Wo)
#     pw = sum wb                      = conv2d(mask, sum_c wb)                shape (1, O, Ho, Wo)
#     n  = C * |T|                     = C * conv2d(mask, ones(kh, kw))        shape (1, 1, Ho, Wo)
#
# where mask = ones(1, 1, H, W), zero-padded like the input, so px, pw and n see only real
# taps. Then, because every real tap is in exactly one of the four cells,
#
#     b = sum (1 - xb) * wb       = pw - a
#     c = sum xb * (1 - wb)       = px - a
#     d = sum (1 - xb)(1 - wb)    = n - px - pw + a  = (n - pw) - c
#
# The last form costs one full-size pass, as b and c do: (n - pw) is (1, O, Ho, Wo), small.
# A padded tap has xb = 0 in the conv of a, but 1 - xb would be 1 there; computing b, c, d
# from the window sums (not from convolutions of 1 - xb) is what keeps padded taps out of
# all four counts.
#
# Backward, with incoming gradients ga, gb, gc, gd (None counts as zero):
#
#     dL/da  = ga - gb - gc + gd                                   full size
#     dL/dpx = sum_O (gc - gd)                                     (N, 1, Ho, Wo)
#     dL/dpw = sum_N (gb - gd)                                     (1, O, Ho, Wo)
#     dL/dxb = conv_input(dL/da, wb) + broadcast_C(conv_input(dL/dpx, ones))
#     dL/dwb = conv_weight(xb, dL/da) + broadcast_C(conv_weight(mask, dL/dpw))
#
# and dL/dx = dL/dxb / 2, dL/dw = dL/dwb / 2. The 1/2 for x is folded into the (small) weight
# operand of the input-gradient convolution, so no extra pass over a full-size tensor is
# needed. dL/da is built from the incoming gradients as a weighted sum of the *distinct*
# tensors among them, with the first weight factored out and folded into the same small
# operand: autograd hands the same tensor to both operands of x+y, so for the baseline
# (a + d) - (b + c) it is 2 * (g - (-g)), one pass instead of four.
#
# Why a hand-written backward: letting autograd differentiate the identities costs a pass per
# broadcast and per subtraction (the prototype in docs/performance.md spent most of its 2.3x of a
# plain conv on such elementwise passes). Here the forward makes 3 full-size passes (b, c, d)
# plus one over the input (xb) and one read (sum over channels); the backward 1-3 passes for
# dL/da, 4 reductions, and one add into dL/dx.
#
# Exactness: the counts are integers below 2**24, exact in float32 for any summation order,
# but a convolution algorithm need not be a sum of products. Measured with torch 2.13 on CPU
# (0/1 operands, 64x256x8x8 and 64x64x32x32, 3x3): with oneDNN enabled every output is an
# exact integer, with or without grad; with oneDNN disabled, PyTorch falls back to NNPACK's
# Winograd and 90% of the outputs are off by up to 4e-3. cuDNN may pick Winograd/FFT too. So
# ``a``, px, pw and n are rounded in place (one pass over ``a``), except for float32 on a CPU
# with oneDNN enabled, where it was measured to be a no-op; the custom backward ignores the
# rounding, which makes its gradient straight-through. verify/test_counts.py pins both branches.
# ----------------------------------------------------------------------------------------------

_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The float type the count convolution runs in: float32 for half types, else the input's own."""
    if t.dtype in _HALF:
        return torch.float32
    if not t.dtype.is_floating_point:
        raise ValueError(f"counts need floating tensors of +-1 values, got dtype {t.dtype}")
    return t.dtype


def no_autocast(device: torch.device):
    """A block in which autocast is off on ``device``."""
    # Under autocast, conv2d would run (and return) in fp16/bf16 and round the counts.
    return torch.autocast(device_type=device.type, enabled=False)


_ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available()


def conv_may_be_inexact(t: torch.Tensor) -> bool:
    """Whether a convolution of ``t`` may not be exact, so its counts must be rounded."""
    # See "Exactness" above: only float32 through oneDNN on a CPU is known exact. Under
    # torch.compile the backend flags cannot be read while tracing and the compiler picks the
    # convolution, so round (the compiler fuses the rounding into a neighbouring kernel).
    if torch.compiler.is_compiling():
        return True
    return not (
        t.device.type == "cpu" and t.dtype == torch.float32 and _ONEDNN_AVAILABLE and torch.backends.mkldnn.enabled
    )


def half_plus_half(t: torch.Tensor) -> torch.Tensor:
    """(1 + t) / 2 (the 0/1 relaxation of +-1 values; exact for -1, 0 and 1 in any float type). Scalars
    only: a 0-dim tensor made from a Python number is a host-to-device copy, which a CUDA graph's
    capture refuses (an H200 run of the graph-replay test found it)."""
    return t.add(1.0).mul_(0.5)


def window_sums_forward(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, xsum=None) -> tuple:
    """The forward both count convolutions share (this module's and bnn/gpu/counts.py's), autocast off:
    ``(a, px, pw, saved)`` with ``saved = (xb, wb, xsum, ones_k, mask, wsum)``, what their backward reads.
    Given ``xsum`` (its channel sum), ``x`` is already the 0/1 relaxation (bnn/gpu/relax.py makes both)."""
    dtype = compute_dtype(x)
    with no_autocast(x.device):
        xb = half_plus_half(x.to(dtype)) if xsum is None else x
        wb = half_plus_half(w.to(dtype))
        conv = dict(stride=stride, padding=padding, dilation=dilation)
        a = F.conv2d(xb, wb, **conv)
        ones_k = torch.ones((1, 1) + tuple(wb.shape[2:]), dtype=dtype, device=x.device)
        mask = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=dtype, device=x.device)
        xsum = xb.sum(1, keepdim=True) if xsum is None else xsum
        wsum = wb.sum(1, keepdim=True)
        px = F.conv2d(xsum, ones_k, **conv)
        pw = F.conv2d(mask, wsum, **conv)
    return a, px, pw, (xb, wb, xsum, ones_k, mask, wsum)


class _CountsConv2d(torch.autograd.Function):
    # Given xsum, x is the 0/1 relaxation xb (bnn/nn/relax.py) and the gradients are dL/dxb and dL/dxsum; else
    # x holds +-1 values and dL/dx = (dL/dxb + broadcast_C(dL/dxsum)) / 2, the 1/2 in the small operands.
    @staticmethod
    def forward(ctx, x, w, stride, padding, dilation, xsum=None):
        a, px, pw, saved = window_sums_forward(x, w, stride, padding, dilation, xsum)
        ones_k, mask = saved[3], saved[4]
        with no_autocast(x.device):
            n = F.conv2d(mask, ones_k, stride=stride, padding=padding, dilation=dilation)
            if conv_may_be_inexact(a):
                for t in (a, px, pw, n):
                    t.round_()
            n_minus_pw = n.mul_(x.shape[1]) - pw  # (1, O, Ho, Wo): small
            if a.dim() == 4 and not a.is_contiguous() and a.is_contiguous(memory_format=torch.channels_last):
                # Elementwise results take their layout from the operands: give the small ones
                # a's layout, or b, c, d come out NCHW under a channels_last model.
                pw, px, n_minus_pw = (t.contiguous(memory_format=torch.channels_last) for t in (pw, px, n_minus_pw))
            b = pw - a
            c = px - a
            d = n_minus_pw - c
        ctx.save_for_backward(*saved)
        ctx.conv = (stride, padding, dilation)
        ctx.in_dtypes = (x.dtype, w.dtype)
        ctx.half = 1.0 if xsum is not None else 0.5  # dL/dxb itself, or dL/dx of +-1 inputs
        return a, b, c, d

    @staticmethod
    def backward(ctx, ga, gb, gc, gd):
        xb, wb, xsum, ones_k, mask, wsum = ctx.saved_tensors
        stride, padding, dilation = ctx.conv
        need_x, need_w = ctx.needs_input_grad[:2]
        half = ctx.half
        relaxed = half == 1.0
        need_xsum = relaxed and ctx.needs_input_grad[5]
        g_a, scale = _weighted_sum(((ga, 1.0), (gd, 1.0), (gb, -1.0), (gc, -1.0)))
        g_px = _diff_of_sums(gc, gd, 1)
        g_pw = _diff_of_sums(gb, gd, 0)
        conv_args = (list(stride), list(padding), list(dilation), False, [0, 0], 1)
        grad_x = grad_w = None
        with no_autocast(xb.device):
            if g_a is not None:
                # dL/da = scale * g_a; scale and dL/dx = dL/dxb / 2 both go into the small weight.
                gx, gw, _ = torch.ops.aten.convolution_backward(
                    g_a, xb, wb * (half * scale), None, *conv_args, [need_x, need_w, False]
                )
                grad_x = gx
                grad_w = gw.mul_(0.5 * scale) if gw is not None else None
            grad_xsum = None
            if ((need_x and not relaxed) or need_xsum) and g_px is not None:
                gxs, _, _ = torch.ops.aten.convolution_backward(
                    g_px, xsum, ones_k * half, None, *conv_args, [True, False, False]
                )
                if relaxed:  # bnn/nn/relax.py adds the two (and halves them) in its own pass
                    grad_xsum = gxs
                else:
                    grad_x = gxs.expand_as(xb) if grad_x is None else grad_x.add_(gxs)
            if need_w and g_pw is not None:
                _, gws, _ = torch.ops.aten.convolution_backward(
                    g_pw, mask, wsum, None, *conv_args, [False, True, False]
                )
                gws.mul_(0.5)
                grad_w = gws.expand_as(wb) if grad_w is None else grad_w.add_(gws)
        if grad_x is not None:
            grad_x = grad_x.to(ctx.in_dtypes[0]) if need_x else None
        if grad_w is not None:
            grad_w = grad_w.to(ctx.in_dtypes[1]) if need_w else None
        return grad_x, grad_w, None, None, None, grad_xsum


def _weighted_sum(terms):
    """(t, scale) with sum(weight * g for g, weight in terms) == scale * t; None for no terms.

    Identical tensors (the same object, as autograd hands out for x+y) are merged first, so
    the full-size passes are one fewer than the distinct tensors, and none for a single one.
    """
    # A list searched with ``is``, not a dict keyed by id(): TorchDynamo (torch 2.11, seen on
    # CUDA) cannot trace id() of a tensor made inside the graph, and broke torch.compile of the
    # backward.
    merged: list[list] = []
    for g, weight in terms:
        if g is None:
            continue
        for entry in merged:
            if entry[0] is g:
                entry[1] += weight
                break
        else:
            merged.append([g, weight])
    parts = [(g, weight) for g, weight in merged if weight != 0.0]
    if not parts:
        return None, 0.0
    (first, scale), rest = parts[0], parts[1:]
    if not rest:
        return first, scale
    # Weights are +-1 or +-2, so the ratios are exact powers of two.
    out = torch.add(first, rest[0][0], alpha=rest[0][1] / scale)
    for g, weight in rest[1:]:
        out.add_(g, alpha=weight / scale)
    return out, scale


def _diff_of_sums(plus, minus, dim):
    if plus is None and minus is None:
        return None
    if minus is None:
        return plus.sum(dim, keepdim=True)
    if plus is None:
        return -minus.sum(dim, keepdim=True)
    return plus.sum(dim, keepdim=True).sub_(minus.sum(dim, keepdim=True))


class _CountsDense(torch.autograd.Function):
    # The 1x1 case of the algebra above: px = row sums of xb, pw = row sums of wb, n = K.
    @staticmethod
    def forward(ctx, x, w):
        dtype = compute_dtype(x)
        with no_autocast(x.device):
            xb = half_plus_half(x.to(dtype))
            wb = half_plus_half(w.to(dtype))
            a = xb @ wb.t()  # GEMMs (MKL, oneDNN, cuBLAS with TF32) sum 0/1 products exactly
            if a.device.type != "cpu":
                a.round_()
            px = xb.sum(1, keepdim=True)
            pw = wb.sum(1).unsqueeze(0)
            b = pw - a
            c = px - a
            d = (x.shape[1] - pw) - c
        ctx.save_for_backward(xb, wb)
        ctx.in_dtypes = (x.dtype, w.dtype)
        return a, b, c, d

    @staticmethod
    def backward(ctx, ga, gb, gc, gd):
        xb, wb = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad
        g_a, scale = _weighted_sum(((ga, 1.0), (gd, 1.0), (gb, -1.0), (gc, -1.0)))
        g_px = _diff_of_sums(gc, gd, 1)
        g_pw = _diff_of_sums(gb, gd, 0)
        grad_x = grad_w = None
        with no_autocast(xb.device):
            if need_x:
                grad_x = torch.zeros_like(xb) if g_a is None else g_a @ (wb * (0.5 * scale))
                if g_px is not None:
                    grad_x.add_(g_px * 0.5)
                grad_x = grad_x.to(ctx.in_dtypes[0])
            if need_w:
                grad_w = torch.zeros_like(wb) if g_a is None else g_a.t() @ (xb * (0.5 * scale))
                if g_pw is not None:
                    grad_w.add_(g_pw.t() * 0.5)
                grad_w = grad_w.to(ctx.in_dtypes[1])
        return grad_x, grad_w


def counts_conv2d(x: torch.Tensor, w: torch.Tensor, stride=1, padding=0, dilation=1, xsum=None):
    """a, b, c, d of a binary 2-D convolution (cross-correlation): x NCHW, w OIHW, +-1 values.

    Padded taps count in none of a, b, c, d. Four float tensors (N, O, Ho, Wo), differentiable. Given
    ``xsum``, ``x`` is already the 0/1 relaxation and ``xsum`` its channel sum (bnn/nn/relax.py's ``relax``).
    """
    if x.dim() != 4:
        raise ValueError(f"x must be NCHW (4-D), got shape {tuple(x.shape)}")
    if w.dim() != 4:
        raise ValueError(f"w must be OIHW (4-D), got shape {tuple(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[1]} channels but w expects {w.shape[1]} (groups=1 only)")
    stride, padding, dilation = (int_pair(v, name) for v, name in ((stride, "stride"), (padding, "padding"),
                                                                   (dilation, "dilation")))
    if min(stride) < 1 or min(dilation) < 1:
        raise ValueError(f"stride and dilation must be >= 1, got stride={stride}, dilation={dilation}")
    if min(padding) < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    # The golden path's rule and words for shapes without a result (a kernel under 1x1, an
    # empty output map); torch would raise its own RuntimeErrors for some, accept others.
    out_h, out_w = window_output_size(x.shape[2], x.shape[3], tuple(w.shape[2:]), stride, padding, dilation)
    _check_exact(compute_dtype(x), x.shape[1] * w.shape[2] * w.shape[3], (w.shape[2], w.shape[3]))
    if 0 in x.shape or 0 in w.shape:
        return _zero_counts(x, w, (x.shape[0], w.shape[0], out_h, out_w))
    return _CountsConv2d.apply(x, w, stride, padding, dilation, xsum)


def window_sizes(x: torch.Tensor, w: torch.Tensor, stride=1, padding=0, dilation=1) -> torch.Tensor:
    """``n = a + b + c + d`` of each window of ``counts_conv2d(x, w, ...)``: (1, 1, Ho, Wo), the
    in-bounds taps times the input channels, as a constant (no gradient) in the counts' dtype.

    What a count convention divides by (refimpl/conventions.py); computed from the geometry alone,
    so it costs one tiny convolution of a mask, not three passes over the counts."""
    dtype = compute_dtype(x)
    with torch.no_grad(), no_autocast(x.device):
        mask = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=dtype, device=x.device)
        ones_k = torch.ones((1, 1) + tuple(w.shape[2:]), dtype=dtype, device=x.device)
        n = F.conv2d(mask, ones_k, stride=stride, padding=padding, dilation=dilation)
        if conv_may_be_inexact(n):
            n.round_()
        return n.mul_(x.shape[1])


def counts_dense(x: torch.Tensor, w: torch.Tensor):
    """a, b, c, d of a binary dense layer: x (N, K), w (M, K), +-1 values -> four (N, M)."""
    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"x must be (N, K) and w (M, K); got shapes {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x rows have {x.shape[1]} elements but w rows have {w.shape[1]}")
    _check_exact(compute_dtype(x), x.shape[1])
    if 0 in x.shape or 0 in w.shape:
        return _zero_counts(x, w, (x.shape[0], w.shape[0]))
    return _CountsDense.apply(x, w)


def _check_exact(dtype: torch.dtype, n: int, kernel=None) -> None:
    # Counts up to n: float32 rounds past 2**24 (16777217 came back as 16777216), silently.
    # The message is built only when raised: under torch.compile the sizes may be symbolic.
    if dtype == torch.float32 and n > FLOAT32_EXACT_COUNT:
        what = "a dense row" if kernel is None else f"a {kernel[0]}x{kernel[1]} window"
        raise ValueError(f"{what} of {n} elements can count past 2**24 = {FLOAT32_EXACT_COUNT}, which float32 "
                         "counts round (docs/design.md section 1); pass float64 tensors")


def _zero_counts(x: torch.Tensor, w: torch.Tensor, shape) -> tuple:
    """The counts when a dimension is empty: no images or filters (an empty result), or no
    channels or input pixels (every window without taps: n = 0, all four counts 0), as refimpl.

    Still functions of x and w, through empty slices: their gradients are zeros of their shapes
    rather than None, as for any other input."""
    tie = x.reshape(-1)[:0].sum() + w.reshape(-1)[:0].sum()  # exactly 0, whatever x and w hold
    zeros = torch.zeros(shape, dtype=compute_dtype(x), device=x.device)
    return tuple(zeros + tie.to(zeros.dtype) for _ in range(4))
