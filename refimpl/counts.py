"""Contingency counts a, b, c, d of binary dense and convolution layers (docs/design.md section 1).

Only ``a = popcount(x & w)`` needs the popcount GEMM. With ``px = popcount(x)`` and
``pw = popcount(w)``, both taken over the same in-bounds elements as ``a``:

    b = pw - a        c = px - a        d = n - px - pw + a

For a convolution, "in-bounds" is per output position: a padded tap belongs to none of a, b, c,
d. The GEMM runs over a zero-padded input (a 0 word adds nothing to ``popcount(x & w)``), while
``px``, ``pw`` and ``n`` are window sums over real taps only:

    px[i, y, x] = sum over in-bounds taps t of popcount(input pixel under t)
    pw[o, y, x] = sum over in-bounds taps t of popcount(w[o, t])        (same for every image)
    n[y, x]     = C * (number of in-bounds taps)

The blocked path (``_counts_fused``) is one pass: each thread computes ``a`` for a unit of
work into an L2-resident stage and, between the panels of its next unit, writes the previous
unit's a, b, c, d. Writing the four int64 outputs, 32 bytes per output position, is the
larger part of the cost once the GEMM runs near the popcount peak (bench/bench_counts.py).
"""
from __future__ import annotations

import functools
import math
import operator
import sys
import threading

import numba
import numpy as np
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _tiles, blocked, gemm
from ._jit import jit
from .bits import pack_nchw, popcount
from .blocked import TILE_CHANNELS, TILE_PIXELS, conv_output_size

# Outputs of at least this many bytes per array are written with non-temporal (streaming)
# stores: they bypass the caches, so writing them costs no read of each line first, and
# nobody will read 4 MB+ back from cache before it is evicted anyway. Smaller outputs stay in
# cache for the caller, who usually reads them next.
STREAM_MIN_BYTES = 4 << 20
# The fused kernel's tiles stay inside one image, so an image's last tile computes 16 positions
# however few are left: a dense layer (one position) would do 16x the work, 2x2 maps 4x. Below
# this share of useful tile positions, the GEMM runs with tiles across images, then the
# identities as a second pass (a dense layer: 2.5x faster so; 7x7 maps, 77% used, are faster
# fused: docs/performance.md).
FUSED_MIN_TILE_USE = 0.5
# Output rows this long or longer are written one array at a time when the arrays' line offsets
# differ (see _identity_row_intrinsic); shorter ones in one loop on a's lines.
SEPARATE_LINES_MIN_POSITIONS = 64
# Per-thread staging of the counts kernel: a unit of work (positions x channels) is sized so
# that its ``a`` block, 8 bytes an output, stays in L2 while its identities are written.
STAGE_ELEMENTS = 16384


def int_pair(value, name: str) -> tuple[int, int]:
    """A geometry value (an int or a pair of ints) as a pair of ints, or a ValueError: 1.7 is not
    truncated to 1, nor "1" or True read as 1. ``bnn/counts.py`` checks with this too."""
    pair = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    try:
        if len(pair) != 2 or any(isinstance(v, (bool, np.bool_)) for v in pair):
            raise TypeError
        return tuple(operator.index(v) for v in pair)  # ints and NumPy integers, never floats or text
    except TypeError:
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}") from None


_pair = int_pair


# --------------------------------------------------------------------------------------------
# Window sums over in-bounds taps (px, pw, n)
# --------------------------------------------------------------------------------------------
@jit
def tap_range(out_pos, stride, padding, dilation, kernel, size):
    """Taps [t0, t1) of one kernel axis that land inside the input at output position out_pos.

    The tap t reads input position ``out_pos*stride - padding + t*dilation``; the in-bounds taps
    are one contiguous run, so window sums need no per-tap bounds test.
    """
    start = out_pos * stride - padding
    t0 = 0 if start >= 0 else (-start + dilation - 1) // dilation
    t1 = min(kernel, (size - start + dilation - 1) // dilation)
    return t0, max(t0, t1)


@jit
def _tap_ranges(n_pos, stride, padding, dilation, kernel, size):
    # tap_range of every output position of one axis: (n_pos, 2). Hoisted out of the window
    # loops, whose cost it was (two integer divisions per output and filter).
    ranges = np.empty((n_pos, 2), dtype=np.int64)
    for pos in range(n_pos):
        ranges[pos, 0], ranges[pos, 1] = tap_range(pos, stride, padding, dilation, kernel, size)
    return ranges


@functools.lru_cache(maxsize=32)
def _in_bounds_taps(h, w, kh, kw, stride, padding, dilation):
    """(ys, xs, taps) of a geometry: the in-bounds tap range of each output row and column,
    (Ho, 2) and (Wo, 2), and the number of in-bounds taps of each output position, (Ho*Wo,).
    Geometry only, so cached (shared arrays: nothing may write to them)."""
    out_h = conv_output_size(h, kh, stride[0], padding[0], dilation[0])
    out_w = conv_output_size(w, kw, stride[1], padding[1], dilation[1])
    ys = _tap_ranges(out_h, stride[0], padding[0], dilation[0], kh, h)
    xs = _tap_ranges(out_w, stride[1], padding[1], dilation[1], kw, w)
    taps = ((ys[:, 1] - ys[:, 0])[:, None] * (xs[:, 1] - xs[:, 0])[None, :]).reshape(-1)
    return ys, xs, taps


@jit
def _window_sum_image(pix, ys, xs, stride, padding, dilation, out):
    # pix (H, W) per-pixel values of one image -> out (Ho, Wo): sums over the in-bounds taps.
    out_h, out_w = out.shape
    for oy in range(out_h):
        for ox in range(out_w):
            total = 0
            for ty in range(ys[oy, 0], ys[oy, 1]):
                y = oy * stride[0] - padding[0] + ty * dilation[0]
                for tx in range(xs[ox, 0], xs[ox, 1]):
                    total += pix[y, ox * stride[1] - padding[1] + tx * dilation[1]]
            out[oy, ox] = total


@jit
def _window_sum_filter(taps, ys, xs, sums, out):
    # taps (KH, KW) per-tap values of one filter -> out (Ho, Wo): sums over the in-bounds taps,
    # from 2-D prefix sums (every window sum is then four lookups); sums: (KH+1, KW+1) scratch.
    kh, kw = taps.shape
    out_h, out_w = out.shape
    sums[0, :] = 0
    sums[:, 0] = 0
    for ty in range(kh):
        for tx in range(kw):
            sums[ty + 1, tx + 1] = taps[ty, tx] + sums[ty, tx + 1] + sums[ty + 1, tx] - sums[ty, tx]
    for oy in range(out_h):
        y0, y1 = ys[oy, 0], ys[oy, 1]
        for ox in range(out_w):
            x0, x1 = xs[ox, 0], xs[ox, 1]
            out[oy, ox] = sums[y1, x1] - sums[y0, x1] - sums[y1, x0] + sums[y0, x0]


@jit
def _word_popcounts(words, out):
    # words (..., K) -> out (...): popcount of each row of K words
    flat, k_words = words.reshape(-1, words.shape[-1]), words.shape[-1]
    dst = out.reshape(-1)
    for r in range(flat.shape[0]):
        total = 0
        for k in range(k_words):
            total += popcount(flat[r, k])
        dst[r] = total


@jit(parallel=True)
def _weight_window_sums(wtaps, ys, xs, out):
    # wtaps (O, KH, KW): popcount of each filter tap; out (O, Ho, Wo): sum over in-bounds taps
    # (ys, xs: the tap ranges of _in_bounds_taps).
    n_out, kh, kw = wtaps.shape
    for o in prange(n_out):
        _window_sum_filter(wtaps[o], ys, xs, np.empty((kh + 1, kw + 1), dtype=np.int64), out[o])


@jit(parallel=True)
def _in_bounds_sums(xwords, wwords, ys, xs, stride, padding, dilation, parts, px, pw):
    # px and pw of docs/design.md section 1 from packed words in one parallel region (the counts API
    # called four before: their start-ups were a visible share of a 2 ms call), in ``parts``
    # runs of items (images, then filters) that allocate their scratch once: an allocation per
    # filter was most of the filters' cost (512 filters: 35 us).
    # xwords (N, H, W, K), wwords (O, KH, KW, K) -> px (N, Ho, Wo), pw (O, Ho, Wo).
    n_img, h, w, _ = xwords.shape
    n_out, kh, kw, _ = wwords.shape
    items = n_img + n_out
    for part in prange(parts):
        pix = np.empty((h, w), dtype=np.int64)
        taps = np.empty((kh, kw), dtype=np.int64)
        sums = np.empty((kh + 1, kw + 1), dtype=np.int64)
        for item in range(part * items // parts, (part + 1) * items // parts):
            if item < n_img:
                _word_popcounts(xwords[item], pix)
                _window_sum_image(pix, ys, xs, stride, padding, dilation, px[item])
            else:
                _word_popcounts(wwords[item - n_img], taps)
                _window_sum_filter(taps, ys, xs, sums, pw[item - n_img])


@jit(parallel=True)
def _finish_counts(a, px, pw, n, b, c, d):
    # a (I, O, P) in; px (I, P), pw (O, P), n (P,); writes b, c, d (I, O, P).
    n_img, n_out, pixels = a.shape
    for r in prange(n_img * n_out):
        i = r // n_out
        o = r - i * n_out
        for p in range(pixels):
            av = a[i, o, p]
            b[i, o, p] = pw[o, p] - av
            c[i, o, p] = px[i, p] - av
            d[i, o, p] = n[p] - px[i, p] - pw[o, p] + av


# --------------------------------------------------------------------------------------------
# The fused counts kernel: popcount GEMM and identities in one pass
# --------------------------------------------------------------------------------------------
def _identity_row_intrinsic(nontemporal: bool):
    """An intrinsic writing one row of the four counts from ``a``'s stage row ``s``:

        a[o0+i] = s[s0+i]            b[o0+i] = pw[w0+i] - s[s0+i]
        c[o0+i] = px[x0+i] - s[s0+i]  d[o0+i] = n[n0+i] - px[x0+i] - pw[w0+i] + s[s0+i]

    for i < count, spelled as ``<8 x i64>`` IR over each output's 64-byte lines: ``lead_k``
    is how many words of output k's first line precede its element o0. Partial first and last
    lines use masked loads and stores; whole lines, plain vectors (streaming stores when
    ``nontemporal``). Rows of a whole-image unit follow each other in the outputs, so the line
    where one row ends and the next begins would take two masked stores, each of which reads
    the line first (7x7 and 5x5 maps wrote at 25 GB/s against 45 with whole lines): with
    ``pair_next`` the last partial line is completed from the next row's first elements (its
    inputs ``next_s`` and ``next_w`` words further on in ``s`` and ``pw``, the same in ``px``
    and ``n``) and written whole, and that row is then written with ``skip_head``. Outputs
    that share a lead (fresh ones do) are written in one loop; otherwise (four ``np.empty``
    arrays start at four different offsets) one after the other, so that no vector store
    straddles two lines: that is two stores, and a streaming store to part of a line is a
    partial write (the 128-channel layer ran 1.6x slower so). Not Numba
    loops: LLVM's loop vectorizer is off here (``_jit.py``), and with it on, these arrays need
    more runtime alias checks than it allows.
    """
    from llvmlite import ir

    arr = types.Array(types.int64, 1, "C")
    i64 = types.int64

    @intrinsic
    def identity_row(typingctx, s, s0, pw, w0, px, x0, n, n0, a, b, c, d, o0, count, lead_a, lead_b, lead_c, lead_d,
                     skip_head, pair_next, next_s, next_w):
        sig = types.void(arr, i64, arr, i64, arr, i64, arr, i64, arr, arr, arr, arr, i64, i64, i64, i64, i64, i64,
                         types.boolean, types.boolean, i64, i64)
        if sig.args != (s, s0, pw, w0, px, x0, n, n0, a, b, c, d, o0, count, lead_a, lead_b, lead_c, lead_d,
                        skip_head, pair_next, next_s, next_w):
            return None

        def codegen(context, builder, signature, args):
            word, vec = ir.IntType(64), ir.VectorType(ir.IntType(64), 8)
            mask_type, vptr, i32 = ir.VectorType(ir.IntType(1), 8), vec.as_pointer(), ir.IntType(32)
            module = builder.module
            # typed-pointer names (LLVM 14); newer LLVMs upgrade them to their opaque form
            masked_load = cgutils.get_or_insert_function(
                module, ir.FunctionType(vec, [vptr, i32, mask_type, vec]), "llvm.masked.load.v8i64.p0v8i64")
            masked_store = cgutils.get_or_insert_function(
                module, ir.FunctionType(ir.VoidType(), [vec, vptr, i32, mask_type]), "llvm.masked.store.v8i64.p0v8i64")
            streaming = module.add_metadata([ir.Constant(i32, 1)])
            count = args[13]
            lanes = ir.Constant(vec, list(range(8)))

            def data(k):
                return context.make_array(arr)(context, builder, args[k]).data

            def splat(value):
                one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined),
                                              ir.Constant(ir.VectorType(i32, 8), [0] * 8))

            # output k: (its array, the inputs it reads, how it combines them)
            outputs = (
                (8, (0,), lambda v: v[0]),
                (9, (0, 2), lambda v: builder.sub(v[2], v[0])),
                (10, (0, 4), lambda v: builder.sub(v[4], v[0])),
                (11, (0, 2, 4, 6), lambda v: builder.add(builder.sub(builder.sub(v[6], v[4]), v[2]), v[0])),
            )
            def lines_of(lead, ks):
                # one loop over the lines that start ``lead`` words before element o0 of the
                # outputs ks (all of which have that lead), reading each input once
                total = builder.add(lead, count)
                inputs = sorted({i for k in ks for i in outputs[k][1]})
                # element ``offset - lead`` of each array: where the first line begins
                starts = {i: builder.gep(data(i), [builder.sub(args[i + 1], lead)]) for i in inputs}
                # the next row's element e sits at its start + e; line element j of this row
                # holds the next row's element j - total
                next_delta = {0: args[20], 2: args[21], 4: ir.Constant(word, 0), 6: ir.Constant(word, 0)}
                nexts = {i: builder.gep(data(i), [builder.sub(builder.add(args[i + 1], next_delta[i]), total)])
                         for i in inputs}
                outs = {k: builder.gep(data(outputs[k][0]), [builder.sub(args[12], lead)]) for k in ks}
                n_lines = builder.lshr(builder.add(total, ir.Constant(word, 7)), ir.Constant(word, 3))
                zero = ir.Constant(vec, [0] * 8)
                eight = ir.Constant(word, 8)
                with cgutils.for_range(builder, n_lines) as loop:
                    j0 = builder.mul(loop.index, eight)

                    def at(ptr):
                        return builder.bitcast(builder.gep(ptr, [j0]), vptr)

                    def store_line(values):
                        for k in ks:
                            # a whole line starts on 64 bytes (streaming needs it said: LLVM
                            # splits an under-aligned streaming vector into eight movnti)
                            store = builder.store(outputs[k][2](values), at(outs[k]), align=64 if nontemporal else 8)
                            if nontemporal:
                                store.set_metadata("nontemporal", streaming)

                    head = builder.icmp_signed("<", j0, lead)
                    tail = builder.icmp_signed(">", builder.add(j0, eight), total)
                    whole = builder.not_(builder.or_(head, tail))
                    paired = builder.and_(builder.and_(tail, builder.not_(head)), args[19])
                    skipped = builder.and_(head, args[18])
                    with builder.if_else(whole) as (then, otherwise):
                        with then:
                            store_line({i: builder.load(at(p), align=8) for i, p in starts.items()})
                        with otherwise:
                            j = builder.add(lanes, splat(j0))
                            mine = builder.and_(builder.icmp_signed(">=", j, splat(lead)),
                                                builder.icmp_signed("<", j, splat(total)))
                            with builder.if_else(paired) as (pair, single):
                                with pair:  # this row's last elements, then the next row's first
                                    theirs = builder.icmp_signed(">=", j, splat(total))
                                    values = {}
                                    for i, p in starts.items():
                                        follow = builder.call(masked_load, [at(nexts[i]), ir.Constant(i32, 8), theirs, zero])
                                        values[i] = builder.call(masked_load, [at(p), ir.Constant(i32, 8), mine, follow])
                                    store_line(values)
                                with single:
                                    with builder.if_then(builder.not_(skipped)):
                                        values = {i: builder.call(masked_load, [at(p), ir.Constant(i32, 8), mine, zero])
                                                  for i, p in starts.items()}
                                        for k in ks:
                                            builder.call(masked_store,
                                                         [outputs[k][2](values), at(outs[k]), ir.Constant(i32, 8), mine])

            leads = args[14:18]
            shared = builder.and_(builder.and_(builder.icmp_signed("==", leads[0], leads[1]),
                                               builder.icmp_signed("==", leads[0], leads[2])),
                                  builder.icmp_signed("==", leads[0], leads[3]))
            with builder.if_else(shared) as (then, otherwise):
                with then:  # one loop for all four (fresh outputs, or arrays at one offset)
                    lines_of(leads[0], (0, 1, 2, 3))
                with otherwise:
                    for k in range(4):
                        lines_of(leads[k], (k,))
            return context.get_dummy_value()

        return sig, codegen

    return identity_row


_identity_row = _identity_row_intrinsic(False)
_identity_row_streamed = _identity_row_intrinsic(True)


@intrinsic
def _store_fence(typingctx):
    """A full fence: streaming stores are weakly ordered, and must be visible before the
    parallel region hands the arrays back (``mfence`` on x86)."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@jit
def _finish_rows(stage, ld, r0, r1, rows, img, o0, p0, p1, positions, n_out, px, pw, n, a, b, c, d, misaligned,
                 stream):
    # Stage rows r0..r1 (of the unit's ``rows``) hold ``a`` of channels o0+r, positions p0..p1
    # of image img; write a, b, c, d there (misaligned[k]: output k's address in words, mod 8).
    npos = p1 - p0
    xo = img * positions + p0
    # whole rows follow each other in the outputs: the line two rows share is written once, by
    # the first (the stage holds every row of the unit by now, those of later calls too)
    chained = npos == positions and npos >= 8
    for r in range(r0, r1):
        o = o0 + r
        oo = (img * n_out + o) * positions + p0
        la, lb, lc, ld_ = ((misaligned[0] + oo) % 8, (misaligned[1] + oo) % 8, (misaligned[2] + oo) % 8,
                           (misaligned[3] + oo) % 8)
        skip_head = chained and r > 0
        pair_next = chained and r + 1 < rows
        if npos < SEPARATE_LINES_MIN_POSITIONS and not la == lb == lc == ld_:
            # short rows at different offsets: one loop on a's lines costs less than four loops
            # (512 channels 4x4: 1.9 against 2.2 ms); b, c, d then straddle lines, unstreamed
            _identity_row(stage, r * ld, pw, o * positions + p0, px, xo, n, p0, a, b, c, d, oo, npos, la, la, la, la,
                          skip_head, pair_next, ld, positions)
        elif stream:
            _identity_row_streamed(stage, r * ld, pw, o * positions + p0, px, xo, n, p0, a, b, c, d, oo, npos,
                                   la, lb, lc, ld_, skip_head, pair_next, ld, positions)
        else:
            _identity_row(stage, r * ld, pw, o * positions + p0, px, xo, n, p0, a, b, c, d, oo, npos, la, lb, lc, ld_,
                          skip_head, pair_next, ld, positions)


_GATHER = getattr(_tiles, blocked.gather_function_name(TILE_PIXELS))
_PANEL = getattr(_tiles, blocked.panel_function_name(TILE_PIXELS, TILE_CHANNELS))


@jit(parallel=True)
def _counts_fused(xflat, wflat, k_words, taps_off, bases, n_out, positions, chunk, group_panels, workers, xscratch,
                  stages, px, pw, n, a, b, c, d, misaligned, stream):
    # One pass for a, b, c, d (all flat, N*O*positions). Units of work are (image, chunk of
    # positions, group of panels); each thread takes a contiguous run of units. A unit's
    # popcount GEMM goes to an L2-resident stage, and the identities of the thread's previous
    # unit are written from the other stage between its panels, a few rows at a time, so ``a``
    # is not re-read from memory; the stores hide little behind the popcounts (measurements:
    # docs/performance.md, "Fused counts pass").
    n_img = px.shape[0] // positions
    steps = taps_off.shape[0] * k_words
    n_panels = (n_out + 7) // 8
    n_groups = (n_panels + group_panels - 1) // group_panels
    n_chunks = (positions + chunk - 1) // chunk
    ld = (chunk + 15) // 16 * 16
    n_units = n_img * n_chunks * n_groups
    for worker in prange(workers):
        tid = numba.get_thread_id()
        xt = xscratch[tid]
        u0 = worker * n_units // workers
        u1 = (worker + 1) * n_units // workers
        # the previous unit: its image, first channel, positions, rows, rows written so far
        q_img = q_o0 = q_p0 = q_p1 = q_rows = q_done = 0
        for u in range(u0, u1 + 1):
            current = stages[tid, u & 1]
            previous = stages[tid, (u + 1) & 1]
            img = p0 = p1 = panel0 = panel1 = 0
            if u < u1:
                img = u // (n_chunks * n_groups)
                rest = u - img * (n_chunks * n_groups)
                ck = rest // n_groups
                group = rest - ck * n_groups
                p0 = ck * chunk
                p1 = min(positions, p0 + chunk)
                panel0 = group * group_panels
                panel1 = min(n_panels, panel0 + group_panels)
                n_steps = ((p1 - p0 + 15) // 16) * (panel1 - panel0)
                step = 0
                for q in range(p0, p1, 16):
                    _GATHER(xflat, k_words, taps_off, bases, img * positions + q, xt)
                    for panel in range(panel0, panel1):
                        _PANEL(xt, wflat, steps, panel, current, (panel - panel0) * 8, ld, q - p0)
                        step += 1
                        target = step * q_rows // n_steps
                        if target > q_done:
                            _finish_rows(previous, ld, q_done, target, q_rows, q_img, q_o0, q_p0, q_p1, positions,
                                         n_out, px, pw, n, a, b, c, d, misaligned, stream)
                            q_done = target
            if q_done < q_rows:
                _finish_rows(previous, ld, q_done, q_rows, q_rows, q_img, q_o0, q_p0, q_p1, positions, n_out,
                             px, pw, n, a, b, c, d, misaligned, stream)
            q_img, q_o0, q_p0, q_p1 = img, panel0 * 8, p0, p1
            q_rows = min(n_out, panel1 * 8) - q_o0 if u < u1 else 0
            q_done = 0
        if stream:
            _store_fence()


def _address(array: np.ndarray) -> int:
    # ``array.ctypes.data`` builds a ctypes object: ~10 us, a visible share of a small call
    return array.__array_interface__["data"][0]


def _run_counts_fused(plan, xflat, px, pw, n, outs):
    """Fill the four (N, O, Ho*Wo) int64 arrays ``outs`` with the fused counts kernel."""
    positions = plan.out_h * plan.out_w
    workers = numba.get_num_threads()
    n_units_min = 4 * workers
    # Chunk: whole images' positions unless a unit's stage would leave L2; then tiles of 16.
    chunk = positions
    if plan.n_panels * TILE_CHANNELS * positions > STAGE_ELEMENTS:
        chunk = max(TILE_PIXELS, STAGE_ELEMENTS // (plan.n_panels * TILE_CHANNELS) // TILE_PIXELS * TILE_PIXELS)
    n_chunks = -(-positions // chunk)
    # Few units (batch 1, small maps): split the panels into groups so that every thread works.
    groups = min(plan.n_panels, max(1, -(-n_units_min // (plan.n_img * n_chunks))))
    group_panels = -(-plan.n_panels // groups)
    ld = -(-chunk // TILE_PIXELS) * TILE_PIXELS
    stages = np.empty((numba.config.NUMBA_NUM_THREADS, 2, group_panels * TILE_CHANNELS * ld), dtype=np.int64)
    flats = [t.reshape(-1) for t in outs]
    addresses = [_address(t) for t in flats]
    misaligned = np.array([address % 64 // 8 for address in addresses], dtype=np.int64)
    # Streaming stores only write whole lines (each output's rows are split at its own lines).
    stream = flats[0].nbytes >= STREAM_MIN_BYTES and all(address % 8 == 0 for address in addresses)
    _counts_fused(xflat, plan.panels, plan.k_words, plan.taps_off, plan.bases, plan.n_out, positions, chunk,
                  group_panels, workers, plan.xscratch, stages, px.reshape(-1), pw.reshape(-1), n, *flats, misaligned,
                  stream)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------
class _OutputBlocks:
    """Recycles the memory of large count outputs that their caller has dropped.

    Four int64 outputs are 32 bytes per output position: 32 MB for the 256-channel 8x8 layer
    of a CIFAR ResNet at batch 64. glibc maps such blocks fresh from the kernel and unmaps them when
    they are freed, so a loop that calls ``counts_conv2d`` and drops the result pays a page
    fault per 4 KB of output, every call: 5-25 ms here against 2 ms of counting. A block is
    handed out again once nothing references it any more (its reference count says so: every
    view of it, however derived, holds a reference). At most ``MAX_BYTES`` are kept: room for
    two calls' outputs of a 64-channel 32x32 layer at batch 64 (128 MB each), since
    ``r = counts_conv2d(...)`` in a loop holds the last result while the next is computed.
    Blocks of another size are dropped once idle; ``clear()`` drops all.
    """

    MIN_BYTES = 1 << 20
    MAX_BYTES = 512 << 20

    def __init__(self):
        self._blocks: list[np.ndarray] = []  # the owners of the memory, never views
        self._lock = threading.Lock()

    def take(self, words: int) -> np.ndarray:
        """A flat int64 array of ``words`` starting on a 64-byte line."""
        if words * 8 < self.MIN_BYTES:
            return self._on_a_line(np.empty(words + 8, dtype=np.int64), words)
        with self._lock:
            # Views of a view keep a reference to the owner itself (NumPy collapses bases), so
            # the owner's count is exactly: the list, the loop variable, getrefcount's argument.
            for raw in self._blocks:
                if raw.size == words + 8 and sys.getrefcount(raw) == 3:
                    return self._on_a_line(raw, words)
            raw = np.empty(words + 8, dtype=np.int64)
            # idle blocks of other sizes go (a new layer shape), blocks in use stay listed
            kept = [b for b in self._blocks if b.size == raw.size or sys.getrefcount(b) > 3]
            if sum(b.nbytes for b in kept) + raw.nbytes <= self.MAX_BYTES:
                kept.append(raw)
            self._blocks = kept
            return self._on_a_line(raw, words)

    @staticmethod
    def _on_a_line(raw: np.ndarray, words: int) -> np.ndarray:
        start = (-_address(raw) % 64) // 8
        return raw[start:start + words]

    def clear(self):
        """Forget every block (memory in use stays with its users)."""
        with self._lock:
            self._blocks = []


_OUTPUT_BLOCKS = _OutputBlocks()
# Each output starts this many words after the previous one's end: on its own 64-byte line,
# and not at the same offset in a 4 KB page (loads and stores to addresses 4 KB apart are
# mistaken for each other by the store-forwarding check, which stalls the identities).
_OUTPUT_STAGGER = 40


def _fresh_outputs(shape):
    size = math.prod(shape)
    stride = -(-(size + _OUTPUT_STAGGER) // 8) * 8
    block = _OUTPUT_BLOCKS.take(4 * stride)
    return tuple(block[k * stride:k * stride + size].reshape(shape) for k in range(4))


def _outputs(out, shape):
    """Four int64 arrays of ``shape``: fresh, or the caller's ``out`` after checking it."""
    if out is None:
        return _fresh_outputs(shape)
    if len(out) != 4:
        raise ValueError(f"out must be four arrays (a, b, c, d), got {len(out)}")
    for name, t in zip("abcd", out):
        if not isinstance(t, np.ndarray) or t.shape != shape or t.dtype != np.int64 or not t.flags.c_contiguous:
            got = f"{t.dtype} {t.shape}" if isinstance(t, np.ndarray) else type(t).__name__
            raise ValueError(f"out array {name} must be C-contiguous int64 of shape {shape}, got {got}")
    return tuple(out)


# float32 holds every integer up to this and not one more: the largest window (n) a float32
# count, or the engine's float32 epilogue, takes exactly (docs/design.md section 1).
FLOAT32_EXACT_COUNT = 1 << 24


def window_output_size(h: int, w: int, kernel, stride, padding, dilation) -> tuple[int, int]:
    """(Ho, Wo) of a counts convolution over an h x w input, or the ValueError for a geometry
    without a result: a kernel under 1x1, or an empty output map. ``bnn/counts.py`` calls this
    too, so the two paths refuse the same shapes in the same words."""
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


def _kernel_name(kernel) -> str:
    kernel = kernel or "blocked"
    if kernel not in ("blocked", "simple"):
        raise ValueError(f"unknown kernel {kernel!r}; valid kernels are 'blocked' and 'simple'")
    return kernel


def _zero_counts(out, shape):
    # An empty dimension: no images or filters (an empty result), or no channels or no input
    # pixels (every window is without taps: n = 0, so every count is 0). Kernels never see it.
    if out is None:
        return tuple(np.zeros(shape, np.int64) for _ in range(4))
    for t in _outputs(out, shape):
        t.fill(0)
    return tuple(out)


def counts_conv2d_packed(xp, wp, in_channels: int, stride=1, padding=0, dilation=1, kernel=None, out=None):
    """Counts from packed operands: ``xp`` (N, H, W, K) words, ``wp`` (O, KH, KW, K) words.

    ``kernel``: ``"blocked"`` (default, the fast GEMM) or ``"simple"`` (one popcount per word
    pair, the readable reference). Returns int64 a, b, c, d of shape (N, O, Ho, Wo).
    """
    kernel = _kernel_name(kernel)
    stride, padding, dilation = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    n_img, h, w, k_words = xp.shape
    n_out, kh, kw, k_words_w = wp.shape
    if k_words != k_words_w:
        raise ValueError(f"input has {k_words} channel words, weights {k_words_w}")
    out_h, out_w = window_output_size(h, w, (kh, kw), stride, padding, dilation)
    if 0 in (n_img, n_out, h, w, in_channels):
        return _zero_counts(out, (n_img, n_out, out_h, out_w))
    xp = np.ascontiguousarray(xp, dtype=np.uint64)
    wp = np.ascontiguousarray(wp, dtype=np.uint64)

    # px, pw, n over in-bounds taps only (see the module docstring).
    ys, xs, taps = _in_bounds_taps(h, w, kh, kw, stride, padding, dilation)
    px = np.empty((n_img, out_h, out_w), dtype=np.int64)
    pw = np.empty((n_out, out_h, out_w), dtype=np.int64)
    _in_bounds_sums(xp, wp, ys, xs, stride, padding, dilation, 4 * numba.get_num_threads(), px, pw)
    n = taps * in_channels

    a, b, c, d = _outputs(out, (n_img, n_out, out_h, out_w))
    px, pw = px.reshape(n_img, -1), pw.reshape(n_out, -1)
    flat = [t.reshape(n_img, n_out, out_h * out_w) for t in (a, b, c, d)]
    if kernel == "blocked":
        plan = blocked.ConvPlan(wp, n_img, h, w, stride, padding, dilation)
        positions = out_h * out_w
        if positions >= FUSED_MIN_TILE_USE * TILE_PIXELS * -(-positions // TILE_PIXELS):
            _run_counts_fused(plan, plan.pad(xp), px, pw, n, (a, b, c, d))
            return a, b, c, d
        plan(plan.pad(xp), flat[0])  # tiles across images, then the identities
    else:
        gemm._conv_simple(xp, wp, stride, padding, dilation, out_h, out_w, a)
    _finish_counts(flat[0], px, pw, n, *flat[1:])
    return a, b, c, d


def counts_conv2d(x, w, stride=1, padding=0, dilation=1, *, kernel=None, out=None):
    """a, b, c, d of a binary 2-D convolution (cross-correlation), NCHW input, OIHW weights.

    ``x`` and ``w`` hold +-1 values (any number is binarized by ``v >= 0``) or booleans.
    Padded taps count in none of a, b, c, d. Returns four int64 arrays (N, O, Ho, Wo), written
    into ``out`` when given (four such arrays; fastest when they start on 64-byte lines).
    Fresh outputs of 1 MB+ are views of one block that is recycled once the caller has dropped
    every view of it (``_OutputBlocks``): fresh pages cost more than the popcounts.
    """
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 4:
        raise ValueError(f"x must be NCHW (4-D), got shape {x.shape}")
    if w.ndim != 4:
        raise ValueError(f"w must be OIHW (4-D), got shape {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has {x.shape[1]} channels but w expects {w.shape[1]} (groups=1 only)")
    for name, v in (("stride", stride), ("dilation", dilation)):
        if min(_pair(v, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {v!r}")
    if min(_pair(padding, "padding")) < 0:
        raise ValueError(f"padding must be >= 0, got {padding!r}")
    if 0 in x.shape or 0 in w.shape:  # nothing to pack: the packed path's empty case
        _kernel_name(kernel)
        out_h, out_w = window_output_size(x.shape[2], x.shape[3], w.shape[2:], _pair(stride, "stride"),
                                          _pair(padding, "padding"), _pair(dilation, "dilation"))
        return _zero_counts(out, (x.shape[0], w.shape[0], out_h, out_w))
    xp = pack_nchw(x)
    wp = pack_nchw(w)  # OIHW packs like NCHW: (O, KH, KW, K) words along input channels
    return counts_conv2d_packed(xp, wp, x.shape[1], stride, padding, dilation, kernel, out)


def counts_dense(x, w, *, kernel=None):
    """a, b, c, d of a binary dense layer: ``x`` (N, K), ``w`` (M, K) -> four int64 (N, M)."""
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"x must be (N, K) and w (M, K); got shapes {x.shape} and {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x rows have {x.shape[1]} elements but w rows have {w.shape[1]}")
    if 0 in x.shape or 0 in w.shape:
        _kernel_name(kernel)
        return _zero_counts(None, (x.shape[0], w.shape[0]))
    # A dense layer is a 1x1 convolution over a 1x1 image.
    xp = pack_nchw(x[:, :, None, None])
    wp = pack_nchw(w[:, :, None, None])
    a, b, c, d = counts_conv2d_packed(xp, wp, x.shape[1], kernel=kernel)
    return tuple(t.reshape(x.shape[0], w.shape[0]) for t in (a, b, c, d))
