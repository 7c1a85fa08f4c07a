"""MNIST / Fashion-MNIST: the IDX reader (good files, each kind of bad file), the checked
download, bnn.data's splits, and --dataset mnist|fashion-mnist in every command line.

Oracles: the arrays the test itself encoded (tests/_tiny_idx.py writes IDX from the format's
definition), hashlib over the bytes written, the published normalization constants typed in by
hand, and the PyTorch model's predictions for the engine."""
import functools
import gzip
import hashlib
import http.server
import json
import os
import threading

import numpy as np
import pytest
from _tiny_idx import NAMES, idx_bytes, make_idx, write
from test_infer import _infer_here  # refimpl.infer's main in this process (its no-torch runs are in test_infer)

from refimpl import datasets

FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg.strip()
    return msg


# ---------------------------------------------------------------------------------------------
# Reading good files


@pytest.mark.parametrize("layout", ["torchvision", "flat"])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_raw_and_gz_files_in_both_layouts_read_back_what_was_written(tmp_path, name, gz, layout):
    _, arrays = make_idx(tmp_path, name, layout, gz)
    train_x, train_y, test_x, test_y, names = datasets.read_idx_dataset(name, str(tmp_path))
    assert train_x.shape == (12, 1, 28, 28) and test_x.shape == (6, 1, 28, 28)
    assert train_x.dtype == test_x.dtype == np.uint8 and train_y.dtype == test_y.dtype == np.int64
    np.testing.assert_array_equal(train_x[:, 0], arrays[NAMES[0]])
    np.testing.assert_array_equal(train_y, arrays[NAMES[1]])
    np.testing.assert_array_equal(test_x[:, 0], arrays[NAMES[2]])
    np.testing.assert_array_equal(test_y, arrays[NAMES[3]])
    assert names == ([str(i) for i in range(10)] if name == "mnist" else FASHION)


def test_pixels_are_row_major_after_the_16_byte_header(tmp_path):
    body = bytearray(2 * 784)
    body[784 + 2 * 28 + 3] = 7  # image 1, row 2, column 3
    write(tmp_path / NAMES[2], bytes.fromhex("00000803 00000002 0000001c 0000001c") + bytes(body))
    write(tmp_path / NAMES[3], bytes.fromhex("00000801 00000002") + bytes([4, 9]))
    x, y, _ = datasets.mnist_test("mnist", str(tmp_path))  # the test split alone: no train files here
    assert x[1, 0, 2, 3] == 7 and x.sum() == 7 and y.tolist() == [4, 9]


def test_mixed_raw_and_gz_files_in_one_folder(tmp_path):
    folder, arrays = make_idx(tmp_path, gz=True)
    os.remove(os.path.join(folder, NAMES[1] + ".gz"))
    write(os.path.join(folder, NAMES[1]), idx_bytes(arrays[NAMES[1]]))
    np.testing.assert_array_equal(datasets.read_idx_dataset("mnist", str(tmp_path))[1], arrays[NAMES[1]])


def test_dataset_names_have_one_spelling():
    assert [datasets.canonical_name(n) for n in ("MNIST", "Fashion-MNIST", "fashion_mnist", "fashionmnist",
                                                 "CIFAR-10")] == ["mnist", "fashion-mnist", "fashion-mnist",
                                                                  "fashion-mnist", "cifar10"]
    with pytest.raises(ValueError, match="choose one of digits, mnist, fashion-mnist, cifar10, cifar100"):
        datasets.canonical_name("emnist")


# ---------------------------------------------------------------------------------------------
# Bad files: each one a one-line error naming the file and what is wrong


def _damage(folder, kind):
    """Rewrite one file of a good set in ``folder``; returns (file name, words the error must hold)."""
    imgs = np.zeros((12, 28, 28), np.uint8)
    good_labels = bytes.fromhex("00000801 0000000c") + bytes(range(10)) + bytes(2)
    header = bytes.fromhex("00000803 0000000c 0000001c 0000001c")
    content = {
        "wrong_magic": (NAMES[0], bytes.fromhex("00000801 0000000c") + bytes(12), "magic number 0x00000801"),
        "labels_as_images": (NAMES[1], idx_bytes(imgs), "magic number 0x00000803"),
        "wrong_dims": (NAMES[0], idx_bytes(np.zeros((12, 27, 28), np.uint8)), "27x28, expected 28x28"),
        "truncated": (NAMES[0], header + bytes(12 * 784 - 1), "truncated"),
        "trailing": (NAMES[0], header + bytes(12 * 784 + 3), "3 trailing bytes"),
        "short_header": (NAMES[0], bytes.fromhex("00000803 0000"), "truncated inside the 16-byte IDX header"),
        "count_mismatch": (NAMES[1], bytes.fromhex("00000801 0000000b") + bytes(11), "12 images but"),
        "label_out_of_range": (NAMES[1], good_labels[:-1] + bytes([10]), "label 10 at index 11 is outside 0..9"),
        "too_many_items": (NAMES[0], bytes.fromhex("00000803 ffffffff 0000001c 0000001c"), "more than these data sets hold"),
    }
    return content[kind]


KINDS = ["wrong_magic", "labels_as_images", "wrong_dims", "truncated", "trailing", "short_header", "count_mismatch",
         "label_out_of_range", "too_many_items"]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_bad_file_is_a_one_line_value_error_naming_it(tmp_path, kind, gz):
    folder, _ = make_idx(tmp_path, gz=gz)
    fname, content, words = _damage(folder, kind)
    path = write(os.path.join(folder, fname), content, gz)
    with pytest.raises(ValueError) as err:
        datasets.read_idx_dataset("mnist", str(tmp_path))
    msg = _one_line(err)
    assert words in msg
    # The count mismatch names both files; every other error names the damaged file.
    assert path in msg and (kind != "count_mismatch" or os.path.join(folder, NAMES[0]) in msg)


def test_a_gz_that_is_not_gzip_is_a_value_error(tmp_path):
    folder, _ = make_idx(tmp_path, gz=True)
    with open(os.path.join(folder, NAMES[2] + ".gz"), "wb") as f:
        f.write(b"plain bytes, no gzip header")
    with pytest.raises(ValueError) as err:
        datasets.mnist_test("mnist", str(tmp_path))
    assert "not a readable gzip file" in _one_line(err) and NAMES[2] + ".gz" in str(err.value)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    folder, _ = make_idx(tmp_path)
    os.remove(os.path.join(folder, NAMES[3]))
    os.mkfifo(os.path.join(folder, NAMES[3]))  # nobody writes: reading it would wait forever
    with pytest.raises(ValueError) as err:
        datasets.mnist_test("mnist", str(tmp_path))
    assert "is not a regular file" in _one_line(err)


def test_missing_files_name_all_four_and_the_folders_searched(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        datasets.read_idx_dataset("fashion-mnist", str(tmp_path))
    msg = _one_line(err)
    assert all(n in msg for n in NAMES)
    assert os.path.join(str(tmp_path), "FashionMNIST", "raw") in msg and "--download" in msg


def test_a_partial_folder_names_the_missing_file(tmp_path):
    folder, _ = make_idx(tmp_path)
    os.remove(os.path.join(folder, NAMES[1]))
    with pytest.raises(FileNotFoundError) as err:
        datasets.read_idx_dataset("mnist", str(tmp_path))
    assert f"{NAMES[1]} missing from {folder}" in _one_line(err)


def test_missing_data_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        datasets.read_idx_dataset("mnist", str(tmp_path / "nowhere"))


# ---------------------------------------------------------------------------------------------
# Download: a local HTTP server on 127.0.0.1 stands in for the mirror


@pytest.fixture
def mirror(tmp_path):
    """Serves tiny .gz files; yields (base URL, {name: raw IDX bytes}, list of paths requested)."""
    served = tmp_path / "served"
    served.mkdir()
    _, arrays = make_idx(tmp_path / "src", seed=3)
    raw = {n: idx_bytes(a) for n, a in arrays.items()}
    for n, content in raw.items():
        write(served / n, content, gz=True)
    requested = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # keep pytest's output clean
            pass

        def do_GET(self):
            requested.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", raw, requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _with_hashes(monkeypatch, raw, override=None):
    # The expected SHA-256 of each file's decompressed content, from the bytes the test wrote.
    sha = {n: hashlib.sha256(content).hexdigest() for n, content in raw.items()}
    sha.update(override or {})
    monkeypatch.setitem(datasets.IDX, "mnist", datasets.IdxSet(**{**vars(datasets.IDX["mnist"]), "sha256": sha}))


def test_download_writes_the_checked_files_atomically_and_skips_present_ones(tmp_path, monkeypatch, mirror):
    url, raw, requested = mirror
    _with_hashes(monkeypatch, raw)
    data = tmp_path / "data"
    written = datasets.download_idx("mnist", str(data), base_url=url, log=lambda s: None)
    folder = data / "MNIST" / "raw"
    assert sorted(written) == sorted(str(folder / (n + ".gz")) for n in NAMES)
    assert sorted(os.listdir(folder)) == sorted(n + ".gz" for n in NAMES)  # no temporary file left
    for n in NAMES:
        assert gzip.decompress((folder / (n + ".gz")).read_bytes()) == raw[n]
    assert sorted(requested) == sorted("/" + n + ".gz" for n in NAMES)
    assert datasets.download_idx("mnist", str(data), base_url=url, log=lambda s: None) == []
    assert len(requested) == 4


def test_download_with_a_wrong_hash_leaves_nothing_and_says_so(tmp_path, monkeypatch, mirror):
    url, raw, _ = mirror
    _with_hashes(monkeypatch, raw, {NAMES[1]: "0" * 64})
    data = tmp_path / "data"
    with pytest.raises(ValueError) as err:
        datasets.download_idx("mnist", str(data), base_url=url, log=lambda s: None)
    msg = _one_line(err)
    assert "SHA-256" in msg and "0" * 64 in msg and hashlib.sha256(raw[NAMES[1]]).hexdigest() in msg
    assert "nothing was written" in msg
    # The file before it was good and stays; the bad one and every temporary file are gone.
    assert os.listdir(data / "MNIST" / "raw") == [NAMES[0] + ".gz"]


def test_download_of_a_missing_url_is_one_line_os_error(tmp_path, monkeypatch, mirror):
    url, raw, _ = mirror
    _with_hashes(monkeypatch, raw)
    with pytest.raises(OSError) as err:
        datasets.download_idx("mnist", str(tmp_path / "data"), base_url=url + "elsewhere/", log=lambda s: None)
    assert "could not download" in _one_line(err) and "404" in str(err.value)
    assert os.listdir(tmp_path / "data" / "MNIST" / "raw") == []


def test_read_with_download_fetches_only_when_files_are_missing(tmp_path, monkeypatch, mirror):
    url, raw, requested = mirror
    _with_hashes(monkeypatch, raw)
    monkeypatch.setitem(datasets.IDX, "mnist", datasets.IdxSet(**{**vars(datasets.IDX["mnist"]), "url": url}))
    x, y, _ = datasets.mnist_test("mnist", str(tmp_path / "data"), download=True)
    np.testing.assert_array_equal(x[:, 0], np.frombuffer(raw[NAMES[2]][16:], np.uint8).reshape(6, 28, 28))
    np.testing.assert_array_equal(y, list(raw[NAMES[3]][8:]))
    n = len(requested)
    datasets.read_idx_dataset("mnist", str(tmp_path / "data"), download=True)
    assert len(requested) == n  # everything was there: no request


def test_recorded_hashes_are_sha256_hex():
    for spec in datasets.IDX.values():
        assert sorted(spec.sha256) == sorted(NAMES)
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in spec.sha256.values())


# ---------------------------------------------------------------------------------------------
# bnn.data: statistics, augmentation, splits, the training subset


def test_load_dataset_mnist_and_fashion_constants(tmp_path):
    from bnn.data import load_dataset

    make_idx(tmp_path, "mnist")
    make_idx(tmp_path, "fashion-mnist", gz=True)
    m = load_dataset("mnist", str(tmp_path), val_size=2)
    f = load_dataset("Fashion-MNIST", str(tmp_path), val_size=2)
    assert m.name == "mnist" and f.name == "fashion-mnist"
    assert m.mean == pytest.approx((33.3285,)) and m.std == pytest.approx((78.5655,))
    assert f.mean == pytest.approx((72.93,)) and f.std == pytest.approx((90.015,))
    assert (m.crop_pad, m.flip, f.crop_pad, f.flip) == (2, False, 2, True)
    assert m.input_shape == (1, 28, 28) and len(m.train_y) == 10 and len(m.val_y) == 2 and len(m.test_y) == 6
    assert f.class_names == FASHION and m.describe()["pixel_max"] == 255


def test_train_size_is_a_nested_seeded_subset_outside_validation(tmp_path):
    from bnn.data import load_dataset

    _, arrays = make_idx(tmp_path, n_train=40)
    full = load_dataset("mnist", str(tmp_path), val_size=8, seed=5)
    sub = load_dataset("mnist", str(tmp_path), val_size=8, seed=5, train_size=10)
    smaller = load_dataset("mnist", str(tmp_path), val_size=8, seed=5, train_size=4)
    rows = {arrays[NAMES[0]][i].tobytes(): i for i in range(40)}  # every random image is distinct

    def idx(t):
        return {rows[im[0].numpy().tobytes()] for im in t}

    assert len(idx(sub.train_x)) == 10 and idx(smaller.train_x) < idx(sub.train_x) < idx(full.train_x)
    assert idx(sub.val_x) == idx(full.val_x) and not idx(sub.val_x) & idx(sub.train_x)
    assert idx(load_dataset("mnist", str(tmp_path), val_size=8, seed=6, train_size=10).train_x) != idx(sub.train_x)
    assert sub.describe()["train_size"] == 10 and sub.train_subset == 10
    for bad in (0, 33):
        with pytest.raises(ValueError, match=r"train_size must be in 1\.\.32"):
            load_dataset("mnist", str(tmp_path), val_size=8, train_size=bad)


# ---------------------------------------------------------------------------------------------
# The command lines


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory):
    """A tiny IDX set and a digits_net trained one epoch on it through bnn.train's main()."""
    import torch

    from bnn.train import main

    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("idx")
    data = root / "data"
    make_idx(data, "mnist", gz=True, n_train=24, n_test=10, seed=1)
    out = root / "run"
    code = main(["--dataset", "mnist", "--data-dir", str(data), "--model", "digits_net", "--preset", "digits",
                 "--epochs", "1", "--val-size", "4", "--train-size", "16", "--batch-size", "8", "--out", str(out),
                 "--json", "--no-progress"])
    assert code == 0
    return {"data": data, "out": out}


def test_train_cli_on_tiny_mnist_records_the_data_set(mnist_run):
    from bnn.train import load_checkpoint

    summary = json.loads((mnist_run["out"] / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["epochs"] == 1 and summary["config"]["train_size"] == 16
    ckpt = load_checkpoint(str(mnist_run["out"] / "checkpoint.pt"))
    assert ckpt["data"]["name"] == "mnist" and ckpt["data"]["train_size"] == 16 and ckpt["data"]["val_size"] == 4
    assert list(ckpt["model_config"]["input_shape"]) == [1, 28, 28]


def test_train_cli_bad_train_size_is_one_line(mnist_run, tmp_path, capsys):
    from bnn.train import main

    code = main(["--dataset", "mnist", "--data-dir", str(mnist_run["data"]), "--model", "digits_net", "--preset",
                 "digits", "--val-size", "4", "--train-size", "21", "--out", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "train_size must be in 1..20" in err[0]


def test_train_cli_missing_idx_files_is_one_line(tmp_path, capsys):
    from bnn.train import main

    code = main(["--dataset", "fashion-mnist", "--data-dir", str(tmp_path), "--model", "digits_net", "--preset",
                 "digits", "--out", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and NAMES[0] in err[0] and "FashionMNIST" in err[0]


@pytest.fixture(scope="module")
def mnist_model(mnist_run):
    from bnn.export import export_checkpoint

    path = mnist_run["out"] / "model.bnn"
    export_checkpoint(str(mnist_run["out"] / "checkpoint.pt"), str(path))
    return path


def test_infer_dataset_mnist_predicts_what_torch_predicts(mnist_run, mnist_model, tmp_path):
    import torch

    from bnn.nn.models import build_model
    from bnn.train import load_checkpoint

    r = _infer_here(mnist_model, "--dataset", "mnist", "--data-dir", mnist_run["data"], "--json", "--out",
                    tmp_path / "p.npy", "--batch", "4")
    assert r.returncode == 0, r.stderr
    ckpt = load_checkpoint(str(mnist_run["out"] / "checkpoint.pt"))
    model = build_model(**ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    model.eval()
    images = np.frombuffer(gzip.decompress((mnist_run["data"] / "MNIST" / "raw" / (NAMES[2] + ".gz")).read_bytes())[16:],
                           np.uint8).reshape(10, 1, 28, 28)
    labels = np.frombuffer(gzip.decompress((mnist_run["data"] / "MNIST" / "raw" / (NAMES[3] + ".gz")).read_bytes())[8:],
                           np.uint8)
    x = (torch.from_numpy(images.astype(np.float32)) - 0.1307 * 255) / (0.3081 * 255)
    with torch.no_grad():
        expected = model(x).argmax(1).numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), expected)
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["n"] == 10 and summary["accuracy"] == pytest.approx(float((expected == labels).mean()))


@pytest.mark.parametrize("args,words", [
    (["--dataset", "digits"], "takes 1x28x28 images, digits has 1x8x8"),
    (["--dataset", "cifar10"], "takes 1x28x28 images, cifar10 has 3x32x32"),
    (["--digits"], "takes 1x28x28 images, digits has 1x8x8"),
    (["--digits", "--data-dir", "x"], "--data-dir and --download go with --dataset"),
    (["--dataset", "fashion-mnist", "--data-dir", "/nonexistent/dir"], "does not exist"),
    (["--dataset", "emnist"], "unknown dataset 'emnist'"),
])
def test_infer_refuses_a_data_set_that_does_not_fit_the_model(mnist_model, args, words):
    r = _infer_here(mnist_model, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr


def test_infer_notes_a_different_data_set_of_the_same_shape(mnist_run, mnist_model, tmp_path):
    make_idx(tmp_path, "fashion-mnist", n_test=3)
    r = _infer_here(mnist_model, "--dataset", "fashion-mnist", "--data-dir", tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    assert "trained on mnist, running it on fashion-mnist" in r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["n"] == 3


def test_search_cli_checks_the_idx_files_before_writing_anything(tmp_path, capsys):
    from bnn.search.cli import main

    run_dir = tmp_path / "run"
    assert main(["--dataset", "mnist", "--data-dir", str(tmp_path), "--model", "digits_net", "--run-dir",
                 str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and NAMES[0] in err[0] and os.path.join(str(tmp_path), "MNIST", "raw") in err[0]
    assert not run_dir.exists()


def test_search_cli_trains_on_a_tiny_idx_set(tmp_path, capsys):
    from bnn.search.cli import main

    make_idx(tmp_path / "data", "fashion-mnist", n_train=14, n_test=4)
    run_dir = tmp_path / "run"
    code = main(["--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "data"), "--model", "digits_net",
                 "--val-size", "4", "--epochs", "1", "--population", "2", "--max-evaluations", "2", "--run-dir",
                 str(run_dir), "--json", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["evaluations"] == 2
    first = json.loads((run_dir / "journal.jsonl").read_text().splitlines()[0])
    assert "fashion-mnist" in json.dumps(first)


def test_reproduce_refuses_a_data_set_the_paper_has_no_table_for(capsys):
    from bnn import reproduce

    assert reproduce.main(["--dataset", "fashion-mnist", "--list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cifar10 and cifar100 only" in err[0] and "fashion-mnist" in err[0]
    assert reproduce.main(["--dataset", "CIFAR-10", "--list"]) == 0
    listed = capsys.readouterr().out.strip().splitlines()
    assert len(listed) == 44 and all(line.startswith("cifar10/") for line in listed)


def test_every_cli_spells_the_data_options_alike(capsys):
    from bnn import reproduce, train
    from bnn.search import cli
    from refimpl.engine import infer

    helps = [train._parser().format_help(), cli.build_parser().format_help(), infer._parser().format_help()]
    with pytest.raises(SystemExit):
        reproduce.main(["--help"])
    helps.append(capsys.readouterr().out)
    for h in helps:
        assert "--dataset {digits,mnist,fashion-mnist,cifar10,cifar100}" in h and "--data-dir" in h and "--download" in h


@pytest.mark.parametrize("command", ["evidence", "calibrate"])
def test_the_grid_and_the_calibration_take_download_as_bnn_train_does(tmp_path, monkeypatch, mirror, capsys, command):
    # The tiny mirror's files are too few for the protocol's validation split: the command downloads them
    # first, then refuses the sizes in one line (or the missing grid); the files are there either way.
    from bnn import evidence
    from bnn.search import calibrate

    url, raw, requested = mirror
    _with_hashes(monkeypatch, raw)
    monkeypatch.setitem(datasets.IDX, "mnist", datasets.IdxSet(**{**vars(datasets.IDX["mnist"]), "url": url}))
    data = tmp_path / "data"
    if command == "evidence":
        code = evidence.main(["--dataset", "mnist", "--data-dir", str(data), "--download", "--root", str(tmp_path / "g"),
                              "--measures", "baseline", "--seeds", "0", "--real-measures", "none", "--no-progress"])
    else:
        code = calibrate.main(["--full", str(tmp_path / "no-grid"), "--rungs", "1:10", "--dataset", "mnist",
                               "--data-dir", str(data), "--download"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error:")
    assert sorted(os.listdir(data / "MNIST" / "raw")) == sorted(n + ".gz" for n in NAMES)
    assert sorted(requested) == sorted("/" + n + ".gz" for n in NAMES)
