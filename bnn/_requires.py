"""bnn needs PyTorch, which the inference install (``pip install .``: refimpl alone) leaves out.

Imported first by ``bnn/__init__.py``. Without torch, ``python -m bnn.<command>`` prints one
``error:`` line naming what to install and exits with status 2 (as the commands' other refusals);
``import bnn`` raises ``ModuleNotFoundError`` with the same words.
"""
from __future__ import annotations

import sys

INSTALL = ('bnn (training, search, export) needs PyTorch, which this environment lacks: pip install -e ".[train]" '
           'in a clone, or pip install "bnn-measure-search[train]"; running exported models '
           "(python -m refimpl.infer) needs only refimpl")

try:
    import torch  # noqa: F401
except ModuleNotFoundError as missing:
    if missing.name != "torch":
        raise  # torch is there and broken: its own traceback says how
    # While ``python -m bnn.x`` imports the package, sys.argv[0] is "-m" (docs: sys.argv).
    if sys.argv[:1] == ["-m"]:
        print(f"error: {INSTALL}", file=sys.stderr)
        raise SystemExit(2) from None
    raise ModuleNotFoundError(INSTALL, name="torch") from None
