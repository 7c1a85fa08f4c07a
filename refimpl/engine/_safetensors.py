"""The safetensors container of a ``.bnn`` file, for ``model_file.py``: only a regular file,
only as many bytes as its header declares, every tensor entry checked before any is loaded.
"""
from __future__ import annotations

import json
import os
import stat

import numpy as np


class ModelFileError(ValueError):
    """A .bnn file that cannot be run; the message names the file and the problem.

    Always one printable line: names from the file (a unit's, a tensor's) may hold newlines or
    terminal escapes, which are shown escaped.
    """

    def __init__(self, message: str):
        super().__init__("".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message))



# A header is a few KB per layer (ResNet-34's is under 100 KB); the bounds keep a crafted header
# from making the reader allocate or parse gigabytes: 92 MB of empty objects once took 1.6 GB.
MAX_HEADER_BYTES = 16 << 20
MAX_HEADER_OBJECTS = 1 << 16  # JSON objects in the header: a few per tensor and per layer
# The tensor dtypes the layers read (safetensors names).
TENSOR_DTYPES = {"F32": np.float32, "U64": np.uint64}


def is_int(v) -> bool:
    """Whether a JSON value is an integer."""
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not the integer 1


def cut(text: str, n: int = 80) -> str:
    """Text from the file cut to a short line (a crafted value can be megabytes)."""
    return text if len(text) <= n else text[:n - 3] + "..."


def show(v) -> str:
    """A value from the file, as it shows in one line of an error."""
    return cut(repr(v))




def _open_regular(path: str):
    """(open binary file, size) of ``path``, refused unless it is a regular file.

    A FIFO would block the open until a writer comes, and a device (``/dev/zero``) would be read
    without end. The open is non-blocking, so a FIFO swapped in after the stat cannot hang it;
    fstat then checks what was actually opened.
    """
    try:
        _require_regular(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file") from None
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot be read ({exc.strerror})") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    try:
        _require_regular(path, st.st_mode)
    except ModelFileError:
        f.close()
        raise
    return f, st.st_size


def _require_regular(path: str, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise ModelFileError(f"{path}: is a directory, not a .bnn file")
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "special")
        raise ModelFileError(f"{path}: not a regular file ({kind}); give the path of a .bnn file")


def _read_exactly(f, n: int, path: str) -> bytes:
    data = f.read(n)
    if len(data) != n:  # a regular file reads short only at its end: it shrank while read
        raise ModelFileError(f"{path}: truncated while being read")
    return data


def json_value(text, path: str, what: str):
    """``text`` parsed as JSON, or the ModelFileError ``path: what``."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nesting too deep
        raise ModelFileError(f"{path}: {what}") from None


def _bounded_json(text: bytes, path: str):
    """The header parsed, refused once it holds more than MAX_HEADER_OBJECTS objects (counted as
    the parser builds them, so a crafted header stops early instead of filling memory)."""
    built = [0]

    def count(pairs):
        built[0] += 1
        if built[0] > MAX_HEADER_OBJECTS:
            raise ModelFileError(f"{path}: not a .bnn file (its header holds over {MAX_HEADER_OBJECTS} JSON objects)")
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=count)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nesting too deep
        if isinstance(exc, ModelFileError):
            raise
        raise ModelFileError(f"{path}: not a safetensors file (unreadable header)") from None


def _tensor_index(header: dict, path: str) -> int:
    """Check every tensor entry of the safetensors header; return the data bytes they declare."""
    end = 0
    for name, v in header.items():
        if name == "__metadata__":
            continue
        w = f"{path}: tensor {show(name)}"
        if not isinstance(v, dict):
            raise ModelFileError(f"{w} is described by {show(v)}, not an object")
        dtype, shape, offsets = v.get("dtype"), v.get("shape"), v.get("data_offsets")
        if not (isinstance(dtype, str) and dtype in TENSOR_DTYPES):
            raise ModelFileError(f"{w}: dtype {show(dtype)} is not one this engine reads ({', '.join(TENSOR_DTYPES)})")
        if not (isinstance(shape, list) and all(is_int(s) and s >= 0 for s in shape)):
            raise ModelFileError(f"{w}: shape must be a list of sizes, got {show(shape)}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise ModelFileError(f"{w}: data_offsets must be two integers 0 <= begin <= end, got {show(offsets)}")
        if int(np.prod(shape, dtype=object)) * np.dtype(TENSOR_DTYPES[dtype]).itemsize != offsets[1] - offsets[0]:
            raise ModelFileError(f"{w}: {dtype} {show(shape)} does not fill data_offsets {offsets}")
        end = max(end, offsets[1])
    return end


def read_container(path: str) -> tuple[dict, bytes]:
    """(header, the whole file's bytes) of a safetensors file, every tensor entry of the header
    checked, reading no more than the header declares."""
    f, size = _open_regular(path)
    with f:
        # The safetensors layout: 8-byte little-endian header length, the JSON header (tensor
        # entries and "__metadata__"), then the tensor data its offsets address.
        if size < 8:
            raise ModelFileError(f"{path}: truncated or not a safetensors file ({size} bytes)")
        prefix = _read_exactly(f, 8, path)
        header_len = int.from_bytes(prefix, "little")
        if header_len > MAX_HEADER_BYTES:
            raise ModelFileError(f"{path}: not a safetensors file (a header of {header_len} bytes; "
                                 f"the limit is {MAX_HEADER_BYTES})")
        if header_len > size - 8:
            raise ModelFileError(f"{path}: truncated or not a safetensors file (header of {header_len} bytes, file has {size})")
        header_bytes = _read_exactly(f, header_len, path)
        header = _bounded_json(header_bytes, path)
        if not isinstance(header, dict):
            raise ModelFileError(f"{path}: not a safetensors file (header is not a JSON object)")
        need, have = _tensor_index(header, path), size - 8 - header_len
        if need > have:
            raise ModelFileError(f"{path}: truncated (tensor data needs {need} bytes after the header, file has {have})")
        if need < have:
            raise ModelFileError(f"{path}: {have - need} bytes past the tensor data its header declares "
                                 "(not a safetensors file, or a damaged one)")
        data = _read_exactly(f, need, path)
    return header, prefix + header_bytes + data
