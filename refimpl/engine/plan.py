"""The engine's plan of a model for one batch size: one callable step per layer, with its
buffers, GEMM indexing and window sums prepared once (a batch-1 call allocates nothing beyond
the outputs it returns).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from ..conventions import DEFAULT as RAW_COUNTS
from ..kernels import blocked
from ..kernels.bits import n_words
from ..kernels.geometry import conv_output_size
from ..kernels.scratch import thread_rows, y_scratch
from ..kernels.tiling import TILE_PIXELS
from ..kernels.window_sums import in_bounds_taps, weight_window_sums
from . import budget, epilogue
from .float_kernels import RUN_THREADS, global_mean, linear, pack_padded, real_shortcut, run_kernel, stem
from .format import BinaryConv, BinaryUnit, GlobalAvgPool, Pool, Stem

_NO_BITS = np.zeros((1, 1, 1, 1), dtype=np.uint64)
_NO_TABLES = np.zeros((1, 1), dtype=np.float32)
_NO_TAILS = np.zeros(1, dtype=np.int64)


def measure_tables(ep, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tab (K, R*L) float32, toff (P,) int64, tails (K,) int64): the lookup tables of the genome
    module ``ep``'s one-count subtrees for windows of sizes ``n`` (P,), one row of L = max(n) + 1
    entries per distinct size (one row under raw counts, whose values do not depend on n), each
    pixel's row offset, and where each of the module's ``TAIL_TABLES`` becomes constant: the
    first count from which every entry has the last entry's bits (L for the other tables)
    (refimpl/codegen/measure_tables.py). Built once per module and set of sizes."""
    if ep.N_TABLES == 0:
        return _NO_TABLES, np.zeros(n.shape[0], dtype=np.int64), _NO_TAILS
    if ep.COUNTS == RAW_COUNTS:
        ns, rows = n.max(keepdims=True), np.zeros(n.shape[0], dtype=np.int64)
    else:
        ns, rows = np.unique(n, return_inverse=True)
    length = int(n.max()) + 1
    cache = ep.__dict__.setdefault("_TABLES", {})
    key = (ns.tobytes(), length)
    if key not in cache:
        tab = np.empty((ep.N_TABLES, ns.shape[0], length), dtype=np.float32)
        ep.build_tables(ns.astype(np.int64), tab)
        _check_cube_products(ep, tab)
        tail = np.full(ep.N_TABLES, length, dtype=np.int64)
        for k in ep.TAIL_TABLES:  # raw counts only: one row
            bits = tab[k, 0].view(np.uint32)
            differs = np.flatnonzero(bits != bits[-1])
            tail[k] = differs[-1] + 1 if differs.size else 0
        cache[key] = tab.reshape(ep.N_TABLES, -1), tail
    tab, tail = cache[key]
    return tab, np.ascontiguousarray(rows.reshape(-1) * length, dtype=np.int64), tail


def _check_cube_products(ep, tab: np.ndarray) -> None:
    """The epilogue takes a cube table's entries below ``CUBE_EXACT`` as products
    (refimpl/codegen/measure_tables.py): refuse to run if one of them is not its product."""
    for k in ep.CUBE_TABLES:
        x = np.arange(min(tab.shape[2], int(ep.CUBE_EXACT)), dtype=np.float32)
        if not np.array_equal(tab[k, 0, :x.size].view(np.uint32), ((x * x) * x).view(np.uint32)):
            raise RuntimeError(f"refimpl: internal error: the cube table of genome {ep.GENOME} differs from the "
                               "product below its exact limit; please report this with `python -m refimpl.info`")


class _Gemm:
    """``a`` (N, Ho*Wo, O) int32, channels last, of one binary convolution over a padded word buffer."""

    def __init__(self, conv: BinaryConv, n_img, h, w, buf_pad, out_h, out_w):
        # Prepared once per plan: at batch 1 the preparation costs more than the arithmetic.
        self.plan = blocked.ConvPlan(conv.bits, n_img, h, w, conv.stride, conv.padding, conv.dilation,
                                     buffer_padding=buf_pad, layout="nhwc")
        self.a = np.empty((n_img, out_h * out_w, conv.out_channels), dtype=np.int32)

    def __call__(self, bits: np.ndarray, px: np.ndarray | None = None) -> np.ndarray:
        return self.plan(bits.reshape(-1), self.a, threads=RUN_THREADS[0], px=px)


class _ConvCounts:
    """Everything per (binary convolution, group of images): GEMM, window sums, buffers."""

    def __init__(self, conv: BinaryConv, n_img, h, w, buf_pad, ep):
        kh, kw = conv.kernel
        out_h = conv_output_size(h, kh, conv.stride[0], conv.padding[0], conv.dilation[0])
        out_w = conv_output_size(w, kw, conv.stride[1], conv.padding[1], conv.dilation[1])
        if out_h <= 0 or out_w <= 0:
            raise ValueError(f"{conv.name}: a {kh}x{kw} kernel does not fit a {h}x{w} input")
        self.conv, self.out_h, self.out_w = conv, out_h, out_w
        self.gemm = _Gemm(conv, n_img, h, w, buf_pad, out_h, out_w)
        ys, xs, taps = in_bounds_taps(h, w, kh, kw, conv.stride, conv.padding, conv.dilation)
        pw = np.empty((conv.out_channels, out_h, out_w), dtype=np.int64)
        weight_window_sums(conv.taps, ys, xs, pw)
        self.pw = pw.reshape(conv.out_channels, -1)
        self.n = taps * conv.in_channels
        # The epilogue's float32 forms (exact: integers below 2**24), channels last (P, O).
        self.pw_f = np.ascontiguousarray(self.pw.T, dtype=np.float32)
        self.npw_f = np.ascontiguousarray((self.n[None, :] - self.pw).T, dtype=np.float32)
        self.tab, self.toff, self.tails = measure_tables(ep, self.n)

    def __call__(self, bits, px):
        """``a`` of the images in ``bits``, and their window popcounts into ``px`` (N, Ho*Wo)."""
        return self.gemm(bits, px)

    def counts(self, a, px):
        """a, b, c, d (N, O, Ho, Wo) int64 (NCHW, as torch has them) from the identities, for debug mode."""
        a = a.transpose(0, 2, 1).astype(np.int64)
        px, pw, n = px.astype(np.int64)[:, None, :], self.pw[None], self.n[None, None]
        shape = (a.shape[0], a.shape[1], self.out_h, self.out_w)
        return tuple(v.reshape(shape) for v in (a, pw - a, px - a, n - px - pw + a))


# Images per GEMM + epilogue round: the int32 ``a`` of a group (and pw) stays in L2 between the
# GEMM that writes it and the epilogue that reads it. With the whole batch at once, ``a`` of a
# 64-channel 32x32 layer at batch 64 is 16 MB, and both passes ran at DRAM speed (measured with
# int64 counts: the epilogue at 2.7 ns per output instead of 1.4).
GROUP_BYTES = 1 << 19


# A unit runs fused (GEMM + epilogue per tile) when it has at least this many tiles of
# TILE_PIXELS pixels per thread; below that (batch 1 on 8x8 and 4x4 maps) every thread needs a
# share of the output channels of a tile too, which only the two-pass path splits.
FUSED_MIN_TILES_PER_THREAD = 8


def _group_size(n_img, out_channels, positions):
    return max(1, min(n_img, GROUP_BYTES // (4 * out_channels * positions)))


def _epilogue_chunk(n_img, positions, channels):
    """Pixels per task of the epilogue: about four tasks per thread, each of at least 2048
    outputs (below that the parallel loop's setup shows), never past one image."""
    per_task = -(-n_img * positions // (4 * RUN_THREADS[0]))
    return max(1, min(positions, max(per_task, -(-2048 // channels))))


# ----------------------------------------------------------------------------------------------
# Plans: one callable step per layer, with its buffers
# ----------------------------------------------------------------------------------------------
@dataclass
class _Plan:
    steps: list


def _needs_bits(layers, idx):
    """The padding of the binary unit right after layer idx, or None if the next layer is not one."""
    if idx + 1 < len(layers) and isinstance(layers[idx + 1], BinaryUnit):
        nxt = layers[idx + 1]
        convs = [nxt.conv] + ([nxt.down] if nxt.down is not None else [])
        return (max(c.padding[0] for c in convs), max(c.padding[1] for c in convs))
    return None


def _bits_buffer(n_img, c, h, w, pad):
    return np.zeros((n_img, h + 2 * pad[0], w + 2 * pad[1], n_words(c)), dtype=np.uint64)


class _Step:
    label = "?"
    bits_out = None  # the packed activation this step leaves for the next binary unit


class _Activations:
    """Two float32 buffers that the steps' outputs alternate between.

    A step reads only the output of the step before it (its input and identity residual), so
    two buffers suffice. One buffer per step made a batch-64 ResNet-18 stream 136 MB of
    activations per run, past what the caches hold; there the epilogues ran at DRAM speed
    (measured with a copy loop on this host: 50 GB/s over 16 MB, 22 GB/s cycling 256 MB).
    """

    def __init__(self):
        self.buffers = [np.empty(0, dtype=np.float32), np.empty(0, dtype=np.float32)]
        self.turn = 0

    def take(self, shape) -> np.ndarray:
        size = int(np.prod(shape))
        slot, self.turn = self.turn, 1 - self.turn
        if self.buffers[slot].size < size:
            # Steps that took views of the old buffer keep it alive; only later steps move.
            self.buffers[slot] = np.empty(size, dtype=np.float32)
        return self.buffers[slot][:size].reshape(shape)


def build_plan(model, n_img: int) -> _Plan:
    """The steps of ``model`` (a ``Model``: its layers and epilogue) for batches of ``n_img``;
    ``budget.PlanMemoryError`` (one line) before any allocation if they would not fit the limit."""
    budget.check(model, n_img)
    steps = []
    arena = _Activations()
    c, h, w = model.input_shape
    prev_bits = None
    for idx, layer in enumerate(model.layers):
        nxt_pad = _needs_bits(model.layers, idx)
        if isinstance(layer, Stem):
            step = _StemStep(layer, n_img, c, h, w, nxt_pad, arena)
        elif isinstance(layer, BinaryUnit):
            step = _UnitStep(model, layer, n_img, c, h, w, prev_bits, nxt_pad, arena)
        elif isinstance(layer, Pool):
            step = _PoolStep(layer, n_img, c, h, w, nxt_pad)
        elif isinstance(layer, GlobalAvgPool):
            step = _GlobalPoolStep()
        else:
            step = _LinearStep(layer)
        c, h, w = getattr(step, "out_chw", (c, h, w))
        prev_bits = step.bits_out
        steps.append(step)
    return _Plan(steps)


class _StemStep(_Step):
    def __init__(self, layer, n_img, c, h, w, nxt_pad, arena):
        self.label = "stem"
        self.layer = layer
        kh, kw = layer.kernel
        (sh, sw), (ph, pw_), (dh, dw) = layer.stride, layer.padding, layer.dilation
        self.out_h = conv_output_size(h, kh, sh, ph, dh)
        self.out_w = conv_output_size(w, kw, sw, pw_, dw)
        o = layer.out_channels
        self.out_chw = (o, self.out_h, self.out_w)
        # (C*KH*KW, O) weight matrix, rows in the order of the im2col columns below.
        self.wmat = np.ascontiguousarray(layer.weight.reshape(o, -1).T)
        self.pad = nxt_pad
        self.bits_out = _bits_buffer(n_img, o, self.out_h, self.out_w, nxt_pad) if nxt_pad else None
        # Buffers reused by every run (fresh ones cost a page fault per 4 KB at batch 64); the
        # im2col columns are per thread.
        # Rows of 1024 floats are 4 KB apart and all fall in one L1 set: the stem tile reads 27
        # of them at once. A few floats of padding per row spread them (measured: 2.2 -> 1.1 ms).
        self.cols = np.empty((numba.config.NUMBA_NUM_THREADS, c * kh * kw, self.out_h * self.out_w + 16),
                             dtype=np.float32)
        self.y = arena.take((n_img, self.out_h * self.out_w, o))

    def __call__(self, x, record):
        L = self.layer
        pack = self.bits_out is not None
        pad = self.pad if pack else (0, 0)
        run_kernel(stem, x.shape[0], x, self.wmat, L.scale, L.shift, *L.kernel, *L.stride, *L.padding,
                   *L.dilation, self.out_w, self.cols, self.y, pack, pad[0], pad[1], self.bits_out if pack else _NO_BITS)
        return self.y.reshape(x.shape[0], self.out_h, self.out_w, -1)


class _UnitStep(_Step):
    def __init__(self, model, layer, n_img, c, h, w, prev_bits, nxt_pad, arena):
        self.label = layer.name
        self.layer = layer
        self.ep = model._epilogue
        conv, down = layer.conv, layer.down
        pad = _needs_bits([None, layer], 0)
        self.bits_in = prev_bits  # written by the previous step
        if prev_bits is None or prev_bits.shape[1:3] != (h + 2 * pad[0], w + 2 * pad[1]):
            raise AssertionError("plan: the previous step did not pack for this unit")
        main = _ConvCounts(conv, 1, h, w, pad, self.ep)
        oh, ow = main.out_h, main.out_w
        self.group = _group_size(n_img, conv.out_channels, oh * ow)
        # One set of counts/buffers per group size: full groups, and the remainder if any.
        self.counts = {}
        for g in {self.group, n_img % self.group} - {0}:
            m = _ConvCounts(conv, g, h, w, pad, self.ep)
            d = _ConvCounts(down, g, h, w, pad, self.ep) if down is not None else None
            if d is not None and (d.out_h, d.out_w) != (oh, ow):
                raise ValueError(f"{layer.name}: shortcut output {d.out_h}x{d.out_w} != conv output {oh}x{ow}")
            self.counts[g] = (m, d)
        # The fused path (the epilogue's ``fused_*``): GEMM and epilogue per tile in one
        # parallel loop over the whole batch, so ``a`` never leaves L1 and a layer is one
        # parallel region instead of two per group.
        if n_img in self.counts:
            self.whole = self.counts[n_img]
        else:
            m = _ConvCounts(conv, n_img, h, w, pad, self.ep)
            self.whole = (m, _ConvCounts(down, n_img, h, w, pad, self.ep) if down is not None else None)
        self.n_tiles = -(-n_img * oh * ow // TILE_PIXELS)
        threads = numba.config.NUMBA_NUM_THREADS
        self.ascratch = [thread_rows(threads, TILE_PIXELS * conv.out_channels, np.int32)
                         for _ in range(2 if down is not None else 1)]
        self.pxscratch = thread_rows(threads, 2 * TILE_PIXELS, np.float32)
        # The measure's y of a block of rows (epilogue_template.py's ROWS_SIGNATURE) per thread.
        self.yscratch = y_scratch(conv.out_channels, threads)
        self.out_chw = (conv.out_channels, oh, ow)
        self.out_shape = (n_img, oh * ow, conv.out_channels)
        # A real shortcut fills the output buffer first; the epilogue adds into it as for identity.
        self.mode = "identity" if layer.residual == "real" else layer.residual
        self.shortcut = layer.shortcut
        if self.shortcut is not None:
            kh, kw = self.shortcut.pool
            # (I, O): one input channel's row per fma step
            self.shortcut_wt = np.ascontiguousarray(self.shortcut.weight.reshape(conv.out_channels, c).T)
            if (-(-h // kh), -(-w // kw)) != (oh, ow):
                raise ValueError(f"{layer.name}: shortcut output {-(-h // kh)}x{-(-w // kw)} != conv output {oh}x{ow}")
            # The pooled image per thread, (C, P) as the stem's im2col; 16 floats of row padding
            # spread rows that would be 4 KB apart over L1 sets (see _StemStep).
            # One spare row holds a window's sums while they are formed.
            self.cols = np.empty((numba.config.NUMBA_NUM_THREADS, c + 1, max(oh * ow + 16, c)), dtype=np.float32)
        # An identity unit adds its output into its input's buffer, in place (the epilogue's
        # template says why); the others write a buffer of their own.
        self.out = None if layer.residual == "identity" else arena.take(self.out_shape)
        self.px = np.empty((n_img, oh * ow), dtype=np.float32)
        self.px2 = np.empty((n_img, oh * ow), dtype=np.float32) if down is not None else None
        self.pack = nxt_pad is not None
        self.pad = nxt_pad or (0, 0)
        self.bits_out = _bits_buffer(n_img, conv.out_channels, oh, ow, nxt_pad) if self.pack else None

    def __call__(self, x, record):
        L, conv = self.layer, self.layer.conv
        n_img = x.shape[0]
        # The residual: the input itself, which the epilogue then overwrites with the output.
        out = x.reshape(self.out_shape) if L.residual == "identity" else self.out
        if self.shortcut is not None:
            s = self.shortcut
            run_kernel(real_shortcut, n_img, np.ascontiguousarray(x), *s.pool, self.shortcut_wt, s.scale, s.shift,
                       self.out_chw[2], self.cols, out)
        debug = [] if record is not None else None
        if record is None and self.n_tiles >= FUSED_MIN_TILES_PER_THREAD * RUN_THREADS[0]:
            self._run_fused(out)
            oc, oh, ow = self.out_chw
            return out.reshape(n_img, oh, ow, oc)
        for g0 in range(0, n_img, self.group):
            g1 = min(n_img, g0 + self.group)
            main, down = self.counts[g1 - g0]
            bits_in = self.bits_in[g0:g1]  # contiguous: a slice of whole images
            px = self.px[g0:g1]
            a = main(bits_in, px)
            bits = self.bits_out[g0:g1] if self.pack else _NO_BITS
            chunk = _epilogue_chunk(g1 - g0, a.shape[1], a.shape[2])
            tail = (self.yscratch, out[g0:g1], bits, self.pack, main.out_w, self.pad[0], self.pad[1], chunk)
            head = (a, px, main.pw_f, main.npw_f, conv.alpha, conv.scale, conv.shift, main.tab, main.toff, main.tails)
            a2 = None
            tasks = (g1 - g0) * -(-a.shape[1] // chunk)
            if L.residual == "none":
                run_kernel(epilogue.kernel(self.ep, "epilogue_none"), tasks, *head, *tail)
            elif self.mode == "identity":
                run_kernel(epilogue.kernel(self.ep, "epilogue_identity"), tasks, *head, *tail)
            else:
                d = L.down
                px2 = self.px2[g0:g1]
                a2 = down(bits_in, px2)
                run_kernel(epilogue.kernel(self.ep, "epilogue_down"), tasks,
                           *head, a2, px2, down.pw_f, down.npw_f, d.alpha, d.scale, d.shift, down.tab, down.toff, down.tails, *tail)
            if debug is not None:
                debug.append((main.counts(a, px), down.counts(a2, px2) if a2 is not None else None))
        oc, oh, ow = self.out_chw
        y = out.reshape(n_img, oh, ow, oc)
        if record is not None:
            joined = [np.concatenate([grp[0][k] for grp in debug]) for k in range(4)]
            record.append({"name": conv.name, **dict(zip("abcd", joined)), "y": y.transpose(0, 3, 1, 2).copy()})
            if L.down is not None:
                joined = [np.concatenate([grp[1][k] for grp in debug]) for k in range(4)]
                record.append({"name": L.down.name, **dict(zip("abcd", joined))})
        # ``y`` is a plan buffer, overwritten later in this run (an identity unit adds into it in
        # place) and by the next run; the next layer consumes it before that, debug records
        # copy it, and run() returns only the classifier's fresh array.
        return y

    def _run_fused(self, out):
        L, conv = self.layer, self.layer.conv
        main, down = self.whole
        mp = main.gemm.plan
        gemm = (self.bits_in.reshape(-1), mp.panels, mp.k_words, mp.taps_off, mp.bases)
        epi = (main.pw_f, main.npw_f, conv.alpha, conv.scale, conv.shift, main.tab, main.toff, main.tails)
        tail = (out, self.bits_out if self.pack else _NO_BITS, self.pack, main.out_w, self.pad[0], self.pad[1])
        scratch = (mp.xscratch, mp.bscratch, self.ascratch[0])
        kernel = epilogue.kernel(self.ep, f"fused_{self.mode}")
        if self.mode in ("none", "identity"):
            kernel(*gemm, *scratch, self.pxscratch, self.yscratch, *epi, *tail)
        else:
            d, dp = L.down, down.gemm.plan
            kernel(*gemm, dp.panels, dp.taps_off, dp.bases, *scratch, self.ascratch[1], self.pxscratch, self.yscratch,
                   *epi, down.pw_f, down.npw_f, d.alpha, d.scale, d.shift, down.tab, down.toff, down.tails, *tail)

    def convs(self):
        """(Conv, out_h, out_w) of the unit's convolutions, for benchmarks."""
        main, down = next(iter(self.counts.values()))
        return [(cc.conv, cc.out_h, cc.out_w) for cc in (main, down) if cc is not None]

    def run_gemm(self, which: int):
        """The popcount GEMMs alone of convolution ``which`` (0 conv, 1 down) over the batch."""
        n_img = self.out_shape[0]
        for g0 in range(0, n_img, self.group):
            g1 = min(n_img, g0 + self.group)
            self.counts[g1 - g0][which].gemm(self.bits_in[g0:g1])


class _PoolStep(_Step):
    def __init__(self, layer, n_img, c, h, w, nxt_pad):
        self.label = layer.op
        self.layer = layer
        (kh, kw), (sh, sw), (ph, pw_) = layer.kernel, layer.stride, layer.padding
        self.out_h = (h + 2 * ph - kh) // sh + 1
        self.out_w = (w + 2 * pw_ - kw) // sw + 1
        self.out_chw = (c, self.out_h, self.out_w)
        self.pad = nxt_pad
        self.bits_out = _bits_buffer(n_img, c, self.out_h, self.out_w, nxt_pad) if nxt_pad else None

    def __call__(self, x, record):
        # x (N, H, W, C), channels last like every activation of the engine.
        L = self.layer
        (kh, kw), (sh, sw), (ph, pw_) = L.kernel, L.stride, L.padding
        is_max = L.op == "maxpool2d"
        if ph or pw_:
            # Max-pool pads with -inf (never chosen); avg-pool with zeros (counted in the divisor
            # when count_include_pad, torch's default).
            fill = -np.inf if is_max else 0.0
            x = np.pad(x, ((0, 0), (ph, ph), (pw_, pw_), (0, 0)), constant_values=fill)
        oh, ow = self.out_h, self.out_w
        acc = None
        # Taps in (ty, tx) order, as torch's CPU pooling loops accumulate them.
        for ty in range(kh):
            for tx in range(kw):
                v = x[:, ty:ty + sh * (oh - 1) + 1:sh, tx:tx + sw * (ow - 1) + 1:sw]
                if acc is None:
                    acc = v.astype(np.float32, copy=True)
                elif is_max:
                    np.maximum(acc, v, out=acc)  # NaN propagates, as in torch
                else:
                    acc += v
        if not is_max:
            if L.count_include_pad or not (ph or pw_):
                acc = acc / np.float32(kh * kw)
            else:
                hh, ww = x.shape[1] - 2 * ph, x.shape[2] - 2 * pw_
                ys = np.arange(oh) * sh - ph
                xs = np.arange(ow) * sw - pw_
                cy = np.minimum(ys + kh, hh) - np.maximum(ys, 0)
                cx = np.minimum(xs + kw, ww) - np.maximum(xs, 0)
                acc = acc / (cy[:, None] * cx[None, :]).astype(np.float32)[:, :, None]
        acc = np.ascontiguousarray(acc, dtype=np.float32)
        if self.bits_out is not None:
            n_img, c = acc.shape[0], acc.shape[3]
            run_kernel(pack_padded, n_img * oh * ow // 16, acc.reshape(n_img, oh * ow, c), ow, self.pad[0],
                       self.pad[1], self.bits_out)
        return acc


class _GlobalPoolStep(_Step):
    label = "global_avgpool"

    def __call__(self, x, record):
        n_img, c = x.shape[0], x.shape[-1]
        out = np.empty((n_img, c), dtype=np.float32)
        run_kernel(global_mean, n_img, np.ascontiguousarray(x).reshape(n_img, -1, c), out)
        return out


class _LinearStep(_Step):
    label = "classifier"

    def __init__(self, layer):
        self.wt = np.ascontiguousarray(layer.weight.T, dtype=np.float32)
        self.bias = np.ascontiguousarray(layer.bias, dtype=np.float32)

    def __call__(self, x, record):
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape[0], -1)
        out = np.empty((x.shape[0], self.wt.shape[1]), dtype=np.float32)
        run_kernel(linear, x.shape[0], x, self.wt, self.bias, out)
        return out
