"""The data sets' files, read with NumPy only: the one reader for training and for the engine.

* CIFAR-10 / CIFAR-100 from the standard Python archives (``cifar-10-python.tar.gz``,
  ``cifar-100-python.tar.gz``) or their extracted folders. ``bnn.data`` reads the whole archive
  for training; the engine reads only the test batch (``cifar_test``).
* MNIST / Fashion-MNIST from the official IDX files, raw or ``.gz``, in torchvision's layout
  (``DIR/MNIST/raw/``, ``DIR/FashionMNIST/raw/``) or directly in ``DIR``; ``download_idx`` fetches
  them (only on ``--download``) and checks the SHA-256 of their decompressed content.
* digits: ``sklearn.datasets.load_digits()``. Its test split is the LAST ``DIGITS_TEST_SIZE``
  images in the order it returns them (no shuffle), so the engine rebuilds exactly the test set
  that ``bnn.train`` reports on; the seeded permutation in ``bnn.data`` only splits train from
  validation.

Images are uint8 NCHW in raw pixel units (0..16 for digits, 0..255 otherwise), labels int64.
Anything malformed raises ``ValueError`` (missing files ``FileNotFoundError``) naming the files
expected and where to get them.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import stat
import struct
import sys
import tarfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass

import numpy as np

from .fileio import atomic_file

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
DIGITS_TEST_SIZE = 360  # 20% of 1797, the last images in load_digits() order


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


# ---------------------------------------------------------------------------------------------
# digits


def read_digits():
    """(train_x, train_y, test_x, test_y, class_names); uint8 (N, 1, 8, 8) with values 0..16."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.images.astype(np.uint8).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    cut = len(y) - DIGITS_TEST_SIZE
    return x[:cut], y[:cut], x[cut:], y[cut:], [str(i) for i in range(10)]


def digits_test() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images uint8 (360, 1, 8, 8), labels int64, class names)."""
    _, _, x, y, names = read_digits()
    return x, y, names


# ---------------------------------------------------------------------------------------------
# CIFAR


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
        allowed = _CIFAR_GLOBALS.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR batch never holds")
        return allowed


def _unpickle(raw: bytes, where: str, spec: CifarArchive) -> dict:
    import io

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


# ---------------------------------------------------------------------------------------------
# Data set names (one spelling for every command line)

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100")
INPUT_SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "fashion-mnist": (1, 28, 28),
                "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}


def canonical_name(name: str) -> str:
    """The registered spelling of a data set name: case, '-' and '_' do not matter."""
    key = str(name).lower().replace("-", "").replace("_", "")
    for known in DATASETS:
        if known.replace("-", "") == key:
            return known
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def dataset_arg(text: str) -> str:
    """``argparse`` type of every ``--dataset`` option: the canonical name, or the choices."""
    import argparse

    try:
        return canonical_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# MNIST and Fashion-MNIST: the IDX files
#
# An IDX file is a big-endian header, magic 0x000008NN (unsigned bytes, NN dimensions) and one
# uint32 per dimension, followed by exactly prod(dims) bytes. Everything read is bounded by the
# header: a raw file's size must match it exactly, a .gz stream is inflated only up to it.

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IDX_IMAGES_MAGIC = 0x00000803
IDX_LABELS_MAGIC = 0x00000801
IDX_SIDE = 28
# More items than any file of these sets holds (60,000): a header claiming more is not theirs.
IDX_MAX_ITEMS = 1_000_000
DOWNLOAD_MAX_BYTES = 64 << 20  # above the largest file, compressed or not (47 MB)
DOWNLOAD_TIMEOUT_S = 60
_CHUNK = 1 << 20


@dataclass(frozen=True)
class IdxSet:
    """One IDX data set: where torchvision keeps it, where to download it, its checksums."""

    name: str
    folder: str  # torchvision's layout: DIR/<folder>/raw/
    url: str  # base URL of the four .gz files
    class_names: tuple[str, ...]
    sha256: dict  # file name -> SHA-256 of the DECOMPRESSED IDX content (independent of gzip's settings)

    def folders(self, data_dir: str) -> tuple[str, str]:
        return os.path.join(data_dir, self.folder, "raw"), data_dir

    def expected(self, data_dir: str) -> str:
        return (f"expected {', '.join(IDX_FILES)} (each raw or .gz) in {' or '.join(self.folders(data_dir))}; "
                f"pass --download, or get them from {self.url}")


IDX = {
    "mnist": IdxSet(
        name="mnist", folder="MNIST", url="https://ossci-datasets.s3.amazonaws.com/mnist/",
        class_names=tuple(str(i) for i in range(10)),
        sha256={
            "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
    ),
    "fashion-mnist": IdxSet(
        name="fashion-mnist", folder="FashionMNIST", url="http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        class_names=("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                     "Ankle boot"),
        sha256={
            "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        },
    ),
}


def idx_spec(name: str) -> IdxSet:
    key = canonical_name(name)
    if key not in IDX:
        raise ValueError(f"{key} is not an IDX data set; those are {', '.join(IDX)}")
    return IDX[key]


def _present(folder: str, name: str) -> str | None:
    """Path of ``name`` or ``name.gz`` in ``folder`` (raw first), whatever its kind; None if neither."""
    for path in (os.path.join(folder, name), os.path.join(folder, name + ".gz")):
        if os.path.lexists(path):
            return path
    return None


def _locate(spec: IdxSet, data_dir: str, names: tuple[str, ...]) -> dict[str, str]:
    """The first searched folder holding all ``names``; else FileNotFoundError saying what is where."""
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data directory {data_dir!r} does not exist; {spec.expected(data_dir)}")
    folders = spec.folders(data_dir)
    for folder in folders:
        paths = {n: _present(folder, n) for n in names}
        if all(paths.values()):
            return paths
    for folder in folders:
        found = [n for n in names if _present(folder, n)]
        if found:
            missing = [n for n in names if n not in found]
            raise FileNotFoundError(f"{spec.name}: {', '.join(missing)} missing from {folder} (which holds "
                                    f"{', '.join(found)}); {spec.expected(data_dir)}")
    raise FileNotFoundError(f"{spec.name} not found; {spec.expected(data_dir)}")


def _open_regular(path: str):
    # O_NONBLOCK: opening a FIFO must not hang; fstat on the open file then rejects it.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise ValueError(f"{path} is not a regular file")
    return f


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


def _read_idx(path: str, images: bool) -> np.ndarray:
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


def _read_split(spec: IdxSet, paths: dict[str, str], split: str) -> tuple[np.ndarray, np.ndarray]:
    img, lbl = paths[f"{split}-images-idx3-ubyte"], paths[f"{split}-labels-idx1-ubyte"]
    x, y = _read_idx(img, images=True), _read_idx(lbl, images=False)
    if len(x) != len(y):
        raise ValueError(f"{img} holds {len(x)} images but {lbl} holds {len(y)} labels; they must be one pair")
    return x.reshape(-1, 1, IDX_SIDE, IDX_SIDE), y.astype(np.int64)


def read_idx_dataset(name: str, data_dir: str, download: bool = False):
    """(train_x, train_y, test_x, test_y, class_names) of ``mnist`` or ``fashion-mnist``;
    uint8 (N, 1, 28, 28) images, int64 labels. ``download``: fetch missing files first."""
    spec = idx_spec(name)
    paths = _locate_or_download(spec, data_dir, IDX_FILES, download)
    train_x, train_y = _read_split(spec, paths, "train")
    test_x, test_y = _read_split(spec, paths, "t10k")
    return train_x, train_y, test_x, test_y, list(spec.class_names)


def mnist_test(name: str, data_dir: str, download: bool = False) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images uint8 (10000, 1, 28, 28), labels int64, class names): the test split only."""
    spec = idx_spec(name)
    paths = _locate_or_download(spec, data_dir, IDX_FILES[2:], download)
    x, y = _read_split(spec, paths, "t10k")
    return x, y, list(spec.class_names)


def _locate_or_download(spec: IdxSet, data_dir: str, names: tuple[str, ...], download: bool) -> dict[str, str]:
    try:
        return _locate(spec, data_dir, names)
    except FileNotFoundError:
        if not download:
            raise
    download_idx(spec.name, data_dir)
    return _locate(spec, data_dir, names)


# ---------------------------------------------------------------------------------------------
# Downloading (only when the user asks: --download)


def download_idx(name: str, data_dir: str, base_url: str | None = None, log=None) -> list[str]:
    """Fetch the four official .gz files missing from ``DATA_DIR/<folder>/raw/``; the paths written.

    Each file's DECOMPRESSED content must have the recorded SHA-256, else nothing is written for
    it (ValueError). Writes are atomic: a temporary file in the same folder, fsync, os.replace.
    """
    spec = idx_spec(name)
    log = log if log is not None else (lambda s: print(s, file=sys.stderr, flush=True))
    folder = spec.folders(data_dir)[0]
    os.makedirs(folder, exist_ok=True)
    written = []
    for fname in IDX_FILES:
        if _present(folder, fname):
            continue
        url = (base_url or spec.url) + fname + ".gz"
        dest = os.path.join(folder, fname + ".gz")
        log(f"downloading {url} -> {dest}")
        _fetch_verified(url, dest, spec.sha256[fname])
        written.append(dest)
    return written


def _fetch_verified(url: str, dest: str, sha256: str) -> None:
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

