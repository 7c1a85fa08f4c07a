"""CIFAR-10 / CIFAR-100 from the standard Python archives or their extracted folders.

The archives are ``cifar-10-python.tar.gz`` and ``cifar-100-python.tar.gz``; ``bnn.data`` reads the
whole archive for training, the engine only the test batch (``cifar_test``). Batches are pickles,
read by an unpickler that builds only dicts, lists, strings, bytes, numbers and NumPy arrays.
"""
from __future__ import annotations

import io
import os
import pickle
import tarfile
from dataclasses import dataclass

import numpy as np

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"


@dataclass(frozen=True)
class CifarArchive:
    """Layout of one CIFAR archive."""

    archive: str
    folder: str
    train_members: tuple[str, ...]
    test_member: str
    meta_member: str
    label_key: bytes
    names_key: bytes
    num_classes: int

    def expected(self) -> str:
        """What a data folder must hold and where to get it, for the end of an error message."""
        return (
            f"expected {self.archive} or the extracted {self.folder}/ "
            f"({', '.join(self.train_members)}, {self.test_member}, {self.meta_member}); "
            f"get it from {CIFAR_URL}"
        )


CIFAR = {
    "cifar10": CifarArchive(
        archive="cifar-10-python.tar.gz",
        folder="cifar-10-batches-py",
        train_members=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_member="test_batch",
        meta_member="batches.meta",
        label_key=b"labels",
        names_key=b"label_names",
        num_classes=10,
    ),
    "cifar100": CifarArchive(
        archive="cifar-100-python.tar.gz",
        folder="cifar-100-python",
        train_members=("train",),
        test_member="test",
        meta_member="meta",
        label_key=b"fine_labels",
        names_key=b"fine_label_names",
        num_classes=100,
    ),
}


def _empty_ndarray(subtype, shape, dtype):
    # What a pickled ndarray starts from (its data comes after, by __setstate__): always an empty
    # plain ndarray; any other shape or class is not NumPy's own pickle.
    if subtype is not np.ndarray or tuple(shape) != (0,):
        raise pickle.UnpicklingError(f"_reconstruct({getattr(subtype, '__name__', subtype)}, {shape!r}) is not an "
                                     "ndarray's pickle")
    return _RECONSTRUCT(np.ndarray, (0,), dtype)


def _latin1(text, encoding):
    # Python 3's protocol-2 pickles spell bytes as _codecs.encode(text, "latin1"); no other codec.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode(..., {encoding!r}) is not a pickled bytes object")
    return text.encode("latin1")


_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(0))[0]  # NumPy's own, whichever module holds it
# Every global a CIFAR batch may name: the official files (Python 2, NumPy 1: numpy.core) and
# the same dicts pickled today (NumPy 2: numpy._core; bytes through _codecs.encode).
_CIFAR_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _empty_ndarray,
    ("numpy._core.multiarray", "_reconstruct"): _empty_ndarray,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1,
}


class _CifarUnpickler(pickle.Unpickler):
    """An unpickler that builds only what the CIFAR format holds: dicts, lists, strings, bytes,
    numbers and NumPy arrays. A pickle naming any other global (``os.system``, ``builtins.exec``,
    ...) is refused before that global is imported, so a crafted data folder cannot run code."""

    def find_class(self, module, name):
        """The allowed global ``module.name``; UnpicklingError for any other, before importing it."""
        allowed = _CIFAR_GLOBALS.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR batch never holds")
        return allowed


def _unpickle(raw: bytes, where: str, spec: CifarArchive) -> dict:
    """The dict pickled in ``raw``, by the restricted unpickler; ValueError naming ``where`` otherwise."""
    try:
        obj = _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{where} is not a CIFAR pickle ({' '.join(str(exc).split())}); refused unread; "
                         f"{spec.expected()}") from None
    except Exception as exc:  # any unpickling failure means the file is not what we expect
        raise ValueError(f"{where} is not a readable CIFAR pickle ({type(exc).__name__}); {spec.expected()}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where} does not hold a dict; {spec.expected()}")
    return obj


def _read_members(name: str, data_dir: str, members: tuple[str, ...]) -> dict[str, bytes]:
    """Raw bytes of ``members``, from the extracted folder or the .tar.gz archive."""
    spec = CIFAR[name]
    for folder in (os.path.join(data_dir, spec.folder), data_dir):
        if all(os.path.isfile(os.path.join(folder, m)) for m in members):
            out = {}
            for m in members:
                with open(os.path.join(folder, m), "rb") as f:
                    out[m] = f.read()
            return out
    archive = os.path.join(data_dir, spec.archive)
    if not os.path.isfile(archive):
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"data directory {data_dir!r} does not exist; {spec.expected()}")
        raise FileNotFoundError(f"{name} not found in {data_dir!r}; {spec.expected()}")
    out = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for info in tar.getmembers():
                base = os.path.basename(info.name)
                if info.isfile() and base in members and os.path.dirname(info.name).endswith(spec.folder):
                    out[base] = tar.extractfile(info).read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ValueError(f"{archive} is corrupt or not a .tar.gz ({exc}); {spec.expected()}") from None
    missing = [m for m in members if m not in out]
    if missing:
        raise ValueError(f"{archive} lacks {', '.join(missing)}; {spec.expected()}")
    return out


def _decode_batch(raw: bytes, where: str, spec: CifarArchive) -> tuple[np.ndarray, np.ndarray]:
    d = _unpickle(raw, where, spec)
    if b"data" not in d or spec.label_key not in d:
        raise ValueError(f"{where} lacks b'data' or {spec.label_key!r}; {spec.expected()}")
    try:
        x = np.asarray(d[b"data"])
        y = np.asarray(d[spec.label_key], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        x = y = np.zeros(0)  # not arrays of numbers: reported just below
    if x.dtype != np.uint8 or y.ndim != 1 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or len(y) != len(x):
        raise ValueError(
            f"{where}: data has shape {x.shape} and dtype {x.dtype} with {y.size} labels; "
            f"expected uint8 (N, 3072) with N labels; {spec.expected()}"
        )
    if len(y) and (y.min() < 0 or y.max() >= spec.num_classes):
        raise ValueError(f"{where}: labels outside 0..{spec.num_classes - 1}; {spec.expected()}")
    return x.reshape(-1, 3, 32, 32), y


def _class_names(raw: bytes, name: str, spec: CifarArchive) -> list[str]:
    meta = _unpickle(raw, f"{name} member {spec.meta_member}", spec)
    names = meta.get(spec.names_key)
    if not isinstance(names, list) or len(names) != spec.num_classes:
        raise ValueError(f"{name} member {spec.meta_member} lacks {spec.num_classes} {spec.names_key!r}; {spec.expected()}")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def read_cifar(name: str, data_dir: str):
    """(train_x, train_y, test_x, test_y, class_names) of ``cifar10`` or ``cifar100``."""
    spec = CIFAR[name]
    raw = _read_members(name, data_dir, (*spec.train_members, spec.test_member, spec.meta_member))
    parts = [_decode_batch(raw[m], f"{name} member {m}", spec) for m in spec.train_members]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = _decode_batch(raw[spec.test_member], f"{name} member {spec.test_member}", spec)
    return train_x, train_y, test_x, test_y, _class_names(raw[spec.meta_member], name, spec)


def cifar_test(data_dir: str, num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images uint8 (N, 3, 32, 32), labels int64, class names) of the CIFAR test split.

    ``num_classes`` (10 or 100) picks the archive; None takes whichever is present (CIFAR-10 first).
    """
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"CIFAR directory {data_dir!r} does not exist")
    kinds = [k for k, spec in CIFAR.items() if num_classes is None or spec.num_classes == num_classes]
    if not kinds:
        raise ValueError(f"no CIFAR variant has {num_classes} classes (CIFAR-10 or CIFAR-100)")
    for kind in kinds:
        spec = CIFAR[kind]
        try:
            raw = _read_members(kind, data_dir, (spec.test_member, spec.meta_member))
        except FileNotFoundError:
            continue
        x, y = _decode_batch(raw[spec.test_member], f"{kind} member {spec.test_member}", spec)
        return x, y, _class_names(raw[spec.meta_member], kind, spec)
    wanted = " or ".join(f"{CIFAR[k].archive} / {CIFAR[k].folder}/" for k in kinds)
    raise FileNotFoundError(f"no CIFAR test split in {data_dir!r}; expected {wanted}")
