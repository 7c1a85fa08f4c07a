"""docs/ and the code stay in step: every reference resolves, the tables match the code's tables."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from refimpl import BINARY, UNARY, Genome
from refimpl.genome import CLASSIC_MEASURES, PAPER_MEASURES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DESIGN = DOCS / "design.md"
CODE_DIRS = ("refimpl", "bnn", "tests", "verify", "bench")
# "docs/design.md section 6", "docs/design.md sections 2, 3 and 8"
SECTION_REF = re.compile(r"docs/design\.md sections? (\d+(?:(?:, | and | or )\d+)*)")
# References to the pages the project had outside the repository, which users cannot see.
STALE = (re.compile(r"\bSPEC\b"), re.compile(r"PERFORMANCE\.md"), re.compile(r"shared/"))


def _sources() -> list[Path]:
    files = [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py")) if "__pycache__" not in p.parts]
    return [p for p in files if p.resolve() != Path(__file__).resolve()]


def _numbers(text: str) -> list[int]:
    return [int(v) for v in re.findall(r"\d+", text)]


def _headings(path: Path) -> dict[int, str]:
    """``{N: title}`` of the ``## N. Title`` headings of a page."""
    return {int(m[1]): m[2] for m in re.finditer(r"^## (\d+)\. (.+)$", path.read_text(), re.MULTILINE)}


def _section(number: int) -> str:
    """The text of design.md section ``number``, up to the next ``## `` heading."""
    text = DESIGN.read_text()
    start = re.search(rf"^## {number}\. .*$", text, re.MULTILINE).end()
    end = re.search(r"^## ", text[start:], re.MULTILINE)
    return text[start:start + end.start()] if end else text[start:]


def _table_rows(text: str, header: str) -> list[list[str]]:
    """Cells of the markdown table whose header line is ``header``."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line == header)
    rows = []
    for line in lines[first + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _code(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), f"expected a `code` cell, got {cell!r}"
    return cell[1:-1]


def test_design_sections_are_numbered_one_to_eleven_in_order():
    text = DESIGN.read_text()
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", text, re.MULTILINE)]
    assert numbers == list(range(1, 12))
    titles = _headings(DESIGN)
    assert titles[1] == "Bits and counts" and titles[2] == "The measure graph" and titles[10] == "The .bnn file format"


def test_every_design_reference_in_the_code_names_an_existing_section():
    sections = set(_headings(DESIGN))
    seen = 0
    for path in _sources():
        for m in SECTION_REF.finditer(path.read_text()):
            for n in _numbers(m[1]):
                seen += 1
                assert n in sections, f"{path.relative_to(ROOT)}: '{m[0]}' names no heading '## {n}.' in docs/design.md"
    assert seen > 0  # the pattern still matches how the code cites the page


def test_every_docs_page_the_code_names_exists():
    for path in _sources():
        for page in re.findall(r"docs/([\w.-]+\.md)", path.read_text()):
            assert (DOCS / page).is_file(), f"{path.relative_to(ROOT)} names docs/{page}, which does not exist"


def test_no_reference_to_pages_outside_the_repository_remains():
    for path in _sources():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for pattern in STALE:
                assert not pattern.search(line), (
                    f"{path.relative_to(ROOT)}:{n} cites a page users cannot see; point it at docs/: {line.strip()}"
                )


def test_section_references_inside_the_docs_resolve():
    sections = set(_headings(DESIGN))
    for page in DOCS.glob("*.md"):
        for m in re.finditer(r"\bsections? (\d+(?:(?:, | and | or )\d+)*)", page.read_text()):
            for n in _numbers(m[1]):
                assert n in sections, f"docs/{page.name}: '{m[0]}' names no section of design.md"


def test_files_the_docs_name_exist():
    # Backticked repository paths: the docs must follow the tree when files move.
    pattern = re.compile(r"`((?:refimpl|bnn|verify|tests|bench|docs)/[\w./-]*\w)`")
    for page in list(DOCS.glob("*.md")) + [ROOT / "README.md"]:
        for rel in pattern.findall(page.read_text()):
            assert (ROOT / rel).exists(), f"{page.relative_to(ROOT)} names `{rel}`, which is not in the tree"


def test_docs_index_links_resolve():
    def slug(title: str) -> str:  # GitHub's heading anchors
        return re.sub(r"[^\w\- ]", "", f"{title}".lower()).replace(" ", "-")

    anchors = {slug(f"{n}. {t}") for n, t in _headings(DESIGN).items()}
    index = (DOCS / "README.md").read_text()
    links = re.findall(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)", index)
    assert {page for page, _ in links} == {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    for page, anchor in links:
        assert (DOCS / page).is_file()
        if anchor:
            assert anchor in anchors, f"docs/README.md links {page}#{anchor}, which is no heading"


def test_unary_table_matches_the_operator_table():
    rows = _table_rows(_section(2), "| code | name | formula | alpha at start |")
    got = [(int(code), name, _code(formula), float(alpha) if alpha else None) for code, name, formula, alpha in rows]
    assert got == [(op.code, op.name, op.formula, op.alpha_init) for op in UNARY]


def test_binary_table_matches_the_operator_table():
    rows = _table_rows(_section(2), "| code | name | formula |")
    got = [(int(code), name, _code(formula)) for code, name, formula in rows]
    assert got == [(op.code, op.name, op.formula) for op in BINARY]


def test_paper_measure_table_matches_the_registered_genomes():
    rows = _table_rows(_section(4), "| name | a' | d' | b' | c' | f(a', d', b', c') | genome | `Genome.formula()` |")
    assert [r[0] for r in rows] == list(PAPER_MEASURES)
    for name, *_, genome, formula in rows:
        assert _code(genome) == PAPER_MEASURES[name], name
        assert _code(formula) == Genome.parse(name).formula(), name


def test_classic_measure_table_matches_the_registered_genomes():
    rows = _table_rows(_section(4), "| name | meaning | genome | `Genome.formula()` |")
    assert [r[0] for r in rows] == list(CLASSIC_MEASURES)
    for name, _, genome, formula in rows:
        assert _code(genome) == CLASSIC_MEASURES[name], name
        assert _code(formula) == Genome.parse(name).formula(), name


@pytest.mark.parametrize("page", ["docs/design.md", "docs/performance.md"])
def test_readme_links_the_docs(page):
    readme = (ROOT / "README.md").read_text()
    assert f"]({page})" in readme, f"README.md does not link {page}"
    layout = readme[readme.index("## Layout"):]
    assert "`docs/`" in layout.split("\n## ")[0], "README.md's layout table does not list docs/"


# The README's layout table: every path it names exists, every code folder is in it.
LAYOUT_HEADER = "| path | what |"
TOP_DIRS = ("refimpl", "bnn", "verify", "tests", "bench", "docs")
CODE_FOLDERS = ("refimpl", "bnn", "verify", "bench")


def _ticks(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def layout_problems(readme: str, root: Path = ROOT) -> list[str]:
    """What the layout table gets wrong about the tree at ``root``: names of missing files, folders it lacks.

    A row's first cell is a path and, after it, names in the same folder (`bnn/settings.py`, `data.py`);
    the other cells' `.py` names are relative to that folder or one above it (`kernels/_tiles.py`).
    """
    problems, rows_named, named = [], set(), set()
    for cells in _table_rows(readme, LAYOUT_HEADER):
        first, *rest = _ticks(cells[0])
        base = root / first
        folder = base if first.endswith("/") else base.parent
        for path in [base] + [folder / name for name in rest]:
            rows_named.add(path)
            if not path.exists():
                problems.append(f"names `{path.relative_to(root).as_posix()}`, which is not in the tree")
        for name in (t for cell in cells[1:] for t in _ticks(cell) if t.endswith((".py", "/"))):
            if name.split("/")[0] in TOP_DIRS:
                candidates = [root / name]
            else:
                candidates = [d / name for d in (folder, *folder.parents) if root in (d, *d.parents)]
            named.update(c for c in candidates if c.exists())
            if not any(c.exists() for c in candidates):
                problems.append(f"the {first} row names `{name}`, which is not in the tree")
    named |= rows_named
    for top in CODE_FOLDERS:
        if not any(root / top in (p, *p.parents) for p in named):
            problems.append(f"lists nothing in {top}/")
        subfolders = {p.parent for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts} - {root / top}
        for sub in sorted(subfolders):
            if not any(p == sub or p.parent == sub for p in rows_named):
                problems.append(f"has no row for {sub.relative_to(root).as_posix()}/")
    return problems


def test_readme_layout_table_matches_the_tree():
    assert layout_problems((ROOT / "README.md").read_text()) == []


def test_layout_check_flags_a_missing_folder_row_and_a_name_not_in_the_tree():
    readme = (ROOT / "README.md").read_text()
    engine_row = next(line for line in readme.splitlines() if line.startswith("| `refimpl/engine/` |"))
    broken = readme.replace(engine_row + "\n", "").replace(
        "| `bnn/reproduce.py` |", "| `bnn/reproduce.py`, `gone.py` | `kernels/nowhere.py` and"
    )
    assert layout_problems(broken) == [
        "names `bnn/gone.py`, which is not in the tree",
        "the bnn/reproduce.py row names `kernels/nowhere.py`, which is not in the tree",
        "has no row for refimpl/engine/",
    ]
