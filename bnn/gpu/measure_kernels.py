"""The measure's forward and backward as two Triton kernels that read the genome as data (issue 37 item 1).

One kernel pair serves every genome: the seven codes, the per-channel alpha and the per-layer unary
tables are small device tensors the kernels load, so a new genome rewrites those tensors in place
and the compiled graph (and a captured CUDA graph) stays the same.

Inputs, for a binary convolution with counts of shape (N, C, Ho, Wo) (P = Ho * Wo pixels):

* ``a``: the count convolution's output, full size, any strides (NCHW or channels_last);
* ``px`` (N, 1, Ho, Wo) and ``pw`` (1, C, Ho, Wo): the window sums of the inputs' and the weights'
  0/1 relaxations; ``nsz`` (P,): the window sizes n (geometry only, computed once per layer);
* ``rows`` (P,) int32: each pixel's table row offset ``r * L`` (raw counts: 0);
* ``tab``, ``dtab`` (4, R, L): per unary slot, the operator at the converted count of each integer
  count ``0 .. L - 1`` in a window of the r-th size, and its derivative by the converted count
  (bnn/gpu/measure_tables.py; for the alpha codes 15-17: the converted count itself and 1).

The counts follow bnn/counts.py's algebra, per element:

    b = pw - a      c = px - a      d = (n - pw) - c

and the backward returns what the count convolution's backward consumes (bnn/counts.py):

    dL/da  = ga - gb - gc + gd          full size
    dL/dpx = sum_C (gc - gd)            (N, 1, Ho, Wo): written as partial sums per channel block
    dL/dpw = sum_N (gb - gd)            (1, C, Ho, Wo): written as partial sums per batch chunk

plus alpha's gradient as partial sums per (batch chunk, pixel block); the launchers add the
partials (a deterministic order, no atomics).

Arithmetic is refimpl's float32 arithmetic: division is IEEE-rounded (``div_rn``; Triton's ``/``
on a GPU is an approximate division), no multiply and add fused into one FMA (``NO_CONTRACTION``: Triton
contracts them by default), ``max``/``min`` propagate NaN and pick the first operand on
ties (``refimpl/_numba_ops.py``'s ``nan_max``/``nan_min``), squares are products. The only
operation that is not correctly rounded is ``exp`` in binary operators 10-13: libdevice's ``expf``
on a GPU (within 2 ulp), NumPy's under Triton's interpreter (``TRITON_INTERPRET=1``), which cannot
run libdevice; the unary operators come from tables built by refimpl's own code, bit for bit.

The backward recomputes the forward per element and applies, node by node, the formulas torch's
autograd uses (``div``: ``grad / y`` and ``-grad * ((x / y) / y)``; ``maximum`` splits a tie in
halves and passes NaN to both; ``abs``: ``grad * sign(x)`` with sign(NaN) = 0, as torch's CPU
kernel), then ``--measure-grad-clip`` (NaN to 0, clamp) on the gradient of each converted count,
then the convention's backward (``grad / n``, ``grad / (n + 4)``), as bnn/layers.py orders them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .require import interpreted

INTERPRETED = interpreted()
# Every launch compiles without floating-point contraction: Triton fuses a multiply feeding an add into one
# FMA by default (one rounding where refimpl and torch's autograd round twice): 48 of them in the forward
# (code 13's exp(-(z * z))) and 28 in the backward (e.g. code 5's div_rn(g, s) + gy), found in the PTX
# compiled for sm_90 (tests/test_gpu_ptx.py reads it for every kernel).
NO_CONTRACTION = {"enable_fp_fusion": False}
CONVENTION_CODES = {"raw": 0, "freq": 1, "laplace": 2}
ALPHA, ALPHA_MUL, ALPHA_ADD, ZERO = 15, 16, 17, 1  # refimpl/operators.py's codes the kernels treat apart

# The device functions the kernels call. Under the interpreter they are plain Python functions: the
# interpreter re-patches triton.language on every call of a jitted device function (about 15 ms
# each, 0.4 s of a 0.6 s launch here), while the kernel's own patch already covers a plain function
# it calls; its only rewrite of a device function's source (chained comparisons) is not used here.
_device = (lambda fn: fn) if INTERPRETED else triton.jit


@_device
def _sum(x, axis: tl.constexpr):
    # tl.sum (and tl.zeros) are jitted functions of triton.language.standard, which the interpreter runs
    # only if triton was imported with TRITON_INTERPRET=1 already set, and torch._dynamo imports triton.
    # tl.sum's own reduction, through the builtin tl.reduce: the interpreter maps it to np.sum.
    return tl.reduce(x, axis, tl.standard._sum_combine)


@_device
def _wide(x, I64: tl.constexpr):
    # Tensor offsets in int64 only for tensors of 2**30 elements or more (the launchers decide): int32
    # arithmetic takes half the registers, and the backward kernel is bound by them.
    if I64:
        return x.to(tl.int64)
    else:
        return x


@_device
def _exp(x, INTERP: tl.constexpr):
    if INTERP:
        return tl.exp(x)  # the interpreter has no libdevice: NumPy's float32 exp
    else:
        return libdevice.exp(x)  # expf, within 2 ulp; tl.exp is ex2.approx-based


@_device
def _nan_max(x, y):
    # refimpl/_numba_ops.py's nan_max: NaN in either operand gives NaN; a tie gives x.
    return tl.where((x != x) | (y != y), x + y, tl.where(x >= y, x, y))


@_device
def _nan_min(x, y):
    return tl.where((x != x) | (y != y), x + y, tl.where(x <= y, x, y))


@_device
def _binary(code, x, y, INTERP: tl.constexpr):
    # refimpl/operators.py's BINARY table; code is a scalar, so every branch is uniform.
    if code == 0:
        r = x + y
    elif code == 1:
        r = x - y
    elif code == 2:
        r = y - x
    elif code == 3:
        r = x * y
    elif code == 4:
        r = tl.math.div_rn(x, y)
    elif code == 5:
        r = tl.math.div_rn(x, x + y)
    elif code == 6:
        r = tl.math.div_rn(y, x)
    elif code == 7:
        r = tl.math.div_rn(y, x + y)
    elif code == 8:
        r = _nan_max(x, y)
    elif code == 9:
        r = _nan_min(x, y)
    elif code == 10:
        r = tl.math.div_rn(x, 1.0 + _exp(-y, INTERP))
    elif code == 11:
        r = tl.math.div_rn(y, 1.0 + _exp(-x, INTERP))
    elif code == 12:
        r = _exp(-tl.abs(x - y), INTERP)
    else:
        z = x - y
        r = _exp(-(z * z), INTERP)
    return r


@_device
def _div_other(g, x, y):
    # torch's div_tensor_other_backward: -grad * ((x / y) / y)
    return -g * tl.math.div_rn(tl.math.div_rn(x, y), y)


@_device
def _binary_backward(code, x, y, g, INTERP: tl.constexpr):
    # (dL/dx, dL/dy) of _binary(code, x, y) given dL/dresult = g, as torch's autograd takes them.
    if code == 0:
        gx = g
        gy = g
    elif code == 1:
        gx = g
        gy = -g
    elif code == 2:
        gx = -g
        gy = g
    elif code == 3:
        gx = g * y
        gy = g * x
    elif code == 4:
        gx = tl.math.div_rn(g, y)
        gy = _div_other(g, x, y)
    elif code == 5:
        s = x + y
        gy = _div_other(g, x, s)
        gx = tl.math.div_rn(g, s) + gy
    elif code == 6:
        gx = _div_other(g, y, x)
        gy = tl.math.div_rn(g, x)
    elif code == 7:
        s = x + y
        gx = _div_other(g, y, s)
        gy = tl.math.div_rn(g, s) + gx
    elif code == 8:
        # torch.maximum: where(x == y, g / 2, g), zeroed where x < y (y: where x > y); min mirrored.
        # A NaN operand makes both comparisons false: both operands get g.
        half = tl.where(x == y, g * 0.5, g)
        gx = tl.where(x < y, 0.0, half)
        gy = tl.where(x > y, 0.0, half)
    elif code == 9:
        half = tl.where(x == y, g * 0.5, g)
        gx = tl.where(x > y, 0.0, half)
        gy = tl.where(x < y, 0.0, half)
    elif code == 10:
        e = _exp(-y, INTERP)
        s = 1.0 + e
        gx = tl.math.div_rn(g, s)
        gy = -(_div_other(g, x, s) * e)
    elif code == 11:
        e = _exp(-x, INTERP)
        s = 1.0 + e
        gy = tl.math.div_rn(g, s)
        gx = -(_div_other(g, y, s) * e)
    elif code == 12:
        z = x - y
        r = _exp(-tl.abs(z), INTERP)
        sgn = tl.where(z > 0, 1.0, tl.where(z < 0, -1.0, 0.0))
        gx = -(g * r) * sgn
        gy = -gx
    else:
        z = x - y
        r = _exp(-(z * z), INTERP)
        gx = -(g * r) * (2.0 * z)
        gy = -gx
    return gx, gy


@_device
def _unary(code, t, al):
    # t: the slot's table entry (for the alpha codes, the converted count itself); al: alpha's row.
    return tl.where(code == 15, al, tl.where(code == 16, al * t, tl.where(code == 17, al + t, t)))


@_device
def _slot(tab_ptr, dtab_ptr, k, idx, codes_ptr, alpha_ptr, o, mo, C, RL, NEED_D: tl.constexpr):
    code = tl.load(codes_ptr + k)
    al = tl.load(alpha_ptr + k * C + o, mask=mo, other=0.0)[:, None]
    t = tl.load(tab_ptr + k * RL + idx)
    if NEED_D:
        dt = tl.load(dtab_ptr + k * RL + idx)
    else:
        dt = t
    return code, al, t, dt, _unary(code, t, al)


@_device
def _counts(a_ptr, px_ptr, pw_ptr, nsz_ptr, rows_ptr, n, o, p, mo, mp, m, W, P, sa_n, sa_o, sa_h, sa_w, L,
            ROUND: tl.constexpr):
    # The four counts of a tile, bnn/counts.py's algebra, and their table indices.
    h = p // W
    w = p - h * W
    off = n * sa_n + o[:, None] * sa_o + (h * sa_h + w * sa_w)[None, :]
    a = tl.load(a_ptr + off, mask=m, other=0.0)
    if ROUND:  # an inexact convolution (Winograd, FFT): counts within 1e-2 of integers
        a = tl.floor(a + 0.5)
    px = tl.load(px_ptr + n * P + p, mask=mp, other=0.0)[None, :]
    pw = tl.load(pw_ptr + o[:, None] * P + p[None, :], mask=m, other=0.0)
    nsz = tl.load(nsz_ptr + p, mask=mp, other=0.0)[None, :]
    row = tl.load(rows_ptr + p, mask=mp, other=0)[None, :]
    b = pw - a
    c = px - a
    d = (nsz - pw) - c
    hi = L - 1
    # Table indices in int32 (a table holds a few thousand entries): half the registers of int64.
    ia = row + tl.minimum(tl.maximum(a, 0.0), hi).to(tl.int32)
    ib = row + tl.minimum(tl.maximum(b, 0.0), hi).to(tl.int32)
    ic = row + tl.minimum(tl.maximum(c, 0.0), hi).to(tl.int32)
    idd = row + tl.minimum(tl.maximum(d, 0.0), hi).to(tl.int32)
    return off, nsz, ia, ib, ic, idd


@triton.jit
def measure_forward_kernel(a_ptr, px_ptr, pw_ptr, nsz_ptr, rows_ptr, codes_ptr, alpha_ptr, tab_ptr, out_ptr,
                           N, C, P, W, sa_n, sa_o, sa_h, sa_w, L, RL, NB,
                           ROUND: tl.constexpr, INTERP: tl.constexpr, BO: tl.constexpr, BP: tl.constexpr,
                           I64: tl.constexpr):
    """One (BO channels x BP pixels) tile of NB images: counts, unary lookups, three binary nodes."""
    p = _wide(tl.program_id(0), I64) * BP + tl.arange(0, BP)
    o = _wide(tl.program_id(1), I64) * BO + tl.arange(0, BO)
    mp = p < P
    mo = o < C
    m = mo[:, None] & mp[None, :]
    c4 = tl.load(codes_ptr + 4)
    c5 = tl.load(codes_ptr + 5)
    c6 = tl.load(codes_ptr + 6)
    start = tl.program_id(2) * NB
    # The last program's images end at N (a loop bound, not a mask: the interpreter mishandles a block
    # mask combined with a scalar one).
    for i in range(0, tl.minimum(NB, N - start)):
        n = _wide(start + i, I64)
        off, nsz, ia, ib, ic, idd = _counts(a_ptr, px_ptr, pw_ptr, nsz_ptr, rows_ptr, n, o, p, mo, mp, m,
                                            W, P, sa_n, sa_o, sa_h, sa_w, L, ROUND)
        _, _, _, _, u1 = _slot(tab_ptr, tab_ptr, 0, ia, codes_ptr, alpha_ptr, o, mo, C, RL, False)
        _, _, _, _, u2 = _slot(tab_ptr, tab_ptr, 1, idd, codes_ptr, alpha_ptr, o, mo, C, RL, False)
        _, _, _, _, u3 = _slot(tab_ptr, tab_ptr, 2, ib, codes_ptr, alpha_ptr, o, mo, C, RL, False)
        _, _, _, _, u4 = _slot(tab_ptr, tab_ptr, 3, ic, codes_ptr, alpha_ptr, o, mo, C, RL, False)
        b1 = _binary(c4, u1, u2, INTERP)
        b2 = _binary(c5, u3, u4, INTERP)
        y = _binary(c6, b1, b2, INTERP)
        tl.store(out_ptr + off, y, mask=m)


@_device
def _count_grad(code, al, t, dt, gu, nsz, CONV: tl.constexpr, CLIP: tl.constexpr, limit):
    # dL/d(count as counted) of one slot, and dL/d(its alpha) per element.
    gx = tl.where(code == 16, gu * al, gu * dt)
    gx = tl.where((code == 15) | (code == 1), 0.0, gx)  # eager: no gradient at all (not 0 * inf)
    if CLIP:  # bnn/layers.py's _ClipMeasureGrad: NaN -> 0, then clamp (+-inf -> +-limit)
        gx = tl.where(gx != gx, 0.0, gx)
        gx = tl.minimum(tl.maximum(gx, -limit), limit)
    if CONV == 1:
        gx = tl.math.div_rn(gx, nsz)
    elif CONV == 2:
        gx = tl.math.div_rn(gx, nsz + 4.0)
    gal = tl.where(code == 16, gu * t, tl.where((code == 15) | (code == 17), gu, 0.0))
    return gx, gal


@triton.jit
def measure_backward_kernel(dy_ptr, a_ptr, px_ptr, pw_ptr, nsz_ptr, rows_ptr, codes_ptr, alpha_ptr, tab_ptr,
                            dtab_ptr, ga_ptr, gpx_part_ptr, gpw_part_ptr, gal_part_ptr,
                            N, C, P, W, sa_n, sa_o, sa_h, sa_w, sd_n, sd_o, sd_h, sd_w, L, RL, NB, limit,
                            CONV: tl.constexpr, CLIP: tl.constexpr, ROUND: tl.constexpr, INTERP: tl.constexpr,
                            BO: tl.constexpr, BP: tl.constexpr, I64: tl.constexpr):
    """One (BO x BP) tile over a chunk of NB images: dL/da, and partial sums of dL/dpx, dL/dpw, dL/dalpha."""
    pid_p = _wide(tl.program_id(0), I64)
    pid_o = _wide(tl.program_id(1), I64)
    chunk = _wide(tl.program_id(2), I64)
    p = pid_p * BP + tl.arange(0, BP)
    o = pid_o * BO + tl.arange(0, BO)
    mp = p < P
    mo = o < C
    m = mo[:, None] & mp[None, :]
    h = p // W
    w = p - h * W
    c4 = tl.load(codes_ptr + 4)
    c5 = tl.load(codes_ptr + 5)
    c6 = tl.load(codes_ptr + 6)
    acc_pw = tl.full((BO, BP), 0.0, tl.float32)
    acc_al0 = tl.full((BO,), 0.0, tl.float32)
    acc_al1 = tl.full((BO,), 0.0, tl.float32)
    acc_al2 = tl.full((BO,), 0.0, tl.float32)
    acc_al3 = tl.full((BO,), 0.0, tl.float32)
    start = tl.program_id(2) * NB
    for i in range(0, tl.minimum(NB, N - start)):
        n = _wide(start + i, I64)
        mm = m
        off, nsz, ia, ib, ic, idd = _counts(a_ptr, px_ptr, pw_ptr, nsz_ptr, rows_ptr, n, o, p, mo, mp, mm,
                                            W, P, sa_n, sa_o, sa_h, sa_w, L, ROUND)
        k1, al1, t1, dt1, u1 = _slot(tab_ptr, dtab_ptr, 0, ia, codes_ptr, alpha_ptr, o, mo, C, RL, True)
        k2, al2, t2, dt2, u2 = _slot(tab_ptr, dtab_ptr, 1, idd, codes_ptr, alpha_ptr, o, mo, C, RL, True)
        k3, al3, t3, dt3, u3 = _slot(tab_ptr, dtab_ptr, 2, ib, codes_ptr, alpha_ptr, o, mo, C, RL, True)
        k4, al4, t4, dt4, u4 = _slot(tab_ptr, dtab_ptr, 3, ic, codes_ptr, alpha_ptr, o, mo, C, RL, True)
        b1 = _binary(c4, u1, u2, INTERP)
        b2 = _binary(c5, u3, u4, INTERP)
        doff = n * sd_n + o[:, None] * sd_o + (h * sd_h + w * sd_w)[None, :]
        g = tl.load(dy_ptr + doff, mask=mm, other=0.0)
        g1, g2 = _binary_backward(c6, b1, b2, g, INTERP)
        gu1, gu2 = _binary_backward(c4, u1, u2, g1, INTERP)
        gu3, gu4 = _binary_backward(c5, u3, u4, g2, INTERP)
        ga, gal1 = _count_grad(k1, al1, t1, dt1, gu1, nsz, CONV, CLIP, limit)
        gd, gal2 = _count_grad(k2, al2, t2, dt2, gu2, nsz, CONV, CLIP, limit)
        gb, gal3 = _count_grad(k3, al3, t3, dt3, gu3, nsz, CONV, CLIP, limit)
        gc, gal4 = _count_grad(k4, al4, t4, dt4, gu4, nsz, CONV, CLIP, limit)
        tl.store(ga_ptr + off, ((ga - gb) - gc) + gd, mask=mm)
        gcd = tl.where(mm, gc - gd, 0.0)
        tl.store(gpx_part_ptr + (n * tl.num_programs(1) + pid_o) * P + p, _sum(gcd, axis=0), mask=mp)
        acc_pw += tl.where(mm, gb - gd, 0.0)
        acc_al0 += _sum(tl.where(mm, gal1, 0.0), axis=1)
        acc_al1 += _sum(tl.where(mm, gal2, 0.0), axis=1)
        acc_al2 += _sum(tl.where(mm, gal3, 0.0), axis=1)
        acc_al3 += _sum(tl.where(mm, gal4, 0.0), axis=1)
    tl.store(gpw_part_ptr + chunk * C * P + o[:, None] * P + p[None, :], acc_pw, mask=m)
    base = gal_part_ptr + (chunk * tl.num_programs(0) + pid_p) * 4 * C
    tl.store(base + o, acc_al0, mask=mo)
    tl.store(base + C + o, acc_al1, mask=mo)
    tl.store(base + 2 * C + o, acc_al2, mask=mo)
    tl.store(base + 3 * C + o, acc_al3, mask=mo)


# ----------------------------------------------------------------------------------------------
# Launchers. Tiles: BP pixels by BO channels; the backward walks NB images per program and keeps
# dL/dpw's running sum in registers, so its partials are (ceil(N / NB), C, P), its dL/dpx partials
# (N, ceil(C / BO), P) and alpha's (ceil(N / NB), ceil(P / BP), 4, C).
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tiling:
    """How a kernel is launched on a GPU: ``elements`` per program (BO x BP), at most ``max_pixels`` of them
    pixels, ``warps`` per program; the backward aims for at least ``programs`` programs, walking fewer
    images each until the grid fills the device (0: the images per program the caller gives)."""
    elements: int
    max_pixels: int
    warps: int
    programs: int = 0


# The shipped launch shapes (docs/performance.md, GPU: bench/tune_gpu_measure.py's sweep on an H200). The
# backward's 2048-element tiles spilled (255 registers); 256 elements (2 per thread) halved its time.
FORWARD = Tiling(elements=2048, max_pixels=128, warps=4)
BACKWARD = Tiling(elements=256, max_pixels=16, warps=4)


def _tiles(o: int, p: int, n: int, images: int, tiling: Tiling) -> tuple[int, int, int]:
    """(BO, BP, NB) on a GPU; under the interpreter, whose cost is per operation and per program, one
    program for the whole tensor."""
    if INTERPRETED:
        return triton.next_power_of_2(max(o, 1)), triton.next_power_of_2(max(p, 1)), max(n, 1)
    bp = min(tiling.max_pixels, triton.next_power_of_2(max(p, 1)))
    bo = min(max(1, tiling.elements // bp), triton.next_power_of_2(max(o, 1)), 64)
    nb = images
    if tiling.programs:
        per_image = triton.cdiv(p, bp) * triton.cdiv(o, bo)
        nb = min(images, n * per_image // tiling.programs)
    return bo, bp, max(1, min(nb, n))


def _wide_offsets(*tensors: torch.Tensor) -> bool:
    """Whether a kernel over these tensors needs int64 offsets: a tensor spans 2**30 elements or more (the
    margin covers a masked lane's offset past the last element)."""
    return max(max(t.numel(), 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0))
               for t in tensors) >= 2**30


def _spatial(t):
    # (N, C, H, W) strides of a 4-D tensor; a 2-D (N, C) one is (N, C, 1, 1).
    if t.dim() == 2:
        return t.stride(0), t.stride(1), 0, 0
    return t.stride()


def forward(a, px, pw, nsz, rows, codes, alpha, tab, round_counts: bool):
    """The measure of the counts (a, px, pw, n): a new tensor of a's shape and strides."""
    n_img, o = a.shape[0], a.shape[1]
    width = a.shape[3] if a.dim() == 4 else 1
    p = nsz.numel()
    px, pw = px.contiguous(), pw.contiguous()
    out = torch.empty_like(a)
    bo, bp, nb = _tiles(o, p, n_img, 1, FORWARD)
    grid = (triton.cdiv(p, bp), triton.cdiv(o, bo), triton.cdiv(n_img, nb))
    measure_forward_kernel[grid](a, px, pw, nsz, rows, codes, alpha, tab, out, n_img, o, p, width, *_spatial(a),
                                 tab.shape[-1], tab[0].numel(), nb, ROUND=bool(round_counts), INTERP=INTERPRETED,
                                 BO=bo, BP=bp, I64=_wide_offsets(a, out), num_warps=FORWARD.warps, **NO_CONTRACTION)
    return out


def backward(dy, a, px, pw, nsz, rows, codes, alpha, tab, dtab, convention: int, clip, round_counts: bool,
             images_per_program: int = 16):
    """(dL/da like a, dL/dpx like px, dL/dpw like pw, dL/dalpha (4, C)) given dL/dy = ``dy``."""
    n_img, o = a.shape[0], a.shape[1]
    width = a.shape[3] if a.dim() == 4 else 1
    p = nsz.numel()
    px, pw = px.contiguous(), pw.contiguous()
    bo, bp, nb = _tiles(o, p, n_img, images_per_program, BACKWARD)
    chunks, p_blocks, o_blocks = triton.cdiv(n_img, nb), triton.cdiv(p, bp), triton.cdiv(o, bo)
    ga = torch.empty_like(a)
    f32 = dict(dtype=torch.float32, device=a.device)
    gpx_part = torch.empty((n_img, o_blocks, p), **f32)
    gpw_part = torch.empty((chunks, o, p), **f32)
    gal_part = torch.empty((chunks, p_blocks, 4, o), **f32)
    limit = float(min(clip, 3.4028234663852886e38)) if clip is not None else 0.0
    measure_backward_kernel[(p_blocks, o_blocks, chunks)](
        dy, a, px, pw, nsz, rows, codes, alpha, tab, dtab, ga, gpx_part, gpw_part, gal_part,
        n_img, o, p, width, *_spatial(a), *_spatial(dy), tab.shape[-1], tab[0].numel(), nb, limit,
        CONV=convention, CLIP=clip is not None, ROUND=bool(round_counts), INTERP=INTERPRETED, BO=bo, BP=bp,
        I64=_wide_offsets(a, dy, ga, gpx_part, gpw_part, gal_part), num_warps=BACKWARD.warps, **NO_CONTRACTION)
    gpx = gpx_part.sum(1).view(px.shape)
    gpw = gpw_part.sum(0).view(pw.shape)
    galpha = gal_part.sum((0, 1))
    return ga, gpx, gpw, galpha
