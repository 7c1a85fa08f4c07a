"""Genome text (docs/design.md section 3): the accepted forms, canonical printing, and clear errors."""
from __future__ import annotations

import pytest

from refimpl import BINARY, CLASSIC_MEASURES, PAPER_MEASURES, REGISTERED, UNARY, Genome


@pytest.mark.parametrize(
    "text,codes",
    [
        ("0-0-0-0-0-0-1", (0, 0, 0, 0, 0, 0, 1)),
        ("0000001", (0, 0, 0, 0, 0, 0, 1)),
        ("baseline", (0, 0, 0, 0, 0, 0, 1)),
        ("M1", (3, 0, 3, 0, 0, 1, 6)),
        ("m1", (3, 0, 3, 0, 0, 1, 6)),
        ("3-14-0-11-0-1-6", (3, 14, 0, 11, 0, 1, 6)),
        ("17-17-17-17-13-13-13", (17, 17, 17, 17, 13, 13, 13)),
        ("  3-0-3-0-0-1-6 ", (3, 0, 3, 0, 0, 1, 6)),
    ],
)
def test_parse_accepted_forms(text, codes):
    assert Genome.parse(text).codes == codes


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_registered_names_round_trip_through_canonical_text(name):
    g = Genome.parse(name)
    assert str(g) == REGISTERED[name]
    assert Genome.parse(str(g)) == g
    assert g.name == name


def test_canonical_text_and_codes():
    g = Genome.parse("3003006")  # M3 in the paper's 7-digit form
    assert str(g) == "3-0-0-3-0-0-6" and g.codes == (3, 0, 0, 3, 0, 0, 6)
    assert repr(g) == "Genome('3-0-0-3-0-0-6')"


def test_formula_of_m1():
    assert Genome.parse("M1").formula() == "(b**3 - c) / (a**3 + d)"


def test_formula_of_baseline_and_classics():
    assert Genome.parse("baseline").formula() == "a + d - (b + c)"
    # The right operand keeps its parentheses: float addition is not associative.
    assert Genome.parse("jaccard").formula() == "(a + 0) / (a + 0 + (b + c))"


@pytest.mark.parametrize(
    "text,fragments",
    [
        ("", ["empty"]),
        ("   ", ["empty"]),
        ("0-0-0-0-0-1", ["6 codes", "expected 7"]),
        ("0-0-0-0-0-0-1-1", ["8 codes", "expected 7"]),
        ("18-0-0-0-0-0-1", ["U1", "position 1", "18", "0..17"]),
        ("0-0-0-0-0-0-14", ["B3", "position 7", "14", "0..13"]),
        ("0-0-0-0-14-0-1", ["B1", "position 5", "0..13"]),
        ("0-0-0-x-0-0-1", ["U4", "position 4", "'x'"]),
        ("0-0-0--1-0-0-1", ["8 codes"]),
        ("0-0-0- -0-0-1", ["U4", "position 4"]),
        ("000000", ["6 digits", "exactly 7"]),
        ("00000001", ["8 digits", "exactly 7"]),
        ("M11", ["unknown genome", "'M11'", "baseline"]),
        ("resnet", ["unknown genome", "M1"]),
    ],
)
def test_bad_text_raises_value_error_naming_the_problem(text, fragments):
    with pytest.raises(ValueError) as info:
        Genome.parse(text)
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in {info.value}"


@pytest.mark.parametrize(
    "codes,fragment",
    [
        ((0,) * 6, "7 codes"),
        ((0, 0, 0, -1, 0, 0, 1), "U4 (position 4) is -1"),
        ((0, 0, 0, 0, 0, 0, 1.0), "must be an integer"),
    ],
)
def test_bad_codes_raise(codes, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Genome(codes)


def test_parse_rejects_non_text():
    with pytest.raises(ValueError, match="int"):
        Genome.parse(1)


def test_registered_genomes_cover_the_paper_and_classics():
    assert set(PAPER_MEASURES) == {"baseline"} | {f"M{i}" for i in range(1, 11)}
    assert {"jaccard", "sokal_michener", "hamming"} <= set(CLASSIC_MEASURES)


def test_every_code_parses_in_every_slot():
    for slot in range(7):
        table = UNARY if slot < 4 else BINARY
        for op in table:
            codes = [0, 0, 0, 0, 0, 0, 1]
            codes[slot] = op.code
            assert Genome.parse("-".join(map(str, codes))).codes[slot] == op.code
