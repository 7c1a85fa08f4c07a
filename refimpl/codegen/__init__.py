"""Generate the Numba source files that are mechanical expansions of something smaller.

One template module per generated file:

* ``ops_template.py`` -> ``refimpl/_numba_ops.py``: the Numba evaluator of the operator table
  (``refimpl/operators.py``);
* ``tiles_template.py`` -> ``refimpl/kernels/_tiles.py``: the register-blocked popcount tiles
  (``refimpl/kernels/blocked.py`` explains them) and the engine stem's float32 tile;
* ``pack_template.py`` -> ``refimpl/kernels/_pack.py``: the bit-packing steps of
  ``bits.pack_nchw``;
* ``epilogue_template.py``: the engine's fused epilogue of one genome, generated at run time
  into a cache folder (``refimpl/engine/epilogue.py``), not into the package; and
  ``refimpl/engine/_drivers.py``, the parallel loops that run every genome's epilogue tasks.

Run ``python -m refimpl.codegen`` after changing a template or its source; a test fails while a
generated file is stale. The files are generated (not built at import with ``exec``) because
Numba can only cache functions that live in a real source file. Sizes and function names the
runtime also needs live in ``refimpl/kernels/tiling.py``: runtime code never imports a template
(the engine's epilogue loader excepted, which generates at run time).
"""
from __future__ import annotations

import sys
from pathlib import Path

from .drivers_template import generate_drivers
from .ops_template import generate_ops
from .pack_template import generate_pack
from .tiles_template import generate_tiles

PACKAGE = Path(__file__).resolve().parent.parent

# Generated file (relative to refimpl/) -> its generator.
TARGETS = {"_numba_ops.py": generate_ops, "kernels/_tiles.py": generate_tiles, "kernels/_pack.py": generate_pack,
           "engine/_drivers.py": generate_drivers}


def main(argv: list[str] | None = None) -> int:
    """Write every generated file, or with ``--check`` exit 1 naming the stale ones."""
    from ..cli import OneLineParser

    parser = OneLineParser(prog="python -m refimpl.codegen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = parser.parse_args(argv)
    stale = []
    for name, generate in TARGETS.items():
        target, text = PACKAGE / name, generate()
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(name)
        else:
            target.write_text(text)
            print(f"wrote {target}")
    if stale:
        print(f"stale generated files: {', '.join(stale)}; run python -m refimpl.codegen", file=sys.stderr)
        return 1
    return 0
