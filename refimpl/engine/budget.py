"""What a plan (``plan.py``) will allocate, counted from the geometry before anything is allocated.

A ``.bnn`` file of a few megabytes can describe a plan of any size: under ``freq`` or ``laplace``
the lookup tables hold one row of ``max(n) + 1`` entries per distinct window size ``n`` of a
layer, so one 4096-channel 64x64 convolution padded 63 on a 64x64 map asks for 1,263 rows of
2**24 + 1 entries (158 GiB); a wide convolution on a large map asks for gigabytes of window sums.
``plan_bytes`` adds up every buffer a plan builds (tables, window sums, GEMM scratch, activations,
packed bits), an upper bound within a small factor, and ``check`` refuses a plan above the limit
in one line, before the first allocation. The limit (``MEMORY_ENV``, in GiB) only refuses: it
never changes how a plan that fits is built, nor any bit of its output.
"""
from __future__ import annotations

import os

import numba

from ..conventions import DEFAULT as RAW_COUNTS
from ..kernels.bits import n_words
from ..kernels.byte_dot import NIBBLES
from ..kernels.geometry import conv_output_size
from ..kernels.scratch import y_scratch_size
from ..kernels.tiling import TILE_CHANNELS, TILE_PIXELS
from ..kernels.window_sums import _tap_ranges
from ._safetensors import ModelFileError
from .format import BinaryUnit, GlobalAvgPool, Pool, Stem

MEMORY_ENV = "BNN_ENGINE_MEMORY_GIB"
DEFAULT_GIB = 8.0
_GIB = float(1 << 30)


class PlanMemoryError(ModelFileError):
    """A plan above the memory limit: one line naming the model, the need and the way to raise it."""


def limit_bytes() -> int:
    """The limit from ``MEMORY_ENV`` (GiB, a number > 0), else ``DEFAULT_GIB``."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if not text:
        return int(DEFAULT_GIB * _GIB)
    try:
        gib = float(text)
    except ValueError:
        gib = float("nan")
    if not (gib > 0 and gib < 1 << 20):
        raise PlanMemoryError(f"{MEMORY_ENV}={text[:40]!r} is not a number of GiB in (0, 1048576); "
                              "set it to e.g. 32, or unset it for the default 8")
    return int(gib * _GIB)


def _table_bytes(ep, conv, h, w) -> int:
    # measure_tables: N_TABLES x (distinct window sizes; one under raw) x (max n + 1) float32,
    # and the per-pixel n, taps and row offsets. From the per-axis tap ranges only: the per-pixel
    # arrays are what is being bounded.
    kh, kw = conv.kernel
    oh = max(conv_output_size(h, kh, conv.stride[0], conv.padding[0], conv.dilation[0]), 1)
    ow = max(conv_output_size(w, kw, conv.stride[1], conv.padding[1], conv.dilation[1]), 1)
    per_pixel = 3 * oh * ow * 8
    if ep.N_TABLES == 0:
        return per_pixel
    ys = _tap_ranges(oh, conv.stride[0], conv.padding[0], conv.dilation[0], kh, h)
    xs = _tap_ranges(ow, conv.stride[1], conv.padding[1], conv.dilation[1], kw, w)
    rows, cols = {int(v) for v in ys[:, 1] - ys[:, 0]}, {int(v) for v in xs[:, 1] - xs[:, 0]}
    if ep.COUNTS == RAW_COUNTS:
        sizes = 1
    elif len(rows) * len(cols) <= 1 << 16:
        sizes = len({r * c for r in rows for c in cols})
    else:
        sizes = len(rows) * len(cols)
    return ep.N_TABLES * sizes * (max(rows) * max(cols) * conv.in_channels + 1) * 4 + per_pixel


def _bits_bytes(n_img, c, h, w, pad) -> int:
    # plan._bits_buffer: the packed activation a binary unit reads, with its padding.
    return 0 if pad is None else n_img * (h + 2 * pad[0]) * (w + 2 * pad[1]) * n_words(c) * 8


def _next_pad(layers, idx):
    # plan._needs_bits, without importing the plan (which imports this module).
    if idx + 1 < len(layers) and isinstance(layers[idx + 1], BinaryUnit):
        nxt = layers[idx + 1]
        convs = [nxt.conv] + ([nxt.down] if nxt.down is not None else [])
        return (max(cv.padding[0] for cv in convs), max(cv.padding[1] for cv in convs))
    return None


def _conv_bytes(conv, g, h, w, threads) -> tuple[int, int]:
    """(bytes of one ``_ConvCounts`` for g images, its output pixels), tables aside."""
    kh, kw = conv.kernel
    oh = conv_output_size(h, kh, conv.stride[0], conv.padding[0], conv.dilation[0])
    ow = conv_output_size(w, kw, conv.stride[1], conv.padding[1], conv.dilation[1])
    p, o, k = max(oh, 1) * max(ow, 1), conv.out_channels, n_words(conv.in_channels)
    panels = (-(-o // TILE_CHANNELS)) * TILE_CHANNELS * kh * kw * k * NIBBLES * 8
    scratch = threads * (kh * kw * k * TILE_PIXELS * NIBBLES + 2 * TILE_CHANNELS * TILE_PIXELS + 64) * 8
    # a (int32), window bases (int64), pw and n - pw (int64) with their float32 forms, taps and n.
    return g * p * (4 * o + 8) + p * o * 24 + p * 24 + panels + scratch, p


def plan_bytes(model, n_img: int) -> int:
    """An upper bound of what ``plan.build_plan(model, n_img)`` allocates, in bytes."""
    threads = numba.config.NUMBA_NUM_THREADS
    ep = model._epilogue
    total = 0
    c, h, w = model.input_shape
    total += n_img * c * h * w * 4  # the caller's input, and its normalized copy in predict
    for idx, layer in enumerate(model.layers):
        pad = _next_pad(model.layers, idx)
        if isinstance(layer, (Stem, BinaryUnit)):
            conv = layer if isinstance(layer, Stem) else layer.conv
            kh, kw = conv.kernel
            oh = conv_output_size(h, kh, conv.stride[0], conv.padding[0], conv.dilation[0])
            ow = conv_output_size(w, kw, conv.stride[1], conv.padding[1], conv.dilation[1])
            oh, ow, o = max(oh, 1), max(ow, 1), conv.out_channels
            p = oh * ow
            if isinstance(layer, Stem):
                total += threads * c * kh * kw * (p + 16) * 4
            else:
                convs = [layer.conv] + ([layer.down] if layer.down is not None else [])
                # Instances: batch 1, a group, the remainder, the whole batch (plan._UnitStep).
                for cv in convs:
                    total += _table_bytes(ep, cv, h, w)
                    for g in (1, n_img, n_img, n_img):
                        total += _conv_bytes(cv, g, h, w, threads)[0]
                total += threads * len(convs) * (TILE_PIXELS * o + 64) * 4 + threads * (2 * TILE_PIXELS + 64) * 4
                total += threads * (y_scratch_size(o) + 64) * 4
                total += 2 * n_img * p * 4
                if layer.shortcut is not None:
                    total += threads * (c + 1) * max(p + 16, c) * 4 + o * c * 4
            # Output activations (two alternating buffers: count both) and the packed bits of the next unit.
            total += 2 * n_img * p * o * 4 + _bits_bytes(n_img, o, oh, ow, pad)
            c, h, w = o, oh, ow
        elif isinstance(layer, Pool):
            (kh, kw), (sh, sw), (ph, pw_) = layer.kernel, layer.stride, layer.padding
            oh, ow = max((h + 2 * ph - kh) // max(sh, 1) + 1, 1), max((w + 2 * pw_ - kw) // max(sw, 1) + 1, 1)
            # The padded copy, the accumulator and its quotient, and the next unit's bits.
            total += n_img * c * ((h + 2 * ph) * (w + 2 * pw_) + 3 * oh * ow) * 4 + _bits_bytes(n_img, c, oh, ow, pad)
            h, w = oh, ow
        elif isinstance(layer, GlobalAvgPool):
            total += n_img * c * 4
            h = w = 1
        else:  # the classifier: its transposed weights and the logits
            total += layer.weight.size * 4 + n_img * layer.weight.shape[0] * 4
    return total


def check(model, n_img: int) -> None:
    """Refuse (``PlanMemoryError``, one line) a plan of ``n_img`` images above ``limit_bytes()``."""
    need, limit = plan_bytes(model, n_img), limit_bytes()
    if need > limit:
        raise PlanMemoryError(
            f"{model.path}: running this model on {n_img} image{'s' if n_img != 1 else ''} at once needs about "
            f"{need / _GIB:.1f} GiB for its tables and buffers, above the engine's limit of {limit / _GIB:.1f} GiB; "
            f"{'use a smaller batch, or ' if n_img > 1 else ''}set {MEMORY_ENV} to a larger number of GiB if this "
            "machine has the memory")
