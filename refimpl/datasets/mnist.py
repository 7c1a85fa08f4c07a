"""MNIST and Fashion-MNIST: where their four IDX files are, their checksums, and reading or fetching them.

The official IDX files, raw or ``.gz``, in torchvision's layout (``DIR/MNIST/raw/``,
``DIR/FashionMNIST/raw/``) or directly in ``DIR``; ``download_idx`` fetches them (only on
``--download``) and checks the SHA-256 of their decompressed content.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from .download import fetch_verified
from .idx import IDX_SIDE, IdxReader, read_idx
from .registry import canonical_name

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class IdxSet:
    """One IDX data set: where torchvision keeps it, where to download it, its checksums."""

    name: str
    folder: str  # torchvision's layout: DIR/<folder>/raw/
    url: str  # base URL of the four .gz files
    class_names: tuple[str, ...]
    sha256: dict  # file name -> SHA-256 of the DECOMPRESSED IDX content (independent of gzip's settings)

    def folders(self, data_dir: str) -> tuple[str, str]:
        """The folders searched, in order: torchvision's ``DIR/<folder>/raw/``, then ``DIR`` itself."""
        return os.path.join(data_dir, self.folder, "raw"), data_dir

    def expected(self, data_dir: str) -> str:
        """What ``data_dir`` must hold and how to get it, for the end of an error message."""
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
    """The IDX set of a data set name in any accepted spelling; ValueError for a set that is not IDX."""
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


def _read_split(spec: IdxSet, paths: dict[str, str], split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 (N, 1, 28, 28) and labels int64 of ``split`` (``train`` or ``t10k``), checked as a pair."""
    img, lbl = paths[f"{split}-images-idx3-ubyte"], paths[f"{split}-labels-idx1-ubyte"]
    x, y = read_idx(img, images=True), read_idx(lbl, images=False)
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


def mnist_test_stream(name: str, data_dir: str, download: bool = False) -> tuple[IdxReader, np.ndarray, list[str]]:
    """``mnist_test`` with the images left in their file: an ``IdxReader`` whose ``batches`` read
    them in order, a batch at a time ((k, 28, 28) uint8); the labels are read whole and the pair's
    counts checked."""
    spec = idx_spec(name)
    paths = _locate_or_download(spec, data_dir, IDX_FILES[2:], download)
    img, lbl = paths["t10k-images-idx3-ubyte"], paths["t10k-labels-idx1-ubyte"]
    y = read_idx(lbl, images=False)
    x = IdxReader(img, images=True)
    if len(x) != len(y):
        x.close()
        raise ValueError(f"{img} holds {len(x)} images but {lbl} holds {len(y)} labels; they must be one pair")
    return x, y.astype(np.int64), list(spec.class_names)


def _locate_or_download(spec: IdxSet, data_dir: str, names: tuple[str, ...], download: bool) -> dict[str, str]:
    """``_locate``; where files are missing and ``download`` is set, fetch them first."""
    try:
        return _locate(spec, data_dir, names)
    except FileNotFoundError:
        if not download:
            raise
    download_idx(spec.name, data_dir)
    return _locate(spec, data_dir, names)


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
        fetch_verified(url, dest, spec.sha256[fname])
        written.append(dest)
    return written

