"""bnn's module paths from before its packages (issue 38): each still imports, as the very module at
its new path, and warns naming that path; the commands run as ``python -m`` as before."""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import bnn
from bnn._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_and_warns_naming_it(old):
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)  # as in a fresh process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is new and module.__name__ == MOVED[old] and module.__spec__.name == MOVED[old]
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        f"{old} moved to {MOVED[old]} (issue 38); import {MOVED[old]}"]


def test_the_warning_points_at_the_importing_line():
    sys.modules.pop("bnn.layers", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from bnn.layers import BinaryConv2d  # noqa: F401
    assert [w.filename for w in caught] == [__file__]


def test_an_old_path_keeps_the_public_name_it_shadows():
    sys.modules.pop("bnn.measure", None)  # so that the import system binds it on bnn again
    with pytest.warns(DeprecationWarning, match="import bnn.nn.measure"):
        import bnn.measure  # noqa: F401  (the old module path of bnn.nn.measure)

    assert callable(bnn.measure) and bnn.measure is bnn.nn.measure.measure


def test_an_old_module_name_is_an_attribute_of_bnn():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert bnn.train_loop is importlib.import_module("bnn.train.loop")
    with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
        bnn.no_such_module  # noqa: B018


def test_the_names_bnn_train_had_are_importable_from_the_package():
    from bnn.train import TrainConfig, load_checkpoint, main, train_model
    from bnn.train.cli import main as cli_main
    from bnn.train.config import TrainConfig as config_TrainConfig
    from bnn.train.files import load_checkpoint as files_load_checkpoint
    from bnn.train.loop import train_model as loop_train_model

    assert (TrainConfig, load_checkpoint, main, train_model) == (
        config_TrainConfig, files_load_checkpoint, cli_main, loop_train_model)


def test_the_package_commands_run_as_python_m_and_torch_loads_on_first_use():
    # One process (torch is imported once): each package's __main__ as ``python -m`` runs it. First,
    # before anything uses a layer: bnn, the search's command line and its workers' module import
    # no torch (3-7 s of CPU a process that never trains); an old path (bnn.measure), imported
    # before bnn.measure was ever read, does not shadow the public function; names load on use.
    code = ("import runpy, sys, warnings\n"
            "import bnn, bnn.search.cli, bnn.search.evaluators\n"
            "print('torch' in sys.modules)\n"
            "with warnings.catch_warnings():\n"
            "    warnings.simplefilter('ignore', DeprecationWarning)\n"
            "    import bnn.measure\n"
            "from bnn import BinaryConv2d\n"
            "print('torch' in sys.modules, callable(bnn.measure), bnn.measure is bnn.nn.measure.measure,\n"
            "      BinaryConv2d.__module__, sorted(bnn.__all__) == sorted(bnn.PUBLIC), set(bnn.PUBLIC) <= set(dir(bnn)))\n"
            "for name in ('bnn.train', 'bnn.evidence', 'bnn.diagnose'):\n"
            "    sys.argv = [name, '--help']\n"
            "    try:\n"
            "        runpy.run_module(name, run_name='__main__', alter_sys=True)\n"
            "    except SystemExit as e:\n"
            "        print(name, 'exit', e.code)\n")
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["False", "True True True bnn.nn.layers True True"]
    for name in ("bnn.train", "bnn.evidence", "bnn.diagnose"):
        assert f"{name} exit 0" in r.stdout


def test_help_and_a_refused_argument_of_every_command_import_no_torch():
    # torch costs a process 3-7 s of CPU to import: a user asking a command for --help, or giving it
    # a bad number, waits for none of it. One fresh process runs each command twice, as python -m.
    code = ("import runpy, sys\n"
            "for name, bad in (('bnn.train', '--epochs=0'), ('bnn.diagnose', '--steps=0'), ('bnn.evidence', '--jobs=0'),\n"
            "                  ('bnn.search', '--population=0'), ('bnn.reproduce', '--bogus'),\n"
            "                  ('bnn.export', '--bogus')):\n"
            "    for arg in ('--help', bad):\n"
            "        sys.argv = [name, arg]\n"
            "        try:\n"
            "            runpy.run_module(name, run_name='__main__', alter_sys=True)\n"
            "        except SystemExit as e:\n"
            "            print(name, arg, e.code, 'torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if line.startswith("bnn.")]
    assert r.returncode == 0 and len(lines) == 12, (r.stdout, r.stderr)
    for line in lines:
        name, arg, code_, torch_loaded = line.split()
        assert code_ == ("0" if arg == "--help" else "2") and torch_loaded == "False", line


def test_no_code_of_the_project_imports_an_old_path():
    root = Path(bnn.__file__).resolve().parent.parent
    hits = []
    for top in ("bnn", "refimpl", "bench", "tests", "verify"):
        for path in sorted((root / top).rglob("*.py")):
            if path.name == "test_old_paths.py":
                continue
            package = list(path.relative_to(root).parent.parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = package[:len(package) - node.level + 1] if node.level else []
                    module = ".".join(base + ([node.module] if node.module else []))
                    names = [module] + [f"{module}.{a.name}" for a in node.names]
                else:
                    continue
                hits += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names if n in MOVED]
    assert hits == [], "old paths (bnn/_moved.py): " + ", ".join(hits)
