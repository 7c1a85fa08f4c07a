"""Journals of one JSON object a line (the evidence grid's, a search's cost notes): each line
appended in one write and fsynced, so a kill leaves whole lines or a torn tail, and written
through ``refimpl.fileio.open_regular``, never through a symbolic link.
"""
from __future__ import annotations

import errno
import json
import math
import os

from refimpl.fileio import open_regular, write_error


def is_number(v) -> bool:
    """A record's field read as a finite int or float (not a bool: JSON's true is not 1)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_accuracy(v) -> bool:
    """A record's field read as an accuracy: a finite number in 0..1."""
    return is_number(v) and 0 <= v <= 1


def all_finite(v) -> bool:
    """No NaN or infinity anywhere in a JSON value (what strict JSON cannot hold)."""
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, (list, tuple, dict)):
        return all(map(all_finite, v.values() if isinstance(v, dict) else v))
    return True


def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None  # strict JSON, as results.json is: no bare NaN or Infinity
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    return [_finite(x) for x in v] if isinstance(v, (list, tuple)) else v


def json_line(row: dict) -> bytes:
    """``row`` as one line of strict JSON (NaN and infinities as null), newline included."""
    return (json.dumps(_finite(row), allow_nan=False) + "\n").encode()


def cut_to(path: str, length: int) -> None:
    """Cut a journal back to ``length`` bytes (its torn last line dropped), fsynced, never through a link."""
    fd = open_regular(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


def append_line(path: str, row: dict) -> None:
    """Append ``row`` as one JSON line, every byte of it, fsynced; or raise ``OutputError`` with
    the file cut back to its length before (a full disk: ``os.write`` may write only part of the
    line, and returns how much). A kill in the middle still leaves whole lines or a torn tail,
    which the readers drop, name and cut off."""
    data = memoryview(json_line(row))
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            while data:
                n = os.write(fd, data)  # one write per line, unless the OS takes only part of it
                if n <= 0:
                    raise OSError(errno.ENOSPC, "no byte of the line was written")
                data = data[n:]
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, start)  # no torn tail behind a failed append, where it can be undone
            except OSError:
                pass  # the readers drop and cut a torn tail
            raise write_error(path, exc) from None
    finally:
        os.close(fd)
