"""A worker process dies with the process that started it: the search's and the evidence grid's
pools both start their workers with ``die_with_parent`` (bnn/search/evaluators.py says why).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _set_parent_death_signal() -> bool:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (prctl). Note the
    kernel's "parent" is the thread that started us: the pool starts workers from the search's
    main thread, which lives as long as the search."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _exit_when_closed(alive) -> None:
    """The fallback's watcher thread: the parent never writes to ``alive``, so recv() returns
    only with EOF, when the parent (the only holder of the other end) has closed it or died."""
    with contextlib.suppress(EOFError, OSError):
        alive.recv()
    os._exit(1)


def die_with_parent(parent_pid: int, alive) -> None:
    """First thing a worker does: make sure it cannot outlive the search that started it (a
    SIGKILLed search would otherwise leave workers, with their memory and GPUs, blocked forever).
    Linux: the parent-death signal, then a check that the parent did not die before it was set;
    elsewhere: a daemon thread that exits when the liveness pipe ``alive`` reaches EOF."""
    if _set_parent_death_signal():
        alive.close()
        if os.getppid() != parent_pid:
            os._exit(1)
        return
    watch_liveness_pipe(alive)


def watch_liveness_pipe(alive) -> None:
    """Exit this process as soon as ``alive`` (a pipe end only the parent holds the other end
    of) reaches EOF: the fallback where there is no parent-death signal."""
    threading.Thread(target=_exit_when_closed, args=(alive,), name="parent-liveness", daemon=True).start()
