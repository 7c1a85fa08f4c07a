"""Issue 36: the fuzzing of round two, extended to the readers added since: the checkpoint reader,
``fitness-extra.jsonl`` and ``results.json`` as ``bnn.search.cost`` reads them, the evidence
journal's protocol and cells, and ``.bnn`` files with count conventions and large geometries.

Each reader answers a drawn input with its content or one refusal line, never a traceback; what
it accepts never contradicts itself (checked here by rebuilding the relation, not by asking the
reader); and a ``.bnn`` file never makes the engine allocate past its limit (tracemalloc's peak
over load and run, measured). BNN_FUZZ_EXAMPLES raises the example count (a campaign: 5000)."""
from __future__ import annotations

import copy
import json
import math
import os
import string
import tracemalloc

import numpy as np
import pytest
import torch
from _cli import run_main
from _tiny_bnn import model_bytes, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import event as _event
from hypothesis import strategies as st

from bnn import evidence
from bnn.search import cost as cost_mod
from refimpl import engine
from refimpl.engine import budget
from refimpl.genome import Genome

FUZZ_EXAMPLES = int(os.environ.get("BNN_FUZZ_EXAMPLES", "100"))  # CI: 100 each, about 2 min on 2 busy cores
_FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                        HealthCheck.data_too_large])
CONVENTIONS = ("raw", "freq", "laplace")
GENOMES = {"baseline": "0-0-0-0-0-0-1", "M1": "3-0-3-0-0-1-6", "M5": str(Genome.parse("M5"))}
_SCALARS = (st.none() | st.booleans() | st.integers(-2, 2 ** 70) | st.floats() | st.text(string.printable, max_size=8)
            | st.sampled_from([*CONVENTIONS, *GENOMES, *GENOMES.values(), "0-0-0-0-0-0-1/raw", "binary", "real"]))
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(string.ascii_lowercase + "_", max_size=10), inner, max_size=3),
                     max_leaves=6)


def event(outcome: str) -> None:
    """hypothesis' ``event``; with BNN_FUZZ_LOG set, also one line appended there per example (a long
    campaign's progress, which hypothesis reports only at its end)."""
    _event(outcome)
    if os.environ.get("BNN_FUZZ_LOG"):
        with open(os.environ["BNN_FUZZ_LOG"], "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?').split('::')[-1].split(' ')[0]}\t{outcome}\n")


def _mutated(base: dict):
    """``base`` with one field set to any JSON value, and maybe one field dropped."""
    return st.builds(lambda k, v, drop: {kk: vv for kk, vv in {**base, k: v}.items() if kk != drop},
                     st.sampled_from(sorted(base)), _JSON, st.sampled_from([None, *sorted(base)]))


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _accuracy(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1


# -- bnn.search.cost: fitness-extra.jsonl and results.json ------------------------------------------

def _extra_record(genome, counts, fitness):
    return {"key": f"{genome}/{counts}", "genome": genome, "counts": counts, "fitness": fitness, "status": "ok"}


_GOOD_EXTRA = st.builds(_extra_record, st.sampled_from(sorted(GENOMES.values())), st.sampled_from(CONVENTIONS),
                        st.none() | st.floats(0, 1))
_EXTRA_LINE = st.integers(0, 9).flatmap(
    lambda k: _GOOD_EXTRA.map(json.dumps) if k < 7 else (_mutated(_extra_record("0-0-0-0-0-0-1", "raw", 0.5)) | _JSON)
    .map(json.dumps)).map(str.encode) | st.binary(max_size=10)
_GOOD_ROW = st.builds(lambda m, c, n, t: {"measure": m, "genome": GENOMES[m], "counts": c, "n_ok": n, "test_mean": t},
                      st.sampled_from(sorted(GENOMES)), st.sampled_from(CONVENTIONS), st.integers(0, 3), st.floats(0, 1))
_ROW = st.integers(0, 9).flatmap(lambda k: _GOOD_ROW if k < 7 else _mutated(
    {"measure": "M1", "genome": GENOMES["M1"], "counts": "raw", "n_ok": 2, "test_mean": 0.5}) | _JSON)


@_FUZZ
@given(extra=st.lists(_EXTRA_LINE, max_size=5), tail=st.sampled_from([b"\n", b"", b'\n{"key": "0-0', b"\n\xff"]),
       rows=st.lists(_ROW, max_size=5), grid_bytes=st.none() | st.binary(max_size=16) | st.just(b"[" * 50_000),
       score=st.booleans())
def test_fuzzed_cost_inputs_are_ranked_or_one_error_line(tmp_path, extra, tail, rows, grid_bytes, score):
    run, grid = tmp_path / "search", tmp_path / "grid"
    run.mkdir(exist_ok=True)
    grid.mkdir(exist_ok=True)
    start = {"type": "start", "version": 1, "time": 1000.0, "config": {"counts": "raw", "fitness": "synthetic:5"}}
    (run / "journal.jsonl").write_text(json.dumps(start) + "\n")
    (run / "fitness-extra.jsonl").write_bytes(b"\n".join(extra) + tail if extra else tail.lstrip(b"\n"))
    (grid / "results.json").write_bytes(grid_bytes if grid_bytes is not None else json.dumps({"rows": rows}).encode())
    r = run_main(cost_mod.main, run, "--full", grid, "--json", *(["--score"] if score else []))
    if r.returncode == 2:
        assert _one_line(r.stderr).startswith("error: ") and r.stdout == ""
        event("refused")
        return
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1], parse_constant=lambda c: pytest.fail(f"--json holds {c}"))
    for pair in result["ranks"][0]["pairs"]:
        assert _accuracy(pair["short"]) and _accuracy(pair["full"]), pair
        assert str(Genome.parse(pair["genome"])) == pair["genome"] and pair["counts"] in CONVENTIONS
    if score:  # the lock holder cut any torn tail off: every line is whole and agrees with itself
        for line in (run / "fitness-extra.jsonl").read_bytes().splitlines():
            rec = json.loads(line)
            assert rec["key"] == f"{Genome.parse(rec['genome'])}/{rec['counts']}"
    event(f"ranked {len(result['ranks'][0]['pairs'])} cells")


# -- the evidence journal: protocol and cells ---------------------------------------------------------

PROTOCOL = {"dataset": "digits", "model": "digits_net", "epochs": 1, "batch_size": 128, "lr": 0.005,
            "train_size": None, "val_size": None, "gamma": 0.2, "split_seed": 0, "milestones": [2]}


def _cell(m, kind, counts, seed, status, acc):
    tag = "" if counts == "raw" else f"{counts}/"
    return {"key": f"{m}/{kind}/{tag}s{seed}", "measure": m, "genome": GENOMES[m], "downsample": kind,
            "counts": counts, "seed": seed, "status": status, "val_acc": acc, "test_acc": acc, "epochs": 1,
            "wall_s": 1.0, "host": "h", "cpu_kind": "x86_64 avx2"}


_GOOD_CELL = st.builds(_cell, st.sampled_from(sorted(GENOMES)), st.sampled_from(["binary", "real"]),
                       st.sampled_from(CONVENTIONS), st.integers(0, 2), st.sampled_from(["ok", "ok", "diverged"]),
                       st.floats(0, 1))
_CELL_LINE = st.integers(0, 9).flatmap(
    lambda k: _GOOD_CELL if k < 6 else _mutated(_cell("M1", "binary", "laplace", 0, "ok", 0.5)) | _JSON)
_PROTOCOL_LINE = st.integers(0, 9).flatmap(
    lambda k: st.just(PROTOCOL) if k < 6 else _mutated(PROTOCOL)).map(
    lambda p: {"kind": "protocol", "version": 1, "protocol": p})


@_FUZZ
@given(first=_PROTOCOL_LINE, cells=st.lists(_CELL_LINE, max_size=5), tail=st.sampled_from([b"\n", b"", b'\n{"key": "M']))
def test_fuzzed_evidence_journal_is_tabulated_consistently_or_one_error_line(tmp_path, first, cells, tail, capsys):
    root = tmp_path / "ev"
    root.mkdir(exist_ok=True)
    for name in os.listdir(root):
        os.remove(root / name)
    (root / "journal.jsonl").write_bytes(b"\n".join(json.dumps(v).encode() for v in [first, *cells]) + tail)
    rc = evidence.main(["--dataset", "digits", "--root", str(root), "--table-only", "--no-plot"])
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert "Traceback" not in out.err and all(x.endswith("ignored a torn last line") for x in lines[:-1]), out.err
    if rc == 2:  # one error line, after the note of a torn line it dropped, if any
        assert lines[-1].startswith("error: ") and not (root / "results.json").exists()
        event("refused")
        return
    assert rc == 0, out.err
    json.loads((root / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"results.json holds {c}"))
    kept = [json.loads(x) for x in (root / "journal.jsonl").read_bytes().splitlines()[1:]]  # a torn tail is cut off
    for cell in kept:  # every cell the grid accepted agrees with itself
        tag = "" if cell.get("counts", "raw") == "raw" else f"{cell['counts']}/"
        assert cell["key"] == f"{cell['measure']}/{cell['downsample']}/{tag}s{cell['seed']}", cell
        g = Genome.parse(cell["genome"])
        assert cell["measure"] == (g.name or str(g)), cell
    event(f"tabulated {len(kept)} cells")


# -- the checkpoint reader ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint():
    from bnn.nn.models import build_model

    model = build_model("digits_net", "M1", 10, (1, 8, 8), counts="freq")
    return {"format": "bnn-train-checkpoint", "version": 1,
            "config": {"model": "digits_net", "dataset": "digits", "measure": "M1", "counts": "freq",
                       "downsample": "binary", "epochs": 2},
            "model_config": dict(model.config), "data": {"name": "digits", "mean": [8.0], "std": [4.0],
                                                         "pixel_max": 16, "class_names": [str(i) for i in range(10)]},
            "model": model.state_dict(), "history": [{"epoch": 1}], "epoch": 1, "status": "ok"}


_CKPT_FIELDS = st.sampled_from(["config", "model_config", "history", "epoch", "status", "data", "format"])


@_FUZZ
@given(edits=st.lists(st.tuples(_CKPT_FIELDS, st.sampled_from(["value", "field", "drop"]), st.text(max_size=12), _JSON),
                      max_size=2),
       damage=st.none() | st.tuples(st.sampled_from(["truncate", "flip"]), st.integers(0, 10 ** 6), st.integers(1, 255)))
def test_fuzzed_checkpoint_is_exported_consistently_or_one_value_error(tmp_path, checkpoint, edits, damage):
    from bnn.export import export_checkpoint
    from bnn.train import load_checkpoint

    ckpt = {**checkpoint, "config": dict(checkpoint["config"]), "model_config": dict(checkpoint["model_config"]),
            "data": dict(checkpoint["data"])}
    for field, how, key, value in edits:
        if how == "drop":
            ckpt.pop(field, None)
        elif how == "field" and isinstance(ckpt.get(field), dict):
            ckpt[field][key or "counts"] = copy.deepcopy(value)
        else:
            ckpt[field] = copy.deepcopy(value)
    path = tmp_path / "checkpoint.pt"
    torch.save(ckpt, path)
    if damage:
        raw = bytearray(path.read_bytes())
        how, at, xor = damage
        at %= len(raw)
        raw = raw[:at] if how == "truncate" else raw[:at] + bytes([raw[at] ^ xor]) + raw[at + 1:]
        path.write_bytes(bytes(raw))
    out = tmp_path / "m.bnn"
    if out.exists():
        out.unlink()  # the previous example's
    try:
        loaded = load_checkpoint(str(path))
        export_checkpoint(str(path), str(out))
    except (ValueError, FileNotFoundError) as exc:
        assert str(exc).strip() and "\n" not in str(exc), exc
        assert not out.exists()  # nothing half-written
        event("refused")
        return
    # Accepted: its two records agree, and the file exported runs under the model's convention.
    cfg, mc = loaded["config"], loaded["model_config"]
    assert cfg.get("counts", "raw") == mc.get("counts", "raw") == engine.load(str(out)).counts
    assert cfg.get("downsample", "binary") == mc.get("downsample", "binary")
    assert str(Genome.parse(cfg["measure"])) == str(Genome.parse(mc["measure"]))
    event("exported")


# -- .bnn files with conventions and large geometries ------------------------------------------------

LIMIT_GIB = 0.25  # the fuzz's engine limit: small, so that refusals happen and the bound is exercised
RUN_VALUES = 4096  # inputs of at most this many values per image are run
# No tables and two: what a file's geometry can make the engine allocate (tables have a row per
# window size under freq and laplace) depends on the table count, not on which operators fill them.
# M5 too compiled three more generated modules, 27 s of a cold suite's CPU (docs/performance.md).
FILE_GENOMES = ("baseline", "M1")


def _seed(counts, genome, side, real):
    meta, tensors = tiny_model(seed=7, side=side, real=real)
    meta["genome"], meta["counts"], meta["version"] = GENOMES[genome], counts, 1 if counts == "raw" else 2
    return meta, tensors


def _geometry_paths(meta):
    for i, layer in enumerate(meta["layers"]):
        for sub in ("conv", "down", None):
            entry = layer.get(sub) if sub else layer
            if isinstance(entry, dict):
                for key in ("stride", "padding", "dilation"):
                    if key in entry:
                        yield (i, sub, key)


@_FUZZ
@given(data=st.data())
def test_fuzzed_bnn_with_conventions_and_large_geometry_stays_within_the_limit(data, tmp_path, monkeypatch):
    counts = data.draw(st.sampled_from(CONVENTIONS))
    meta, tensors = _seed(counts, data.draw(st.sampled_from(FILE_GENOMES)), data.draw(st.sampled_from([8, 16])),
                          data.draw(st.booleans()))
    for _ in range(data.draw(st.integers(1, 3))):
        what = data.draw(st.sampled_from(["geometry", "geometry", "side", "counts", "version"]))
        if what == "geometry":
            i, sub, key = data.draw(st.sampled_from(list(_geometry_paths(meta))))
            entry = meta["layers"][i][sub] if sub else meta["layers"][i]
            entry[key][data.draw(st.integers(0, 1))] = data.draw(st.sampled_from([0, 1, 2, 7, 31, 63, 64, 255, 4096]))
        elif what == "side":
            meta["input_shape"][1 + data.draw(st.integers(0, 1))] = data.draw(st.sampled_from([1, 4, 64, 512, 4096, 65536]))
        elif what == "counts":
            meta["counts"] = data.draw(st.sampled_from([*CONVENTIONS, "median", 1, None]))
        else:
            meta["version"] = data.draw(st.sampled_from([1, 2, 3]))
    path = tmp_path / "m.bnn"
    path.write_bytes(model_bytes(meta, tensors))
    monkeypatch.setenv(budget.MEMORY_ENV, str(LIMIT_GIB))
    n = data.draw(st.sampled_from([1, 3]))
    tracemalloc.start()
    try:
        try:
            model = engine.load(str(path))
            c, h, w = model.input_shape
            if c * h * w <= RUN_VALUES:
                x = np.random.default_rng(0).normal(size=(n, c, h, w)).astype(np.float32)
                logits = model.run(x)
                assert logits.shape == (n, model.num_classes) and logits.dtype == np.float32
                # The file's convention is the one the model runs, and its version goes with it.
                assert model.counts == meta["counts"] and meta["version"] == (1 if model.counts == "raw" else 2)
                event(f"ran ({model.counts})")
            else:
                event("loaded, input too large to run")
        except engine.ModelFileError as exc:  # PlanMemoryError included
            msg = str(exc)
            assert msg.startswith(str(path)) and msg.isprintable(), msg
            event("refused: memory limit" if budget.MEMORY_ENV in msg else "refused")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # The input is the caller's (at most RUN_VALUES floats an image); the rest is the plan's.
    assert peak <= LIMIT_GIB * 2 ** 30 + (16 << 20), f"{peak} bytes allocated under a {LIMIT_GIB} GiB limit"
