"""Issue 36 item 1: a small .bnn file cannot make the engine allocate without bound.

A 2 MB file (one 4096-channel 64x64 binary convolution padded 63 on a 64x64 map, under ``freq``)
described lookup tables of 1,263 window sizes x (2**24 + 1) entries, 158 GiB. The engine counts a
plan's bytes from its geometry first (``refimpl/engine/budget.py``) and refuses one above its
limit in one line, at load for one image and at run for a batch; a MemoryError anywhere in
``refimpl.infer`` is one line too. The oracle for the counts is tracemalloc's peak over the real
plan, measured, never the estimate itself."""
from __future__ import annotations

import numpy as np
import pytest
from _cli import run_main
from _memory import peak_bytes_while
from _tiny_bnn import model_bytes, tiny_model

from refimpl import engine
from refimpl.engine import budget
from refimpl.engine import infer as infer_cli
from refimpl.genome import Genome


def _wide_window_model(counts="freq", genome="M1", channels=4096, side=64, pad=63) -> tuple[dict, dict]:
    """Stem 1 -> ``channels``, then one binary convolution ``channels`` -> 1 with a side x side
    kernel padded ``pad`` (a window of up to channels * side**2 = 2**24 taps), pooled, classified."""
    rng = np.random.default_rng(0)
    words = -(-channels // 64)
    layers = [
        {"op": "stem", "tensors": "stem", "in_channels": 1, "out_channels": channels, "kernel": [1, 1],
         "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1]},
        {"op": "binary_unit", "name": "u", "residual": "none",
         "conv": {"tensors": "u.conv", "in_channels": channels, "out_channels": 1, "kernel": [side, side],
                  "stride": [1, 1], "padding": [pad, pad], "dilation": [1, 1]}},
        {"op": "global_avgpool"},
        {"op": "linear", "tensors": "classifier", "in_features": 1, "out_features": 2},
    ]
    meta = {"format": engine.FORMAT, "version": 1 if counts == "raw" else 2, "counts": counts, "arch": "hostile",
            "genome": str(Genome.parse(genome)), "num_classes": 2, "input_shape": [1, side, side],
            "input": {"mean": [0.0], "std": [1.0], "pixel_max": 1}, "class_names": ["a", "b"], "layers": layers}
    bits = rng.integers(0, 2 ** 63, (1, side, side, words), dtype=np.uint64)
    if channels % 64:
        bits[..., -1] &= np.uint64((1 << channels % 64) - 1)  # tail bits past the last channel are zero
    tensors = {
        "stem.weight": rng.normal(size=(channels, 1, 1, 1)).astype(np.float32),
        "stem.scale": np.ones(channels, np.float32), "stem.shift": np.zeros(channels, np.float32),
        "u.conv.bits": bits,
        "u.conv.alpha": np.ones((4, 1), np.float32), "u.conv.scale": np.ones(1, np.float32),
        "u.conv.shift": np.zeros(1, np.float32),
        "classifier.weight": np.ones((2, 1), np.float32), "classifier.bias": np.zeros(2, np.float32),
    }
    return meta, tensors


def test_a_2mb_file_asking_for_158_gib_of_tables_is_refused_at_load_in_one_line(tmp_path):
    path = tmp_path / "wide.bnn"
    path.write_bytes(model_bytes(*_wide_window_model()))
    assert path.stat().st_size < 3 << 20
    holder = {}

    def load():
        with pytest.raises(engine.ModelFileError) as info:
            engine.load(str(path))
        holder["msg"] = str(info.value)

    peak = peak_bytes_while(load)
    msg = holder["msg"]
    assert msg.startswith(str(path)) and "\n" not in msg and budget.MEMORY_ENV in msg, msg
    # 1,263 rows x (2**24 + 1) float32 per table, two cube tables (a**3, b**3): 157.9 GiB, and buffers.
    assert float(msg.split("needs about ")[1].split(" GiB")[0]) >= 2 * 1263 * (2 ** 24 + 1) * 4 / 2 ** 30, msg
    assert peak < 64 << 20, f"{peak} bytes allocated to refuse the file"


def test_the_refusal_is_one_error_line_and_exit_2_from_refimpl_infer(tmp_path):
    path = tmp_path / "wide.bnn"
    path.write_bytes(model_bytes(*_wide_window_model()))
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 64, 64), np.float32))
    r = run_main(infer_cli.main, str(path), "--input", tmp_path / "x.npy", "--normalized")
    assert r.returncode == 2 and r.stdout == "", r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and budget.MEMORY_ENV in lines[0], r.stderr


def test_the_limit_is_raised_by_its_variable_and_a_malformed_value_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "wide.bnn"
    # The same geometry at 64 channels: 1,263 rows x (2**18 + 1) entries x 2 tables = 2.5 GiB.
    path.write_bytes(model_bytes(*_wide_window_model(channels=64)))
    monkeypatch.setenv(budget.MEMORY_ENV, "1")
    with pytest.raises(engine.ModelFileError, match=budget.MEMORY_ENV):
        engine.load(str(path))
    monkeypatch.setenv(budget.MEMORY_ENV, "lots")
    with pytest.raises(engine.ModelFileError, match="not a number of GiB"):
        engine.load(str(path))


def test_a_batch_whose_buffers_exceed_the_limit_is_refused_before_its_plan(tmp_path, monkeypatch):
    path = tmp_path / "ok.bnn"
    path.write_bytes(model_bytes(*tiny_model()))
    model = engine.load(str(path))
    x = np.zeros((2, 1, 8, 8), np.float32)
    single = budget.plan_bytes(model, 1)
    monkeypatch.setenv(budget.MEMORY_ENV, str(single * 1.5 / 2 ** 30))  # batch 1 fits, batch 64 does not
    model.run(x[:1])
    with pytest.raises(budget.PlanMemoryError, match="64 images at once"):
        model.run(np.zeros((64, 1, 8, 8), np.float32))
    assert 64 not in {k[0] for k in model._plans}


@pytest.mark.parametrize("make", [lambda: tiny_model(), lambda: tiny_model(real=True, side=16),
                                  lambda: _wide_window_model(channels=64, side=8, pad=7),
                                  lambda: _wide_window_model(channels=130, side=5, pad=2, counts="raw")])
@pytest.mark.parametrize("n_img", [1, 7, 64])
def test_the_counted_bytes_bound_what_a_plan_allocates(tmp_path, make, n_img):
    path = tmp_path / "m.bnn"
    path.write_bytes(model_bytes(*make()))
    model = engine.load(str(path))
    from refimpl.engine.plan import build_plan

    build_plan(model, n_img)  # tables are cached per module: measure a second build too, below
    model._epilogue.__dict__.pop("_TABLES", None)
    peak = peak_bytes_while(lambda: build_plan(model, n_img))
    counted = budget.plan_bytes(model, n_img)
    assert peak <= counted, f"the plan allocated {peak} bytes, {counted} were counted"


def test_a_memory_error_in_refimpl_infer_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "ok.bnn"
    path.write_bytes(model_bytes(*tiny_model()))
    np.save(tmp_path / "x.npy", np.zeros((3, 1, 8, 8), np.float32))

    def no_memory(self, x, debug=False):
        raise MemoryError("Unable to allocate 158. GiB for an array with shape (2, 1263, 16777217)")

    monkeypatch.setattr(engine.Model, "run", no_memory)
    r = run_main(infer_cli.main, str(path), "--input", tmp_path / "x.npy", "--normalized")
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "memory" in lines[0], r.stderr
