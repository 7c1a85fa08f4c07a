"""Test splits for the CPU engine, read with NumPy only (``bnn/data.py`` needs torch).

* ``digits_test()``: the same test split as ``bnn.data.read_digits``: the LAST ``DIGITS_TEST_SIZE``
  images of ``sklearn.datasets.load_digits()`` in the order it returns them (bnn.data's rule; the
  seeded permutation there only splits train/validation, so the test split does not depend on a
  seed). ``tests/test_infer.py`` asserts both give identical arrays.
* ``cifar_test(DIR)``: the test batch of the standard CIFAR-10 or CIFAR-100 Python archive, from
  the extracted folder or the ``.tar.gz``, as ``bnn.data.read_cifar`` finds it.

Images are uint8 NCHW in raw pixel units (0..16 for digits, 0..255 for CIFAR), labels int64.
"""
from __future__ import annotations

import os
import pickle
import tarfile

import numpy as np

DIGITS_TEST_SIZE = 360  # must equal bnn.data.DIGITS_TEST_SIZE (a test checks it)

# kind -> (folder, archive, test member, meta member, label key, names key, classes)
_CIFAR = {
    "cifar10": ("cifar-10-batches-py", "cifar-10-python.tar.gz", "test_batch", "batches.meta",
                b"labels", b"label_names", 10),
    "cifar100": ("cifar-100-python", "cifar-100-python.tar.gz", "test", "meta",
                 b"fine_labels", b"fine_label_names", 100),
}


def digits_test() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images uint8 (360, 1, 8, 8), labels int64, class names)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.images.astype(np.uint8).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    cut = len(y) - DIGITS_TEST_SIZE
    return x[cut:], y[cut:], [str(i) for i in range(10)]


def _members(kind: str, data_dir: str) -> dict[str, bytes] | None:
    folder, archive, test, meta = _CIFAR[kind][:4]
    for d in (os.path.join(data_dir, folder), data_dir):
        if os.path.isfile(os.path.join(d, test)) and os.path.isfile(os.path.join(d, meta)):
            out = {}
            for m in (test, meta):
                with open(os.path.join(d, m), "rb") as f:
                    out[m] = f.read()
            return out
    path = os.path.join(data_dir, archive)
    if not os.path.isfile(path):
        return None
    out = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for info in tar.getmembers():
                base = os.path.basename(info.name)
                if info.isfile() and base in (test, meta) and os.path.dirname(info.name).endswith(folder):
                    out[base] = tar.extractfile(info).read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ValueError(f"{path} is corrupt or not a .tar.gz ({exc})") from None
    missing = [m for m in (test, meta) if m not in out]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return out


def _unpickle(raw: bytes, where: str) -> dict:
    try:
        obj = pickle.loads(raw, encoding="bytes")
    except Exception as exc:  # any unpickling failure means the file is not a CIFAR pickle
        raise ValueError(f"{where} is not a readable CIFAR pickle ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where} does not hold a dict")
    return obj


def cifar_test(data_dir: str, num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images uint8 (N, 3, 32, 32), labels int64, class names) of the CIFAR test split.

    ``num_classes`` (10 or 100) picks the archive; None takes whichever is present (CIFAR-10 first).
    """
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"CIFAR directory {data_dir!r} does not exist")
    kinds = [k for k in _CIFAR if num_classes is None or _CIFAR[k][6] == num_classes]
    if not kinds:
        raise ValueError(f"no CIFAR variant has {num_classes} classes (CIFAR-10 or CIFAR-100)")
    for kind in kinds:
        raw = _members(kind, data_dir)
        if raw is None:
            continue
        folder, archive, test, meta, label_key, names_key, classes = _CIFAR[kind]
        d = _unpickle(raw[test], f"{kind} {test}")
        if b"data" not in d or label_key not in d:
            raise ValueError(f"{kind} {test} lacks b'data' or {label_key!r}")
        x = np.asarray(d[b"data"])
        y = np.asarray(d[label_key], dtype=np.int64)
        if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072 or len(y) != len(x):
            raise ValueError(f"{kind} {test}: data is {x.dtype} {x.shape} with {len(y)} labels; expected uint8 (N, 3072)")
        if len(y) and (y.min() < 0 or y.max() >= classes):
            raise ValueError(f"{kind} {test}: labels outside 0..{classes - 1}")
        names = _unpickle(raw[meta], f"{kind} {meta}").get(names_key)
        if not isinstance(names, list) or len(names) != classes:
            raise ValueError(f"{kind} {meta} lacks {classes} {names_key!r}")
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        return x.reshape(-1, 3, 32, 32), y, names
    wanted = " or ".join(f"{_CIFAR[k][1]} / {_CIFAR[k][0]}/" for k in kinds)
    raise FileNotFoundError(f"no CIFAR test split in {data_dir!r}; expected {wanted}")
