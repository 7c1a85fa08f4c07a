"""One jit factory (refimpl/_jit.py): every kernel of refimpl, generated ones included, is made by
it, and importing refimpl leaves Numba's vectorizer settings to other code as Numba has them."""
from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from numba import types
from numba.extending import intrinsic

import refimpl
from refimpl import _jit, codegen
from refimpl.codegen import epilogue_template

PACKAGE = Path(refimpl.__file__).resolve().parent
# Numba's ways to make a compiled function; only refimpl/_jit.py may call them.
FACTORIES = {"njit", "jit", "vectorize", "guvectorize", "cfunc", "stencil", "generated_jit", "jit_module"}
VECTORIZER_ENV = ("NUMBA_SLP_VECTORIZE", "NUMBA_LOOP_VECTORIZE")


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def direct_numba_factories(source: str) -> list[str]:
    """``numba.njit``-like uses in ``source``: an import of a factory from numba, or an attribute
    ``<numba or its alias>.<...>.<factory>``."""
    tree = ast.parse(source)
    aliases = {"numba"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name.split(".")[0] == "numba"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "numba":
            found += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name in FACTORIES]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FACTORIES:
            name = _dotted(node)
            if name.split(".")[0] in aliases:
                found.append(f"line {node.lineno}: {name}")
    return found


@pytest.mark.parametrize("source", [
    "import numba\n@numba.njit\ndef f(x):\n    return x\n",
    "import numba\ng = numba.njit('f8(f8)', cache=True)(lambda x: x)\n",
    "import numba as nb\n@nb.vectorize(['f8(f8)'])\ndef f(x):\n    return x\n",
    "from numba import njit as fast\n",
    "from numba.core.decorators import jit\n",
    "import numba.core.decorators\nf = numba.core.decorators.jit(print)\n",
])
def test_the_scanner_finds_a_direct_numba_factory(source):
    assert direct_numba_factories(source)


def test_the_scanner_passes_the_factory_and_other_numba_names():
    source = ("import numba\nfrom numba import prange, types\nfrom ._jit import jit\n"
              "@jit(parallel=True)\ndef f(x):\n    return numba.get_thread_id() + numba.config.NUMBA_NUM_THREADS\n")
    assert direct_numba_factories(source) == []


def _package_sources() -> list[Path]:
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts]
    assert PACKAGE / "engine" / "plan.py" in files and PACKAGE / "kernels" / "_tiles.py" in files
    return [p for p in files if p != PACKAGE / "_jit.py"]


def test_no_refimpl_source_calls_numba_jit_directly():
    offenders = {str(p.relative_to(PACKAGE)): hits for p in _package_sources()
                 if (hits := direct_numba_factories(p.read_text(encoding="utf-8")))}
    assert offenders == {}, "use refimpl._jit.jit, the one factory"


@pytest.mark.parametrize("genome", ["baseline", "M1", "M5", "2-3-4-5-6-7-8"])
def test_generated_epilogues_use_the_factory(genome):
    text = epilogue_template.generate(genome)
    assert direct_numba_factories(text) == []
    assert "from refimpl._jit import jit" in text and "@jit(" in text


def test_generated_package_files_use_the_factory():
    for name, generate in codegen.TARGETS.items():
        assert direct_numba_factories(generate()) == [], name


def _refimpl_modules():
    for info in pkgutil.walk_packages(refimpl.__path__, "refimpl."):
        if not info.name.endswith("__main__"):
            yield importlib.import_module(info.name)


def _package_dispatchers() -> dict:
    dispatchers = {}
    for module in _refimpl_modules():
        for name, value in vars(module).items():
            if isinstance(value, numba.core.registry.CPUDispatcher) and value.py_func.__module__ == module.__name__:
                dispatchers[f"{module.__name__}.{name}"] = value
    return dispatchers


def test_every_dispatcher_of_the_package_was_made_by_the_factory():
    dispatchers = _package_dispatchers()
    assert "refimpl.engine.float_kernels.stem" in dispatchers and "refimpl.kernels.fma._fma_arrays" in dispatchers
    strays = sorted(name for name, d in dispatchers.items() if not _jit.compiled_here(d))
    assert strays == []
    assert not _jit.compiled_here(numba.njit(lambda x: x)), "the check can tell the two apart"


def test_no_dispatcher_of_the_package_is_a_closure():
    # Numba keys a closure's cache entry by its pickled cells, and a pickled dispatcher carries a
    # per-process id: refimpl.measure's kernels, closures over the dtype's evaluators, missed the
    # cache in every process (tests/test_kernel_cache.py checks that one directly).
    dispatchers = _package_dispatchers()
    assert "refimpl._numba_ops.measure_f64" in dispatchers
    assert sorted(name for name, d in dispatchers.items() if d.py_func.__closure__) == []

    def make(f):
        return _jit.jit(lambda x: f(x))

    assert make(dispatchers["refimpl._numba_ops.measure_f64"]).py_func.__closure__, "the check sees a closure"


def _recorder(seen: list):
    """A kernel body that appends Numba's vectorizer settings to ``seen`` while it compiles (a new
    intrinsic each time: Numba types one only once)."""

    @intrinsic
    def record(typingctx):
        seen.append((numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE))

        def codegen(context, builder, signature, args):
            return context.get_dummy_value()

        return types.none(), codegen

    def kernel():
        record()

    return kernel


@pytest.mark.skipif(any(v in os.environ for v in VECTORIZER_ENV), reason="the user set Numba's vectorizers")
@pytest.mark.parametrize("loop_vectorize", [False, True])
def test_a_kernel_compiles_with_the_packages_vectorizers_and_numbas_come_back(monkeypatch, loop_vectorize):
    monkeypatch.setattr(numba.config, "SLP_VECTORIZE", 0)  # Numba's defaults, as other code has them
    monkeypatch.setattr(numba.config, "LOOP_VECTORIZE", 1)
    seen = []
    _jit.jit(cache=False, loop_vectorize=loop_vectorize)(_recorder(seen))()
    assert seen == [(1, int(loop_vectorize))]
    assert (numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE) == (0, 1)
    numba.njit(_recorder(seen))()
    assert seen[1:] == [(0, 1)], "a plain numba.njit compiles with the settings it finds"


def test_numbas_settings_come_back_after_a_failed_compile(monkeypatch):
    monkeypatch.setattr(numba.config, "SLP_VECTORIZE", 0)
    monkeypatch.setattr(numba.config, "LOOP_VECTORIZE", 1)
    with pytest.raises(numba.core.errors.TypingError):
        _jit.jit(cache=False)(lambda x: x.no_such_attribute)(1.0)
    assert (numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE) == (0, 1)


def _add(x, y, out):
    for i in range(out.shape[0]):
        out[i] = x[i] + y[i]


def _vector_ops(kernel) -> int:
    x = np.ones(64, np.float32)
    kernel(x, x, np.empty_like(x))
    return len(re.findall(r"fadd <\d+ x float>", kernel.inspect_llvm(kernel.signatures[0])))


@pytest.mark.skipif(any(v in os.environ for v in VECTORIZER_ENV), reason="the user set Numba's vectorizers")
def test_a_plain_loop_vectorizes_only_where_the_kernel_asks_and_in_other_numba_code():
    assert _vector_ops(_jit.jit(cache=False)(_add)) == 0, "package kernels keep the loop vectorizer off"
    assert _vector_ops(_jit.jit(cache=False, loop_vectorize=True)(_add)) > 0
    assert _vector_ops(numba.njit(_add)) > 0, "other Numba code keeps Numba's default (loop vectorizer on)"


def test_importing_refimpl_leaves_numbas_vectorizer_settings_alone(tmp_path):
    script = ("import numba\nbefore = (numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE)\n"
              "import refimpl, refimpl.engine\n"
              "print(before == (numba.config.SLP_VECTORIZE, numba.config.LOOP_VECTORIZE))\n")
    env = {k: v for k, v in os.environ.items() if k not in VECTORIZER_ENV}
    env["BNN_MEASURE_CACHE"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-c", script], cwd=PACKAGE.parent, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]


def test_the_package_stamp_covers_subpackages(tmp_path):
    (tmp_path / "kernels" / "deep").mkdir(parents=True)
    (tmp_path / "top.py").write_text("x = 1\n")
    nested = tmp_path / "kernels" / "deep" / "tile.py"
    nested.write_text("y = 1\n")
    (tmp_path / "kernels" / "notes.txt").write_text("not a source\n")
    first = _jit.package_stamp(tmp_path)
    (tmp_path / "kernels" / "notes.txt").write_text("still not a source\n")
    assert _jit.package_stamp(tmp_path) == first
    nested.write_text("y = 2\n")
    assert _jit.package_stamp(tmp_path) != first
