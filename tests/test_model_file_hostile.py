"""A .bnn file is data: a crafted or broken one is one ModelFileError line, never a crash.

Every case starts from a small valid model built by hand (``_tiny_bnn.py``: every layer kind
the engine runs, a dilation, identity and 1x1 shortcuts) and breaks one rule of the format
(``refimpl/engine/model_file.py``). The oracle is the rule itself: the file must
be refused at load, with a message that starts with the file's name and is one line. The fuzz
test at the end mutates the same file at random: loading either succeeds, and then the model
runs, or raises ModelFileError; anything else (another exception, a crash of the process, a
hang) fails it.
"""
from __future__ import annotations

import contextlib
import copy
import os
import stat
import threading

import numba
import numpy as np
import pytest
from _cli import run_main
from _memory import peak_bytes_while
from _tiny_bnn import join, model_bytes, split, tiny_model
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from refimpl import engine

FORMAT = engine.FORMAT


def _refused(path, needle=None) -> str:
    with pytest.raises(engine.ModelFileError) as info:
        engine.load(str(path))
    msg = str(info.value)
    assert msg.startswith(str(path)) and "\n" not in msg, msg
    if needle:
        assert needle in msg, msg
    return msg


def test_the_hand_built_model_loads_and_runs(tmp_path):
    # The starting point of every case below must itself be valid.
    path = tmp_path / "ok.bnn"
    path.write_bytes(model_bytes(*tiny_model()))
    model = engine.load(str(path))
    x = np.random.default_rng(1).normal(size=(2, 1, 8, 8)).astype(np.float32)
    logits = model.run(x)
    assert logits.shape == (2, 3) and np.isfinite(logits).all()


# ---------------------------------------------------------------------------------------------
# Geometry: no value reaches a kernel unchecked


def _set(layer, key, value, sub=None):
    def edit(meta, tensors):
        entry = meta["layers"][layer] if sub is None else meta["layers"][layer][sub]
        entry[key] = value
    return edit


def _kernel_zero(meta, tensors):
    # A 0x3 stem kernel, with a weight tensor of that (empty) shape, so only the geometry is wrong.
    meta["layers"][0]["kernel"] = [0, 3]
    tensors["stem.weight"] = np.zeros((8, 1, 0, 3), np.float32)


def _unit_kernel_zero(meta, tensors):
    meta["layers"][3]["conv"]["kernel"] = [0, 0]
    tensors["u2.conv.bits"] = np.zeros((16, 0, 0, 1), np.uint64)


GEOMETRY = {
    "binary padding -1": (_set(1, "padding", [-1, -1], "conv"), "padding"),
    "binary stride 0": (_set(3, "stride", [0, 0], "conv"), "stride"),
    "binary dilation 0": (_set(3, "dilation", [0, 0], "conv"), "dilation"),
    "binary kernel 0": (_unit_kernel_zero, "kernel"),
    "shortcut stride 0": (_set(3, "stride", [2, 0], "down"), "stride"),
    "stem stride 0": (_set(0, "stride", [0, 1]), "stride"),
    "stem dilation 0": (_set(0, "dilation", [0, 0]), "dilation"),
    "stem dilation -1": (_set(0, "dilation", [-1, -1]), "dilation"),
    "stem kernel 0": (_kernel_zero, "kernel"),
    "stem padding 1000": (_set(0, "padding", [1000, 1000]), "padding"),
    "stem padding past the kernel": (_set(0, "padding", [4, 1]), "padding"),
    "stem stride 2**70": (_set(0, "stride", [2 ** 70, 1]), "stride"),
    "stem dilation empties the map": (_set(0, "dilation", [5, 5]), "map"),
    "geometry as bools": (_set(1, "stride", [True, True], "conv"), "integers"),
    "pool kernel larger than the map": (_set(2, "kernel", [20, 20]), "map"),
    "pool kernel 0": (_set(2, "kernel", [0, 2]), "kernel"),
    "pool stride 0": (_set(2, "stride", [2, 0]), "stride"),
    "pool padding -1": (_set(4, "padding", [-1, -1]), "padding"),
    "pool padding over half the kernel": (_set(4, "padding", [2, 2]), "padding"),
    "identity shortcut shrinks the map": (_set(1, "padding", [0, 0], "conv"), "map"),
    "shortcut map differs from the conv's": (_set(3, "stride", [1, 1], "down"), "map"),
}


@pytest.mark.parametrize("case", list(GEOMETRY))
def test_bad_geometry_is_refused_at_load(case, tmp_path):
    edit, needle = GEOMETRY[case]
    meta, tensors = tiny_model()
    edit(meta, tensors)
    path = tmp_path / "bad.bnn"
    path.write_bytes(model_bytes(meta, tensors))
    _refused(path, needle)


# ---------------------------------------------------------------------------------------------
# Header fields of the wrong JSON type


def _meta(key, value):
    def edit(meta, tensors):
        meta[key] = value
    return edit


META_TYPES = {
    "input a list": _meta("input", [0.0, 1.0]),
    "class_names an int": _meta("class_names", 3),
    "class_names numbers": _meta("class_names", [1, 2, 3]),
    "input_shape with a bool": _meta("input_shape", [True, 8, 8]),
    "version a bool": _meta("version", True),
    "pixel_max a string": lambda meta, tensors: meta["input"].update(pixel_max="255"),
    "count_include_pad a string": _set(4, "count_include_pad", "no"),
    "unit name a list": _set(1, "name", ["u1"]),
    "channels as a float": _set(0, "in_channels", 1.0),
    "in_features as a float": _set(7, "in_features", 16.0),
}


@pytest.mark.parametrize("case", list(META_TYPES))
def test_metadata_field_of_the_wrong_type_is_refused(case, tmp_path):
    meta, tensors = tiny_model()
    META_TYPES[case](meta, tensors)
    path = tmp_path / "bad.bnn"
    path.write_bytes(model_bytes(meta, tensors))
    _refused(path)


def _first_tensor(header):
    return next(k for k in header if k != "__metadata__")


HEADER_TYPES = {
    "__metadata__ a number": lambda h: h.update(__metadata__=5),
    "metadata entry a number": lambda h: h["__metadata__"].update({FORMAT: 5}),
    "data_offsets a string": lambda h: h[_first_tensor(h)].update(data_offsets="0,4608"),
    "metadata nested 100000 deep": lambda h: h["__metadata__"].update({FORMAT: "[" * 100000}),
}


@pytest.mark.parametrize("case", list(HEADER_TYPES))
def test_safetensors_header_of_the_wrong_type_is_refused(case, tmp_path):
    header, data = split(model_bytes(*tiny_model()))
    HEADER_TYPES[case](header)
    path = tmp_path / "bad.bnn"
    path.write_bytes(join(header, data))
    _refused(path)


def test_header_nested_too_deep_is_refused(tmp_path):
    path = tmp_path / "bad.bnn"
    path.write_bytes(join(b"[" * 100000, b""))
    _refused(path)


# ---------------------------------------------------------------------------------------------
# Sizes: read no more than the header says, and not what is not a regular file


def test_oversize_header_length_is_refused_unread(tmp_path):
    path = tmp_path / "bad.bnn"
    with open(path, "wb") as f:
        f.write((200 << 20).to_bytes(8, "little"))
        f.truncate(8 + (200 << 20) + 8)  # sparse: a 200 MB header of zeros, costs no disk
    peak = peak_bytes_while(lambda: _refused(path, "header"))
    assert peak < 8 << 20, f"{peak} bytes allocated to refuse the file"


def test_bytes_past_the_tensor_data_are_refused_unread(tmp_path):
    path = tmp_path / "bad.bnn"
    raw = model_bytes(*tiny_model())
    with open(path, "wb") as f:
        f.write(raw)
        f.truncate(len(raw) + (200 << 20))  # sparse trailing zeros
    peak = peak_bytes_while(lambda: _refused(path))
    assert peak < 8 << 20, f"{peak} bytes allocated to refuse the file"


def _load_in_thread(path, load=None):
    """``load()`` (default: engine.load(path)) in a thread: (finished, exception, result). A FIFO
    must not block it."""
    out = {}

    def target():
        try:
            out["result"] = load() if load else engine.load(str(path))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(120)
    finished = not t.is_alive()
    if not finished and stat.S_ISFIFO(os.stat(path).st_mode):
        # Unblock the reader: a writer that opens and closes gives it end of file.
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        t.join()
    return finished, out.get("exc"), out.get("result")


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "directory"])
def test_a_path_that_is_not_a_regular_file_is_refused_unopened(kind, tmp_path):
    if kind == "fifo":
        path = tmp_path / "model.bnn"
        os.mkfifo(path)
    elif kind == "directory":
        path = tmp_path
    else:
        path = kind
    finished, exc, _ = _load_in_thread(path)
    assert finished, f"engine.load blocked on a {kind}"
    assert isinstance(exc, engine.ModelFileError), repr(exc)
    msg = str(exc)
    assert msg.startswith(str(path)) and ("not a regular file" in msg or "directory" in msg), msg


# ---------------------------------------------------------------------------------------------
# The command line: one line on stderr, exit 2 (in this process, tests/_cli.py)


def _infer(model, tmp_path):
    from refimpl.infer import main

    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, 8, 8, 1), np.uint8))
    finished, exc, result = _load_in_thread(model, lambda: run_main(main, model, "--input", x))
    assert finished, "refimpl.infer blocked on the model file"
    if exc is not None:
        raise exc
    return result


@pytest.mark.parametrize("kind", ["negative padding", "fifo"])
def test_infer_refuses_a_crafted_file_in_one_line(kind, tmp_path):
    path = tmp_path / "model.bnn"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        meta, tensors = tiny_model()
        meta["layers"][1]["conv"]["padding"] = [-1, -1]
        path.write_bytes(model_bytes(meta, tensors))
    r = _infer(path, tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), r.stderr


# ---------------------------------------------------------------------------------------------
# Model.check_input


def test_a_read_only_input_runs_like_a_writable_one(tmp_path):
    # np.load(mmap_mode="r") and frombuffer views are read-only; Numba refused them with a traceback.
    path = tmp_path / "ok.bnn"
    path.write_bytes(model_bytes(*tiny_model()))
    model = engine.load(str(path))
    x = np.random.default_rng(2).normal(size=(3, 1, 8, 8)).astype(np.float32)
    frozen = x.copy()
    frozen.flags.writeable = False
    np.testing.assert_array_equal(model.run(frozen), model.run(x))


# ---------------------------------------------------------------------------------------------
# Fuzz: random mutations of a valid file load, and then run, or raise ModelFileError
#
# In process on purpose: a kernel that writes out of bounds kills pytest, which fails the run.
# BNN_FUZZ_EXAMPLES raises the example count (a campaign: BNN_FUZZ_EXAMPLES=5000).

FUZZ_EXAMPLES = int(os.environ.get("BNN_FUZZ_EXAMPLES", "300"))
RUN_LIMIT = 4096  # inputs of at most this many values per image are run (a larger one is the user's to give)

_SEEDS = {"binary shortcuts": tiny_model(seed=4), "real shortcut": tiny_model(seed=5, real=True),
          "16x16": tiny_model(seed=6, side=16)}
_EDGE_NUMBERS = [0, 1, 2, 3, -1, -2, 7, 8, 16, 63, 64, 65, 1000, 2 ** 31, 2 ** 63, 2 ** 64, 2 ** 70, -(2 ** 63),
                 0.5, 1.0, -0.0, 1e308, float("inf"), float("nan"), True, False, None, "", "1", [], {}]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _paths(node, prefix=()):
    """The path (keys and indices) of every value in a JSON tree, the root's included."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _paths(child, (*prefix, key))


def _at(root, path):
    for key in path:
        root = root[key]
    return root


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _mutate_tree(data, root):
    """One random edit of a JSON tree: a value replaced (any JSON, an edge number, an integer
    nudged), a key or element deleted, or one value copied over another. Half the edits pick a
    number (geometry, channels, shapes, offsets): those are the edits that can still load, and so
    reach the kernels. Returns the new root."""
    paths = list(_paths(root))
    numbers = [p for p in paths if _is_number(_at(root, p))]
    if numbers and data.draw(st.booleans()):
        path = data.draw(st.sampled_from(numbers))
        how = data.draw(st.sampled_from(["edge", "nudge", "nudge"]))
    else:
        path = data.draw(st.sampled_from(paths))
        how = data.draw(st.sampled_from(["json", "edge", "nudge", "delete", "copy"]))
    old = _at(root, path)
    if how == "json":
        new = data.draw(_json_values)
    elif how == "edge":
        new = copy.deepcopy(data.draw(st.sampled_from(_EDGE_NUMBERS)))
    elif how == "nudge" and isinstance(old, int) and not isinstance(old, bool):
        new = old + data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
    elif how == "copy":
        new = copy.deepcopy(_at(root, data.draw(st.sampled_from(paths))))
    elif how == "delete" and path:
        del _at(root, path[:-1])[path[-1]]
        return root
    else:
        return root
    if not path:
        return new
    _at(root, path[:-1])[path[-1]] = new
    return root


def _mutate_geometry(data, meta):
    """One window value (kernel of a pool; stride, padding, dilation of any window) set to 0..4:
    small, so that many such files still load and run geometries no exporter writes."""
    windows = [p for p in _paths(meta) if p and p[-1] in ("stride", "padding", "dilation", "pool")
               or len(p) == 3 and p[-1] == "kernel" and meta["layers"][p[1]].get("op", "").endswith("pool2d")]
    path = data.draw(st.sampled_from(windows))
    _at(meta, path)[data.draw(st.integers(0, 1))] = data.draw(st.integers(0, 4))
    return meta


def _mutate_bytes(data, raw: bytes) -> bytes:
    how = data.draw(st.sampled_from(["flip", "truncate", "insert", "length"]))
    if how == "length":
        return data.draw(st.integers(0, 2 ** 64 - 1)).to_bytes(8, "little") + raw[8:]
    at = data.draw(st.integers(0, len(raw)))
    if how == "truncate":
        return raw[:at]
    if how == "insert":
        return raw[:at] + data.draw(st.binary(min_size=1, max_size=8)) + raw[at:]
    if at == len(raw):
        return raw
    return raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1:]


@contextlib.contextmanager
def _threads(n):
    saved = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(saved)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_model_file_loads_and_runs_or_is_one_model_file_error(data, tmp_path):
    meta, tensors = copy.deepcopy(_SEEDS[data.draw(st.sampled_from(sorted(_SEEDS)))])
    # One kind of damage per example, mostly to the metadata: a file broken in two places at once
    # is refused for the first, and the second tests nothing.
    where = data.draw(st.sampled_from(["metadata", "metadata", "geometry", "geometry", "header", "bytes"]))
    edits = data.draw(st.integers(1, 3))
    for _ in range(edits if where == "metadata" else 0):
        meta = _mutate_tree(data, meta)
    for _ in range(edits if where == "geometry" else 0):
        meta = _mutate_geometry(data, meta)
    raw = model_bytes(meta, tensors)  # json.dumps takes whatever the edits left, a non-object root too
    if where == "header":
        header, body = split(raw)
        for _ in range(edits):
            header = _mutate_tree(data, header)
        raw = join(header, body)
    for _ in range(edits if where == "bytes" else 0):
        raw = _mutate_bytes(data, raw)
    path = tmp_path / "fuzzed.bnn"
    path.write_bytes(raw)
    try:
        model = engine.load(str(path))
    except engine.ModelFileError as exc:
        msg = str(exc)
        assert msg.startswith(str(path)) and msg.isprintable(), msg
        event(f"{where} edited: refused")
        return
    c, h, w = model.input_shape
    if c * h * w > RUN_LIMIT:
        event(f"{where} edited: loaded, input too large to run")
        return
    event(f"{where} edited: loaded and ran")
    # Batch 1 runs the two-pass layers, batch 5 the fused ones where the maps allow; debug runs
    # record every layer's counts. One run per example: a fresh model's first run builds its plan.
    n, debug = data.draw(st.sampled_from([1, 5])), data.draw(st.booleans())
    # Mostly one thread: these layers are tiny, and waking a second thread costs more than their
    # arithmetic (about 7 ms a kernel on a busy 2-core machine); one thread also fuses a layer
    # from 8 tiles on. Sometimes all threads, which split the layers' work differently.
    threads = data.draw(st.sampled_from([1, 1, 1, numba.config.NUMBA_NUM_THREADS]))
    x = np.random.default_rng(0).normal(size=(n, c, h, w)).astype(np.float32)
    with _threads(threads):
        logits, record = model.run(x, debug=True) if debug else (model.run(x), [])
    assert logits.shape == (n, model.num_classes) and logits.dtype == np.float32
    assert all(r["a"].shape[0] == n for r in record)
