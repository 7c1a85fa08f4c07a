"""The data sets' files, read with NumPy only: the one reader for training and for the engine.

* ``cifar``: CIFAR-10 / CIFAR-100 from the standard Python archives (``cifar-10-python.tar.gz``,
  ``cifar-100-python.tar.gz``) or their extracted folders. ``bnn.data`` reads the whole archive
  for training; the engine reads only the test batch (``cifar_test``).
* ``mnist`` (with ``idx``, the file format, and ``download``): MNIST / Fashion-MNIST from the
  official IDX files, raw or ``.gz``, in torchvision's layout (``DIR/MNIST/raw/``,
  ``DIR/FashionMNIST/raw/``) or directly in ``DIR``; ``download_idx`` fetches them (only on
  ``--download``) and checks the SHA-256 of their decompressed content.
* ``digits``: ``sklearn.datasets.load_digits()``. Its test split is the LAST ``DIGITS_TEST_SIZE``
  images in the order it returns them (no shuffle), so the engine rebuilds exactly the test set
  that ``bnn.train`` reports on; the seeded permutation in ``bnn.data`` only splits train from
  validation.
* ``registry``: the data set names every command line accepts, and their image shapes.

Images are uint8 NCHW in raw pixel units (0..16 for digits, 0..255 otherwise), labels int64.
Anything malformed raises ``ValueError`` (missing files ``FileNotFoundError``) naming the files
expected and where to get them.
"""
from .cifar import CIFAR, CIFAR_URL, CifarArchive, cifar_test, read_cifar
from .digits import DIGITS_TEST_SIZE, digits_test, read_digits
from .download import DOWNLOAD_MAX_BYTES, DOWNLOAD_TIMEOUT_S
from .idx import IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, IDX_MAX_ITEMS, IDX_SIDE, IdxReader
from .mnist import IDX, IDX_FILES, IdxSet, download_idx, idx_spec, mnist_test, mnist_test_stream, read_idx_dataset
from .registry import DATASETS, INPUT_SHAPES, canonical_name, dataset_arg

__all__ = [
    "CIFAR",
    "CIFAR_URL",
    "DATASETS",
    "DIGITS_TEST_SIZE",
    "DOWNLOAD_MAX_BYTES",
    "DOWNLOAD_TIMEOUT_S",
    "IDX",
    "IDX_FILES",
    "IDX_IMAGES_MAGIC",
    "IDX_LABELS_MAGIC",
    "IDX_MAX_ITEMS",
    "IDX_SIDE",
    "INPUT_SHAPES",
    "CifarArchive",
    "IdxReader",
    "IdxSet",
    "canonical_name",
    "cifar_test",
    "dataset_arg",
    "digits_test",
    "download_idx",
    "idx_spec",
    "mnist_test",
    "mnist_test_stream",
    "read_cifar",
    "read_digits",
    "read_idx_dataset",
]
