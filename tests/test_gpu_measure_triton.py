"""bnn/gpu's Triton measure (issue 37 items 1, 2, 4): refimpl's float32 measure bit for bit, eager autograd's
gradients, one custom operator and one compiled graph for every genome.

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set here before
``triton`` is imported) on CPU tensors. The interpreter costs about a millisecond per Triton
operation, whatever the tensor's size, and the launchers give it one program per launch, so the
tensors here are small and each test counts its launches.

The oracle for forward values is ``refimpl.measure(counts_conv2d(...), dtype=float32)``: equal bit
for bit (NaN where it has NaN) for genomes whose binary operators involve no ``exp``; for the
others (binary 10-13, whose ``exp`` of two operands cannot be tabled) the kernel runs NumPy's
``expf`` under the interpreter and libdevice's on a GPU, so the oracle is refimpl's expression
with NumPy's ``exp`` in those nodes (bit for bit under the interpreter; on a GPU the same
non-finite values, finite ones within rtol 1e-5 plus 1e-6 of the element's largest operand), and
NumPy's ``exp`` itself is checked within 2 ulp of refimpl's.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

# Measures that divide by zero or overflow on purpose: NumPy (the interpreter, the oracle) warns of what
# the tests compare, non-finite values in the same places, so the warning says nothing here.
pytestmark = pytest.mark.filterwarnings("ignore:(invalid value|divide by zero|overflow) encountered:RuntimeWarning")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when a kernel is decorated: bnn.gpu's import below
pytest.importorskip("triton")

import refimpl  # noqa: E402
from bnn.gpu import measure_kernels as kernels  # noqa: E402
from bnn.gpu.counts import count_sums  # noqa: E402
from bnn.gpu.measure_tables import rows_of, unary_table, unary_tables  # noqa: E402
from bnn.nn.layers import clip_measure_grad  # noqa: E402
from bnn.nn.measure import convert_counts  # noqa: E402
from bnn.nn.measure import measure as eager_measure  # noqa: E402
from refimpl._numba_ops import unary_f32  # noqa: E402
from refimpl.conventions import NAMES as CONVENTIONS  # noqa: E402
from refimpl.conventions import convert  # noqa: E402
from refimpl.operators import BINARY, UNARY  # noqa: E402

if DEVICE == "cpu" and not kernels.INTERPRETED:
    pytest.skip("TRITON_INTERPRET was 0 before this module set it, and there is no GPU", allow_module_level=True)

N_UNARY, N_BINARY = len(UNARY), len(BINARY)
EXP_BINARY = {10, 11, 12, 13}  # binary operators with an exp of two operands: not tabled
# (kernel, stride, padding, dilation): padded borders (n smaller there), stride 2, 1x1, no padding
GEOMETRIES = [(3, 1, 1, 1), (3, 2, 1, 1), (1, 2, 0, 1), (3, 1, 0, 2)]


def _latin_genomes():
    # Genome j puts unary code (j + s) % 18 in slot s and binary codes j, j + 5, j + 10 (mod 14): over
    # the 18 genomes, every unary code in every unary slot and every binary code in every binary slot.
    return [tuple([(j + s) % N_UNARY for s in range(4)] + [j % N_BINARY, (j + 5) % N_BINARY, (j + 10) % N_BINARY])
            for j in range(N_UNARY)]


def _random_genomes(count: int, seed: int):
    rng = np.random.default_rng(seed)
    return [tuple(int(v) for v in np.r_[rng.integers(0, N_UNARY, 4), rng.integers(0, N_BINARY, 3)])
            for _ in range(count)]


def _inputs(geometry, channels_last: bool, seed: int = 0, images: int = 2, c_in: int = 3, c_out: int = 4):
    """+-1 inputs with a blank region (a = 0, c = 0: divisors of zero) and weights, as int8 and float32."""
    k, stride, padding, dilation = geometry
    rng = np.random.default_rng(seed)
    x = np.where(rng.random((images, c_in, 6, 6)) < 0.5, 1, -1).astype(np.int8)
    x[0, :, :3, :3] = -1
    w = np.where(rng.random((c_out, c_in, k, k)) < 0.5, 1, -1).astype(np.int8)
    xt, wt = torch.from_numpy(x).float(), torch.from_numpy(w).float()
    a, px, pw, round_counts = count_sums(xt, wt, (stride, stride), (padding, padding), (dilation, dilation))
    if channels_last:
        a = a.contiguous(memory_format=torch.channels_last)
    ref = refimpl.counts_conv2d(x, w, stride=stride, padding=padding, dilation=dilation)
    n = (ref[0] + ref[1] + ref[2] + ref[3])[0, 0]  # refimpl's window sizes (P,)
    return dict(a=a, px=px, pw=pw, n=n, ref=ref, round_counts=round_counts)


def _setup(data, genome, counts, alpha_shift=0.25):
    g = refimpl.Genome(genome)
    ns, rows, length = rows_of(data["n"], counts)
    tab, dtab = unary_tables(g.codes[:4], counts, ns, length)
    c_out = data["a"].shape[1]
    alpha = torch.from_numpy(refimpl.default_alpha(g, c_out, np.float32)) + alpha_shift
    dev = dict(device=DEVICE)
    return dict(nsz=torch.tensor(data["n"].reshape(-1), dtype=torch.float32, **dev), rows=torch.from_numpy(rows).to(DEVICE),
                codes=torch.tensor(g.codes, dtype=torch.int32, **dev), alpha=alpha.to(DEVICE),
                tab=torch.from_numpy(tab).to(DEVICE), dtab=torch.from_numpy(dtab).to(DEVICE))


def _forward(data, s):
    a, px, pw = (data[k].to(DEVICE) for k in ("a", "px", "pw"))
    y = kernels.forward(a, px, pw, s["nsz"], s["rows"], s["codes"], s["alpha"], s["tab"], data["round_counts"])
    assert y.stride() == a.stride()
    return y.cpu().numpy()


def _np_binary(code, x, y):
    # refimpl's float32 binary operators, with NumPy's exp in 10-13 (the interpreter's).
    one = np.float32(1.0)
    with np.errstate(all="ignore"):
        return [lambda: x + y, lambda: x - y, lambda: y - x, lambda: x * y, lambda: x / y, lambda: x / (x + y),
                lambda: y / x, lambda: y / (x + y),
                lambda: np.where(np.isnan(x) | np.isnan(y), x + y, np.where(x >= y, x, y)),
                lambda: np.where(np.isnan(x) | np.isnan(y), x + y, np.where(x <= y, x, y)),
                lambda: x / (one + np.exp(-y)), lambda: y / (one + np.exp(-x)), lambda: np.exp(-np.abs(x - y)),
                lambda: np.exp(-((x - y) * (x - y)))][code]()


def _oracle(genome, counts, ref, alpha):
    """refimpl.measure's float32 expression, unary operators by refimpl's own scalar code, NumPy's exp."""
    a, b, c, d = (v.astype(np.float32) for v in ref)
    n = a + b + c + d
    conv = [v if counts == "raw" else convert(counts, v, n) for v in (a, d, b, c)]
    slots = []
    for k, x in enumerate(conv):
        al = np.broadcast_to(alpha[k].reshape(1, -1, 1, 1), x.shape)
        slots.append(np.vectorize(lambda v, q, code=genome[k]: unary_f32(code, np.float32(v), np.float32(q)),
                                  otypes=[np.float32])(x, al))
    b1, b2 = _np_binary(genome[4], slots[0], slots[1]), _np_binary(genome[5], slots[2], slots[3])
    y = _np_binary(genome[6], b1, b2)
    # Each element's largest finite operand on the way: the scale of the rounding a different exp can leave.
    scale = np.max([np.where(np.isfinite(v), np.abs(v), 0) for v in (*slots, b1, b2, y)], axis=0)
    return y, scale


def _assert_bits(got, want, what):
    same = (got.view(np.int32) == want.view(np.int32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: {int((~same).sum())} of {same.size} differ, e.g. {got[~same][:3]} vs {want[~same][:3]}"


def _check_forward(data, genome, counts):
    s = _setup(data, genome, counts)
    got = _forward(data, s)
    alpha = s["alpha"].cpu().numpy()
    want = refimpl.measure(refimpl.Genome(genome), *data["ref"], alpha=alpha, dtype=np.float32, counts=counts)
    if not EXP_BINARY & set(genome[4:]):
        _assert_bits(got, want, f"{genome} {counts} vs refimpl")
        return
    oracle, scale = _oracle(genome, counts, data["ref"], alpha)
    if kernels.INTERPRETED:
        _assert_bits(got, oracle, f"{genome} {counts} vs refimpl with NumPy's exp")
        return
    # libdevice's exp differs from NumPy's by an ulp or two, which a later x - y can leave as an absolute error
    # of a few ulps of its operands (seen on an H200: -1.2338e-4 against -1.2344e-4 from operands near 0.6).
    assert np.array_equal(np.isnan(got), np.isnan(oracle)), f"{genome} {counts}: NaN positions differ"
    assert np.array_equal(np.where(np.isinf(got), got, 0), np.where(np.isinf(oracle), oracle, 0)), \
        f"{genome} {counts}: infinities differ"
    finite = np.isfinite(oracle)
    err = np.abs(got[finite].astype(np.float64) - oracle[finite])
    assert (err <= 1e-5 * np.abs(oracle[finite]) + 1e-6 * scale[finite]).all(), f"{genome} {counts}: {err.max()}"


@pytest.mark.parametrize("counts", CONVENTIONS)
def test_tables_are_refimpl_float32_bits(counts):
    ns, length = (4, 6, 9, 27), 28
    for code in range(N_UNARY):
        table = unary_table(code, counts, ns, length)
        x = np.arange(length, dtype=np.float32)
        for r, n in enumerate(ns):
            conv = x if counts == "raw" else convert(counts, x, np.float32(n))
            want = np.array([unary_f32(0 if UNARY[code].uses_alpha else code, v, np.float32(0)) for v in conv],
                            dtype=np.float32)
            _assert_bits(table[r], want, f"code {code} n {n}")


@pytest.mark.parametrize("counts", CONVENTIONS)
def test_every_code_in_every_slot_matches_refimpl(counts):
    data = _inputs(GEOMETRIES[0], channels_last=False)
    for genome in _latin_genomes():  # 18 launches
        _check_forward(data, genome, counts)


def test_300_random_genomes_match_refimpl():
    # Every convention, geometry and layout in turn: 300 launches of one image each (the interpreter's cost
    # is per operation, and the launch loops over images).
    inputs = [_inputs(geom, cl, seed=i, images=1)
              for i, (geom, cl) in enumerate((g, cl) for g in GEOMETRIES for cl in (False, True))]
    for i, genome in enumerate(_random_genomes(300, seed=37)):
        _check_forward(inputs[i % len(inputs)], genome, CONVENTIONS[i % len(CONVENTIONS)])


def _ulps(got, want):
    finite = np.isfinite(want) & (want != 0)
    assert np.array_equal(np.isfinite(want), np.isfinite(got))
    return int(np.abs(got[finite].view(np.int32).astype(np.int64) - want[finite].view(np.int32)).max())


def test_exp_nodes_are_within_a_few_ulp_of_refimpl():
    # The one operation not taken from refimpl: exp inside binary operators 10-13. NumPy's (the interpreter's)
    # expf is within 2 ulp of refimpl's (glibc's) and libdevice's is documented within 2 ulp; the sigmoid gates
    # 10 and 11 divide by 1 + exp, which can double that (4 ulp measured: 1 + e keeps e's relative error for
    # large e, and two more roundings follow).
    from refimpl._numba_ops import binary_f32

    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-90, 90, 2000), rng.uniform(-5, 5, 2000)]).astype(np.float32)
    y = rng.uniform(-5, 5, x.size).astype(np.float32)
    assert _ulps(np.exp(-x), np.array([unary_f32(13, v, np.float32(0)) for v in x], dtype=np.float32)) <= 2
    for code in sorted(EXP_BINARY):
        ref = np.array([binary_f32(code, u, v) for u, v in zip(x, y)], dtype=np.float32)
        assert _ulps(_np_binary(code, x, y), ref) <= (4 if code in (10, 11) else 2), code


def test_inexact_counts_are_rounded_in_the_kernel():
    data = _inputs(GEOMETRIES[0], channels_last=False)
    noisy = dict(data, a=data["a"] + torch.empty_like(data["a"]).uniform_(-4e-3, 4e-3), round_counts=True)
    genome = refimpl.Genome.parse("M5").codes
    _assert_bits(_forward(noisy, _setup(noisy, genome, "raw")), _forward(data, _setup(data, genome, "raw")), "rounded")


def _eager_grads(data, s, genome, counts, dy, clip):
    """What the count convolution's backward receives from the eager measure: dL/da, dL/dpx, dL/dpw, dL/dalpha."""
    a, px, pw = data["a"], data["px"], data["pw"]
    n = torch.from_numpy(data["n"]).float().reshape(1, 1, *a.shape[2:])
    b = pw - a
    c = px - a
    cs = [t.detach().clone().requires_grad_() for t in (a, b, c, (n - pw) - c)]
    al = s["alpha"].cpu().clone().requires_grad_()
    y = eager_measure(refimpl.Genome(genome), *clip_measure_grad(convert_counts(counts, *cs, n), clip), al)
    grads = torch.autograd.grad(y, cs + [al], dy, allow_unused=True)
    ga, gb, gc, gd, gal = (torch.zeros_like(t) if g is None else g for g, t in zip(grads, cs + [al]))
    return ga - gb - gc + gd, (gc - gd).sum(1, keepdim=True), (gb - gd).sum(0, keepdim=True), gal


GRADIENT_GENOMES = [refimpl.Genome.parse(name).codes for name in ("baseline", "M1", "M5", "M6", "M7", "M9")] + [
    (1, 15, 3, 9, 10, 13, 12), (14, 2, 4, 5, 11, 12, 13), (0, 16, 17, 15, 8, 9, 4), (1, 1, 0, 0, 4, 5, 6),
    (3, 0, 5, 1, 5, 7, 4), (16, 16, 17, 17, 8, 9, 3), (0, 0, 0, 0, 3, 3, 4), (2, 4, 6, 7, 10, 11, 8)]


@pytest.mark.parametrize("counts", CONVENTIONS)
@pytest.mark.parametrize("clip", [None, 1.0])
def test_gradients_match_eager_autograd(counts, clip):
    # Genomes that divide by zero (a = 0, c = 0 in the blank region; 0/0, x/0), alpha codes, constant slots.
    # Half the genomes per clip setting (each genome under every convention); 3 images, 2 per program, so
    # dL/dpw's partial sums over image chunks are exercised, and channels_last with the clip off.
    data = _inputs(GEOMETRIES[0], channels_last=clip is None, images=3)
    gen = torch.Generator().manual_seed(7)
    for genome in GRADIENT_GENOMES[(clip is None)::2]:
        s = _setup(data, genome, counts)
        dy = torch.randn(data["a"].shape, generator=gen)
        got = kernels.backward(dy.to(DEVICE), *(data[k].to(DEVICE) for k in ("a", "px", "pw")), s["nsz"], s["rows"],
                               s["codes"], s["alpha"], s["tab"], s["dtab"], kernels.CONVENTION_CODES[counts], clip,
                               data["round_counts"], images_per_program=2)
        want = _eager_grads(data, s, genome, counts, dy, clip)
        for name, g, w in zip(("a", "px", "pw", "alpha"), got, want):
            torch.testing.assert_close(g.cpu(), w.reshape(g.shape), rtol=1e-5, atol=1e-5 * float(w.abs().nan_to_num(0, 0, 0).max()),
                                       equal_nan=True, msg=lambda m, name=name, genome=genome: f"{genome} d{name}: {m}")


def test_launch_tiles_on_a_gpu(monkeypatch):
    # The GPU launch shapes, computed by hand (the interpreter itself always takes one program per launch).
    monkeypatch.setattr(kernels, "INTERPRETED", False)
    t = kernels.Tiling(elements=256, max_pixels=16, warps=4)
    assert kernels._tiles(64, 1024, 128, 16, t) == (16, 16, 16)  # 16 channels x 16 pixels, 16 images
    assert kernels._tiles(512, 16, 128, 16, t) == (16, 16, 16)
    assert kernels._tiles(3, 5, 2, 16, t) == (4, 8, 2)  # powers of two covering the tensor, images <= N
    assert kernels._tiles(64, 1024, 128, 16, kernels.Tiling(2048, 128, 4)) == (16, 128, 16)
    assert kernels._tiles(1024, 4096, 8, 16, kernels.Tiling(8192, 64, 4)) == (64, 64, 8)  # BO at most 64
    # Aiming for 2048 programs: 1 x 32 tiles an image, so 128 * 32 // 2048 = 2 images a program.
    assert kernels._tiles(512, 16, 128, 16, kernels.Tiling(256, 16, 4, programs=2048)) == (16, 16, 2)
    assert kernels._tiles(512, 16, 4, 16, kernels.Tiling(256, 16, 4, programs=2048)) == (16, 16, 1)


def test_offsets_widen_to_int64_only_for_huge_tensors():
    meta = dict(device="meta", dtype=torch.float32)
    assert not kernels._wide_offsets(torch.empty(128, 512, 32, 32, **meta))
    assert kernels._wide_offsets(torch.empty(1024, 1024, 32, 32, **meta))  # 2**30 elements
    # A view spans its strides' reach, not only its elements.
    assert kernels._wide_offsets(torch.empty(2, 2**30, **meta)[:, :1])
    assert not kernels._wide_offsets(torch.empty(0, 64, **meta))
