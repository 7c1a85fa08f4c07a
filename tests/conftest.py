"""Session set-up shared by every worker: the forced-path probes start in the background.

See ``tests/_isa_background.py`` for why. Only the controller (or a run without xdist) starts
the runner, only when the run includes ``tests/test_isa_paths.py``, and only when none runs yet
(``.ci/run`` starts one during its install and exports ``REFIMPL_TEST_ISA_PROBES``).
"""
from __future__ import annotations

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
    lower = _isa_background.lower_paths()
    if not lower:
        return
    _folder = folder = tempfile.mkdtemp(prefix="isa-probes-")
    _runner = _isa_background.start(folder, lower)
    threading.Thread(target=_runner.wait, daemon=True).start()  # reaped at once: a dead runner has no pid
    os.environ[_isa_background.FOLDER_VARIABLE] = _isa_background.setting(folder, _runner, lower)


def pytest_unconfigure(config):
    if _runner is None:
        return
    try:
        os.killpg(_runner.pid, signal.SIGKILL)  # a run that stopped early (-x, -k, Ctrl-C) needs no more probes
    except ProcessLookupError:
        pass  # it had finished
    shutil.rmtree(_folder, ignore_errors=True)
