"""Append-only JSONL journal: ``RUN_DIR/journal.jsonl``, the search's only durable state.

Every line is one JSON object, written with a single ``write`` of the whole line, flushed and
fsynced before the engine acts on it. A process killed mid-write leaves at most one torn last
line; ``read`` ignores it and ``open_for_append`` cuts it off, so new lines never follow garbage.

Line types: ``start`` (configuration), ``resume`` (informational), ``proposal`` (one candidate,
with how it was bred), ``result`` (its outcome), ``end`` (why the run stopped; informational:
whether to continue is decided from the replayed state, not from this line).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

JOURNAL = "journal.jsonl"


class JournalError(ValueError):
    pass


def read(path: Path) -> tuple[list[dict], int]:
    """Events and the byte length of the complete lines (the torn tail, if any, is excluded)."""
    data = Path(path).read_bytes()
    events, good = [], 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break  # torn last line (no newline): ignored
        line = data[pos:nl]
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if data[nl + 1 :].strip():
                raise JournalError(f"{path}: line {len(events) + 1} is not JSON and is not the last line") from None
            break  # a garbled last line is a torn write too
        pos = nl + 1
        good = pos
    if not events or events[0].get("type") != "start":
        raise JournalError(f"{path}: not a search journal (no start line)")
    return events, good


class Journal:
    def __init__(self, path: Path, fh):
        self.path = Path(path)
        self._fh = fh

    @classmethod
    def create(cls, path: Path, start: dict) -> "Journal":
        fh = open(path, "xb")  # never clobber an existing journal
        j = cls(path, fh)
        j.append({"type": "start", **start})
        return j

    @classmethod
    def open_for_append(cls, path: Path, good_length: int) -> "Journal":
        fh = open(path, "r+b")
        fh.truncate(good_length)  # drop a torn tail before appending after it
        fh.seek(good_length)
        return cls(path, fh)

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
        self._fh.flush()

    def sync(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
