"""Settings from the environment that must be checked before Numba is imported (NumPy-free).

Numba reads ``NUMBA_NUM_THREADS`` while it is imported and raises a bare ValueError for 0; with
``NUMBA_DISABLE_JIT=1`` the kernels' popcount intrinsics have no Python form and the first run
fails deep in a kernel. Both are refused here, when ``refimpl`` is imported, with ``SettingError``;
left uncaught (any command line: the import comes first), it is one ``error: ...`` line and exit
status 2, not a traceback (``one_line_if_uncaught``, which ``isa.py`` uses for ``REFIMPL_ISA`` too).
"""
from __future__ import annotations

import os
import re
import sys


class SettingError(ValueError):
    """An environment setting refimpl cannot run with; its text names the setting and the fix."""


def one_line_if_uncaught(error: BaseException) -> None:
    """Print ``error`` as one line and exit 2 if nothing catches it: the import that raises it
    runs before any command line's own error handling (``python -m refimpl.info`` imports the
    package first), and a setting the user typed deserves a line, not a traceback."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if value is not error:
            return previous(kind, value, tb)
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2)

    sys.excepthook = hook


def _problem() -> str | None:
    threads = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if threads and not (re.fullmatch(r"[0-9]+", threads) and int(threads) > 0):
        return f"NUMBA_NUM_THREADS={threads[:40]!r} is not a positive integer; unset it or set the thread count (1 or more)"
    jit_off = os.environ.get("NUMBA_DISABLE_JIT", "").strip()
    if jit_off and jit_off != "0":
        return (f"NUMBA_DISABLE_JIT={jit_off[:40]!r}: refimpl's kernels need Numba's compiler (their popcount "
                "intrinsics have no pure-Python form); unset NUMBA_DISABLE_JIT")
    return None


def check() -> None:
    """Raise ``SettingError`` (one line if uncaught) for an environment Numba or refimpl cannot run with."""
    problem = _problem()
    if problem:
        error = SettingError(problem)
        one_line_if_uncaught(error)
        raise error
