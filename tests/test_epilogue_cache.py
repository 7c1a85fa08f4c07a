"""The generated-epilogue cache (issue 18 item 6): code planted in the cache folder (a ``.pyc`` in
its ``__pycache__``, a ``.py`` that differs from the generated text) never runs, the results stay
those of ``refimpl.measure``, and a folder that is not private to the user is not used. A change
to any refimpl source the epilogue inlines rebuilds it (issue 17 item 3)."""
import importlib.util
import marshal
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

from refimpl import measure
from refimpl.engine import epilogue

GENOME = "M1"
posix_only = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="file ownership and modes are POSIX")


def _evil_source(marker) -> str:
    return f"open({str(marker)!r}, 'w').write('planted code ran')\n"


def _pyc(source: str, filename: str, header: bytes) -> bytes:
    # Built by hand from the format (PEP 552): magic, 4 flag bytes, 8 bytes of header, marshal.
    return importlib.util.MAGIC_NUMBER + header + marshal.dumps(compile(source, filename, "exec"))


def _unchecked_hash_header() -> bytes:
    return (0b01).to_bytes(4, "little") + b"\0" * 8  # hash-based, source never checked


def _timestamp_header(py_path) -> bytes:
    st = os.stat(py_path)
    return (0).to_bytes(4, "little") + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + \
        (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")


@pytest.fixture
def fresh_loads(monkeypatch):
    """Nothing loaded yet in this process, as in a new one (restored afterwards)."""
    monkeypatch.setattr(epilogue, "_LOADED", {})
    monkeypatch.setattr(epilogue, "_FALLBACK", [])
    key, _ = epilogue.module_name(GENOME)
    if key in sys.modules:
        monkeypatch.setitem(sys.modules, key, sys.modules[key])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A cache folder holding GENOME's generated file and Numba's cache of it (one compile,
    copied into each test's folder so that the cases whose .py is intact load without one)."""
    seed = tmp_path_factory.mktemp("seed") / "cache"
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("BNN_MEASURE_CACHE", str(seed))
        mp.setattr(epilogue, "_LOADED", {})
        key, _ = epilogue.module_name(GENOME)
        if key in sys.modules:
            mp.setitem(sys.modules, key, sys.modules[key])
        epilogue.load(GENOME)
    finally:
        mp.undo()
    return seed


def _check_results(module):
    rng = np.random.default_rng(3)
    shape = (2, 3, 33)
    a, b, c, d = (rng.integers(0, 300, shape) for _ in range(4))
    a[0, 0, :5] = 0  # zero counts: the division by zero of M1's denominator
    d[0, 0, :5] = 0
    alpha = rng.uniform(-2, 2, (4, 3)).astype(np.float32)
    expected = measure(GENOME, a, b, c, d, alpha=alpha, dtype=np.float32)
    # The module's own scalar measure (its tasks need a whole layer's arguments), element by element.
    f32 = [v.astype(np.float32) for v in (a, b, c, d)]
    got = np.array([module.measure(*(v[idx] for v in f32), *alpha[:, idx[1]]) for idx in np.ndindex(shape)],
                   np.float32).reshape(shape)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("planted", ["unchecked-hash pyc", "timestamp pyc matching the py",
                                     "mismatched py with its pyc"])
def test_code_planted_in_the_cache_never_runs(tmp_path, monkeypatch, fresh_loads, compiled, planted):
    cache = tmp_path / "cache"
    shutil.copytree(compiled, cache)  # keeps mtimes: Numba's cache of the intact file stays valid
    monkeypatch.setenv("BNN_MEASURE_CACHE", str(cache))
    key, text = epilogue.module_name(GENOME)
    py = cache / f"{key}.py"
    assert py.read_text() == text
    marker = tmp_path / "marker"
    evil = _evil_source(marker)
    if planted == "mismatched py with its pyc":
        py.write_text(evil)
    header = _timestamp_header(py) if planted.startswith("timestamp") else _unchecked_hash_header()
    pyc = importlib.util.cache_from_source(str(py))
    os.makedirs(os.path.dirname(pyc), exist_ok=True)  # absent when NUMBA_CACHE_DIR keeps Numba's files elsewhere
    with open(pyc, "wb") as f:
        f.write(_pyc(evil, str(py), header))

    module = epilogue.load(GENOME)

    assert not marker.exists(), "code planted in the cache folder ran"
    assert module.__file__ == str(py) and py.read_text() == text, "the generated file is written back"
    _check_results(module)


@posix_only
def test_a_new_cache_folder_is_private(tmp_path, monkeypatch, fresh_loads):
    monkeypatch.setenv("BNN_MEASURE_CACHE", str(tmp_path / "new" / "cache"))
    assert epilogue.private_cache_dir() == str(tmp_path / "new" / "cache")
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "cache").st_mode) == 0o700


@posix_only
@pytest.mark.parametrize("problem", ["group-writable", "world-writable", "another user's",
                                     "its __pycache__ world-writable"])
def test_a_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch, fresh_loads, capsys, problem):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    if problem == "group-writable":
        shared.chmod(0o770)
    elif problem == "world-writable":
        shared.chmod(0o757)
    elif problem == "another user's":
        uid = os.geteuid()
        monkeypatch.setattr(epilogue.os, "geteuid", lambda: uid + 1)  # as if the folder were not ours
    else:
        (shared / "__pycache__").mkdir()
        (shared / "__pycache__").chmod(0o777)
    monkeypatch.setenv("BNN_MEASURE_CACHE", str(shared))

    first = epilogue.private_cache_dir()
    err = capsys.readouterr().err
    assert first != str(shared) and not first.startswith(str(shared) + os.sep)
    assert err.count("\n") == 1 and err.startswith("refimpl: warning: ") and str(shared) in err
    st = os.stat(first)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.stat(tmp_path).st_uid
    assert epilogue.private_cache_dir() == first and capsys.readouterr().err == "", "one folder, one warning"
    shutil.rmtree(first)


# Builds the baseline's epilogue in a fresh process and runs it on one output whose counts are
# a = 3, px = 5, pw = 4, n = 10, so b = 1, c = 2, d = 4 and XNOR (a + d) - (b + c) = 4; BatchNorm
# scale 2, shift 1 gives fma(4, 2, 1) = 9.
REBUILD_SCRIPT = """
import numba
import numpy as np
from refimpl.engine import epilogue
key, _ = epilogue.module_name("baseline")
module = epilogue.load("baseline")
a = np.full((1, 1, 1), 3, np.int32)
px, pw, npw = (np.full((1, 1), v, np.float32) for v in (5, 4, 10 - 4))
alpha = np.ones((4, 1), np.float32)
scale, shift = np.full(1, 2, np.float32), np.full(1, 1, np.float32)
out = np.zeros((1, 1, 1), np.float32)
tab, toff, tails = np.zeros((1, 1), np.float32), np.zeros(1, np.int64), np.zeros(1, np.int64)  # the baseline has no lookup tables
yscratch = np.zeros((numba.config.NUMBA_NUM_THREADS, 2048), np.float32)  # a thread's rows of y
epilogue.kernel(module, "epilogue_none")(a, px, pw, npw, alpha, scale, shift, tab, toff, tails, yscratch, out, np.zeros((1, 1, 1, 1), np.uint64), False, 1, 0, 0, 1)
print(epilogue.__file__, key, float(out[0, 0, 0]))
"""


def _build_epilogue(root, cache) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PYTHONPATH")}
    env["BNN_MEASURE_CACHE"] = str(cache)
    result = subprocess.run([sys.executable, "-c", REBUILD_SCRIPT], cwd=root, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    where, key, y = result.stdout.split()
    assert os.path.dirname(os.path.realpath(where)) == os.path.realpath(root / "refimpl" / "engine"), "ran the copy"
    return key, y


def test_the_epilogue_is_rebuilt_when_a_helper_it_inlines_changes(tmp_path):
    package = os.path.dirname(os.path.dirname(os.path.realpath(epilogue.__file__)))
    shutil.copytree(package, tmp_path / "refimpl", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    key, y = _build_epilogue(tmp_path, cache)
    assert y == "9.0"
    assert [p.name for p in cache.glob("*.py")] == [f"{key}.py"]

    # fma.fma32 is inlined into the generated kernels; neither the generator nor the genome changes
    fma = tmp_path / "refimpl" / "kernels" / "fma.py"
    text = fma.read_text()
    assert text.count("return builder.fma(*args)") == 1
    fma.write_text(text.replace("return builder.fma(*args)",
                                "return builder.fadd(builder.fma(*args), args[0].type(1.0))"))
    new_key, new_y = _build_epilogue(tmp_path, cache)
    assert new_y == "10.0", "the cached epilogue kept the old fma32"
    assert new_key != key and sorted(p.name for p in cache.glob("*.py")) == sorted([f"{key}.py", f"{new_key}.py"])
