"""Downloading a checked file (only when the user asks: ``--download``): bounded, hashed, atomic."""
from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
import zlib

from ..fileio import atomic_file

DOWNLOAD_MAX_BYTES = 64 << 20  # above the largest file, compressed or not (47 MB)
DOWNLOAD_TIMEOUT_S = 60
_CHUNK = 1 << 20


def fetch_verified(url: str, dest: str, sha256: str) -> None:
    """Download the gzip file at ``url`` to ``dest`` if what it inflates to has SHA-256 ``sha256``.

    Otherwise nothing is written: OSError (one line) when the transfer fails, ValueError for a wrong
    hash, a file that is not gzip, a truncated one, or one over ``DOWNLOAD_MAX_BYTES``.
    """
    # atomic_file: temp file, fsync, rename, fsync the folder; any error leaves no file behind.
    with atomic_file(dest) as out:
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
                digest = _copy_and_hash(resp, out, url)
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = exc if isinstance(exc, urllib.error.HTTPError) else getattr(exc, "reason", exc)
            raise OSError(f"could not download {url} ({' '.join(str(reason).split())}); check the connection, "
                          f"or place the official files in {os.path.dirname(dest)} yourself") from None
        if digest != sha256:
            raise ValueError(f"{url}: the SHA-256 of its decompressed content is {digest}, expected {sha256}; "
                             f"nothing was written (retry, or place the official files in "
                             f"{os.path.dirname(dest)} yourself)")


def _copy_and_hash(resp, out, url: str) -> str:
    """Copy the gzip stream to ``out`` and return the SHA-256 of what it inflates to (bounded)."""
    inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)  # | 16: gzip framing
    h = hashlib.sha256()
    got = inflated = 0
    try:
        while chunk := resp.read(_CHUNK):
            got += len(chunk)
            out.write(chunk)
            data = chunk
            while data and not inflate.eof:
                plain = inflate.decompress(data, _CHUNK)  # max_length: a small chunk cannot inflate unboundedly
                inflated += len(plain)
                h.update(plain)
                data = inflate.unconsumed_tail
            if got > DOWNLOAD_MAX_BYTES or inflated > DOWNLOAD_MAX_BYTES:
                raise ValueError(f"{url}: more than {DOWNLOAD_MAX_BYTES >> 20} MiB, larger than any file of these data "
                                 "sets; nothing was written")
    except zlib.error as exc:
        raise ValueError(f"{url}: not a gzip file ({exc}); nothing was written") from None
    if not inflate.eof:
        raise ValueError(f"{url}: the gzip stream ends early (truncated transfer); nothing was written")
    return h.hexdigest()
