"""The fused counts kernel: the popcount GEMM and the count identities in one pass.

Each thread computes ``a`` for a unit of work (image, run of positions, group of panels) into an
L2-resident stage and, between the panels of its next unit, writes the previous unit's a, b, c, d
(``identity_row.py``). Writing the four int64 outputs, 32 bytes per output position, is the
larger part of the cost once the GEMM runs near the popcount peak (bench/bench_counts.py).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .._jit import jit
from . import _tiles
from .byte_dot import BYTE_LOOKUP
from .identity_row import identity_row, identity_row_streamed, store_fence
from .outputs import address
from .tiling import TILE_CHANNELS, TILE_PIXELS, gather_function_name, panel_function_name

# Outputs of at least this many bytes per array are written with non-temporal (streaming)
# stores: they bypass the caches, so writing them costs no read of each line first, and
# nobody will read 4 MB+ back from cache before it is evicted anyway. Smaller outputs stay in
# cache for the caller, who usually reads them next.
STREAM_MIN_BYTES = 4 << 20
# Output rows this long or longer are written one array at a time when the arrays' line offsets
# differ (see identity_row.py); shorter ones in one loop on a's lines.
SEPARATE_LINES_MIN_POSITIONS = 64
# Per-thread staging of the counts kernel: a unit of work (positions x channels) is sized so
# that its ``a`` block, 8 bytes an output, stays in L2 while its identities are written.
STAGE_ELEMENTS = 16384


@jit
def finish_rows(stage, ld, r0, r1, rows, img, o0, p0, p1, positions, n_out, px, pw, n, a, b, c, d, misaligned,
                stream):
    """Write a, b, c, d of stage rows r0..r1 (of the unit's ``rows``), which hold ``a`` of
    channels o0+r, positions p0..p1 of image img (misaligned[k]: output k's address in words,
    mod 8; ``stream``: whole lines with streaming stores)."""
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
            identity_row(stage, r * ld, pw, o * positions + p0, px, xo, n, p0, a, b, c, d, oo, npos, la, la, la, la,
                         skip_head, pair_next, ld, positions)
        elif stream:
            identity_row_streamed(stage, r * ld, pw, o * positions + p0, px, xo, n, p0, a, b, c, d, oo, npos,
                                  la, lb, lc, ld_, skip_head, pair_next, ld, positions)
        else:
            identity_row(stage, r * ld, pw, o * positions + p0, px, xo, n, p0, a, b, c, d, oo, npos, la, lb, lc, ld_,
                         skip_head, pair_next, ld, positions)


_GATHER = getattr(_tiles, gather_function_name(TILE_PIXELS))
_PANEL = getattr(_tiles, panel_function_name(TILE_PIXELS, TILE_CHANNELS))


# SLP would re-pack the byte-lookup panel inlined here (refimpl/kernels/byte_dot.py).
@jit(parallel=True, slp_vectorize=not BYTE_LOOKUP)
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
        # np.int64(0), not 0: a literal reaching finish_rows compiles it once per Literal[int] pattern.
        q_img = q_o0 = q_p0 = q_p1 = q_rows = q_done = np.int64(0)
        for u in range(u0, u1 + 1):
            current = stages[tid, u & 1]
            previous = stages[tid, (u + 1) & 1]
            img = p0 = p1 = panel0 = panel1 = np.int64(0)
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
                            finish_rows(previous, ld, q_done, target, q_rows, q_img, q_o0, q_p0, q_p1, positions,
                                         n_out, px, pw, n, a, b, c, d, misaligned, stream)
                            q_done = target
            if q_done < q_rows:
                finish_rows(previous, ld, q_done, q_rows, q_rows, q_img, q_o0, q_p0, q_p1, positions, n_out,
                             px, pw, n, a, b, c, d, misaligned, stream)
            q_img, q_o0, q_p0, q_p1 = img, panel0 * 8, p0, p1
            q_rows = min(n_out, panel1 * 8) - q_o0 if u < u1 else 0
            q_done = 0
        if stream:
            store_fence()


def run_fused(plan, xflat, px, pw, n, outs):
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
    addresses = [address(t) for t in flats]
    misaligned = np.array([at % 64 // 8 for at in addresses], dtype=np.int64)
    # Streaming stores only write whole lines (each output's rows are split at its own lines).
    stream = flats[0].nbytes >= STREAM_MIN_BYTES and all(at % 8 == 0 for at in addresses)
    _counts_fused(xflat, plan.panels, plan.k_words, plan.taps_off, plan.bases, plan.n_out, positions, chunk,
                  group_panels, workers, plan.xscratch, stages, px.reshape(-1), pw.reshape(-1), n, *flats, misaligned,
                  stream)
