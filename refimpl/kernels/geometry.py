"""Convolution geometry and the checks of the counts' arguments, shared by both paths
(``bnn/nn/counts.py`` imports them, so the two refuse the same input in the same words)."""
from __future__ import annotations

import operator

import numpy as np

# float32 holds every integer up to this and not one more: the largest window (n) a float32
# count, or the engine's float32 epilogue, takes exactly (docs/design.md section 1).
FLOAT32_EXACT_COUNT = 1 << 24

KERNELS = ("blocked", "simple")


def int_pair(value, name: str) -> tuple[int, int]:
    """A geometry value (an int or a pair of ints) as a pair of ints, or a ValueError naming
    ``name``: 1.7 is not truncated to 1, nor "1" or True read as 1."""
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    try:
        if len(pair) != 2 or any(isinstance(v, (bool, np.bool_)) for v in pair):
            raise TypeError
        return tuple(operator.index(v) for v in pair)  # ints and NumPy integers, never floats or text
    except TypeError:
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}") from None


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output length of one axis of a convolution (torch's formula; <= 0 when nothing fits)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def window_output_size(h: int, w: int, kernel, stride, padding, dilation) -> tuple[int, int]:
    """(Ho, Wo) of a counts convolution over an h x w input, or the ValueError for a geometry
    without a result: a kernel under 1x1, or an empty output map."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"stride and dilation must be >= 1 and padding >= 0, got stride={tuple(stride)}, "
                         f"padding={tuple(padding)}, dilation={tuple(dilation)}")
    if kh < 1 or kw < 1:
        raise ValueError(f"the kernel is {kh}x{kw}; it must be at least 1x1")
    out_h = conv_output_size(h, kh, sh, ph, dh)
    out_w = conv_output_size(w, kw, sw, pw, dw)
    if out_h <= 0 or out_w <= 0:
        raise ValueError(
            f"output would be {out_h}x{out_w}: a {kh}x{kw} kernel (dilation {tuple(dilation)}) does not fit "
            f"a {h}x{w} input with padding {tuple(padding)}"
        )
    return out_h, out_w


def check_kernel(kernel) -> str:
    """The counts kernel asked for: ``"blocked"`` (None too) or ``"simple"``."""
    kernel = kernel or "blocked"
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; valid kernels are 'blocked' and 'simple'")
    return kernel


def conv_arguments(stride, padding, dilation) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(stride, padding, dilation) as pairs, stride and dilation at least 1, padding at least 0."""
    pairs = int_pair(stride, "stride"), int_pair(padding, "padding"), int_pair(dilation, "dilation")
    for name, value, given in (("stride", pairs[0], stride), ("dilation", pairs[2], dilation)):
        if min(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {given!r}")
    if min(pairs[1]) < 0:
        raise ValueError(f"padding must be >= 0, got {padding!r}")
    return pairs
