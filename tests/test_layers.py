"""refimpl's layers (refimpl/__init__.py): the algebra at the top imports no layer, the kernels
import neither the engine nor a generator, and of the runtime only the engine's epilogue loader
imports a template (it generates at run time)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import refimpl

PACKAGE = Path(refimpl.__file__).resolve().parent
ALGEBRA = ("operators.py", "genome.py", "formula.py", "measure.py")


def imported_modules(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` (a file of refimpl) imports, relative imports resolved."""
    package = ["refimpl", *path.relative_to(PACKAGE).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return found


def _sources(folder: str) -> list[Path]:
    return sorted(p for p in (PACKAGE / folder).glob("*.py"))


def test_the_scanner_resolves_relative_imports():
    engine_file = PACKAGE / "engine" / "epilogue.py"
    names = imported_modules(engine_file)
    assert "refimpl.codegen.epilogue_template" in names and "refimpl.genome" in names


@pytest.mark.parametrize("name", ALGEBRA)
def test_the_algebra_imports_no_layer(name):
    layers = ("refimpl.kernels", "refimpl.engine", "refimpl.codegen")
    hits = [m for m in imported_modules(PACKAGE / name) if m.startswith(layers)]
    assert hits == [], f"refimpl/{name} imports {hits}"


def test_the_kernels_import_neither_the_engine_nor_a_generator():
    for path in _sources("kernels"):
        hits = [m for m in imported_modules(path) if m.startswith(("refimpl.engine", "refimpl.codegen"))]
        assert hits == [], f"{path.relative_to(PACKAGE)} imports {hits}"


def test_only_the_epilogue_loader_imports_a_template():
    importers = sorted(str(p.relative_to(PACKAGE)) for p in _sources("engine") + _sources("kernels") + _sources(".")
                       if any(m.startswith("refimpl.codegen") for m in imported_modules(p)))
    assert importers == ["engine/epilogue.py"]
