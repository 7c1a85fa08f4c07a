"""Byte-compile this interpreter's site-packages (installed with `pip install --no-compile`).

    python .ci/byte_compile.py           # every package, a process per core
    python .ci/byte_compile.py --early   # the packages there now, one process: beside the next pip install

pip writes the same .pyc files in one process. Here the packages pip installed first (torch and
what it brings, 40% of the source) compile on one core while pip installs the extras on the other,
and the rest on both cores afterwards; a file whose .pyc is current is skipped. As pip does, a
file that does not compile (torch ships one in Python 3.12 syntax) is skipped. The libraries' own
test folders (2,700 of 13,000 files) are skipped: the suite never imports them.
"""
import compileall
import os
import re
import sys
import sysconfig

SITE = sysconfig.get_paths()["purelib"]
TESTS = re.compile(r"[/\\]tests?[/\\]")

if sys.argv[1:] == ["--early"]:
    # Only what exists now: the folders the next install writes are left to the final pass.
    for entry in sorted(os.listdir(SITE)):
        path = os.path.join(SITE, entry)
        if os.path.isdir(path):
            compileall.compile_dir(path, quiet=2, workers=1, rx=TESTS)
        elif entry.endswith(".py"):
            compileall.compile_file(path, quiet=2)
else:
    compileall.compile_dir(SITE, quiet=2, workers=0, rx=TESTS)
