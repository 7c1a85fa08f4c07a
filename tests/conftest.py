"""Session set-up shared by every worker: the forced-path probes start in the background.

See ``tests/_isa_background.py`` for why. Only the controller (or a run without xdist) starts
the runner, and only when the run includes ``tests/test_isa_paths.py``.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import _isa_background

# Torch's OpenMP threads spin between parallel regions by default. With two xdist workers (and
# their subprocesses) on two cores, spinning threads steal the cores the other trainings need:
# a 3-epoch digits training took 160 s under such load and 37 s with passive waiting, same
# result (docs/performance.md). Set before any worker or subprocess starts; a user's value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

TESTS = Path(__file__).resolve().parent
ISA_TESTS = TESTS / "test_isa_paths.py"
_runner = None
_folder = None


def _standalone_isa():
    # refimpl/isa.py alone: importing the package here would compile kernels before workers start.
    spec = importlib.util.spec_from_file_location("_refimpl_isa_for_conftest", TESTS.parent / "refimpl" / "isa.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _selects_isa_tests(config) -> bool:
    for arg in config.args or [str(config.rootpath)]:
        target = Path(arg.split("::")[0]).resolve()
        if target == ISA_TESTS or target in ISA_TESTS.parents:
            return True
    return False


def pytest_configure(config):
    global _runner, _folder
    if hasattr(config, "workerinput") or _isa_background.FOLDER_VARIABLE in os.environ:
        return
    if not _selects_isa_tests(config):
        return
    isa = _standalone_isa()
    wanted = os.environ.get(isa.ENV, "").strip().lower()
    current = wanted if wanted in isa.PATHS else isa.host_path()
    lower = [p for p in isa.executable_paths() if p != current]
    if not lower:
        return
    _folder = folder = tempfile.mkdtemp(prefix="isa-probes-")
    _runner = _isa_background.start(folder, lower)
    threading.Thread(target=_runner.wait, daemon=True).start()  # reaped at once: a dead runner has no pid
    os.environ[_isa_background.FOLDER_VARIABLE] = os.pathsep.join([folder, str(_runner.pid), ",".join(lower)])


def pytest_unconfigure(config):
    if _runner is None:
        return
    try:
        os.killpg(_runner.pid, signal.SIGKILL)  # a run that stopped early (-x, -k, Ctrl-C) needs no more probes
    except ProcessLookupError:
        pass  # it had finished
    shutil.rmtree(_folder, ignore_errors=True)
