"""Append-only JSONL journal: ``RUN_DIR/journal.jsonl``, the search's only durable state.

Every line is one JSON object, written with a single ``write`` of the whole line, flushed and
fsynced before the engine acts on it, through a handle opened in append mode. A process killed
mid-write leaves at most one torn last line; ``read`` ignores it and ``open_for_append`` cuts it
off, so new lines never follow garbage. One process writes it at a time: the engine's caller
holds the run folder's lock (``bnn.common.runlock``) from before the journal is read until the end.

Line types: ``start`` (configuration), ``resume`` (informational), ``proposal`` (one candidate,
with how it was bred), ``result`` (its outcome), ``end`` (why the run stopped; informational:
whether to continue is decided from the replayed state, not from this line).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from refimpl.fileio import open_regular, read_regular

JOURNAL = "journal.jsonl"


class JournalError(ValueError):
    """A journal that cannot be read (no start line, garbage before the last line) or replayed (it diverges)."""


def read(path: Path) -> tuple[list[dict], int]:
    """Events and the byte length of the complete lines (the torn tail, if any, is excluded).
    Each event is an object and the first a start line with its ``config`` object, or a
    ``JournalError``; the file is read without following a symbolic link."""
    data = read_regular(path)
    events, good = [], 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # torn last line (no newline): ignored
        line = data[pos:nl]
        try:
            events.append(json.loads(line))
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            if data[nl + 1 :].strip():
                raise JournalError(f"{path}: line {len(events) + 1} is not JSON and is not the last line") from None
            break  # a garbled last line is a torn write too
        pos = nl + 1
        good = pos
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise JournalError(f"{path}: line {i + 1} is {type(e).__name__}, not an object; not a search journal")
    if not events or events[0].get("type") != "start":
        raise JournalError(f"{path}: not a search journal (no start line)")
    if not isinstance(events[0].get("config"), dict):
        raise JournalError(f"{path}: its start line has no config object; not a search journal")
    return events, good


class Journal:
    """An open journal file that appends whole JSON lines."""
    def __init__(self, path: Path, fh):
        self.path = Path(path)
        self._fh = fh

    @classmethod
    def create(cls, path: Path, start: dict) -> "Journal":
        # O_EXCL: never clobber an existing journal; O_APPEND: every write lands at the end.
        """Create a new journal at ``path`` (never over an existing one) holding its start line."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_BINARY", 0), 0o666)
        j = cls(path, os.fdopen(fd, "ab"))
        j.append({"type": "start", **start})
        return j

    @classmethod
    def open_for_append(cls, path: Path, good_length: int) -> "Journal":
        """Cut a torn tail off, then append: in append mode no write can land on earlier bytes
        (the run folder's lock, ``bnn.common.runlock``, keeps a second writer out altogether)."""
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND)  # never through a link planted meanwhile
        try:
            os.ftruncate(fd, good_length)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, os.fdopen(fd, "ab"))

    def append(self, event: dict, sync: bool = True) -> None:
        """Write one line; ``sync=True`` flushes and fsyncs it (and everything before it).

        The engine fsyncs every result line. A proposal line is only flushed (``flush()``, so a
        killed process still shows what it was running) and becomes durable with the next
        fsync: losing it to a power cut costs nothing, because replay proposes the identical
        candidate again. The file is always a prefix of the event sequence."""
        line = (json.dumps(event, separators=(",", ":"), allow_nan=False) + "\n").encode()
        self._fh.write(line)
        if sync:
            self.sync()

    def flush(self) -> None:
        """Hand written lines to the OS (visible to readers, not yet durable)."""
        self._fh.flush()

    def sync(self) -> None:
        """Flush and fsync: every line written so far is durable."""
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the file (once; a second call does nothing)."""
        if not self._fh.closed:
            self._fh.close()
