"""The CPU engine (refimpl.engine, refimpl.infer) predicts what the PyTorch model predicts.

Oracles: the PyTorch model in eval mode (float32) for logits and predictions; ``bnn.counts_conv2d``
on the inputs torch's binary layers actually saw (forward hooks) for the per-layer counts;
``bnn.data`` for the data splits. The generated measure against ``refimpl.measure(dtype=float32)``
is tests/test_measure_tables.py's.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from _cli import run_main
from _engine_models import assert_logits_close, digits_images, fresh_model, torch_logits
from _tiny_cifar import make_cifar
from safetensors.numpy import load_file, save_file

from bnn.data import DIGITS_TEST_SIZE, load_dataset, read_cifar
from bnn.export import export_checkpoint, export_model
from bnn.nn.counts import counts_conv2d as torch_counts
from bnn.nn.layers import BinaryConv2d, sign
from bnn.train import TrainConfig, train_model
from refimpl import datasets, engine
from refimpl.engine import plan
from refimpl.engine.format import FORMAT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Runs refimpl.infer with torch unimportable: a meta-path finder raises ImportError for torch
# (and bnn, which imports it), so any such import anywhere in the engine's import graph fails
# the run. (sys.modules['torch'] = None would also block it, but SciPy's array-API helpers,
# reached through sklearn, look torch up in sys.modules and trip over the None.)
NO_TORCH = (
    "import sys, runpy\n"
    "class _Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'torchvision', 'bnn'):\n"
    "            raise ImportError('blocked: ' + name)\n"
    "sys.meta_path.insert(0, _Block())\n"
    "sys.argv = ['refimpl.infer'] + sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_module('refimpl.infer', run_name='__main__', alter_sys=True)\n"
    "finally:\n"
    "    assert 'torch' not in sys.modules\n"
)


def _infer(*args):
    return subprocess.run([sys.executable, "-c", NO_TORCH, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def _infer_here(*args):
    """refimpl.infer's main in this process (tests/_cli.py): every property but "no torch"."""
    from refimpl.infer import main

    return run_main(main, *args)


def _last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# A digits model trained a few epochs, exported from its checkpoint


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits")
    torch.set_num_threads(2)
    cfg = TrainConfig(epochs=4, milestones=(3,), out_dir=str(out))
    r = train_model(cfg)
    assert r.status == "ok" and r.test_acc > 0.8  # it learned something; parity on a random net is weaker
    path = os.path.join(out, "model.bnn")
    export_checkpoint(os.path.join(out, "checkpoint.pt"), path)
    from bnn.nn.models import build_model
    from bnn.train import load_checkpoint

    ckpt = load_checkpoint(os.path.join(out, "checkpoint.pt"))
    model = build_model("digits_net", "baseline", 10, (1, 8, 8))
    model.load_state_dict(ckpt["model"])
    model.eval()
    data = load_dataset("digits")
    x = data.normalize(data.test_x).numpy()
    return {"path": path, "model": model, "x": x, "y": data.test_y.numpy(), "test_acc": r.test_acc, "dir": out}


def test_trained_digits_engine_matches_torch_on_every_test_image(digits_run):
    m = engine.load(digits_run["path"])
    logits = m.run(digits_run["x"])
    assert_logits_close(logits, torch_logits(digits_run["model"], digits_run["x"]))


def test_trained_digits_counts_are_identical_in_every_binary_layer(digits_run):
    _assert_counts_identical(digits_run["model"], engine.load(digits_run["path"]), digits_run["x"][:64])


def test_engine_preprocessing_equals_bnn_data_normalize(digits_run):
    m = engine.load(digits_run["path"])
    data = load_dataset("digits")
    raw = data.test_x.numpy()
    np.testing.assert_array_equal(m.preprocess(raw.astype(np.float32)), digits_run["x"])
    np.testing.assert_array_equal(m.preprocess(raw.transpose(0, 2, 3, 1).copy()), digits_run["x"])  # uint8 HWC


def _assert_counts_identical(model, m, x):
    """Engine counts (debug mode) == bnn.counts_conv2d on the inputs torch's layers saw."""
    seen = []

    def hook(layer, inputs, output):
        a, b, c, d = torch_counts(sign(inputs[0]), sign(layer.weight), layer.stride, layer.padding, layer.dilation)
        seen.append([t.round().to(torch.int64).numpy() for t in (a, b, c, d)])

    layers = [mod for mod in model.modules() if isinstance(mod, BinaryConv2d)]
    hooks = [layer.register_forward_hook(hook) for layer in layers]
    try:
        with torch.no_grad():
            model(torch.from_numpy(x))
    finally:
        for h in hooks:
            h.remove()
    _, record = m.run(x, debug=True)
    # Execution order: torch runs conv before down_conv in BinaryUnit.forward, as the engine records.
    assert [r["name"] for r in record] == [n for n, mod in model.named_modules() if isinstance(mod, BinaryConv2d)]
    for r, expected in zip(record, seen):
        for key, want in zip("abcd", expected):
            np.testing.assert_array_equal(r[key], want, err_msg=f"{r['name']} count {key}")


# ---------------------------------------------------------------------------------------------
# Freshly initialized networks with BatchNorm statistics from data


def _digits_batch(n=128):
    images, _ = digits_images()
    return torch.from_numpy((images[:n].astype(np.float32) - 4.884) / 6.017)


def _export_and_load(model, tmp_path, name="m.bnn"):
    path = tmp_path / name
    export_model(model, str(path))
    return engine.load(str(path))


@pytest.mark.parametrize("downsample,size", [("binary", 32), ("real", 16)])  # both kinds (docs/design.md section 6)
def test_resnet18_cifar_shape_counts_and_logits_match_torch(downsample, size, tmp_path):
    torch.manual_seed(0)
    # Smooth random images (a blurred noise field), closer to photos than white noise.
    x = torch.nn.functional.avg_pool2d(torch.randn(12, 3, size + 8, size + 8), 9, stride=1)[:, :, :size, :size] * 3
    model = fresh_model("resnet18", "baseline", (3, size, size), x[:8], downsample=downsample)
    m = _export_and_load(model, tmp_path)
    xs = x.numpy().copy()
    assert_logits_close(m.run(xs), torch_logits(model, xs))
    _assert_counts_identical(model, m, xs[:3])


@pytest.mark.parametrize("arch", ["vgg13", "nin", "resnet34"])
def test_other_cifar_architectures_match_torch(arch, tmp_path):
    torch.manual_seed(1)
    x = torch.randn(4, 3, 32, 32)  # the torch count path is slow on CPU; 4 images suffice
    model = fresh_model(arch, "baseline", (3, 32, 32), x)
    m = _export_and_load(model, tmp_path)
    xs = x.numpy().copy()
    assert_logits_close(m.run(xs), torch_logits(model, xs))
    _assert_counts_identical(model, m, xs[:2])


@pytest.mark.parametrize("genome,random_alpha", [("M9", False), ("M1", False), ("M7", True), ("M3", False)])
def test_searched_measures_match_torch(genome, random_alpha, tmp_path):
    x = _digits_batch()
    model = fresh_model("digits_net", genome, (1, 8, 8), x, seed=2, random_alpha=random_alpha)
    m = _export_and_load(model, tmp_path)
    xs = x.numpy().copy()
    assert_logits_close(m.run(xs), torch_logits(model, xs))


@pytest.mark.parametrize("arch,shape,downsample", [
    ("digits_net", (1, 8, 8), "binary"),
    ("resnet18", (3, 16, 16), "binary"),
    ("downsampling_net", (1, 14, 14), "real"),  # the real shortcut's pool and 1x1 conv, odd maps
])
def test_engine_logits_do_not_depend_on_batch_split_or_thread_count(arch, shape, downsample, tmp_path):
    # One answer per model and input: the float parts (stem, epilogue, pooling, classifier) sum in
    # a fixed order, so logits are bit-identical whatever the batch split and thread count (a BLAS
    # classifier broke this on an AVX2 host: 124 of 400 logits differed by a few ulps).
    import numba

    if arch == "digits_net":
        x = _digits_batch(40)
    else:
        torch.manual_seed(5)
        c, h, w = shape
        x = torch.nn.functional.avg_pool2d(torch.randn(40, c, h + 8, w + 8), 9, stride=1)[:, :, :h, :w] * 3
    model = fresh_model(arch, "baseline", shape, x[:16], downsample=downsample)
    m = _export_and_load(model, tmp_path)
    xs = x.numpy().copy()
    whole = m.run(xs).copy()
    parts = np.concatenate([m.run(xs[i:i + 7]).copy() for i in range(0, 40, 7)])
    np.testing.assert_array_equal(parts, whole)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one_thread = m.run(xs).copy()
        singles = np.concatenate([m.run(xs[i:i + 1]).copy() for i in range(0, 40, 13)])
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(one_thread, whole)
    np.testing.assert_array_equal(singles, whole[0:40:13])


@pytest.mark.parametrize("arch,genome,size,downsample", [
    ("resnet18", "baseline", 32, "binary"),  # identity and downsampling shortcuts
    ("resnet18", "M7", 16, "binary"),
    ("resnet18", "M7", 16, "real"),  # the real shortcut fills the buffer the identity epilogue adds into
    ("vgg13", "M3", 32, "binary"),  # no shortcuts, pools in between
    ("nin", "M1", 32, "binary"),
])
def test_fused_and_two_pass_layers_agree_bit_for_bit(arch, genome, size, downsample, tmp_path, monkeypatch):
    # The fused path (GEMM and epilogue per tile, sign bits by vector compares) and the
    # two-pass path (GEMM into ``a``, then the epilogue) must give the same float32 bits: the
    # engine picks between them by batch size and layer shape.
    torch.manual_seed(3)
    x = torch.nn.functional.avg_pool2d(torch.randn(6, 3, size + 8, size + 8), 9, stride=1)[:, :, :size, :size] * 3
    model = fresh_model(arch, genome, (3, size, size), x[:4], seed=4, random_alpha=True, downsample=downsample)
    xs = x.numpy().copy()
    results = {}
    for name, min_tiles in (("fused", 0), ("two-pass", 10**9)):
        monkeypatch.setattr(plan, "FUSED_MIN_TILES_PER_THREAD", min_tiles)
        m = _export_and_load(model, tmp_path, f"{name}.bnn")
        results[name] = m.run(xs).copy()
    np.testing.assert_array_equal(results["fused"], results["two-pass"])
    assert np.isfinite(results["fused"]).all()


# ---------------------------------------------------------------------------------------------
# Data splits without torch


def test_digits_test_split_is_the_one_bnn_train_uses():
    assert datasets.DIGITS_TEST_SIZE == DIGITS_TEST_SIZE
    data = load_dataset("digits", seed=123)  # the validation seed must not matter for the test split
    x, y, names = datasets.digits_test()
    np.testing.assert_array_equal(x, data.test_x.numpy())
    np.testing.assert_array_equal(y, data.test_y.numpy())
    assert names == data.class_names


@pytest.mark.parametrize("kind,archive", [("cifar10", True), ("cifar10", False), ("cifar100", True)])
def test_cifar_test_split_is_the_one_bnn_data_reads(kind, archive, tmp_path):
    make_cifar(tmp_path, kind, per_batch=6, archive=archive, seed=4)
    _, _, tx, ty, names = read_cifar(kind, str(tmp_path))
    x, y, got_names = datasets.cifar_test(str(tmp_path), 10 if kind == "cifar10" else 100)
    np.testing.assert_array_equal(x, tx)
    np.testing.assert_array_equal(y, ty)
    assert got_names == names


# ---------------------------------------------------------------------------------------------
# The command line: the digits run (and one bad file below) with torch unimportable, which
# covers every import the engine and the data readers make (all at module level but
# scikit-learn's, which the digits split imports); the rest in this process (tests/_cli.py)


def test_infer_digits_without_torch_reports_the_torch_accuracy(digits_run, tmp_path):
    preds = tmp_path / "preds.npy"
    r = _infer(digits_run["path"], "--digits", "--json", "--batch", "50", "--threads", "1", "--out", preds)
    assert r.returncode == 0, r.stderr
    summary = _last_json(r.stdout)
    expected = torch_logits(digits_run["model"], digits_run["x"]).argmax(1)
    assert summary["n"] == 360
    assert summary["accuracy"] == pytest.approx(float((expected == digits_run["y"]).mean()), abs=1e-12)
    assert summary["accuracy"] == pytest.approx(digits_run["test_acc"], abs=1e-12)  # bnn.train's number
    assert summary["images_per_s"] > 0 and summary["latency_ms_batch1"] > 0
    np.testing.assert_array_equal(np.load(preds), expected)


def test_a_model_trained_on_freq_counts_predicts_without_torch_what_torch_predicts(tmp_path):
    # issue 27: the engine runs a model trained under another count convention, torch-free
    out = tmp_path / "run"
    torch.set_num_threads(2)
    r = train_model(TrainConfig(epochs=3, milestones=(2,), out_dir=str(out), measure="M10", counts="freq"))
    assert r.status == "ok" and r.test_acc > 0.3  # far above chance (0.1) after 3 short epochs: it learned
    path = str(tmp_path / "m10-freq.bnn")
    assert export_checkpoint(os.path.join(out, "checkpoint.pt"), path)["counts"] == "freq"
    from bnn.nn.models import build_model
    from bnn.train import load_checkpoint

    model = build_model("digits_net", "M10", 10, (1, 8, 8), counts="freq")
    model.load_state_dict(load_checkpoint(os.path.join(out, "checkpoint.pt"))["model"])
    model.eval()
    data = load_dataset("digits")
    expected = torch_logits(model, data.normalize(data.test_x).numpy()).argmax(1)
    preds = tmp_path / "preds.npy"
    run = _infer(path, "--digits", "--json", "--out", preds)
    assert run.returncode == 0, run.stderr
    summary = _last_json(run.stdout)
    assert summary["counts"] == "freq" and summary["genome"] == "3-2-3-8-0-0-6"
    np.testing.assert_array_equal(np.load(preds), expected)
    assert summary["accuracy"] == pytest.approx(r.test_acc, abs=1e-12)  # bnn.train's number


def test_infer_input_npy_uint8_hwc_float_nchw_and_normalized(digits_run, tmp_path):
    raw = load_dataset("digits").test_x.numpy()
    expected = torch_logits(digits_run["model"], digits_run["x"]).argmax(1)
    np.save(tmp_path / "hwc.npy", raw.transpose(0, 2, 3, 1).copy())
    np.save(tmp_path / "nchw.npy", raw.astype(np.float32))
    np.save(tmp_path / "norm.npy", digits_run["x"])
    np.save(tmp_path / "y.npy", digits_run["y"])
    for name, extra in (("hwc", []), ("nchw", []), ("norm", ["--normalized"])):
        out = tmp_path / f"p_{name}.npy"
        r = _infer_here(digits_run["path"], "--input", tmp_path / f"{name}.npy", "--labels", tmp_path / "y.npy",
                        "--out", out, "--json", *extra)
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(out), expected, err_msg=name)
        assert _last_json(r.stdout)["accuracy"] == pytest.approx(float((expected == digits_run["y"]).mean()))


def test_infer_cifar_directory_predicts_what_torch_predicts(tmp_path):
    from bnn.data import _CIFAR10_MEAN, _CIFAR10_STD

    make_cifar(tmp_path, "cifar10", per_batch=5)
    x = torch.randn(8, 3, 32, 32)
    model = fresh_model("resnet18", "baseline", (3, 32, 32), x)
    path = tmp_path / "r.bnn"
    export_model(model, str(path), mean=_CIFAR10_MEAN, std=_CIFAR10_STD, pixel_max=255)
    r = _infer_here(path, "--cifar", tmp_path, "--json", "--out", tmp_path / "p.npy", "--batch", "4")
    assert r.returncode == 0, r.stderr
    _, _, tx, ty, _ = read_cifar("cifar10", str(tmp_path))
    mean = torch.tensor(_CIFAR10_MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(_CIFAR10_STD, dtype=torch.float32).view(1, 3, 1, 1)
    xn = ((torch.from_numpy(tx).float() - mean) / std).numpy()
    expected = torch_logits(model, xn).argmax(1)
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), expected)
    assert _last_json(r.stdout)["accuracy"] == pytest.approx(float((expected == ty).mean()))


def test_infer_help():
    r = _infer_here("--help")
    assert r.returncode == 0 and "--digits" in r.stdout and "--threads" in r.stdout


# ---------------------------------------------------------------------------------------------
# Bad files and bad inputs: one line, non-zero exit, no traceback


def _rewrite(src, dst, edit_meta=None, edit_tensors=None):
    from safetensors import safe_open

    with safe_open(str(src), "np") as f:
        meta = json.loads(f.metadata()[FORMAT])
    tensors = load_file(str(src))
    if edit_meta:
        edit_meta(meta)
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, str(dst), metadata={FORMAT: json.dumps(meta)})


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    model = fresh_model("digits_net", "baseline", (1, 8, 8), _digits_batch(32))
    path = d / "ok.bnn"
    export_model(model, str(path))
    return path


def _bad_cases():
    def drop(name):
        return lambda t: t.pop(name)

    def setm(fn):
        return fn

    return {
        "missing": (None, "no such file"),
        "truncated": ("truncate", "truncated"),
        "not safetensors": ("garbage", "not a safetensors"),
        "wrong format": (("meta", setm(lambda m: m.update(format="other-format"))), "format is 'other-format'"),
        "no metadata": ("nometa", "not a bnn-measure model"),
        "unsupported version": (("meta", setm(lambda m: m.update(version=99))), "version 99"),
        "tensor missing": (("tensors", drop("body.1.conv.bits")), "body.1.conv.bits' is missing"),
        "shape disagrees": (("meta", setm(lambda m: m["layers"][1]["conv"].update(out_channels=32))), "metadata implies"),
        "extra tensor": (("tensors", lambda t: t.update(stray=np.zeros(3, np.float32))), "stray"),
        "bad genome": (("meta", setm(lambda m: m.update(genome="9-9-9"))), "genome"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_model_file_is_one_line_error(case, small_model, tmp_path):
    how, needle = _bad_cases()[case]
    bad = tmp_path / "bad.bnn"
    if how == "truncate":
        raw = small_model.read_bytes()
        bad.write_bytes(raw[: len(raw) // 2])
    elif how == "garbage":
        bad.write_bytes(b"\x00" * 3 + b"hello")
    elif how == "nometa":
        save_file(load_file(str(small_model)), str(bad))
    elif how is not None:
        kind, fn = how
        _rewrite(small_model, bad, **({"edit_meta": fn} if kind == "meta" else {"edit_tensors": fn}))
    # One case in a process that cannot import torch: the error path is torch-free too.
    r = (_infer if case == "truncated" else _infer_here)(bad, "--digits")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr
    with pytest.raises(ValueError):
        engine.load(str(bad))


@pytest.mark.parametrize("array,needle", [
    (np.zeros((3, 8, 8), np.uint8), "uint8 images must be (N, H, W, C)"),
    (np.zeros((3, 1, 8, 8), np.float64), "dtype float64"),
    (np.zeros((3, 3, 8, 8), np.float32), "float32 images must be NCHW"),
    (np.zeros((0, 8, 8, 1), np.uint8), "no images"),
])
def test_bad_input_array_is_one_line_error(array, needle, small_model, tmp_path):
    np.save(tmp_path / "x.npy", array)
    r = _infer_here(small_model, "--input", tmp_path / "x.npy")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_bad_labels_and_missing_input_are_one_line_errors(small_model, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((3, 8, 8, 1), np.uint8))
    np.save(tmp_path / "y.npy", np.zeros(4, np.int64))
    for args, needle in (
        (["--input", tmp_path / "x.npy", "--labels", tmp_path / "y.npy"], "--labels must be 3 integers"),
        (["--input", tmp_path / "nope.npy"], "does not exist"),
        (["--input", tmp_path / "x.npy", "--batch", "0"], "argument --batch: expected a positive integer"),
    ):
        r = _infer_here(small_model, *args)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---------------------------------------------------------------------------------------------
# Execution paths that must not change a bit


def test_one_thread_and_all_threads_give_identical_logits(tmp_path):
    import numba

    x = torch.randn(5, 3, 32, 32)
    model = fresh_model("resnet18", "M3", (3, 32, 32), x)
    m = _export_and_load(model, tmp_path)
    xs = x.numpy().copy()
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        serial = m.run(xs).copy()
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        parallel = m.run(xs).copy()
    finally:
        numba.set_num_threads(saved)
    np.testing.assert_array_equal(serial, parallel)


