"""The layers of the code. refimpl's (refimpl/__init__.py): the algebra at the top imports no layer,
the kernels import neither the engine nor a generator, and of the runtime only the engine's
epilogue loader imports a template (it generates at run time). bnn's (bnn/__init__.py, RANKS
below): each package imports only packages below it, and no private name of another. And no
module of bnn/, refimpl/ or bench/ is in an import cycle."""
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


# -- every module of bnn/, refimpl/ and bench/: no import cycle, no upward import ------------------

ROOT = PACKAGE.parent
# bnn's packages from the bottom up; a module may import its own unit and units of lower rank
# only (a lazy import inside a function counts too: it is an edge all the same). refimpl is below
# all of bnn. bnn.gpu (Triton kernels of the differentiable path) sits above bnn.nn, below training.
RANKS = [
    ("refimpl",),
    ("bnn._requires",),  # imported first by bnn: torch or one line saying how to install it
    ("bnn.common", "bnn.settings", "bnn.paper_results", "bnn.data"),
    ("bnn.nn",),
    ("bnn.gpu",),
    ("bnn.train",),
    ("bnn.search", "bnn.evidence"),
    ("bnn.diagnose", "bnn.export", "bnn.reproduce"),
    ("bnn._moved",),  # the old import paths: names only, it imports none of them
    ("bnn",),
    ("bnn.__main__",),  # python -m bnn: the index of every command
]
RANK = {unit: r for r, units in enumerate(RANKS) for unit in units}


def module_files() -> dict[str, Path]:
    """``{module name: file}`` of bnn/, refimpl/ and bench/ (bench's scripts import each other by stem)."""
    found = {}
    for top in ("bnn", "refimpl", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if top == "bench":
                parts = parts[1:]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def import_edges(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports: ``from P import n``
    names P.n where that is a module, else P; ``import a.b`` names a.b."""
    is_package = path.name == "__init__.py"
    package = name.split(".") if is_package else name.split(".")[:-1]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            edges |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in known:
                    edges.add(sub)
                elif module in known:
                    edges.add(module)
    edges.discard(name)
    return edges


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: import_edges(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unit(name: str) -> str:
    """The package (or top-level module) of bnn a module belongs to; refimpl is one unit."""
    parts = name.split(".")
    if parts[0] == "refimpl":
        return "refimpl"
    return ".".join(parts[:2])


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_bnn_refimpl_or_bench_is_in_an_import_cycle():
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_package_of_bnn_has_a_rank():
    units = {unit(n) for n in import_graph() if n.split(".")[0] in ("bnn", "refimpl")}
    assert sorted(units - set(RANK)) == [], "declare each new package of bnn in RANKS"


def against_layers(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import of bnn or refimpl into a unit not below its own."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if m.split(".")[0] in ("bnn", "refimpl") and unit(m) != unit(t)
                  and not RANK.get(unit(t), -1) < RANK.get(unit(m), -1))


def test_the_layer_rule_flags_an_upward_import_and_one_between_siblings():
    graph = {"bnn.nn.layers": {"bnn.settings", "bnn.train.loop"}, "bnn.evidence.grid": {"bnn.search.evaluators"},
             "bnn.search.cost": {"bnn.common.stats", "bnn.evidence.journal"}, "refimpl.genome": {"bnn.nn.measure"}}
    assert against_layers(graph) == ["bnn.evidence.grid -> bnn.search.evaluators",
                                     "bnn.nn.layers -> bnn.train.loop",
                                     "bnn.search.cost -> bnn.evidence.journal",
                                     "refimpl.genome -> bnn.nn.measure"]


def test_no_package_of_bnn_imports_one_above_it_or_beside_it():
    upward = against_layers(import_graph())
    assert upward == [], "imports against the layers (tests/test_layers.py RANKS):\n" + "\n".join(upward)


def test_no_module_takes_a_private_name_from_another_package():
    # A name with a leading underscore (or one in a private module) is its package's own business.
    files = module_files()
    hits = []
    for name, path in files.items():
        if name.split(".")[0] not in ("bnn", "refimpl"):
            continue
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.split(".")[0] not in ("bnn", "refimpl"):
                continue
            for alias in node.names:
                target = f"{module}.{alias.name}" if f"{module}.{alias.name}" in files else module
                private = alias.name.startswith("_") or any(p.startswith("_") for p in module.split("."))
                if private and unit(target) != unit(name) and target.rpartition(".")[0] != name:
                    hits.append(f"{name} takes {module}.{alias.name}")
    assert hits == [], "; ".join(hits)
