"""Data loading: the CIFAR archive formats, clear errors, the seeded split, device augmentation."""
import os
import pickle

import numpy as np
import pytest
import torch
from _tiny_cifar import ARCHIVE, FOLDER, make_cifar

from bnn.data import CIFAR_URL, DIGITS_TEST_SIZE, load_dataset, read_cifar


@pytest.mark.parametrize("kind", ["cifar10", "cifar100"])
def test_archive_and_extracted_folder_give_the_same_arrays(tmp_path, kind):
    a = read_cifar(kind, make_cifar(tmp_path / "a", kind, archive=True))
    b = read_cifar(kind, make_cifar(tmp_path / "b", kind, archive=False))
    for u, v in zip(a[:4], b[:4]):
        np.testing.assert_array_equal(u, v)
    train_x, train_y, test_x, test_y, names = a
    assert train_x.shape == (40, 3, 32, 32) and train_x.dtype == np.uint8
    assert test_x.shape == (8, 3, 32, 32)
    assert len(names) == (10 if kind == "cifar10" else 100)


def test_images_are_decoded_channel_major(tmp_path):
    # CIFAR rows hold 1024 red, then 1024 green, then 1024 blue values, each row-major.
    root = make_cifar(tmp_path, archive=False)
    with open(os.path.join(root, FOLDER["cifar10"], "data_batch_1"), "rb") as f:
        row = pickle.load(f, encoding="bytes")[b"data"][0]
    x = read_cifar("cifar10", root)[0][0]
    assert x[1, 2, 3] == row[1024 + 2 * 32 + 3]


def test_missing_data_names_the_files_and_where_to_get_them(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("cifar10", str(tmp_path / "nowhere"))
    msg = str(err.value)
    assert "cifar-10-python.tar.gz" in msg and "cifar-10-batches-py" in msg and CIFAR_URL in msg
    assert "\n" not in msg


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_shape"])
def test_malformed_archive_is_a_value_error(tmp_path, damage):
    root = make_cifar(tmp_path, archive=damage != "wrong_shape")
    if damage == "garbage":
        with open(os.path.join(root, ARCHIVE["cifar10"]), "wb") as f:
            f.write(b"not a tarball at all")
    elif damage == "truncated":
        path = os.path.join(root, ARCHIVE["cifar10"])
        raw = open(path, "rb").read()
        open(path, "wb").write(raw[: len(raw) // 2])
    else:
        path = os.path.join(root, FOLDER["cifar10"], "test_batch")
        with open(path, "wb") as f:
            pickle.dump({b"data": np.zeros((4, 100), np.uint8), b"labels": [0] * 4}, f)
    with pytest.raises(ValueError, match="cifar"):
        load_dataset("cifar10", root)


def test_download_without_torchvision_says_how_to_get_the_data(tmp_path):
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torchvision is installed; a download would reach the network")
    with pytest.raises(ValueError, match="torchvision.*cifar-10-python.tar.gz"):
        load_dataset("cifar10", str(tmp_path), download=True)


def test_unknown_dataset_is_a_value_error():
    with pytest.raises(ValueError, match="unknown dataset 'emnist'"):
        load_dataset("emnist")


def test_validation_split_is_seeded_disjoint_and_complete(tmp_path):
    root = make_cifar(tmp_path, per_batch=20)  # 100 training images
    a = load_dataset("cifar10", root, val_size=30, seed=1)
    b = load_dataset("cifar10", root, val_size=30, seed=1)
    c = load_dataset("cifar10", root, val_size=30, seed=2)
    assert torch.equal(a.val_x, b.val_x) and not torch.equal(a.val_x, c.val_x)
    assert len(a.val_y) == 30 and len(a.train_y) == 70
    full = read_cifar("cifar10", root)[0].reshape(100, -1)
    rows = {r.tobytes() for r in full}
    seen = [r.numpy().tobytes() for r in torch.cat([a.train_x, a.val_x]).reshape(100, -1)]
    assert sorted(seen) == sorted(r.tobytes() for r in full) and len(set(seen)) == len(rows)
    assert a.train_x.dtype == torch.uint8 and a.test_x.shape == (20, 3, 32, 32)


def test_digits_test_set_is_the_last_images_and_val_is_a_tenth():
    from sklearn.datasets import load_digits

    d = load_dataset("digits")
    raw = load_digits()
    np.testing.assert_array_equal(d.test_y.numpy(), raw.target[-DIGITS_TEST_SIZE:])
    np.testing.assert_array_equal(d.test_x.numpy().reshape(-1, 64), raw.data[-DIGITS_TEST_SIZE:])
    n = len(raw.target) - DIGITS_TEST_SIZE
    assert len(d.val_y) == n // 10 and len(d.train_y) == n - n // 10
    assert d.input_shape == (1, 8, 8) and d.flip is False
    assert int(d.train_x.max()) == 16


def test_crop_takes_the_window_at_the_drawn_offset_of_the_zero_padded_image(tmp_path):
    d = load_dataset("cifar10", make_cifar(tmp_path), val_size=0)
    x = d.train_x[:3]
    offsets = torch.tensor([[4, 4], [0, 0], [8, 5]])
    out = d.augment(x, offsets, torch.zeros(3, dtype=torch.bool))
    assert torch.equal(out[0], x[0])  # offset = pad: the original image
    assert torch.equal(out[1, :, 4:, 4:], x[1, :, :28, :28]) and out[1, :, :4].eq(0).all()
    assert torch.equal(out[2, :, :28, :31], x[2, :, 4:, 1:]) and out[2, :, 28:].eq(0).all()


def test_flip_mirrors_columns_only_where_drawn(tmp_path):
    d = load_dataset("cifar10", make_cifar(tmp_path), val_size=0)
    x = d.train_x[:2]
    centre = torch.full((2, 2), d.crop_pad)
    out = d.augment(x, centre, torch.tensor([True, False]))
    assert torch.equal(out[0], x[0].flip(2)) and torch.equal(out[1], x[1])


def test_epoch_plan_is_reproducible_from_the_generator_state(tmp_path):
    d = load_dataset("cifar10", make_cifar(tmp_path), val_size=8)
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    first = d.epoch_plan(g)
    g.set_state(state)
    again = d.epoch_plan(g)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert sorted(first["perm"].tolist()) == list(range(32))


def test_normalize_uses_raw_pixel_statistics():
    d = load_dataset("digits")
    x = torch.full((1, 1, 8, 8), 16, dtype=torch.uint8)
    expected = (16 - d.mean[0]) / d.std[0]
    torch.testing.assert_close(d.normalize(x), torch.full((1, 1, 8, 8), expected))
