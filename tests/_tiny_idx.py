"""Tiny MNIST-style IDX files for tests, written byte by byte from the format's definition
(big-endian magic 0x00000803 / 0x00000801, one uint32 per dimension, then the bytes); nothing
downloads."""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np

NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
FOLDER = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}


def idx_bytes(array: np.ndarray, magic: int | None = None) -> bytes:
    """The IDX encoding of a uint8 array (magic 0x0803 for 3-d, 0x0801 for 1-d unless given)."""
    array = np.asarray(array, dtype=np.uint8)
    magic = (0x0800 | array.ndim) if magic is None else magic
    return struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write(path, content: bytes, gz: bool = False) -> str:
    path = str(path) + (".gz" if gz else "")
    with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
        f.write(content)
    return path


def make_idx(root, name: str = "mnist", layout: str = "torchvision", gz: bool = False,
             n_train: int = 12, n_test: int = 6, seed: int = 0) -> tuple[str, dict[str, np.ndarray]]:
    """Write the four files under ``root`` (torchvision's ``root/<Folder>/raw/`` or ``flat`` in
    ``root``); returns (the folder written, {file name: the array written})."""
    rng = np.random.default_rng(seed)
    arrays = {
        NAMES[0]: rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        NAMES[1]: rng.integers(0, 10, n_train, dtype=np.uint8),
        NAMES[2]: rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        NAMES[3]: rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder = os.path.join(str(root), FOLDER[name], "raw") if layout == "torchvision" else str(root)
    os.makedirs(folder, exist_ok=True)
    for fname, arr in arrays.items():
        write(os.path.join(folder, fname), idx_bytes(arr), gz)
    return folder, arrays
