"""Binary layers: sign with straight-through estimators, counts, measure (docs/design.md section 6).

BatchNorm is not part of the layer; the models put it after.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from refimpl.conventions import DEFAULT, check_counts
from refimpl.genome import Genome
from refimpl.kernels.geometry import int_pair

from ..settings import MEASURE_IMPLS
from .counts import counts_conv2d, counts_dense, window_sizes
from .measure import convert_counts, initial_alpha, measure
from .relax import applies as relax_applies
from .relax import relax


def sign(x: torch.Tensor) -> torch.Tensor:
    """+1 where ``x >= 0``, else -1: zero maps to +1 (unlike ``torch.sign``; docs/design.md section 1)."""
    return torch.where(x >= 0, x.new_ones(()), x.new_full((), -1.0))


class _SteSign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip_value):
        ctx.clip_value = clip_value
        if clip_value is not None:
            ctx.save_for_backward(x)
        return sign(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.clip_value is None:
            return grad, None
        (x,) = ctx.saved_tensors
        return torch.where(x.abs() <= ctx.clip_value, grad, grad.new_zeros(())), None


def ste_sign(x: torch.Tensor, clip_value: float | None = 1.0) -> torch.Tensor:
    """``sign(x)`` forward; backward passes the gradient where ``|x| <= clip_value``.

    ``clip_value=1.0`` is the clipped identity used for activations, ``None`` the plain identity
    used for weights (docs/design.md section 6).
    """
    if clip_value is not None and not clip_value > 0:
        raise ValueError(f"clip_value must be a positive number or None, got {clip_value!r}")
    return _SteSign.apply(x, clip_value)


class _ClipMeasureGrad(torch.autograd.Function):
    # Identity forward (the values are the inputs'); backward: each gradient with NaN -> 0, then clamped to
    # [-limit, limit] (so +-inf -> +-limit), in place on the gradient autograd hands over.
    @staticmethod
    def forward(ctx, limit, *counts):
        ctx.limit = limit
        return tuple(t.view_as(t) for t in counts)

    @staticmethod
    def backward(ctx, *grads):
        limit = ctx.limit
        return (None, *(None if g is None else torch.nan_to_num(g, nan=0.0).clamp_(-limit, limit) for g in grads))


def clip_measure_grad(counts, limit: float | None):
    """``counts`` unchanged forward; backward, the gradients reaching them with NaN as 0 and clamped to
    [-limit, limit] (docs/design.md section 6, ``--measure-grad-clip``). ``None``: the counts themselves."""
    if check_measure_grad_clip(limit) is None:
        return tuple(counts)
    return _ClipMeasureGrad.apply(float(limit), *counts)


# The clip is applied to float32 gradients (torch.clamp takes it as a float32 scalar there): a
# finite double above float32's largest, 1e39, is inf in float32 and crashed the first backward.
FLOAT32_MAX = 3.4028234663852886e38


def check_measure_grad_clip(limit):
    """``limit`` if it is None (off) or a number in (0, float32's largest], else a one-line ValueError."""
    if limit is not None and not (isinstance(limit, (int, float)) and not isinstance(limit, bool)
                                  and math.isfinite(limit) and 0 < limit <= FLOAT32_MAX):
        raise ValueError(f"measure_grad_clip must be a number > 0 and at most {FLOAT32_MAX:.7g} (float32's largest), "
                         f"or None (off), got {limit!r}")
    return limit


def check_measure_impl(impl) -> str:
    """``impl`` if it names a measure implementation (MEASURE_IMPLS), else a one-line ValueError."""
    if not isinstance(impl, str) or impl not in MEASURE_IMPLS:
        raise ValueError(f"unknown measure_impl {impl!r}; choose one of {', '.join(MEASURE_IMPLS)}")
    return impl


class BinaryMeasureLayer(nn.Module):
    """What BinaryConv2d and BinaryLinear share: the genome, the count convention, alpha, and the
    measure of the counts (eager, or fused where it applies); the layer a probe or a training
    option looks for."""

    # Training options, not part of the model (the forward's values are unchanged, or the same up to
    # float32 rounding): bnn.train --measure-grad-clip and --measure-impl.
    measure_grad_clip: float | None = None
    measure_impl: str = "eager"  # "fused": bnn.nn.measure_fused where it applies (float32 CPU, not compiling)

    def _init_measure(self, measure_spec, out_units: int, counts: str) -> None:
        self.genome = Genome.parse(measure_spec)
        self.counts = check_counts(counts)  # the count convention (refimpl/conventions.py)
        # One alpha row per unary slot; rows of slots whose operator ignores alpha stay at 0 and
        # get no gradient.
        self.alpha = nn.Parameter(initial_alpha(self.genome, out_units))

    def _measure(self, a, b, c, d):
        # The counts arrive converted (_converted): measure_op.py replaces this method alone.
        return measure(self.genome, a, b, c, d, self.alpha)

    def _converted(self, counts, n):
        return clip_measure_grad(convert_counts(self.counts, *counts, n), self.measure_grad_clip)

    def _measure_counts(self, counts, n):
        # The measure of the counts as counted (n: the windows' sizes, None under raw counts).
        if self.measure_impl == "fused" and not torch.compiler.is_compiling():
            from .measure_fused import measure_counts  # Numba and code generation, only when used

            out = measure_counts(self, counts, n)
            if out is not None:
                return out
        return self._measure(*self._converted(counts, n))


def set_measure_grad_clip(model: nn.Module, limit: float | None) -> nn.Module:
    """Clip the gradients reaching every binary layer's measure inputs to [-limit, limit] (NaN -> 0) in
    training, or (``None``) not; the forward is unchanged. Returns ``model``."""
    check_measure_grad_clip(limit)  # a bad limit is refused before any layer changes
    for layer in model.modules():
        if isinstance(layer, BinaryMeasureLayer):
            layer.measure_grad_clip = limit
    return model


def set_measure_impl(model: nn.Module, impl: str) -> nn.Module:
    """How every binary layer evaluates its measure in training: ``"eager"`` (torch operators, one pass
    each) or ``"fused"`` (bnn/nn/measure_fused.py's Numba kernels where they apply: float32 CPU
    counts outside torch.compile; eager elsewhere). Returns ``model``."""
    check_measure_impl(impl)
    for layer in model.modules():
        if isinstance(layer, BinaryMeasureLayer):
            layer.measure_impl = impl
    return model


def use_fused_measure(model: nn.Module) -> nn.Module:
    """Route every binary layer of ``model`` through the fused kernels where they apply (in place;
    returns ``model``): ``set_measure_impl(model, "fused")``."""
    return set_measure_impl(model, "fused")


class BinaryConv2d(BinaryMeasureLayer):
    """``measure(counts(sign(x), sign(w)))``; no bias, no BatchNorm (the model adds it)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, measure="baseline",
                 counts=DEFAULT):
        super().__init__()
        kh, kw = int_pair(kernel_size, "kernel_size")
        for value, name in ((stride, "stride"), (padding, "padding"), (dilation, "dilation")):
            int_pair(value, name)  # a stride of 1.7 or "1" is refused here, not truncated at the first forward
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding, self.dilation = (kh, kw), stride, padding, dilation
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kh, kw))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Conv2d's initialization
        self._init_measure(measure, out_channels, counts)

    def forward(self, x):
        """Measure values (N, O, Ho, Wo) of the counts between sign(x) (N, C, H, W) and the signed weights."""
        geometry = (self.stride, self.padding, self.dilation)
        if relax_applies(x):  # ste_sign(x, 1.0) and the count convolution's 0/1 relaxation in one pass each way
            xb, xsum = relax(x)
            counts = counts_conv2d(xb, ste_sign(self.weight, None), *geometry, xsum=xsum)
        else:
            counts = counts_conv2d(ste_sign(x, 1.0), ste_sign(self.weight, None), *geometry)
        n = window_sizes(x, self.weight, *geometry) if self.counts != "raw" else None
        return self._measure_counts(counts, n)

    def extra_repr(self):
        """The constructor's arguments and the measure's genome, for ``print(model)``."""
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}, measure='{self.genome}', counts='{self.counts}'"
        )


class BinaryLinear(BinaryMeasureLayer):
    """``measure(counts(sign(x), sign(w)))`` of a dense layer; no bias."""
    def __init__(self, in_features, out_features, measure="baseline", counts=DEFAULT):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self._init_measure(measure, out_features, counts)

    def forward(self, x):
        """Measure values (N, O) of the counts between sign(x) (N, I) and the signed weights."""
        counts = counts_dense(ste_sign(x, 1.0), ste_sign(self.weight, None))
        return self._measure_counts(counts, self.in_features)

    def extra_repr(self):
        """The layer's sizes, the measure's genome and the count convention, for ``print(model)``."""
        return f"{self.in_features}, {self.out_features}, measure='{self.genome}', counts='{self.counts}'"


_BinaryMeasureLayer = BinaryMeasureLayer  # its name before it was public (issue 38)
