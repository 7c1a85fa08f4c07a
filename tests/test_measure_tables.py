"""The engine's generated measure is refimpl.measure(dtype=float32), bit for bit, and its lookup
tables (refimpl/codegen/measure_tables.py) change no bit.

Every unary code in every slot, under every count convention, with every table entry of a few
window sizes looked up: the tabled generated code equals ``refimpl.measure(dtype=float32)`` and
the untabled generated code bit for bit. Exported models of every paper measure give the same
logits and unit outputs with tables on and off, and that comparison sees a one-ulp change in one
table entry.
"""
from __future__ import annotations

import numpy as np
import pytest

from refimpl import PAPER_MEASURES, Genome, measure
from refimpl.codegen import epilogue_template
from refimpl.codegen import measure_tables as mt
from refimpl.conventions import NAMES as CONVENTIONS
from refimpl.engine import epilogue
from refimpl.engine.plan import measure_tables
from refimpl.kernels.scratch import y_scratch
from refimpl.operators import BINARY, UNARY

N_UNARY, N_BINARY = len(UNARY), len(BINARY)
WINDOWS = (1, 2, 9, 64, 300)  # window sizes n: each count takes every value 0..n below


def _latin_genomes():
    # Genome j puts unary code (j + s) % 18 in slot s: over j, every code in every slot; binary
    # codes cycle so that each appears, with one-count operands (x_gate_y's 1 + exp(-y)) too.
    return ["-".join(map(str, [(j + s) % N_UNARY for s in range(4)]
                         + [j % N_BINARY, (j + 5) % N_BINARY, (j + 10) % N_BINARY])) for j in range(N_UNARY)]


def _counts():
    """(a, b, c, d) int64, (1, 3, L): for each window size n and each count, that count at every
    value 0..n with the rest of n split at random among the other three."""
    rng = np.random.default_rng(3)
    rows = []
    for n in WINDOWS:
        for which in range(4):
            for x in range(n + 1):
                cut = np.sort(rng.integers(0, n - x + 1, 2))
                rest = [cut[0], cut[1] - cut[0], n - x - cut[1]]
                rows.append(rest[:which] + [x] + rest[which:])
    counts = np.array(rows, dtype=np.int64).T  # (4, L)
    return tuple(np.broadcast_to(v, (1, 3, v.size)).copy() for v in counts)


def _bits(x):
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def test_latin_genomes_put_every_unary_code_in_every_slot_and_use_every_binary_code():
    genomes = [Genome.parse(g) for g in _latin_genomes()]
    assert {(s, g.unary[s]) for g in genomes for s in range(4)} == {(s, u) for s in range(4) for u in range(N_UNARY)}
    assert {b for g in genomes for b in g.binary} == set(range(N_BINARY))


def test_split_tables_the_costly_one_count_subtrees_only():
    # M5 = (b - erf(c)) / (a**3 + exp(-d**2)): erf(c), a**3 and exp(-d**2) become lookups; b stays.
    tree, found = mt.split(Genome.parse("M5").expression())
    assert [(count, mt.ast.unparse(node)) for count, node in found] == [
        ("c", "erf(c)"), ("a", "a ** 3"), ("d", "exp(-d ** 2)")]
    assert mt.ast.unparse(tree) == "(b - T0) / (T1 + T2)"
    # M6's x_gate_y of c: the whole 1 + exp(-c); the square of M9's d is plain arithmetic.
    assert [mt.ast.unparse(n) for _, n in mt.split(Genome.parse("M6").expression())[1]] == [
        "b ** 3", "1 + exp(-c)", "a ** 3"]
    assert mt.ast.unparse(mt.split(Genome.parse("M9").expression())[0]) == "T0 / T1 / (T2 + d ** 2)"
    assert mt.split(Genome.parse("baseline").expression())[1] == []


@pytest.mark.parametrize("counts", CONVENTIONS)
@pytest.mark.parametrize("genome", _latin_genomes())
def test_tabled_measure_equals_refimpl_measure_and_the_untabled_code(genome, counts):
    a, b, c, d = _counts()
    alpha = np.random.default_rng(5).uniform(-2, 2, (4, 3)).astype(np.float32)
    expected = measure(genome, a, b, c, d, alpha=alpha, dtype=np.float32, counts=counts)
    mod, arrays = epilogue.load(genome, counts), epilogue.load_arrays(genome)
    n = (a + b + c + d).reshape(-1)
    tab, toff, _ = measure_tables(mod, n)  # the convention's tables, as the engine builds them
    assert mod.N_TABLES == arrays.N_TABLES == len(mt.split(Genome.parse(genome).expression())[1])
    f32 = [v.astype(np.float32) for v in (a, b, c, d)]
    cv = epilogue.convention_vector(counts)
    tabled, untabled = np.empty(a.shape, np.float32), np.empty(a.shape, np.float32)
    arrays.measure_array_tabled(*f32, toff.reshape(a.shape), tab, cv, alpha, tabled)
    arrays.measure_array(*f32, cv, alpha, untabled)
    np.testing.assert_array_equal(_bits(tabled), _bits(untabled))
    np.testing.assert_array_equal(np.isnan(tabled), np.isnan(expected))
    np.testing.assert_array_equal(tabled, expected)  # infinities with their signs, finite values exactly


def test_tables_have_one_row_per_window_size_except_under_raw_counts():
    n = np.array([4, 6, 9, 6, 4, 9, 9])
    raw, freq = epilogue.load("M1", "raw"), epilogue.load("M1", "freq")
    tab, toff, _ = measure_tables(raw, n)
    assert tab.shape == (2, 10) and not toff.any()
    tab, toff, _ = measure_tables(freq, n)
    assert tab.shape == (2, 30) and list(toff) == [0, 10, 20, 10, 0, 20, 20]
    # the row of n = 6, at count 3: b**3 of the frequency 3/6, as refimpl.measure would take it
    x = np.float32(3) / np.float32(6)
    assert tab[0, 10 + 3] == np.float32(x) ** np.float32(3)


# ---------------------------------------------------------------------------------------------
# The generated epilogue's measure is refimpl.measure(dtype=float32), bit for bit


# The Latin square covers every code in every slot (a superset of the 5 genomes this test had),
# and its modules are the ones the test above loads: one per genome for the three conventions, compiled
# once for both tests (the suite's cold time). The epilogue tasks write each convention out instead; the
# two forms agree operation for operation (verify/test_conventions.py), and the models of
# verify/test_model_predictions.py run the tasks under each convention against torch.
@pytest.mark.parametrize("counts", CONVENTIONS)
@pytest.mark.parametrize("genome", list(PAPER_MEASURES) + _latin_genomes())
def test_generated_measure_equals_refimpl_measure_float32(genome, counts):
    rng = np.random.default_rng(7)
    shape = (2, 6, 257)
    a, b, c, d = (rng.integers(0, 700, shape) for _ in range(4))
    a[0, 0, :20] = 0  # zero counts: log(0), 0/0, division by zero
    d[0, 1, :20] = 0
    c[1, 2, :20] = 0
    alpha = rng.uniform(-2, 2, (4, 6)).astype(np.float32)
    expected = measure(genome, a, b, c, d, alpha=alpha, dtype=np.float32, counts=counts)
    got = np.empty(shape, np.float32)
    epilogue.load_arrays(genome).measure_array(*(v.astype(np.float32) for v in (a, b, c, d)),
                                              epilogue.convention_vector(counts), alpha, got)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(got, expected)  # infinities with their signs, finite values exactly


def test_measure_expression_is_the_genome_formula():
    # The generated expression and Genome.formula() come from the same table substitution.
    src = epilogue_template.generate("M1")
    assert f"measure = {Genome.parse('M1').formula()}" in src
    assert "b ** F(3.0) - c" in epilogue_template.measure_expression("M1")


# ---------------------------------------------------------------------------------------------
# Whole exported models: tables on and off give the same bits


# M5 and M9 are not finite with binary downsampling on raw counts (verify/test_model_predictions.py
# says why), so they take the real shortcut; the others exercise the binary one (epilogue_down).
MODEL_CASES = ([(name, "real" if name in ("M5", "M9") else "binary", "raw") for name in PAPER_MEASURES]  # baseline first
               + [("M5", "binary", "laplace"), ("M9", "binary", "laplace"), ("M7", "binary", "freq")])


def _model_pair(tmp_path, name, downsample, counts):
    """(engine model with tables, the same file's engine model without), from an exported
    downsampling_net with random alphas and BatchNorm statistics set from digits images."""
    import torch

    from bnn.export import export_model
    from bnn.nn.layers import BinaryConv2d
    from bnn.nn.models import calibrate_batchnorm
    from refimpl import engine
    from verify.nets import downsampling_net

    torch.manual_seed(0)
    model = downsampling_net(name, 10, (1, 8, 8), downsample=downsample, counts=counts)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, BinaryConv2d):
                m.alpha.copy_(0.5 + 2 * torch.rand(m.alpha.shape))
    calibrate_batchnorm(model, torch.from_numpy(_digits(256)))
    path = str(tmp_path / f"{name}-{downsample}-{counts}.bnn")
    export_model(model, path)
    tabled, untabled = engine.load(path), engine.load(path)
    untabled._epilogue = epilogue.load(untabled.genome, untabled.counts, tables=False)
    return tabled, untabled


def _digits(n):
    from sklearn.datasets import load_digits

    images = load_digits().images.astype(np.float32)[:n].reshape(-1, 1, 8, 8)
    return (images - images.mean()) / images.std()


def _differences(tabled, untabled, x) -> list[str]:
    """What differs, bit for bit, between the two models on ``x``: the tabled model's logits of the
    fused run, and logits and every unit's output of the debug (two-pass) run, against the untabled
    model's debug run. The untabled model runs only the two-pass kernels: its fused ones would be a
    second compile of every task per case (the suite's cold time), and the tabled fused run equals
    the untabled two-pass one only if fused and two-pass agree too."""
    found = []
    (lt, rt), (lu, ru) = tabled.run(x, debug=True), untabled.run(x, debug=True)
    if not np.array_equal(_bits(tabled.run(x)), _bits(lu)):
        found.append("logits")
    if not np.array_equal(_bits(lt), _bits(lu)):
        found.append("debug logits")
    found += [r["name"] for r, s in zip(rt, ru) if "y" in r and not np.array_equal(_bits(r["y"]), _bits(s["y"]))]
    return found


@pytest.mark.parametrize("name, downsample, counts", MODEL_CASES)
def test_exported_models_give_the_same_bits_with_and_without_tables(tmp_path, name, downsample, counts):
    tabled, untabled = _model_pair(tmp_path, name, downsample, counts)
    x = _digits(64)  # batch 64 runs the fused kernels, the debug run the two-pass ones
    assert tabled._epilogue.N_TABLES == len(mt.split(Genome.parse(name).expression())[1])
    assert untabled._epilogue.N_TABLES == 0
    assert _differences(tabled, untabled, x) == []


def test_the_model_comparison_sees_one_table_entry_one_ulp_off(tmp_path):
    # M9 = b**3 / atan(c) / (a**3 + d**2): its table of c (table 1), which a division keeps to
    # the ulp. Not a cube (this small network's windows, at most 72 bits, take their cubes as
    # products) and without a constant tail (which would serve most pixels from one entry).
    tabled, untabled = _model_pair(tmp_path, "M9", "real", "raw")
    x = _digits(64)
    assert _differences(tabled, untabled, x) == []
    # The most used entry of the table in the first unit, one ulp up. (Later units add a residual
    # of about 1 that absorbs an ulp of this network's small measure terms, which is why every
    # unit's output is compared.)
    _, record = tabled.run(x, debug=True)
    first = record[0]
    values, uses = np.unique(first["c"], return_counts=True)
    x_most = int(values[uses.argmax()])
    step = next(s for s in tabled._plan(64).steps if getattr(getattr(s, "layer", None), "conv", None) is not None
                and s.layer.conv.name == first["name"])
    tab = step.whole[0].tab
    assert tab.shape[0] == 3 and not step.whole[0].toff.any()  # b**3, atan(c), a**3; raw: one row
    saved = tab[1, x_most]
    try:
        tab[1, x_most] = np.nextafter(saved, np.float32(np.inf))
        assert first["name"] in _differences(tabled, untabled, x)
    finally:
        tab[1, x_most] = saved
    assert _differences(tabled, untabled, x) == []


# ---------------------------------------------------------------------------------------------
# Cubes of raw counts as products below the exact limit, lookups at and above it


def test_exact_cube_limit_is_the_first_count_whose_reference_cube_is_not_the_product():
    # The reference's cube alone: (a**3 + 0) + (0 + 0) under the add operator, in float32.
    x = np.arange(4097, dtype=np.int64).reshape(1, 1, -1)
    zero = np.zeros_like(x)
    cube = measure("3-1-1-1-0-0-0", x, zero, zero, zero, dtype=np.float32)
    xf = x.astype(np.float32)
    differs = np.flatnonzero(_bits(cube) != _bits((xf * xf) * xf))
    expected = int(differs[0]) if differs.size else mt.CUBE_SEARCH_END
    assert mt.exact_cube_limit() == expected
    assert mt.exact_cube_limit() > 64  # a cube below 2**24 is exact: the first ties come later


def test_the_cube_limit_is_measured_on_the_operator_tables_cube():
    assert UNARY[mt.CUBE_CODE].formula == "x**3"


def test_cube_count_is_raw_counts_cubed_only():
    tree, found = mt.split(Genome.parse("M5").expression())  # erf(c), a**3, exp(-d**2)
    assert [mt.cube_count(node, "raw") for _, node in found] == [None, "a", None]
    assert [mt.cube_count(node, "laplace") for _, node in found] == [None, None, None]


# Every genome here takes a fast path: M1, M7 cube two counts, M5 cubes a beside two saturating
# tables (erf(c), exp(-d**2)), M2, M6, M8 a saturating table of c between their cubes, M9 and M4
# a table without a constant tail (atan(c), sin(c)); the last genome cubes all four counts.
FAST_GENOMES = ["M1", "M2", "M4", "M5", "M6", "M7", "M8", "M9", "3-3-3-3-0-1-6"]


def _pixel(rng, n_out: int, kind: str):
    """(a, b, c, d) int64 (n_out,) of one pixel (px = a + c the same in every channel). ``fast``:
    every count in [120, 260], below the cube limit and past every paper table's constant tail;
    ``cubes``: a over [0, 700] and b, d over [0, 500] (cubes at and above the limit, some counts
    short of the tails); ``big``: a over [261, 600], c over [200, 539] and d over [150, 500] (the
    cubes at and above the limit, every count past the tails); ``tails``: below the cube limit,
    but c over [0, 40] and d over [0, 20] (short of the tails)."""
    if kind == "big":
        a, b, d = rng.integers(261, 601, n_out), rng.integers(0, 501, n_out), rng.integers(150, 501, n_out)
        return a, b, 800 - a, d
    if kind == "fast":
        a, b, d = rng.integers(120, 141, n_out), rng.integers(120, 261, n_out), rng.integers(120, 261, n_out)
        return a, b, 260 - a, d
    if kind == "cubes":
        a, b, d = rng.integers(0, 701, n_out), rng.integers(0, 501, n_out), rng.integers(0, 501, n_out)
        return a, b, 700 - a, d
    a, b, d = rng.integers(200, 241, n_out), rng.integers(0, 261, n_out), rng.integers(0, 21, n_out)
    return a, b, 240 - a, d


def _run_epilogue(mod, a, b, c, d, alpha, tab=None):
    """The generated ``epilogue_none`` of one image, counts (P, O) per pixel and channel, with
    scale 1 and shift 0 (so y = fma(m, 1, 0) = m); (out (P, O), the tables it used)."""
    px = (a + c)[:, 0]
    assert ((a + c) == px[:, None]).all()  # the engine's px is one value a pixel
    pw, npw = a + b, c + d
    P, n_out = a.shape
    built, _, tails = measure_tables(mod, (pw + npw).reshape(-1))
    tab = built.copy() if tab is None else tab
    out = np.empty((1, P, n_out), np.float32)
    epilogue.kernel(mod, "epilogue_none")(
        a[None].astype(np.int32), px[None].astype(np.float32), pw.astype(np.float32), npw.astype(np.float32),
        alpha, np.ones(n_out, np.float32), np.zeros(n_out, np.float32), tab, np.zeros(P, np.int64), tails,
        y_scratch(n_out), out, np.zeros((1, 1, 1, 1), np.uint64), False, P, 0, 0, 1)
    return out[0], tab


def _reference(genome, a, b, c, d, alpha):
    return measure(genome, *(v.T[None] for v in (a, b, c, d)), alpha=alpha, dtype=np.float32)[0].T


@pytest.mark.parametrize("genome", FAST_GENOMES)
def test_epilogue_fast_and_slow_pixels_equal_refimpl_measure(genome):
    # Each kind of pixel twice; 70 channels: four vectors of 16 and a remainder.
    rng = np.random.default_rng(11)
    kinds = ["fast", "cubes", "tails", "big", "fast", "tails", "big", "cubes"]
    mod = epilogue.load(genome, "raw")
    assert mod.CUBE_TABLES and mod.CUBE_EXACT == mt.exact_cube_limit()
    a, b, c, d = (np.stack(v) for v in zip(*(_pixel(rng, 70, kind) for kind in kinds)))
    alpha = rng.uniform(-2, 2, (4, 70)).astype(np.float32)
    out, _ = _run_epilogue(mod, a, b, c, d, alpha)
    expected = _reference(genome, a, b, c, d, alpha)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_array_equal(out, expected)  # infinities with their signs, finite values exactly


def test_tail_tables_are_the_saturating_ones():
    assert [mt.tail_candidate(n, "raw") for _, n in mt.split(Genome.parse("M5").expression())[1]] == [True, False, True]
    assert epilogue.load("M5", "raw").TAIL_TABLES == (0, 2)  # erf(c), exp(-d**2); a**3 is a cube
    for name in ("M4", "M9", "M1"):  # sin(c), atan(c): no constant tail; M1 only cubes
        assert epilogue.load(name, "raw").TAIL_TABLES == ()
    assert epilogue.load("M5", "laplace").TAIL_TABLES == epilogue.load("M5", "laplace").CUBE_TABLES == ()


def test_a_table_tail_starts_where_the_reference_becomes_constant():
    # erf(c) alone through the reference: (0 + 0) + (0 + erf(c)); M5's table 0 is erf(c).
    n = 3000
    c = np.arange(n + 1).reshape(1, 1, -1)
    zero = np.zeros_like(c)
    bits = _bits(measure("1-1-1-11-0-0-0", zero, zero, c, zero, dtype=np.float32)).reshape(-1)
    start = int(np.flatnonzero(bits != bits[-1])[-1]) + 1
    tab, _, tails = measure_tables(epilogue.load("M5", "raw"), np.array([n]))
    assert 0 < start < 100 and tails[0] == start
    assert tails[1] == n + 1  # a**3: not a tail table


def test_one_count_at_the_limit_sends_its_pixel_to_the_tables():
    # M1 = (b**3 - c) / (a**3 + d) cubes a and b (table 0 is b**3). Both pixels have b = 20
    # everywhere; pixel 1 has one a at the limit. An entry b = 20 made one ulp off changes
    # pixel 1 (it reads its cubes from the tables), not pixel 0 (it takes products).
    limit = mt.exact_cube_limit()
    mod = epilogue.load("M1", "raw")
    a = np.full((2, 16), 10)
    a[1, 5] = limit
    b, d = np.full((2, 16), 20), np.full((2, 16), 40)
    c = np.array([[30], [limit + 30]]) - a  # c is not cubed in M1: any size
    alpha = np.zeros((4, 16), np.float32)
    clean, tab = _run_epilogue(mod, a, b, c, d, alpha)
    np.testing.assert_array_equal(clean, _reference("M1", a, b, c, d, alpha))
    tab[0, 20] = np.nextafter(tab[0, 20], np.float32(np.inf))
    touched, _ = _run_epilogue(mod, a, b, c, d, alpha, tab)
    assert np.array_equal(_bits(touched[0]), _bits(clean[0]))
    assert not np.array_equal(_bits(touched[1]), _bits(clean[1]))


def test_one_count_short_of_a_tail_sends_its_pixel_to_the_tables():
    # M6 = b**3 / (1 + exp(-c)) / (a**3 + d): table 1 is 1 + exp(-c), 1.0 from some c on. Pixel
    # 0 has every c past the tail, pixel 1 the same but one c = 0. Both have c = 150 somewhere;
    # that entry made one ulp off changes pixel 1 (it looks c up), not pixel 0 (it takes the
    # tail's value, read at the tail's start).
    mod = epilogue.load("M6", "raw")
    a = np.full((2, 16), 50)
    a[1, 3] = 200
    c = np.array([[200], [200]]) - a  # pixel 0: c = 150; pixel 1: c = 150 and one c = 0
    b, d = np.full((2, 16), 30), np.full((2, 16), 60)
    alpha = np.zeros((4, 16), np.float32)
    clean, tab = _run_epilogue(mod, a, b, c, d, alpha)
    tails = measure_tables(mod, (a + b + c + d).reshape(-1))[2]
    assert 0 < tails[1] < 150
    np.testing.assert_array_equal(clean, _reference("M6", a, b, c, d, alpha))
    tab[1, 150] = np.nextafter(tab[1, 150], np.float32(np.inf))
    touched, _ = _run_epilogue(mod, a, b, c, d, alpha, tab)
    assert np.array_equal(_bits(touched[0]), _bits(clean[0]))
    assert not np.array_equal(_bits(touched[1]), _bits(clean[1]))


def test_plan_refuses_a_cube_table_that_is_not_its_product(monkeypatch):
    mod = epilogue.load("M1", "raw")
    build = mod.build_tables

    def off_by_one_ulp(ns, out):
        build(ns, out)
        out[1, 0, 7] = np.nextafter(out[1, 0, 7], np.float32(np.inf))

    monkeypatch.setattr(mod, "build_tables", off_by_one_ulp)
    monkeypatch.setattr(mod, "_TABLES", {})  # plan.py's cache of built tables
    with pytest.raises(RuntimeError, match="cube table"):
        measure_tables(mod, np.array([100, 90]))
