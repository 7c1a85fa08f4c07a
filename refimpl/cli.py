"""What every command line of the project shares, refimpl's and bnn's: bad input is one line.

``OneLineParser`` is argparse with its errors printed as one ``error: ...`` line on stderr and exit
status 2, without the usage block (``--help`` still shows it).

The ``type=`` checkers below refuse a setting while the arguments are parsed, before anything
runs or is written: argparse prints ``argument --lr: expected a finite number > 0, got 'inf'``,
which names the option, the bad value and the valid range. Integers are ASCII digits only
(Python's ``int`` also reads '٣' and '３').
"""
from __future__ import annotations

import argparse
import difflib
import io
import math
import re
import sys
from fractions import Fraction

# Seeds reach torch.manual_seed, NumPy and Python's random: all take 0..2**63-1 as an int64.
SEED_MAX = 2**63 - 1
_INT = re.compile(r"[+-]?[0-9]+")
_UNSET = object()


class _Refused(SystemExit):
    """A refused command line: exit status 2 unless ``OneLineParser.parse`` returns it."""


# An error line is cut here: a value echoed back (a 100,000-character --measure) stays readable.
MAX_ERROR_CHARS = 500


def one_line(message) -> str:
    """``message`` (text or an exception) as one short line: runs of whitespace and newlines become
    one space, and a line over MAX_ERROR_CHARS is cut, saying how much was left out."""
    text = " ".join(str(message).split()) or type(message).__name__
    if len(text) > MAX_ERROR_CHARS:
        text = f"{text[:MAX_ERROR_CHARS]}... ({len(text) - MAX_ERROR_CHARS} more characters)"
    return text


def printable_streams() -> None:
    """Make stdout and stderr show a character their encoding lacks escaped instead of raising
    (``PYTHONIOENCODING=ascii`` and a non-ASCII path in a summary line was a traceback)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line and exit status 2; making one
    also makes the output streams ``printable_streams``, as every command line starts so."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        printable_streams()

    def error(self, message):
        """Print ``error: MESSAGE`` as one line and refuse the command line (status 2), no usage text;
        an unknown option gets the nearest known one (``--out-dir``: did you mean ``--out``?)."""
        print(f"error: {one_line(message)}{self._suggestion(message)}", file=sys.stderr)
        raise _Refused(2)

    def _suggestion(self, message) -> str:
        prefix = "unrecognized arguments: "
        if not str(message).startswith(prefix):
            return ""
        known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        near = []
        for word in str(message)[len(prefix):].split():
            if word.startswith("--") and (m := nearest_option(word.split("=", 1)[0], known)):
                near.append(f"{m} for {word.split('=', 1)[0]}")
        return f"; did you mean {', '.join(near)}? (--help lists every option)" if near else ""

    def parse(self, argv=None) -> tuple[argparse.Namespace | None, int]:
        """``(args, 0)``, or ``(None, 2)`` once the refusal's line is printed: a ``main(argv)``
        returns the status, so an in-process caller gets it rather than SystemExit (``--help``
        still exits, as argparse does)."""
        try:
            return self.parse_args(argv), 0
        except _Refused as exc:
            return None, exc.code

    def given(self, argv=None) -> set[str]:
        """The destinations the command line itself set, a default typed out included (argparse
        fills a default only where the namespace has no value yet, so the unset ones keep a marker)."""
        # An appending option adds to what the namespace holds: it starts from None, not the marker.
        appending = (argparse._AppendAction, argparse._AppendConstAction, argparse._CountAction)
        probe = argparse.Namespace(**{a.dest: None if isinstance(a, appending) else _UNSET
                                      for a in self._actions if a.dest != argparse.SUPPRESS})
        self.parse_args(argv, namespace=probe)
        return {k for k, v in vars(probe).items() if v is not _UNSET and v is not None}


def nearest_option(word: str, known: list[str]) -> str | None:
    """The known option a mistyped ``word`` most likely meant: itself with hyphens for underscores, the
    longest known option it starts with (``--out-dir``: ``--out``), else the closest spelling, or None."""
    dashed = "--" + word[2:].replace("_", "-")
    if dashed in known:
        return dashed
    starts = [k for k in known if dashed.startswith(k + "-") or dashed.startswith(k) and len(k) > 3]
    if starts:
        return max(starts, key=len)
    close = difflib.get_close_matches(dashed, known, 1, 0.75)
    return close[0] if close else None


# The reference's commands as ``python -m refimpl`` lists them (``python -m bnn`` lists the first two too).
COMMANDS = (
    ("refimpl.infer", "run an exported .bnn model on a CPU (accuracy, images/s, latency), without PyTorch"),
    ("refimpl.info", "the CPU, kernel path and versions, for bug reports"),
    ("refimpl.codegen", "write the generated kernel files, or --check that they are fresh"),
)


def command_index(prog: str, title: str, commands, argv) -> int:
    """``python -m PACKAGE``: its commands one line each (0), or one error line for anything else (2)."""
    if argv and argv[0] not in ("-h", "--help"):
        print(f"error: python -m {prog} takes no command of its own; run one of these: python -m {commands[0][0]} ...",
              file=sys.stderr)
        return 2
    width = max(len(name) for name, _ in commands)
    print(title)
    print("\n".join(f"  {name:<{width}}  {what}" for name, what in commands))
    return 0


def refuse_with(given: set[str], option: str, others, why: str) -> None:
    """ValueError when ``option`` and any of ``others`` (argparse destinations) were both given."""
    clash = [o for o in others if o in given]
    if option in given and clash:
        flags = ", ".join("--" + o.replace("_", "-") for o in clash)
        raise ValueError(f"--{option.replace('_', '-')} and {flags} cannot go together: {why}")


def _range_text(lo: int, hi: int | None) -> str:
    if hi is None:
        return "a positive integer" if lo == 1 else f"an integer >= {lo}"
    return f"an integer in {lo}..{'2**63-1' if hi == SEED_MAX else hi}"


def parse_int(text: str, lo: int, hi: int | None = None) -> int:
    """``text`` as an integer in ``lo..hi`` (``hi`` None: no upper bound); ArgumentTypeError otherwise."""
    s = text.strip() if isinstance(text, str) else ""
    value = int(s) if _INT.fullmatch(s) else None
    if value is None or value < lo or (hi is not None and value > hi):
        raise argparse.ArgumentTypeError(f"expected {_range_text(lo, hi)}, got {text!r}")
    return value


def int_in(lo: int, hi: int | None = None):
    """An argparse ``type=``: an integer in ``lo..hi``."""
    def check(text: str) -> int:
        return parse_int(text, lo, hi)

    return check


positive_int = int_in(1)
nonnegative_int = int_in(0)
seed_int = int_in(0, SEED_MAX)


def positive_float(text: str) -> float:
    """An argparse ``type=``: a finite number > 0 (refuses inf, nan, 0 and negatives)."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and v > 0 and str(text).strip().isascii()):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return v


def fraction(text: str) -> float:
    """An argparse ``type=``: a number in (0, 1], as a decimal or a ratio (``0.25``, ``1/3``)."""
    try:
        v = float(Fraction(str(text).strip()))
    except (TypeError, ValueError, ZeroDivisionError):
        v = math.nan
    if not (0 < v <= 1 and str(text).isascii()):
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] such as 1/3 or 0.25, got {text!r}")
    return v
