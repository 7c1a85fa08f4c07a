"""digits: ``sklearn.datasets.load_digits()``, split so that the engine rebuilds training's test set.

Its test split is the LAST ``DIGITS_TEST_SIZE`` images in the order it returns them (no shuffle), so
the engine rebuilds exactly the test set that ``bnn.train`` reports on; the seeded permutation in
``bnn.data`` only splits train from validation.
"""
from __future__ import annotations

import numpy as np

DIGITS_TEST_SIZE = 360  # 20% of 1797, the last images in load_digits() order


def read_digits():
    """(train_x, train_y, test_x, test_y, class_names); uint8 (N, 1, 8, 8) with values 0..16."""
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError as missing:  # the inference install (pip install .) leaves it out
        if missing.name != "sklearn":
            raise
        raise ValueError('the digits data set ships with scikit-learn, which this environment lacks: '
                         'pip install scikit-learn (or the project\'s [train] extra)') from None

    d = load_digits()
    x = d.images.astype(np.uint8).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    cut = len(y) - DIGITS_TEST_SIZE
    return x[:cut], y[:cut], x[cut:], y[cut:], [str(i) for i in range(10)]


def digits_test() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images uint8 (360, 1, 8, 8), labels int64, class names)."""
    _, _, x, y, names = read_digits()
    return x, y, names
