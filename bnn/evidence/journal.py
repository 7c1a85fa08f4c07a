"""The evidence grid's journal (``bnn/evidence/grid.py`` says what it holds): read, checked, appended.

Every line the reader accepts has the types the report needs, so a damaged or crafted journal is
one ``GridError`` line, never a traceback in the report and never a bare ``NaN`` in results.json.
Only a torn last line that starts as this module starts that line (``{"kind": "protocol"`` or
``{"key": ``) is cut off: a line of a user's text (a notes file put in the folder) is refused, not
truncated. The file is read, appended to and cut through ``refimpl.fileio.open_regular``, never
through a symbolic link.
"""
from __future__ import annotations

import json
import os

from refimpl.conventions import DEFAULT as RAW
from refimpl.conventions import NAMES as COUNT_CONVENTIONS
from refimpl.engine.format import DOWNSAMPLE_KINDS as DOWNSAMPLES
from refimpl.fileio import atomic_write_bytes, read_regular
from refimpl.genome import Genome

from ..common.jsonl import all_finite, cut_to, is_accuracy, is_number, json_line

STATUSES = ("ok", "diverged", "rejected", "error")
# What the report formats from a protocol line, and the type each must have (None: the default).
_PROTOCOL_TYPES = {"dataset": (str,), "model": (str,), "epochs": (int,), "batch_size": (int,), "lr": (int, float),
                   "train_size": (int, type(None)), "val_size": (int, type(None)), "gamma": (int, float),
                   "split_seed": (int, type(None)), "milestones": (list, type(None))}
# Cut off only what a kill in the middle of this module's own write can leave: the start of a
# protocol line (line 1) or of a cell line (the others), as json.dumps writes them.
_TORN_STARTS = (b'{"kind": "protocol"', b'{"key": ')


class GridError(Exception):
    """A one-line user error: the CLI prints it and exits 2."""


def _cell_problem(row) -> str | None:
    """What makes ``row`` not a finished cell of a grid, or None."""
    if not isinstance(row, dict):
        return f"is {type(row).__name__}, not an object"
    if not isinstance(row.get("key"), str) or row.get("status") not in STATUSES:
        return "is not a cell of this grid (no key or status)"
    for field in ("measure", "genome", "downsample"):
        if not isinstance(row.get(field), str):
            return f"has no {field} text"
    if not isinstance(row.get("seed"), int) or isinstance(row.get("seed"), bool):
        return "has no integer seed"
    if row.get("counts", "raw") not in COUNT_CONVENTIONS:  # cells before conventions existed are raw
        return f"has counts {str(row.get('counts'))[:40]!r}, not one of {', '.join(COUNT_CONVENTIONS)}"
    problem = _identity_problem(row)
    if problem:
        return problem
    for field in ("test_acc", "val_acc"):
        v = row.get(field)
        if not (v is None and row["status"] != "ok") and not is_accuracy(v):
            return f"has {field} {v!r}, not an accuracy in 0..1"
    if not all(is_number(row.get(f, 0.0)) for f in ("wall_s", "cpu_s")) or not all(
            isinstance(row.get(f, ""), (str, type(None))) for f in ("host", "cpu_kind")):
        return "has a wall_s, cpu_s, host or cpu_kind of the wrong type"  # cells before cpu_s have none
    t = row.get("threads", 1)  # cells before threads were recorded have none
    if not isinstance(t, int) or isinstance(t, bool) or t < 1:
        return f"has threads {str(t)[:40]!r}, not a positive count"
    return None


def _identity_problem(row: dict) -> str | None:
    """What makes a cell's fields contradict each other, or None: its key is built from its
    measure, downsample, counts and seed (``bnn.evidence.plan_cells``), and its measure is its
    genome's label. A line keyed ``M1/binary/laplace/s0`` with counts raw is not a raw cell."""
    try:
        g = Genome.parse(row["genome"])
    except ValueError:
        return f"has genome {row['genome'][:40]!r}, not a genome"
    if row["measure"] != (g.name or str(g)):
        return f"has measure {row['measure'][:40]!r}, which contradicts its genome {g} ({g.name or str(g)})"
    if row["downsample"] not in DOWNSAMPLES:
        return f"has downsample {row['downsample'][:40]!r}, not one of {', '.join(DOWNSAMPLES)}"
    counts = row.get("counts", RAW)
    key = f"{row['measure']}/{row['downsample']}/{'' if counts == RAW else counts + '/'}s{row['seed']}"
    if row["key"] != key:
        return f"has key {row['key'][:60]!r}, which contradicts its measure, downsample, counts and seed ({key})"
    return None


def protocol_problem(p) -> str | None:
    """What makes ``p`` not a protocol the report can print, or None."""
    if not isinstance(p, dict):
        return "has no protocol object"
    for key, types in _PROTOCOL_TYPES.items():
        v = p.get(key, 0.2 if key == "gamma" else None)  # an absent gamma is printed as its default
        if not isinstance(v, types) or isinstance(v, bool) or not all_finite(v):
            return f"has a protocol whose {key} is {str(v)[:40]}"
    milestones = p.get("milestones") or []
    if not all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in milestones):
        return f"has a protocol whose milestones are {str(milestones)[:40]}, not epochs 1, 2, ..."
    bad = next((k for k, v in p.items() if not all_finite(v)), None)  # the report copies it into strict JSON
    if bad is not None:
        return f"has a protocol whose {str(bad)[:40]} holds NaN or infinity"
    return None


def _split(path: str, raw: bytes, log) -> list:
    """The JSON values of the complete lines; a torn last line of ours is reported and cut off."""
    lines, good_end, rows = raw.split(b"\n"), 0, []
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if last and not line:
            break
        try:
            row = json.loads(line)
            if last:  # complete JSON without its newline: the write was cut before it ended
                raise ValueError
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            tail = last or (i == len(lines) - 2 and not lines[-1])
            start = _TORN_STARTS[0 if i == 0 else 1]
            if not (tail and line[:len(start)] == start[:len(line)]):
                raise GridError(f"{path} line {i + 1} is not a line this grid wrote; repair or remove that line, "
                                "or use another --root") from None
            log(f"{path}: ignored a torn last line")
            cut_to(path, good_end)
            break
        rows.append(row)
        good_end += len(line) + 1
    return rows


def read_journal(path: str, log) -> tuple[dict | None, dict[str, dict]]:
    """(protocol, finished cells by key; the last line of a key wins). A torn last line, left
    by a kill in the middle of a write, is reported and cut off; any other bad line is an error."""
    if not os.path.lexists(path):
        return None, {}
    rows = _split(path, read_regular(path), log)
    if not rows:
        return None, {}
    if not isinstance(rows[0], dict) or rows[0].get("kind") != "protocol":
        raise GridError(f"{path} does not start with a protocol line; use another --root")
    problem = protocol_problem(rows[0].get("protocol"))
    if problem:
        raise GridError(f"{path} line 1 {problem}; use another --root")
    for i, row in enumerate(rows[1:], 2):
        problem = _cell_problem(row)
        if problem:
            raise GridError(f"{path} line {i} {problem}; repair or remove that line, or use another --root")
    return rows[0]["protocol"], {r["key"]: r for r in rows[1:]}


def start_journal(path: str, protocol: dict) -> None:
    """A new journal holding the protocol line, replacing an empty or torn one (create-then-rename:
    a link in its place is refused, never written through)."""
    atomic_write_bytes(path, json_line({"kind": "protocol", "version": 1, "protocol": protocol}))
