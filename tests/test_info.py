"""``python -m refimpl.info`` reports the kernel path, how it was chosen, and the environment.

In this process (whatever path the suite runs with) and in a subprocess with ``REFIMPL_ISA=avx2``
forced, through the real command line; the subprocess also shows that torch is never imported.
"""
import json
import os
import platform
import re
import subprocess
import sys

import numba
import numpy as np
import pytest

from refimpl import info, isa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = {"cpu_model", "cores", "usable_cores", "architecture", "isa_path", "isa_host_path", "isa_executable_paths",
        "isa_forced", "isa_chosen_by", "numba_cpu_name", "project", "python", "numpy", "numba", "llvmlite", "numba_threads",
        "numba_threading_layer", "kernel_cache"}


def _run(env_update: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("REFIMPL_ISA", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    env.update(env_update)
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "refimpl.info", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300, check=False)


def test_in_process_fields_describe_this_interpreter_and_cpu(capsys):
    assert info.main(["--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == KEYS
    assert got["architecture"] == platform.machine()
    assert got["cores"] == os.cpu_count() and 1 <= got["usable_cores"] <= got["cores"]
    assert (got["numpy"], got["numba"], got["python"]) == (np.__version__, numba.__version__,
                                                           platform.python_version())
    assert got["numba_threads"] == numba.config.NUMBA_NUM_THREADS
    assert got["isa_executable_paths"][-1] == "portable"
    assert set(got["isa_executable_paths"]) <= set(isa.PATHS)
    assert got["isa_path"] in got["isa_executable_paths"] and got["isa_host_path"] == got["isa_executable_paths"][0]
    forced = os.environ.get("REFIMPL_ISA", "").strip().lower() not in ("", "host")
    assert got["isa_forced"] is forced
    if forced:
        assert got["isa_path"] == os.environ["REFIMPL_ISA"].strip().lower()
    assert os.path.isdir(got["kernel_cache"])
    # the installed version, and in a git checkout the commit a bug report needs
    from importlib import metadata

    assert got["project"].startswith(metadata.version("bnn-measure-search"))
    if os.path.isdir(os.path.join(ROOT, ".git")):
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        commit = got["project"].split("(commit ", 1)[1].rstrip(")")
        assert len(commit) >= 7 and head.startswith(commit)


def test_the_table_names_the_path_and_how_it_was_chosen(capsys):
    assert info.main([]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^kernel path\s+{re.escape(isa.current_path())} \(", out, re.MULTILINE)
    assert "numba " + numba.__version__ in out


def test_forced_avx2_in_a_subprocess_is_reported_as_forced_and_never_imports_torch():
    r = _run({"REFIMPL_ISA": "avx2"}, "--json")
    if "avx2" not in isa.executable_paths():  # e.g. ARM64: the forced path is refused, naming the paths it has
        assert r.returncode != 0 and "avx2" in r.stderr and "portable" in r.stderr
        return
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["isa_path"], got["isa_forced"], got["isa_chosen_by"]) == ("avx2", True, "REFIMPL_ISA")
    assert got["numba_cpu_name"] == "haswell"  # the LLVM CPU the avx2 path compiles for
    assert got["isa_host_path"] == isa.host_path()
    assert not re.search(r"\|\s+torch(\.|$)", r.stderr, re.MULTILINE), "refimpl.info imported torch"


def test_unforced_subprocess_takes_the_hosts_best_path():
    r = _run({}, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["isa_path"], got["isa_forced"], got["isa_chosen_by"]) == (isa.host_path(), False, "host")


def test_a_bad_option_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        info.main(["--bogus"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["error: unrecognized arguments: --bogus"]


def test_refimpl_infer_json_carries_the_kernel_path(tmp_path, capsys):
    from _tiny_bnn import model_bytes, tiny_model

    from refimpl.engine import infer

    model = tmp_path / "tiny.bnn"
    model.write_bytes(model_bytes(*tiny_model()))
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).integers(0, 17, size=(3, 8, 8, 1), dtype=np.uint8))
    assert infer.main([str(model), "--input", str(x), "--json", "--batch", "2", "--threads", "1"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["isa_path"] == isa.current_path() and summary["isa_path"] in isa.PATHS
