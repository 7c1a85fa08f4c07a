"""The IDX file format of MNIST and Fashion-MNIST: one file read, raw or ``.gz``, bounded by its header.

An IDX file is a big-endian header, magic 0x000008NN (unsigned bytes, NN dimensions) and one
uint32 per dimension, followed by exactly prod(dims) bytes. Everything read is bounded by the
header: a raw file's size must match it exactly, a .gz stream is inflated only up to it.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import stat
import struct
import zlib
from collections.abc import Iterator

import numpy as np

IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801
IDX_SIDE = 28
# More items than any file of these sets holds (60,000): a header claiming more is not theirs.
IDX_MAX_ITEMS = 1_000_000
_CHUNK = 1 << 20


def _open_regular(path: str):
    """``path`` opened for binary reading; ValueError if it is not a regular file."""
    # O_NONBLOCK: opening a FIFO must not hang; fstat on the open file then rejects it, before
    # fdopen, which says only "Is a directory: 4" (the descriptor) for a folder.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a folder, not an IDX file" if stat.S_ISDIR(mode) else "not a regular file"
        raise ValueError(f"{path} is {what}; put the data set's file there")
    return os.fdopen(fd, "rb")


def _read_upto(stream, n: int) -> np.ndarray:
    """At most ``n`` bytes as uint8, fewer only at the end of the stream."""
    # np.empty commits pages only as they are written: a header that lies costs no memory.
    buf = np.empty(n, dtype=np.uint8)
    view, got = memoryview(buf), 0
    while got < n:
        k = stream.readinto(view[got:min(n, got + _CHUNK)])
        if not k:
            break
        got += k
    return buf[:got]


class IdxReader:
    """One IDX file read in order, checked as it goes: the header when opened (magic, shape, item
    count, a raw file's exact size), each part's bytes as read, and the end of a ``.gz`` stream
    (truncated, trailing bytes) once the last item is read. ``read_idx`` reads a file in one part;
    ``refimpl.infer`` reads images a batch at a time (``batches``), so memory holds one batch."""

    def __init__(self, path: str, images: bool):
        self.path, self.images = path, images
        self.kind, magic_want, ndim = ("images", IDX_IMAGES_MAGIC, 3) if images else ("labels", IDX_LABELS_MAGIC, 1)
        self.item = IDX_SIDE * IDX_SIDE if images else 1
        gz = path.endswith(".gz")
        self._raw = _open_regular(path)
        self._stream = gzip.GzipFile(fileobj=self._raw, mode="rb") if gz else self._raw
        try:
            with self._gzip_errors():
                head = _read_upto(self._stream, 4 + 4 * ndim).tobytes()
            self.n = self._check_header(head, magic_want, ndim)
            self.whole = len(head) + self.n * self.item
            size = os.fstat(self._raw.fileno()).st_size
            if not gz and size != self.whole:
                what = "truncated" if size < self.whole else f"{size - self.whole} trailing bytes"
                raise ValueError(f"{path}: {what}: {size} bytes, its header ({self.n} {self.kind}) needs exactly {self.whole}")
        except BaseException:
            self.close()
            raise
        self._gz, self._read = gz, 0

    def _check_header(self, head: bytes, magic_want: int, ndim: int) -> int:
        path, kind = self.path, self.kind
        if len(head) >= 4 and int.from_bytes(head[:4], "big") != magic_want:
            raise ValueError(f"{path}: magic number 0x{int.from_bytes(head[:4], 'big'):08x}, expected "
                             f"0x{magic_want:08x} (IDX {kind}, unsigned bytes); is it the {kind} file?")
        if len(head) < 4 + 4 * ndim:
            raise ValueError(f"{path}: truncated inside the {4 + 4 * ndim}-byte IDX header ({len(head)} bytes)")
        dims = struct.unpack(f">{ndim}I", head[4:])
        if self.images and dims[1:] != (IDX_SIDE, IDX_SIDE):
            raise ValueError(f"{path}: images are {dims[1]}x{dims[2]}, expected {IDX_SIDE}x{IDX_SIDE}")
        if dims[0] > IDX_MAX_ITEMS:
            raise ValueError(f"{path}: header announces {dims[0]} {kind}, more than these data sets hold ({IDX_MAX_ITEMS})")
        return dims[0]

    def __len__(self) -> int:
        return self.n

    @contextlib.contextmanager
    def _gzip_errors(self):
        try:
            yield
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(f"{self.path}: not a readable gzip file "
                             f"({' '.join(str(exc).split()) or type(exc).__name__})") from None

    def read(self, count: int) -> np.ndarray:
        """The next ``count`` items (fewer past the last), uint8; after the last, the stream's end is checked."""
        count = min(count, self.n - self._read)
        with self._gzip_errors():
            data = _read_upto(self._stream, count * self.item)
            if len(data) < count * self.item:
                got = self.whole - (self.n - self._read) * self.item + len(data)
                raise ValueError(f"{self.path}: truncated: {got} bytes, its header ({self.n} {self.kind}) needs {self.whole}")
            self._read += count
            if self._read == self.n and self._gz:  # a raw file's size was checked when opened
                extra = len(_read_upto(self._stream, _CHUNK))
                if extra:
                    what = f"{extra} trailing bytes" if extra < _CHUNK else f"over {_CHUNK} trailing bytes"
                    raise ValueError(f"{self.path}: {what} after the {self.whole} bytes its header ({self.n} {self.kind}) describes")
        return data.reshape(count, IDX_SIDE, IDX_SIDE) if self.images else data

    def batches(self, size: int) -> Iterator[np.ndarray]:
        """The items in order, ``size`` at a time (the file is closed at the end)."""
        try:
            while self._read < self.n:
                yield self.read(size)
        finally:
            self.close()

    def close(self) -> None:
        """Close the file (a second call does nothing)."""
        self._raw.close()


def read_idx(path: str, images: bool) -> np.ndarray:
    """The validated content of one IDX file: uint8 (N, 28, 28) images or (N,) labels."""
    reader = IdxReader(path, images)
    try:
        out = reader.read(reader.n)
    finally:
        reader.close()
    if images:
        return out
    if reader.n and out.max() > 9:
        i = int(np.argmax(out > 9))
        raise ValueError(f"{path}: label {out[i]} at index {i} is outside 0..9")
    return out
