"""A command line's ``main(argv)`` run in the test's own process, as ``python -m`` would run it.

A fresh interpreter costs 1.5-4 s (Python, torch, refimpl, Numba's cache); most command-line
properties do not need one. ``run_main`` returns what ``subprocess.run`` would (exit status,
stdout, stderr), so a test's assertions read the same either way:

* the exit status is ``main``'s return value, or the code of the ``SystemExit`` it raised
  (argparse, ``--help``); any other exception propagates and fails the test, as the traceback
  it would print from ``python -m`` must;
* stdout and stderr are what ``main`` printed, plus on stderr one line per warning the default
  warning filters of a plain ``python -m`` would have shown (pytest would otherwise swallow them,
  and they would break "one line on stderr");
* Numba's and torch's thread counts are put back (``refimpl.infer --threads`` sets Numba's).

Properties that need a process of their own stay in subprocesses: "never imports torch", signals,
kills and resumes across processes, locks held by another process, forced ISA paths.
"""
from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import warnings

# What CPython's default filters hide outside __main__ (the warnings module's documentation).
_HIDDEN = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def _thread_counts():
    saved = []
    if "numba" in sys.modules:
        numba = sys.modules["numba"]
        saved.append((numba.set_num_threads, numba.get_num_threads()))
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        saved.append((torch.set_num_threads, torch.get_num_threads()))
    return saved


def run_main(main, *args) -> subprocess.CompletedProcess:
    """``main([str(a) for a in args])`` with its exit status, stdout and stderr, in this process."""
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    threads = _thread_counts()
    try:
        with warnings.catch_warnings(record=True) as caught, \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
    finally:
        for set_threads, n in threads:
            set_threads(n)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed to stderr, status 1
        err.write(f"{code}\n")
        code = 1
    for w in caught:
        if not issubclass(w.category, _HIDDEN):
            err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno).rstrip("\n") + "\n")
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
