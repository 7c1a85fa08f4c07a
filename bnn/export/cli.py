"""``python -m bnn.export CHECKPOINT -o MODEL.bnn``: a ``bnn.train`` checkpoint to the engine's file.

The command line only; it imports torch (3-7 s of CPU) once its arguments are parsed, so ``--help``
and a missing argument never pay it. The export itself is bnn/export/model_file.py.
"""
from __future__ import annotations

import os
import shlex
import sys

from refimpl.cli import OneLineParser, one_line


def main(argv=None) -> int:
    """``python -m bnn.export CHECKPOINT -o OUT``: 0, or 2 with one ``error:`` line."""
    p = OneLineParser(prog="python -m bnn.export",
                description="Export a bnn.train checkpoint to a .bnn file for the CPU engine (python -m refimpl.infer).")
    p.add_argument("checkpoint", help="checkpoint.pt written by python -m bnn.train")
    p.add_argument("-o", "--out", required=True, help="output file, e.g. MODEL.bnn")
    args = p.parse_args(argv)
    from .model_file import export_checkpoint  # torch: once the arguments are parsed

    try:
        meta = export_checkpoint(args.checkpoint, args.out)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {meta['arch']} with genome {meta['genome']}, {meta['downsample']} downsampling, "
          f"{meta['counts']} counts, "
          f"{size / 1e6:.2f} MB")
    print(f"run it: python -m refimpl.infer {shlex.quote(args.out)} --dataset NAME (or --input X.npy); its layers and "
          f"costs: python -m refimpl.infer {shlex.quote(args.out)} --summary")
    return 0
