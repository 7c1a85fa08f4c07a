"""Old import paths of bnn's modules, from before bnn/ had packages (issue 38): each still imports,
as the very module at its new path, with a DeprecationWarning that names the new path.

``MOVED`` is the one table; ``install`` puts a finder on ``sys.meta_path`` that answers only the
names in it. ``import bnn.layers`` then gives the module object of ``bnn.nn.layers`` itself
(``is``, not a copy: a monkeypatch through either name reaches the same globals), and
``bnn.layers`` also works as an attribute. A name that moved between modules (not with its
module) is not covered: ``use_fused_measure`` is in ``bnn.nn.layers``, ``append_line`` in
``bnn.common.jsonl``, ``die_with_parent`` in ``bnn.common.liveness``.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {
    "bnn.counts": "bnn.nn.counts",
    "bnn.measure": "bnn.nn.measure",
    "bnn.measure_op": "bnn.nn.measure_op",
    "bnn.measure_fused": "bnn.nn.measure_fused",
    "bnn.layers": "bnn.nn.layers",
    "bnn.models": "bnn.nn.models",
    "bnn.train_config": "bnn.train.config",
    "bnn.train_loop": "bnn.train.loop",
    "bnn.train_files": "bnn.train.files",
    "bnn._evidence_journal": "bnn.evidence.journal",
    "bnn._evidence_report": "bnn.evidence.report",
    "bnn._diagnose_probe": "bnn.diagnose.probe",
    "bnn._diagnose_report": "bnn.diagnose.report",
    "bnn.runlock": "bnn.common.runlock",
    "bnn._stats": "bnn.common.stats",
}


def _caller_stacklevel() -> int:
    # The warning points at the user's import line: past this file, the package's __init__ and
    # importlib.import_module (warnings.warn skips the import system's frozen frames by itself).
    here = (__file__, __file__.replace("_moved.py", "__init__.py"), importlib.__file__)
    frame, level = sys._getframe(1), 1  # level 1: warn()
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<frozen importlib"):
            if name not in here:
                return level
            level += 1
        frame = frame.f_back
    return level


def warn(old: str) -> None:
    """The DeprecationWarning of an import of ``old``, naming its new path."""
    warnings.warn(f"{old} moved to {MOVED[old]} (issue 38); import {MOVED[old]}", DeprecationWarning,
                  stacklevel=_caller_stacklevel())


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        warn(spec.name)
        module = importlib.import_module(MOVED[spec.name])
        _SPECS[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        # The import system set __spec__ to the alias's spec; the module keeps its own.
        module.__spec__ = _SPECS[module.__name__]


_SPECS: dict = {}  # new module name -> its own spec, kept across the import system's rebinding


class _Package(types.ModuleType):
    # The import system binds an imported submodule on its package: an old path must not replace a
    # public name of bnn that has the same name (bnn.measure is the function, not bnn.nn.measure),
    # loaded or not yet (bnn's public names are imported on first use).
    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and f"{self.__name__}.{name}" in MOVED \
                and name in self.__dict__.get("PUBLIC", ()):
            getattr(self, name)  # the public name, imported now if it was not
            return
        super().__setattr__(name, value)


def install(package: types.ModuleType) -> None:
    """The finder on sys.meta_path (once), and ``package`` (bnn) keeping its public names (its ``PUBLIC``)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())  # first: an editable install's finder would look for the old file
    package.__class__ = _Package


def attribute(name: str):
    """``bnn.<name>`` for an old module name (bnn's ``__getattr__``): the module, with the warning."""
    old = f"bnn.{name}"
    if old not in MOVED:
        raise AttributeError(f"module 'bnn' has no attribute {name!r}")
    return importlib.import_module(old)
