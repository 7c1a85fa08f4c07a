"""Data sets for training: MNIST, Fashion-MNIST (IDX files), CIFAR-10, CIFAR-100 (standard Python
archives) and the 8x8 digits; the NumPy readers are in ``refimpl.datasets``.

The whole data set lives on the training device as uint8 NCHW tensors, loaded once and reused by
every training run of a process (the search trains hundreds of models per worker). Normalization,
random crop and horizontal flip are batch operations on the device; there are no DataLoader
workers, and the same code runs on CPU and GPU.

Splits: the validation set is held out of the training set by a seeded permutation (docs/design.md section 7:
fitness and model selection use it); the test set is only for final numbers.
digits has no official test set: its test set is the LAST ``DIGITS_TEST_SIZE`` images of
``sklearn.datasets.load_digits()`` in the order it returns them (no shuffle, so an engine without
torch can rebuild exactly the same test set).

Normalization is ``(pixel - mean[c]) / std[c]`` on RAW pixel values (0..255 for CIFAR and the
MNISTs, 0..16 for digits); ``Dataset.mean``/``std`` hold those raw-unit constants and travel in the checkpoint.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from refimpl import datasets
from refimpl.datasets import (  # noqa: F401  (re-exported)
    CIFAR,
    CIFAR_URL,
    DATASETS,
    DIGITS_TEST_SIZE,
    IDX,
    canonical_name,
    dataset_arg,
    read_digits,
)

# Digits fill their 8x8 frame, so a pad-4 crop would cut away half a digit; a one-pixel shift
# still regularizes a network that otherwise memorizes 1,300 images. No flip: mirrored digits
# are other symbols (2/5, 3/E).
DIGITS_CROP_PAD = 1

# Per-channel statistics of each training set, in raw pixel units. CIFAR: the usual published
# values (x255); digits: over all 1797 images, so the constants do not depend on the split.
_CIFAR10_MEAN = tuple(255 * v for v in (0.4914, 0.4822, 0.4465))
_CIFAR10_STD = tuple(255 * v for v in (0.2470, 0.2435, 0.2616))
_CIFAR100_MEAN = tuple(255 * v for v in (0.5071, 0.4865, 0.4409))
_CIFAR100_STD = tuple(255 * v for v in (0.2673, 0.2564, 0.2762))
_DIGITS_MEAN = (4.884,)
_DIGITS_STD = (6.017,)
# The usual published MNIST / Fashion-MNIST statistics (x255). A pad-2 crop shifts the centred
# 20x20 content without cutting it off; Fashion-MNIST's garments are left/right symmetric enough to
# flip, digits are not.
_IDX_STATS = {"mnist": ((0.1307 * 255,), (0.3081 * 255,)), "fashion-mnist": ((0.2860 * 255,), (0.3530 * 255,))}
IDX_CROP_PAD = 2
_IDX_FLIP = {"mnist": False, "fashion-mnist": True}


# Normalization statistics per CIFAR variant (raw pixel units); the archive layouts live with
# the NumPy reader in refimpl.datasets.
_CIFAR_STATS = {"cifar10": (_CIFAR10_MEAN, _CIFAR10_STD), "cifar100": (_CIFAR100_MEAN, _CIFAR100_STD)}


@dataclass
class Dataset:
    """A loaded data set on one device. ``*_x``: uint8 (N, C, H, W); ``*_y``: int64 (N,)."""

    name: str
    num_classes: int
    class_names: list[str]
    input_shape: tuple[int, int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pad: int  # random crop after zero-padding by this many pixels; 0 = no crop
    flip: bool  # random horizontal flip
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    val_size: int
    split_seed: int
    device: torch.device
    train_subset: int | None = None  # the train_size asked for (a seeded subset); None = all
    _mean_t: torch.Tensor = field(init=False, repr=False)
    _std_t: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        c = self.input_shape[0]
        self._mean_t = torch.tensor(self.mean, dtype=torch.float32, device=self.device).view(1, c, 1, 1)
        self._std_t = torch.tensor(self.std, dtype=torch.float32, device=self.device).view(1, c, 1, 1)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 batch -> normalized float32 (channels_last on CUDA, where convolutions prefer it)."""
        out = (x.float() - self._mean_t) / self._std_t
        if out.is_cuda:
            out = out.contiguous(memory_format=torch.channels_last)
        return out

    def epoch_plan(self, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Every random draw of one training epoch, taken from ``generator`` (a CPU generator, so
        the sequence is the same on every device and its state can be checkpointed)."""
        n = len(self.train_y)
        perm = torch.randperm(n, generator=generator)
        offsets = torch.randint(0, 2 * self.crop_pad + 1, (n, 2), generator=generator)
        flips = torch.randint(0, 2, (n,), generator=generator, dtype=torch.bool)
        return {k: v.to(self.device) for k, v in (("perm", perm), ("offsets", offsets), ("flips", flips))}

    def augment(self, x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
        """Random crop (zero padding, as torchvision's RandomCrop(padding=p)) and flip, on uint8."""
        if self.crop_pad:
            p = self.crop_pad
            b, c, h, w = x.shape
            padded = F.pad(x, (p, p, p, p))
            dev = x.device
            rows = (offsets[:, 0:1] + torch.arange(h, device=dev)).view(b, 1, h, 1)
            cols = (offsets[:, 1:2] + torch.arange(w, device=dev)).view(b, 1, 1, w)
            x = padded[
                torch.arange(b, device=dev).view(b, 1, 1, 1),
                torch.arange(c, device=dev).view(1, c, 1, 1),
                rows,
                cols,
            ]
        if self.flip:
            x = torch.where(flips.view(-1, 1, 1, 1), x.flip(3), x)
        return x

    def describe(self) -> dict:
        """What an exporter and the inference engine need to preprocess inputs identically."""
        return {
            "name": self.name,
            "num_classes": self.num_classes,
            "class_names": list(self.class_names),
            "input_shape": list(self.input_shape),
            "mean": list(self.mean),
            "std": list(self.std),
            "normalization": "(pixel - mean[c]) / std[c], raw pixel units",
            "pixel_max": 16 if self.name == "digits" else 255,
            "val_size": self.val_size,
            "split_seed": self.split_seed,
            "train_size": len(self.train_y),
            "test_size": len(self.test_y),
        }


# ---------------------------------------------------------------------------------------------
# Reading the archives


def _download(name: str, data_dir: str) -> None:
    try:
        import torchvision.datasets as tvd
    except ImportError:
        raise ValueError(
            f"--download needs torchvision, which is not installed; download {CIFAR[name].archive} "
            f"from {CIFAR_URL} into {data_dir!r} instead"
        ) from None
    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    os.makedirs(data_dir, exist_ok=True)
    cls(root=data_dir, train=True, download=True)


def read_cifar(name: str, data_dir: str, download: bool = False):
    """(train_x, train_y, test_x, test_y, class_names) as NumPy arrays, uint8 NCHW images."""
    if download:
        try:
            return datasets.read_cifar(name, data_dir)
        except FileNotFoundError:
            _download(name, data_dir)
    return datasets.read_cifar(name, data_dir)


# ---------------------------------------------------------------------------------------------
# The public loader


def default_val_size(name: str, train_size: int) -> int:
    """The validation split a data set gets when none is asked: a tenth of the training images for digits, else 5000."""
    return train_size // 10 if name == "digits" else 5000


def check_split_sizes(key: str, n: int, val_size: int | None, train_size: int | None) -> int:
    """The validation size (``None``: the default) for a training split of ``n`` images, or the
    ValueError that names the setting and its valid range: every command checks this before it
    writes anything, and ``load_dataset`` again."""
    if val_size is None:
        val_size = default_val_size(key, n)
    if not 0 <= val_size < n:
        raise ValueError(f"val_size must be in 0..{n - 1} for {key} ({n} training images), got {val_size}")
    left = n - val_size
    if train_size is not None and not 1 <= train_size <= left:
        raise ValueError(f"train_size must be in 1..{left} for {key} ({n} training images, {val_size} "
                         f"held out for validation), got {train_size}")
    return val_size


def read_arrays(name: str, data_dir: str | None = None, download: bool = False):
    """(train_x, train_y, test_x, test_y, class_names) of a data set as NumPy arrays, uint8 NCHW."""
    key = canonical_name(name)
    if key == "digits":
        return read_digits()
    data_dir = data_dir if data_dir is not None else os.environ.get("BNN_DATA_DIR", "data")
    if key in IDX:
        return datasets.read_idx_dataset(key, data_dir, download)
    return read_cifar(key, data_dir, download)


def load_dataset(
    name: str = "digits",
    data_dir: str | None = None,
    val_size: int | None = None,
    seed: int = 0,
    device="cpu",
    download: bool = False,
    train_size: int | None = None,
) -> Dataset:
    """Load once, keep on ``device``; ``seed`` chooses the validation split and the subset.

    ``train_size``: train on this many images, a seeded subset of what the validation holdout
    leaves (the first ``train_size`` of the same permutation, so smaller subsets nest in larger
    ones); None trains on all of it. Validation and test sets do not change.
    """
    key = canonical_name(name)
    device = torch.device(device)
    train_x, train_y, test_x, test_y, names = read_arrays(key, data_dir, download)
    if key == "digits":
        mean, std, crop_pad, flip = _DIGITS_MEAN, _DIGITS_STD, DIGITS_CROP_PAD, False
    elif key in IDX:
        (mean, std), crop_pad, flip = _IDX_STATS[key], IDX_CROP_PAD, _IDX_FLIP[key]
    else:
        (mean, std), crop_pad, flip = _CIFAR_STATS[key], 4, True
    n = len(train_y)
    val_size = check_split_sizes(key, n, val_size, train_size)
    perm = np.random.default_rng(seed).permutation(n)
    val_idx = np.sort(perm[:val_size])
    train_idx = np.sort(perm[val_size:] if train_size is None else perm[val_size:val_size + train_size])

    def on_device(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    return Dataset(
        name=key,
        num_classes=len(names),
        class_names=names,
        input_shape=tuple(train_x.shape[1:]),
        mean=tuple(float(v) for v in mean),
        std=tuple(float(v) for v in std),
        crop_pad=crop_pad,
        flip=flip,
        train_x=on_device(train_x[train_idx]),
        train_y=on_device(train_y[train_idx]),
        val_x=on_device(train_x[val_idx]),
        val_y=on_device(train_y[val_idx]),
        test_x=on_device(test_x),
        test_y=on_device(test_y),
        val_size=val_size,
        split_seed=seed,
        device=device,
        train_subset=train_size,
    )
