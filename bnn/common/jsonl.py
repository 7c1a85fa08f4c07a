"""Journals of one JSON object a line (the evidence grid's, a search's cost notes): each line
appended in one write and fsynced, so a kill leaves whole lines or a torn tail, and written
through ``refimpl.fileio.open_regular``, never through a symbolic link.
"""
from __future__ import annotations

import json
import math
import os

from refimpl.fileio import open_regular


def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None  # strict JSON, as results.json is: no bare NaN or Infinity
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    return [_finite(x) for x in v] if isinstance(v, (list, tuple)) else v


def json_line(row: dict) -> bytes:
    """``row`` as one line of strict JSON (NaN and infinities as null), newline included."""
    return (json.dumps(_finite(row), allow_nan=False) + "\n").encode()


def append_line(path: str, row: dict) -> None:
    """Append ``row`` as one JSON line in one write, fsynced: a kill leaves whole lines or a torn tail."""
    data = json_line(row)
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)  # one write per line: a kill leaves a whole line or a torn tail
        os.fsync(fd)
    finally:
        os.close(fd)
