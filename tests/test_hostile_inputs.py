"""Models, data and environments from issue 30 (items 5-7 and section 9): a diverged or non-finite
model is refused or reported, a damaged kernel cache is rebuilt, inputs stream in batches, and
every bad setting or file is one ``error:`` line with a non-zero exit, never a traceback."""
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _tiny_bnn import model_bytes, tiny_model
from _tiny_idx import make_idx

from refimpl import datasets
from refimpl.engine import ModelFileError
from refimpl.engine.model import Model, load

ROOT = Path(__file__).resolve().parents[1]
MAX_ERROR_CHARS = 500  # refimpl.cli's, written out: the line must stay short whatever the value


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _run(*args, env=None, **kw):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}, **kw)


def _write_model(path, meta, tensors):
    path.write_bytes(model_bytes(meta, tensors))
    return path


# -- non-finite models -----------------------------------------------------------------------------

def test_a_model_file_with_a_nan_scale_is_refused_by_the_reader(tmp_path):
    meta, tensors = tiny_model(seed=1)
    name = next(k for k in tensors if k.endswith(".scale"))
    tensors[name][0] = np.nan
    with pytest.raises(ModelFileError, match=f"'{name}' holds inf or NaN"):
        load(str(_write_model(tmp_path / "m.bnn", meta, tensors)))


def test_non_finite_logits_are_reported_on_stdout_with_a_failing_status_and_no_class(tmp_path):
    meta, tensors = tiny_model(seed=1, classes=3)
    tensors["classifier.weight"] = np.full_like(tensors["classifier.weight"], 3e38)  # finite, overflows
    model = _write_model(tmp_path / "m.bnn", meta, tensors)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).integers(0, 256, (6, 8, 8, 1), dtype=np.uint8))
    r = _run("-m", "refimpl.infer", str(model), "--input", str(tmp_path / "x.npy"), "--out", str(tmp_path / "p.npy"),
             "--json")
    assert r.returncode == 1, r.stderr
    assert "6 of 6 images have non-finite logits" in r.stdout
    assert json.loads(r.stdout.splitlines()[-1])["nonfinite"] == 6
    assert np.load(tmp_path / "p.npy").tolist() == [-1] * 6  # no class assigned


def test_export_refuses_a_diverged_model_even_where_folding_hides_it(tmp_path):
    import torch
    from _engine_models import fresh_model

    from bnn.export import export_model

    model = fresh_model("digits_net", "baseline", (1, 8, 8), torch.zeros(2, 1, 8, 8))
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    bn.running_var.fill_(float("inf"))  # folds to scale 0: finite, and wrong
    with pytest.raises(ValueError, match="running_var holds inf or NaN") as info:
        export_model(model, str(tmp_path / "m.bnn"))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "m.bnn").exists()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch

    from bnn.train import TrainConfig, train_model

    out = tmp_path_factory.mktemp("run")
    torch.set_num_threads(1)
    assert train_model(TrainConfig(epochs=1, out_dir=str(out), eval_test=False)).status == "ok"
    return out / "checkpoint.pt"


def _edited_checkpoint(checkpoint, tmp_path, **changes):
    import torch

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    ckpt.update(changes)
    (tmp_path / "run").mkdir(exist_ok=True)
    torch.save(ckpt, tmp_path / "run" / "checkpoint.pt")
    return tmp_path / "run" / "checkpoint.pt"


def test_export_refuses_a_checkpoint_of_a_diverged_run(checkpoint, tmp_path):
    from bnn.export import main

    path = _edited_checkpoint(checkpoint, tmp_path, status="diverged")
    assert main([str(path), "-o", str(tmp_path / "m.bnn")]) == 2
    assert not (tmp_path / "m.bnn").exists()


@pytest.mark.parametrize("history", [{"epoch": 1}, "x", [1, 2]])
def test_resume_of_a_checkpoint_whose_history_is_not_a_list_of_rows_is_one_line(checkpoint, tmp_path, history,
                                                                                 capsys):
    from bnn.train import main

    path = _edited_checkpoint(checkpoint, tmp_path, history=history)
    assert main(["--resume", str(path.parent), "--no-progress"]) == 2
    assert "damaged bnn.train checkpoint" in _one_error_line(capsys.readouterr().err)


# -- the kernel cache ------------------------------------------------------------------------------

def test_a_damaged_kernel_cache_entry_is_rebuilt_not_an_abort(tmp_path):
    model = _write_model(tmp_path / "m.bnn", *tiny_model(seed=2))
    np.save(tmp_path / "x.npy", np.random.default_rng(1).integers(0, 256, (5, 8, 8, 1), dtype=np.uint8))
    args = ("-m", "refimpl.infer", str(model), "--input", str(tmp_path / "x.npy"), "--out", str(tmp_path / "p.npy"))
    env = {"BNN_MEASURE_CACHE": str(tmp_path / "cache")}
    assert _run(*args, env=env).returncode == 0
    first = np.load(tmp_path / "p.npy")
    entries = sorted((tmp_path / "cache" / "__pycache__").glob("*.nbc"))
    assert entries, "nothing was cached"
    rng = np.random.default_rng(2)
    for path in entries:
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2:len(raw) // 2 + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        path.write_bytes(bytes(raw))
    r = _run(*args, env=env)
    assert r.returncode == 0, r.stderr
    assert "kernel cache entry" in r.stderr and "damaged" in r.stderr
    assert np.array_equal(np.load(tmp_path / "p.npy"), first)
    r = _run(*args, env=env)  # rebuilt: read back without a word
    assert r.returncode == 0 and "damaged" not in r.stderr


def test_a_cache_folder_that_cannot_be_created_falls_back_to_a_private_one(tmp_path):
    model = _write_model(tmp_path / "m.bnn", *tiny_model(seed=2))
    np.save(tmp_path / "x.npy", np.zeros((2, 8, 8, 1), dtype=np.uint8))
    env = {k: v for k, v in os.environ.items() if k not in ("BNN_MEASURE_CACHE", "XDG_CACHE_HOME")}
    r = subprocess.run([sys.executable, "-m", "refimpl.infer", str(model), "--input", str(tmp_path / "x.npy")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env={**env, "HOME": "/proc"})
    assert r.returncode == 0, r.stderr
    assert "refimpl: warning: not using the measure cache: /proc/.cache/bnn-measure cannot be created" in r.stderr


def test_a_read_only_cache_folder_falls_back_to_a_private_one(tmp_path, monkeypatch, capsys):
    from refimpl.engine import epilogue

    monkeypatch.setattr(epilogue, "_FALLBACK", [])
    monkeypatch.setenv("BNN_MEASURE_CACHE", str(tmp_path / "cache"))
    real_access = os.access
    monkeypatch.setattr(epilogue.os, "access", lambda p, mode: p != str(tmp_path / "cache") and real_access(p, mode))
    folder = epilogue.private_cache_dir()  # as root, only a read-only mount is unwritable: the check is faked
    assert folder != str(tmp_path / "cache") and os.path.isdir(folder)
    assert f"{tmp_path / 'cache'} is not writable" in capsys.readouterr().err
    shutil.rmtree(folder)


# -- bounded memory --------------------------------------------------------------------------------

# The process's peak resident memory in kB: VmHWM starts afresh with the program, where getrusage's
# ru_maxrss keeps the peak of the (large) pytest process it was forked from.
HWM = """
def peak_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
"""
PEAK = HWM + """
import sys
from refimpl.engine.infer import main
code = main(sys.argv[1:])
print("peak_kb", peak_kb(), code)
"""
needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")


def _peak_mb(*args) -> float:
    r = _run("-c", PEAK, *args)
    words = r.stdout.split()
    assert "peak_kb" in words and words[-1] == "0", r.stderr
    return int(words[words.index("peak_kb") + 1]) / 1024


@needs_proc
def test_inference_memory_does_not_grow_with_the_image_count_beyond_the_stored_input(tmp_path):
    meta, tensors = tiny_model(seed=2, side=28, classes=10)
    model = _write_model(tmp_path / "m.bnn", meta, tensors)
    peaks = {}
    for n in (64, 40_000):  # all-zero images, as a header announcing many of them makes
        folder = tmp_path / str(n)
        folder.mkdir()
        for name, body, magic in (("t10k-images-idx3-ubyte", struct.pack(">III", n, 28, 28), 0x803),
                                  ("t10k-labels-idx1-ubyte", struct.pack(">I", n), 0x801)):
            with gzip.open(folder / f"{name}.gz", "wb", compresslevel=1) as f:
                f.write(struct.pack(">I", magic) + body + bytes(n * (784 if magic == 0x803 else 1)))
        peaks[n] = _peak_mb(str(model), "--dataset", "mnist", "--data-dir", str(folder), "--batch", "256")
    # Read a batch at a time: neither the 31 MB of uint8 nor three float32 copies (376 MB) are held
    # (compiling the kernels sets both peaks; the images stay below it).
    assert peaks[40_000] - peaks[64] < 20, peaks


@needs_proc
def test_predict_normalizes_a_batch_at_a_time(tmp_path):
    script = HWM + """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from _tiny_bnn import tiny_model
from refimpl.engine.model import Model
model = Model(*tiny_model(seed=3, channels=2, side=12, classes=5))
images = np.random.default_rng(0).integers(0, 256, (100_000, 12, 12, 2), dtype=np.uint8)  # 29 MB
model.predict(images[:300])  # compiled, its plans made
before = peak_kb()
logits = model.predict(images)
print(logits.shape[0], peak_kb() - before)
"""
    n, grew_kb = map(int, _run("-c", script, str(ROOT / "tests")).stdout.split())
    assert n == 100_000 and grew_kb < 30 * 1024  # the whole input in float32 is 115 MB, and it took 3 copies


@needs_proc
def test_an_idx_file_announcing_a_million_images_is_read_in_bounded_memory(tmp_path):
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:  # 784 MB of zeros in under 1 MB
        f.write(struct.pack(">IIII", 0x803, 1_000_000, 28, 28))
        for _ in range(1000):
            f.write(bytes(1000 * 784))
    script = HWM + """
import sys
from refimpl.datasets import IdxReader
before, images = peak_kb(), 0
for batch in IdxReader(sys.argv[1], images=True).batches(1024):
    images += len(batch)
print(images, peak_kb() - before)
"""
    images, grew_kb = map(int, _run("-c", script, str(path)).stdout.split())
    assert images == 1_000_000 and grew_kb < 20 * 1024


def test_a_npy_header_claiming_a_trillion_images_is_one_line(tmp_path, capsys):
    from refimpl.engine.infer import main

    model = _write_model(tmp_path / "m.bnn", *tiny_model(seed=2))
    header = {"descr": "|u1", "fortran_order": False, "shape": (10**12, 8, 8, 1)}
    with open(tmp_path / "x.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(bytes(64))
    assert main([str(model), "--input", str(tmp_path / "x.npy")]) == 2
    assert "is not a readable .npy array" in _one_error_line(capsys.readouterr().err)


def test_a_folder_in_place_of_an_idx_file_says_so(tmp_path):
    folder, _ = make_idx(tmp_path)
    os.remove(os.path.join(folder, "t10k-images-idx3-ubyte"))
    os.mkdir(os.path.join(folder, "t10k-images-idx3-ubyte"))
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte is a folder, not an IDX file"):
        datasets.mnist_test("mnist", str(tmp_path))


@needs_proc
def test_a_header_of_many_empty_objects_is_refused_before_it_fills_memory(tmp_path):
    script = HWM + """
import sys
from refimpl.engine.model_file import read
from refimpl.engine import ModelFileError
before = peak_kb()
for path in sys.argv[1:]:
    try:
        read(path)
    except ModelFileError as exc:
        print("refused", str(exc)[-60:])
print("grew_kb", peak_kb() - before)
"""
    paths = []
    # Under the byte limit, a million distinct empty objects (about 360 MB parsed whole); over it,
    # 92 MB of them (1.6 GB parsed whole; a repeated key here, as only its length is read now).
    for name, header in (("many", b"{" + b",".join(b'"%d":{}' % i for i in range(1_100_000)) + b"}"),
                         ("huge", b"{" + b'"a":{},' * (92 * (1 << 20) // 7) + b'"b":{}}')):
        path = tmp_path / f"{name}.bnn"
        path.write_bytes(len(header).to_bytes(8, "little") + header)
        paths.append(str(path))
    r = _run("-c", script, *paths)
    lines = r.stdout.splitlines()
    assert [x.split()[0] for x in lines] == ["refused", "refused", "grew_kb"], r.stdout + r.stderr
    assert int(lines[-1].split()[1]) < 100 * 1024


# -- settings and text ------------------------------------------------------------------------------

@pytest.mark.parametrize("setting, word", [({"NUMBA_NUM_THREADS": "0"}, "NUMBA_NUM_THREADS"),
                                           ({"NUMBA_DISABLE_JIT": "1"}, "NUMBA_DISABLE_JIT")])
def test_an_environment_numba_cannot_run_with_is_one_line(tmp_path, setting, word):
    model = _write_model(tmp_path / "m.bnn", *tiny_model(seed=2))
    np.save(tmp_path / "x.npy", np.zeros((2, 8, 8, 1), dtype=np.uint8))
    r = _run("-m", "refimpl.infer", str(model), "--input", str(tmp_path / "x.npy"), env=setting)
    assert r.returncode == 2
    assert _one_error_line(r.stderr).startswith(f"error: {word}=")


def test_a_non_ascii_path_under_an_ascii_encoding_is_printed_escaped(tmp_path):
    model = _write_model(tmp_path / "modèle.bnn", *tiny_model(seed=2))
    np.save(tmp_path / "données.npy", np.zeros((2, 8, 8, 1), dtype=np.uint8))
    r = subprocess.run([sys.executable, "-m", "refimpl.infer", str(model), "--input", str(tmp_path / "données.npy")],
                       cwd=ROOT, capture_output=True, timeout=600, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr.decode()
    assert b"donn\\xe9es.npy" in r.stdout


@pytest.mark.parametrize("size", [100_000, 1_000_000])
def test_an_error_line_of_a_huge_value_is_cut_short(size, capsys):
    from bnn.train import main

    assert main(["--measure", "x" * size, "--epochs", "1", "--no-progress"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert len(line) < MAX_ERROR_CHARS + 100 and "more characters)" in line


def test_shared_model_runs_are_serialized_and_say_so():
    assert "serialized" in Model.run.__doc__
    assert "the calls are serialized" in " ".join((ROOT / "README.md").read_text().split())
