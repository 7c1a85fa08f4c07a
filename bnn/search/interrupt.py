"""Ctrl-C during a search: noted always, raised only where it cannot be lost (``Interrupts``)."""
from __future__ import annotations

import contextlib
import signal
import threading


class Interrupts:
    """SIGINT while a search runs: always noted, raised as KeyboardInterrupt only at the top of the
    engine's loop and inside a training that runs in this process. Raised anywhere else it could
    be lost: Numba compiles the screening's measures through ctypes callbacks, which print and
    swallow an exception, and a pool search then ran on for minutes as if nothing had happened
    (so did its workers, restarted after the same Ctrl-C killed them during their imports). Nor
    can it cut a journal line or a worker's start in half. Only the main thread can own the
    handler; elsewhere SIGINT keeps its usual behaviour."""

    def __init__(self):
        self.requested = False
        self._raise_now = False
        self._previous = None

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handler(self, signum, frame) -> None:
        self.requested = True
        if self._raise_now:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came since the search started."""
        if self.requested:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def interruptible(self):
        """A block (a training in this process) that a Ctrl-C interrupts where it is."""
        self.check()
        self._raise_now = True
        try:
            yield
        finally:
            self._raise_now = False
