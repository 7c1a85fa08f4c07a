"""The inference install (pyproject's base dependencies; README, "Inference only"): refimpl imports
nothing that the base does not install, and bnn without torch says in one line what to install.

.ci/inference-only proves the same in a real venv without torch; these run in every suite.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE = {"numpy", "numba", "safetensors"}
# Numba's own code generator, imported by the kernels; scikit-learn only for the digits data set,
# whose reader says in one line to install it (refimpl/datasets/digits.py).
BEYOND_BASE = {"llvmlite", "sklearn"}


def _top_level_imports(root: Path) -> set[str]:
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found.add(node.module.split(".")[0])
    return found


def test_the_base_dependencies_are_refimpls_and_torch_is_an_extra():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[; ]", d)[0] for d in project["dependencies"]}
    assert names == BASE
    assert any(d.startswith("torch") for d in project["optional-dependencies"]["train"])


def test_refimpl_imports_nothing_the_base_install_lacks():
    third_party = _top_level_imports(ROOT / "refimpl") - set(sys.stdlib_module_names) - {"refimpl", "__future__"}
    assert third_party <= BASE | BEYOND_BASE, sorted(third_party - BASE - BEYOND_BASE)


def _without_torch(tmp_path, *args):
    # This environment less torch: every entry of its site-packages linked into one folder but
    # torch's, and Python started without its site (-S) on that folder and the checkout.
    site = tmp_path / "site"
    site.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith("torch"):
            (site / entry.name).symlink_to(entry)
    env = {**os.environ, "PYTHONPATH": str(site)}
    look = subprocess.run([sys.executable, "-S", "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert look.stdout == "None\n", look  # torch is not there to be found
    return subprocess.run([sys.executable, "-S", *args], cwd=ROOT, env=env, capture_output=True, text=True)


def test_a_bnn_command_without_torch_is_one_line_naming_the_install(tmp_path):
    r = _without_torch(tmp_path, "-m", "bnn.train", "--epochs", "1")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert 'pip install -e ".[train]"' in r.stderr and r.stdout == ""


def test_importing_bnn_without_torch_names_the_install(tmp_path):
    r = _without_torch(tmp_path, "-c", "import bnn")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("ModuleNotFoundError: bnn (training, search, export) needs PyTorch")
