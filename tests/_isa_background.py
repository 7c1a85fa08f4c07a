"""The forced-path probes (``tests/_isa_probe.py``), started once per test session in the background.

A probe for a path other than the host's compiles the whole counts API for that target, 40-70 s
of one core on the 2-core CI host, and nothing else in the suite needs that compile. Run inside
the test that asks, it was the suite's longest test and its tail (the other worker idle). So
``tests/conftest.py`` starts one low-priority runner at session start that probes every lower
path in turn while the suite fills the cores' idle time (tests waiting on their subprocesses);
the tests of ``test_isa_paths.py`` wait for the runner's result files, never for a sleep.
Without the runner (a single test run by node id, say) the test probes synchronously.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = os.path.join(ROOT, "tests", "_isa_probe.py")
FOLDER_VARIABLE = "REFIMPL_TEST_ISA_PROBES"  # the runner's folder and pid, for xdist workers too
WAIT_LIMIT_S = 1800.0


def probe_environment(path: str) -> dict[str, str]:
    from refimpl import isa

    env = {**os.environ, **isa.forced_environment(path)}
    env.pop("NUMBA_CPU_NAME", None)
    env.pop("NUMBA_CPU_FEATURES", None)
    env.pop(FOLDER_VARIABLE, None)
    return env


def run_probe(path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, PROBE], capture_output=True, text=True, env=probe_environment(path),
                          cwd=ROOT)


def _write_atomically(name: str, text: str) -> None:
    with open(name + ".part", "w") as f:
        f.write(text)
    os.replace(name + ".part", name)


def runner_main(folder: str, paths: list[str]) -> None:
    """Probe each path in turn, at low priority; ``PATH.result`` appears when its probe ends."""
    os.nice(5)  # below the tests, so their idle time is what it mostly takes
    for path in paths:
        r = run_probe(path)
        _write_atomically(os.path.join(folder, f"{path}.result"),
                          json.dumps({"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr[-4000:]}))


def start(folder: str, paths: list[str]) -> subprocess.Popen:
    code = f"import sys; sys.path.insert(0, {os.path.join(ROOT, 'tests')!r}); import _isa_background as b; " \
           f"b.runner_main({folder!r}, {paths!r})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                            start_new_session=True)  # its own group: stopped with its probe at session end


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def scheduled_result(path: str) -> dict | None:
    """The background probe of ``path``, waited for; None when no runner was started for it."""
    setting = os.environ.get(FOLDER_VARIABLE)
    if not setting:
        return None
    folder, pid, paths = setting.split(os.pathsep, 2)
    if path not in paths.split(","):
        return None
    result = os.path.join(folder, f"{path}.result")
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not os.path.exists(result):
        # The conftest reaps the runner, so a runner that died leaves no pid behind.
        assert _alive(int(pid)), f"the background probe runner (pid {pid}) ended without a result for {path}"
        assert time.monotonic() < deadline, f"no result for {path} from the background probe runner in {WAIT_LIMIT_S} s"
        time.sleep(0.5)
    with open(result) as f:
        return json.load(f)
