"""Tiny data sets in the exact CIFAR-10 / CIFAR-100 Python formats, for tests (nothing downloads)."""
from __future__ import annotations

import io
import os
import pickle
import tarfile

import numpy as np


def _batches(kind: str, per_batch: int, seed: int) -> dict[str, dict]:
    rng = np.random.default_rng(seed)

    def batch(n, classes, label_key):
        return {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            label_key: [int(v) for v in rng.integers(0, classes, n)],
        }

    if kind == "cifar10":
        files = {f"data_batch_{i}": batch(per_batch, 10, b"labels") for i in range(1, 6)}
        files["test_batch"] = batch(per_batch, 10, b"labels")
        files["batches.meta"] = {b"label_names": [f"class{i}".encode() for i in range(10)]}
    else:
        files = {"train": batch(5 * per_batch, 100, b"fine_labels"), "test": batch(per_batch, 100, b"fine_labels")}
        files["meta"] = {b"fine_label_names": [f"fine{i}".encode() for i in range(100)]}
    return files


FOLDER = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
ARCHIVE = {"cifar10": "cifar-10-python.tar.gz", "cifar100": "cifar-100-python.tar.gz"}


def make_cifar(root, kind="cifar10", per_batch=8, archive=True, seed=0) -> str:
    """Write a tiny CIFAR data set under ``root`` (a .tar.gz, or the extracted folder); returns root.

    ``per_batch`` images per training batch file (5 of them) and in the test file.
    """
    root = str(root)
    os.makedirs(root, exist_ok=True)
    files = _batches(kind, per_batch, seed)
    if archive:
        with tarfile.open(os.path.join(root, ARCHIVE[kind]), "w:gz") as tar:
            for name, obj in files.items():
                raw = pickle.dumps(obj, protocol=2)
                info = tarfile.TarInfo(f"{FOLDER[kind]}/{name}")
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
    else:
        folder = os.path.join(root, FOLDER[kind])
        os.makedirs(folder, exist_ok=True)
        for name, obj in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                pickle.dump(obj, f, protocol=2)
    return root
