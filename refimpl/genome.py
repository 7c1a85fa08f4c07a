"""``Genome``: seven operator codes ``U1 U2 U3 U4 B1 B2 B3`` (docs/design.md sections 2, 3 and 8).

    a' = U1(a)   d' = U2(d)   b' = U3(b)   c' = U4(c)
    y  = B3( B1(a', d'), B2(b', c') )
"""
from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass

from . import formula as _formula
from .operators import BINARY, N_BINARY, N_UNARY, UNARY, UNARY_SLOT_INPUTS

SLOT_NAMES = ("U1", "U2", "U3", "U4", "B1", "B2", "B3")

# The paper's Table "Promising Similarity Measures", encoded (docs/design.md section 4). Binary code 6 is
# y/x, so "B3 = y/x" puts B1(a', d') in the denominator. M6's b'*sigmoid(c') is binary code 10,
# M9's b'/(c'*(a'+d')) is (b'/c') / (a'+d'), i.e. B2 = x/y and B3 = y/x.
PAPER_MEASURES: dict[str, str] = {
    "baseline": "0-0-0-0-0-0-1",
    "M1": "3-0-3-0-0-1-6",
    "M2": "3-0-3-8-0-0-6",
    "M3": "3-0-3-0-0-0-6",
    "M4": "3-0-3-6-0-1-6",
    "M5": "3-14-0-11-0-1-6",
    "M6": "3-0-3-0-0-10-6",
    "M7": "3-15-3-0-0-0-4",
    "M8": "3-0-3-13-0-0-6",
    "M9": "3-2-3-10-0-4-6",
    "M10": "3-2-3-8-0-0-6",
}

# Classic binary similarity measures the fixed graph expresses exactly.
CLASSIC_MEASURES: dict[str, str] = {
    "jaccard": "0-1-0-0-0-0-5",  # a / (a + b + c): U2 = 0 drops d, B3 = x/(x+y)
    "sokal_michener": "0-0-0-0-0-0-5",  # (a + d) / n
    "hamming": "0-0-0-0-0-0-7",  # normalized Hamming distance (b + c) / n
}

REGISTERED: dict[str, str] = {**PAPER_MEASURES, **CLASSIC_MEASURES}
_REGISTERED_LOWER = {k.lower(): v for k, v in REGISTERED.items()}


@dataclass(frozen=True, order=True)
class Genome:
    """The seven operator codes ``U1-U2-U3-U4-B1-B2-B3`` of one measure, checked at construction.

    ``Genome.parse`` reads the text form or a registered name; ``str()`` writes the text form.
    """
    codes: tuple[int, int, int, int, int, int, int]

    def __post_init__(self) -> None:
        codes = tuple(self.codes)
        if len(codes) != len(SLOT_NAMES):
            raise ValueError(f"a genome has {len(SLOT_NAMES)} codes ({' '.join(SLOT_NAMES)}), got {len(codes)}")
        checked = []
        for i, code in enumerate(codes):
            try:
                code = operator.index(code)  # ints and NumPy integers, not floats
            except TypeError:
                raise ValueError(f"genome code {SLOT_NAMES[i]} must be an integer, got {code!r}") from None
            unary = i < len(UNARY_SLOT_INPUTS)
            limit = N_UNARY if unary else N_BINARY
            kind = "unary" if unary else "binary"
            if not 0 <= code < limit:
                raise ValueError(
                    f"genome code {SLOT_NAMES[i]} (position {i + 1}) is {code}; "
                    f"{kind} codes are 0..{limit - 1}"
                )
            checked.append(code)
        object.__setattr__(self, "codes", tuple(checked))

    # -- parsing ---------------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: "str | Genome") -> "Genome":
        """Parse canonical ``0-0-0-0-0-0-1``, the paper's ``0000001``, or a registered name.

        Codes are ASCII digits only: ``\\d`` and ``int`` would also read '٣' or '３'."""
        if isinstance(text, Genome):
            return text
        if not isinstance(text, str):
            raise ValueError(f"a genome is given as text, got {type(text).__name__}")
        s = text.strip()
        if not s:
            raise ValueError("empty genome text; expected e.g. '0-0-0-0-0-0-1', '0000001' or 'M1'")
        if s.lower() in _REGISTERED_LOWER:
            return cls.parse(_REGISTERED_LOWER[s.lower()])
        if re.fullmatch(r"[0-9]{7}", s):
            return cls(tuple(int(ch) for ch in s))
        if "-" in s:
            parts = s.split("-")
            if len(parts) != 7:
                raise ValueError(
                    f"genome {text!r} has {len(parts)} codes; expected 7 joined by '-' "
                    "(U1-U2-U3-U4-B1-B2-B3)"
                )
            for i, p in enumerate(parts):
                if not re.fullmatch(r"[0-9]+", p):
                    raise ValueError(
                        f"genome {text!r}: code {SLOT_NAMES[i]} (position {i + 1}) is {p!r}, "
                        "not a non-negative integer"
                    )
            return cls(tuple(int(p) for p in parts))
        if re.fullmatch(r"[0-9]+", s):
            raise ValueError(
                f"genome {text!r} has {len(s)} digits; the 7-digit form needs exactly 7 single-digit "
                "codes (use '-' between codes, e.g. '3-14-0-11-0-1-6')"
            )
        names = ", ".join(REGISTERED)
        raise ValueError(f"unknown genome {text!r}; give 7 codes like '0-0-0-0-0-0-1' or a name: {names}")

    # -- views -----------------------------------------------------------------------------------
    def __str__(self) -> str:
        return "-".join(str(c) for c in self.codes)

    def __repr__(self) -> str:
        return f"Genome('{self}')"

    @property
    def unary(self) -> tuple[int, int, int, int]:
        """The codes of the four unary slots: a' = U1(a), d' = U2(d), b' = U3(b), c' = U4(c)."""
        return self.codes[:4]

    @property
    def binary(self) -> tuple[int, int, int]:
        """The codes of the three binary nodes: B1(a', d'), B2(b', c'), B3(B1, B2)."""
        return self.codes[4:]

    @property
    def name(self) -> str | None:
        """The registered name of this genome, if it has one."""
        for name, text in REGISTERED.items():
            if text == str(self):
                return name
        return None

    def uses_alpha(self) -> tuple[bool, bool, bool, bool]:
        """Per unary slot, whether its operator reads a learnable per-channel alpha."""
        return tuple(UNARY[c].uses_alpha for c in self.unary)

    def expression(self, alpha_names=None) -> ast.expr:
        """The measure as one expression tree over the names a, b, c, d and the slots' alphas.

        ``alpha_names``: the name of each unary slot's alpha (default ``alpha_a`` ... ``alpha_c``).
        """
        if alpha_names is None:
            alpha_names = [f"alpha_{count}" for count in UNARY_SLOT_INPUTS]
        slots = [
            _formula.substitute(_formula.parse(UNARY[code].formula), {"x": ast.Name(count), "alpha": ast.Name(alpha)})
            for code, count, alpha in zip(self.unary, UNARY_SLOT_INPUTS, alpha_names)
        ]
        a_, d_, b_, c_ = slots
        b1, b2, b3 = (_formula.parse(BINARY[c].formula) for c in self.binary)
        left = _formula.substitute(b1, {"x": a_, "y": d_})
        right = _formula.substitute(b2, {"x": b_, "y": c_})
        return _formula.substitute(b3, {"x": left, "y": right})

    def formula(self) -> str:
        """The measure as a formula in a, b, c, d (alphas named alpha_a ... alpha_c)."""
        return _formula.render(self.expression())
