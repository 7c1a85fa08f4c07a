"""One writer per run folder: an OS file lock on ``RUN_DIR/lock``, held for the run's lifetime.

``hold_run_dir(run_dir)`` takes an exclusive, non-blocking lock on ``RUN_DIR/lock`` and writes
this process's pid into it; a second process (or a second holder in this one) gets
``RunDirInUse``, whose text is the one line the command lines print. The lock is the kernel's
(``flock`` on POSIX, ``msvcrt.locking`` on Windows), so it vanishes with its process: a SIGKILLed
run leaves a stale ``lock`` file but never a stale lock, and the file is never deleted (deleting
it would let two processes lock two different files of one name). A ``lock`` that is a symbolic
link or not a regular file is refused (``refimpl.fileio.open_regular``), never written through.

    with hold_run_dir(run_dir):
        ... read the journal, replay, append, write the results ...
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from refimpl.fileio import OutputError, open_regular

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

LOCK = "lock"
# msvcrt locks are mandatory (a locked byte cannot be read), so Windows locks one byte far past
# the pid text, which stays readable for the refusal message.
_WIN_LOCK_OFFSET = 1 << 30


class RunDirInUse(OSError):
    """Another process holds the run folder's lock."""

    def __init__(self, run_dir, pid: int | None):
        self.run_dir, self.pid = str(run_dir), pid
        who = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(f"{run_dir} is in use by another process ({who}): "
                         "wait for it to finish or use another folder")

    def __str__(self) -> str:  # OSError's own str would prefix "[Errno ...]" when errno is set
        return self.args[0]


class RunLock:
    """The held lock; ``release()`` (or leaving the ``with`` block) gives it back."""

    def __init__(self, run_dir: Path, fh):
        self.run_dir, self._fh = Path(run_dir), fh

    def release(self) -> None:
        """Give the lock back (closing its file); a second call does nothing."""
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        try:
            if fcntl is None:
                fh.seek(_WIN_LOCK_OFFSET)
                msvcrt.locking(fh.fileno(), msvcrt.LK_UNLCK, 1)
        finally:
            fh.close()  # closing the descriptor drops a flock

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fh is not None

    def __enter__(self) -> RunLock:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        self.release()


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() else None


def _try_lock(fh) -> bool:
    try:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fh.seek(_WIN_LOCK_OFFSET)
            msvcrt.locking(fh.fileno(), msvcrt.LK_NBLCK, 1)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
            return False
        raise
    return True


def hold_run_dir(run_dir, create: bool = True) -> RunLock:
    """Lock RUN_DIR for this process or raise ``RunDirInUse``. ``create``: make the folder first
    (otherwise a missing folder is a ``FileNotFoundError``)."""
    run_dir = Path(run_dir)
    if create:
        run_dir.mkdir(parents=True, exist_ok=True)
    elif not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such folder")
    path = run_dir / LOCK
    # Held open for the run, never truncated before the lock (the holder's pid is in there), and
    # never through a link: a planted ``lock -> someone's file`` would have that file overwritten.
    fh = os.fdopen(open_regular(path, os.O_RDWR | os.O_CREAT, 0o644), "r+b")
    try:
        if os.fstat(fh.fileno()).st_nlink > 1:  # a hard link planted as ``lock``: another file's content
            raise OutputError(f"refusing to use {path}: it has other hard links, so writing the pid would change "
                              "another file; remove it")
        if not _try_lock(fh):
            raise RunDirInUse(run_dir, _read_pid(path))
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n".encode())
        fh.flush()
    except BaseException:
        fh.close()
        raise
    return RunLock(run_dir, fh)
