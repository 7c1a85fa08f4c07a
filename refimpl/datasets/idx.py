"""The IDX file format of MNIST and Fashion-MNIST: one file read, raw or ``.gz``, bounded by its header.

An IDX file is a big-endian header, magic 0x000008NN (unsigned bytes, NN dimensions) and one
uint32 per dimension, followed by exactly prod(dims) bytes. Everything read is bounded by the
header: a raw file's size must match it exactly, a .gz stream is inflated only up to it.
"""
from __future__ import annotations

import gzip
import os
import stat
import struct
import zlib

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


def read_idx(path: str, images: bool) -> np.ndarray:
    """The validated content of one IDX file: uint8 (N, 28, 28) images or (N,) labels."""
    kind, magic_want, ndim = ("images", IDX_IMAGES_MAGIC, 3) if images else ("labels", IDX_LABELS_MAGIC, 1)
    gz = path.endswith(".gz")
    with _open_regular(path) as raw:
        size = os.fstat(raw.fileno()).st_size
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        try:
            head = _read_upto(stream, 4 + 4 * ndim)
            head = head.tobytes()
            if len(head) >= 4 and int.from_bytes(head[:4], "big") != magic_want:
                raise ValueError(f"{path}: magic number 0x{int.from_bytes(head[:4], 'big'):08x}, expected "
                                 f"0x{magic_want:08x} (IDX {kind}, unsigned bytes); is it the {kind} file?")
            if len(head) < 4 + 4 * ndim:
                raise ValueError(f"{path}: truncated inside the {4 + 4 * ndim}-byte IDX header ({len(head)} bytes)")
            dims = struct.unpack(f">{ndim}I", head[4:])
            if images and dims[1:] != (IDX_SIDE, IDX_SIDE):
                raise ValueError(f"{path}: images are {dims[1]}x{dims[2]}, expected {IDX_SIDE}x{IDX_SIDE}")
            n = dims[0]
            if n > IDX_MAX_ITEMS:
                raise ValueError(f"{path}: header announces {n} {kind}, more than these data sets hold ({IDX_MAX_ITEMS})")
            body = n * (IDX_SIDE * IDX_SIDE if images else 1)
            whole = len(head) + body
            if not gz and size != whole:
                what = "truncated" if size < whole else f"{size - whole} trailing bytes"
                raise ValueError(f"{path}: {what}: {size} bytes, its header ({n} {kind}) needs exactly {whole}")
            data = _read_upto(stream, body)
            if len(data) < body:
                raise ValueError(f"{path}: truncated: {len(head) + len(data)} bytes, its header ({n} {kind}) needs {whole}")
            extra = len(_read_upto(stream, _CHUNK)) if gz else 0  # a raw file's size was checked above
            if extra:
                what = f"{extra} trailing bytes" if extra < _CHUNK else f"over {_CHUNK} trailing bytes"
                raise ValueError(f"{path}: {what} after the {whole} bytes its header ({n} {kind}) describes")
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise ValueError(f"{path}: not a readable gzip file ({' '.join(str(exc).split()) or type(exc).__name__})") from None
    out = data
    if images:
        return out.reshape(n, IDX_SIDE, IDX_SIDE)
    if n and out.max() > 9:
        i = int(np.argmax(out > 9))
        raise ValueError(f"{path}: label {out[i]} at index {i} is outside 0..9")
    return out
