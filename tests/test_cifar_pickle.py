"""CIFAR batches are pickles: a crafted one in a data folder must not run code.

The oracle for refusal is a marker file the payload would create: it must not appear, and the
load is one ValueError line. The oracle for the genuine format is ``_tiny_cifar``'s own arrays
(the dicts it pickled), and the globals the official files name (NumPy 1, Python 2: the module
``numpy.core.multiarray``), spelled out here by hand.
"""
from __future__ import annotations

import builtins
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from _cli import run_main
from _tiny_bnn import model_bytes, tiny_model
from _tiny_cifar import FOLDER, _batches, make_cifar

from refimpl import datasets


class _Payload:
    """Pickles as a call of ``fn(*args)``: what a crafted batch file would run on load."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _payloads(marker):
    py = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": _Payload(os.system, (f"touch '{marker}'",)),
        "subprocess.call": _Payload(subprocess.call, ([sys.executable, "-c", py],)),
        "builtins.exec": _Payload(builtins.exec, (py,)),
        # Hidden inside the dict, next to genuine arrays: refused all the same.
        "nested": {b"data": np.zeros((1, 3072), np.uint8), b"labels": [_Payload(builtins.exec, (py,))]},
    }


def _plant(root, member, obj):
    """A tiny CIFAR-10 folder whose ``member`` holds ``obj`` pickled (protocol 2, as the real files)."""
    make_cifar(root, "cifar10", per_batch=4, archive=False)
    with open(os.path.join(root, FOLDER["cifar10"], member), "wb") as f:
        pickle.dump(obj, f, protocol=2)
    return str(root)


@pytest.mark.parametrize("payload", ["os.system", "subprocess.call", "builtins.exec", "nested"])
@pytest.mark.parametrize("member", ["test_batch", "batches.meta"])
def test_crafted_test_batch_is_refused_without_running(payload, member, tmp_path):
    marker = tmp_path / "marker"
    root = _plant(tmp_path / "data", member, _payloads(marker)[payload])
    with pytest.raises(ValueError) as info:
        datasets.cifar_test(root, 10)
    assert not marker.exists(), "the pickle ran its payload"
    msg = str(info.value)
    assert "\n" not in msg and member in msg and "never holds" in msg, msg


def test_crafted_training_batch_is_refused_without_running(tmp_path):
    # The training reader (bnn.train, bnn.search's up-front check, bnn.reproduce) reads every batch.
    marker = tmp_path / "marker"
    root = _plant(tmp_path / "data", "data_batch_3", _payloads(marker)["os.system"])
    with pytest.raises(ValueError, match="data_batch_3"):
        datasets.read_cifar("cifar10", root)
    assert not marker.exists()


def test_crafted_member_of_an_archive_is_refused_without_running(tmp_path):
    import io
    import tarfile

    marker = tmp_path / "marker"
    root = tmp_path / "data"
    make_cifar(root, "cifar10", per_batch=4, archive=True)
    archive = root / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    members[f"{FOLDER['cifar10']}/test_batch"] = pickle.dumps(_payloads(marker)["builtins.exec"], protocol=2)
    with tarfile.open(archive, "w:gz") as tar:
        for name, raw in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    with pytest.raises(ValueError, match="never holds"):
        datasets.cifar_test(str(root), 10)
    assert not marker.exists()


def test_ndarray_reconstruct_with_another_class_or_shape_is_refused(tmp_path):
    # NumPy's _reconstruct is admitted only as NumPy's own pickles call it: (ndarray, (0,), ...).
    class Call:
        def __reduce__(self):
            return datasets.cifar._RECONSTRUCT, (np.ndarray, (1 << 40,), b"b")

    root = _plant(tmp_path / "data", "test_batch", {b"data": Call(), b"labels": [0]})
    with pytest.raises(ValueError, match="is not an ndarray's pickle"):
        datasets.cifar_test(root, 10)


@pytest.mark.parametrize("kind", ["cifar10", "cifar100"])
@pytest.mark.parametrize("archive", [False, True])
def test_genuine_tiny_cifar_still_loads(kind, archive, tmp_path):
    make_cifar(tmp_path, kind, per_batch=5, archive=archive, seed=3)
    files = _batches(kind, 5, 3)
    test = files["test_batch" if kind == "cifar10" else "test"]
    label_key = b"labels" if kind == "cifar10" else b"fine_labels"
    x, y, names = datasets.cifar_test(str(tmp_path), 10 if kind == "cifar10" else 100)
    np.testing.assert_array_equal(x, test[b"data"].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(y, test[label_key])
    assert names[:2] == (["class0", "class1"] if kind == "cifar10" else ["fine0", "fine1"])


def test_official_numpy1_globals_still_load(tmp_path):
    # The official batches were pickled (protocol 2) by NumPy 1, which names the module
    # numpy.core.multiarray: rename it in today's pickle to get the same references.
    files = _batches("cifar10", 4, 5)
    make_cifar(tmp_path, "cifar10", per_batch=4, archive=False, seed=5)
    raw = pickle.dumps(files["test_batch"], protocol=2)
    assert raw.count(b"cnumpy._core.multiarray\n_reconstruct\n") == 1
    raw = raw.replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")
    (tmp_path / FOLDER["cifar10"] / "test_batch").write_bytes(raw)
    x, y, _ = datasets.cifar_test(str(tmp_path), 10)
    np.testing.assert_array_equal(x, files["test_batch"][b"data"].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(y, files["test_batch"][b"labels"])


def test_infer_refuses_a_crafted_cifar_folder_in_one_line(tmp_path):
    marker = tmp_path / "marker"
    root = _plant(tmp_path / "data", "test_batch", _payloads(marker)["os.system"])
    model = tmp_path / "m.bnn"
    model.write_bytes(model_bytes(*tiny_model(channels=3, side=32, classes=10)))
    from refimpl.infer import main

    r = run_main(main, model, "--cifar", root)  # in this process: a payload that ran would leave the marker
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error:") and "never holds" in lines[0], r.stderr
    assert not marker.exists()
