"""bnn needs PyTorch, which the inference install (``pip install .``: refimpl alone) leaves out.

Imported first by ``bnn/__init__.py``. It looks torch up without importing it (the import costs
3-7 s of CPU; bnn's modules import it where they use it). Without torch, ``python -m bnn.<command>``
prints one ``error:`` line naming what to install and exits with status 2 (as the commands' other
refusals); ``import bnn`` raises ``ModuleNotFoundError`` with the same words.
"""
from __future__ import annotations

import importlib.util
import sys

INSTALL = ('bnn (training, search, export) needs PyTorch, which this environment lacks: pip install -e ".[train]" '
           'in a clone, or pip install "bnn-measure-search[train]"; running exported models '
           "(python -m refimpl.infer) needs only refimpl")

if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
    # While ``python -m bnn.x`` imports the package, sys.argv[0] is "-m" (docs: sys.argv).
    if sys.argv[:1] == ["-m"]:
        print(f"error: {INSTALL}", file=sys.stderr)
        raise SystemExit(2) from None
    raise ModuleNotFoundError(INSTALL, name="torch") from None
