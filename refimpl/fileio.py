"""Durable, atomic output files: the one writer every command uses (NumPy-free, torch-free).

A file is written to ``.NAME.tmp.<pid>.<tag>`` in its own folder, flushed and fsynced, renamed over
``NAME`` (``os.replace``) and the folder is fsynced, so a reader, a kill or a power cut leaves
the old file or the new one, never half of one. A failed write (a full disk, a quota, a
read-only folder) removes the temp file, keeps the old file byte for byte and raises
``OutputError``, one line that names the file and the way out; it is an ``OSError``, which every
command line prints as its one-line error.

    with atomic_file(path) as f:      # a binary file object: torch.save(obj, f), np.save(f, a)
        ...
    atomic_write_bytes(path, data)

A destination that exists and is not a regular file (a folder, a FIFO, a device node, a
symbolic link) is refused, never renamed over; ``check_output(path, inputs)`` says so up front
and also refuses an output that is one of the command's inputs. A process killed while writing
leaves its temp file behind: ``remove_stale_temps(folder)`` deletes those of processes that no
longer exist, and the commands call it on their run folder at start. ``<tag>`` is a hash of NAME
and the pid, so only a file this module named is ever deleted: a user's ``notes.tmp.999999`` is not.

``open_regular(path, flags)`` opens a file in a user's folder without following a symbolic link
(``O_NOFOLLOW``) and refuses anything but a regular file: the journals and the run lock, which are
appended to or written in place, use it, so a planted link cannot turn a write onto another file.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

TEMP_PATTERN = re.compile(r"^\.(?P<name>.+)\.tmp\.(?P<pid>[0-9]+)\.(?P<tag>[0-9a-f]{12})$")
# A full disk or quota is the user's to fix by freeing space; other errors get a generic hint.
_HINTS = {
    errno.ENOSPC: "free space and rerun",
    getattr(errno, "EDQUOT", errno.ENOSPC): "free space and rerun",  # no EDQUOT on Windows
    errno.EFBIG: "the file is over the size limit; raise it (ulimit -f) or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.EACCES: "check the folder's permissions or write elsewhere",
    errno.EPERM: "check the folder's permissions or write elsewhere",
    errno.ENOENT: "create its folder first",
}
# Folders of some file systems cannot be fsynced; the rename is as durable as they allow.
_DIR_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.EBADF, errno.EISDIR, getattr(errno, "ENOTSUP", errno.EINVAL)}


class OutputError(OSError):
    """An output that cannot or must not be written; its text is one line naming the fix."""

    def __init__(self, message: str, err: int | None = None):
        super().__init__(message)
        self.errno = err

    def __str__(self) -> str:  # OSError's own str would prefix "[Errno N]"
        return self.args[0]


def _temp_tag(name: str, pid: int) -> str:
    # Ties a temp name to this module: only a file named by temp_path matches its own tag.
    return hashlib.sha256(f"refimpl.fileio temp\0{name}\0{pid}".encode("utf-8", "surrogateescape")).hexdigest()[:12]


def temp_name(name: str, pid: int) -> str:
    """The temp file name ``atomic_file`` uses for the file ``name`` in process ``pid``."""
    return f".{name}.tmp.{pid}.{_temp_tag(name, pid)}"


def temp_path(path: str | os.PathLike) -> str:
    """The temp file ``atomic_file`` writes for ``path``: ``.NAME.tmp.<pid>.<tag>`` beside it."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, temp_name(name, os.getpid()))


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return word
    return "not a regular file"


def refuse_non_regular(path: str | os.PathLike) -> None:
    """Raise ``OutputError`` if ``path`` exists and is not a regular file (a link is not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise write_error(path, exc) from None
    if not stat.S_ISREG(mode):
        kind = _kind(mode)
        fix = "name a file inside it" if kind == "a folder" else "choose a regular file's path"
        raise OutputError(f"refusing to write {os.fspath(path)}: it is {kind}, and replacing it would destroy it; {fix}")


def check_output(path: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = ()) -> None:
    """Refuse an output that is not a regular file or that is one of ``inputs`` (same file, any
    spelling); call it before any work, so a bad output costs nothing."""
    refuse_non_regular(path)
    for inp in inputs:
        if inp is None:
            continue
        same = os.path.realpath(path) == os.path.realpath(inp)
        if not same and os.path.exists(path) and os.path.exists(inp):
            same = os.path.samefile(path, inp)
        if same:
            raise OutputError(f"refusing to write {os.fspath(path)}: it is the input {os.fspath(inp)}, which "
                              "writing would destroy; choose another output path")


def open_regular(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags)`` that never follows a symbolic link (``O_NOFOLLOW``) and refuses a
    path that is not a regular file (before ``O_TRUNC`` could act: a FIFO or device is opened
    without it); an ``OutputError`` names the problem. Returns the descriptor."""
    refuse_non_regular(path)  # says what it is (a link, a FIFO) before any open that could block
    # O_NONBLOCK: a FIFO swapped in after the check opens at once (and is refused below), never
    # hangs; a regular file ignores it.
    nofollow = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, (flags & ~os.O_TRUNC) | nofollow, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link planted between the check and the open
            raise OutputError(f"refusing to open {os.fspath(path)}: it is a symbolic link; "
                              "remove it or choose another folder") from None
        if not flags & (os.O_WRONLY | os.O_RDWR):
            raise  # a read's own error (a missing file), for its caller to word
        raise write_error(path, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputError(f"refusing to open {os.fspath(path)}: it is not a regular file; "
                              "remove it or choose another folder")
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file ``path``, not through a symbolic link (``open_regular``);
    anything else is an ``OutputError`` that says it could not be read (not "refusing to write")."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot read {os.fspath(path)}: {' '.join((exc.strerror or str(exc)).split())}") from None
    if not stat.S_ISREG(mode):
        raise OutputError(f"cannot read {os.fspath(path)}: it is {_kind(mode)}, not a file; "
                          "move it away or give the path of a regular file")
    with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
        return f.read()


def write_error(path, exc: OSError) -> OutputError:
    """The one-line ``OutputError`` for a failed write of ``path`` (for writers that append)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    hint = _HINTS.get(exc.errno, "fix that and rerun")
    return OutputError(f"cannot write {os.fspath(path)}: {' '.join(reason.split())}; {hint}", exc.errno)


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename in ``folder`` durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # Windows cannot open a folder; its rename is durable on its own terms
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file object whose content replaces ``path`` durably when the block ends without
    an exception; on any exception the temp file is removed and ``path`` is untouched. An
    ``OSError`` with an errno (a write that failed) becomes ``OutputError``."""
    refuse_non_regular(path)
    tmp = temp_path(path)
    try:
        _remove(tmp)  # a leftover of a dead process that had this pid: O_EXCL below needs it gone
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            refuse_non_regular(path)  # made meanwhile (by another process): still never rename over it
            os.replace(tmp, path)
        except OutputError:
            raise
        except OSError as exc:
            if exc.errno is None:
                raise  # not a failed write: the caller's own error, unchanged
            raise write_error(path, exc) from None
    except BaseException:
        _remove(tmp)
        raise
    try:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as exc:
        raise write_error(path, exc) from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data``, durably and atomically (see ``atomic_file``)."""
    with atomic_file(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """``atomic_write_bytes`` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # no cheap, harmless probe (os.kill would terminate): keep the file
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, OSError):
        return True  # another user's process, or a value no probe can answer: keep the file
    return True


def remove_stale_temps(folder: str | os.PathLike) -> list[str]:
    """Delete the temp files in ``folder`` left by dead processes; the names removed, sorted.

    A temp file is ``.NAME.tmp.<pid>.<tag>`` with the tag ``temp_name`` gives it, a regular file
    of this user's, whose pid is not a live process; a live writer's temp file is kept, and a
    name this module did not make (``notes.tmp.999999``) is never touched."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for name in sorted(names):
        m = TEMP_PATTERN.match(name)
        if m is None or m["tag"] != _temp_tag(m["name"], int(m["pid"])) or _pid_alive(int(m["pid"])):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        mine = not hasattr(os, "geteuid") or st.st_uid == os.geteuid()  # another user's file is theirs
        if stat.S_ISREG(st.st_mode) and mine:
            _remove(path)
            removed.append(name)
    return removed
