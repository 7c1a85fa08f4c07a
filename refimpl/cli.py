"""What every command line of the project shares, refimpl's and bnn's: bad input is one line.

``OneLineParser`` is argparse with its errors printed as one ``error: ...`` line on stderr and exit
status 2, without the usage block (``--help`` still shows it).
"""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line and exit status 2."""

    def error(self, message):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
