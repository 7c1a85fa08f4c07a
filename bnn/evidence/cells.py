"""A grid cell's run folder: where a cell in progress keeps bnn.train's checkpoint, so that a grid stopped
by a kill or the end of its machine continues the cell from its last finished epoch (a cell of the full
recipe is 15-25 minutes of one core on a 2-core host: docs/evidence.md section 5)."""
from __future__ import annotations

import os
import shutil
import stat

from refimpl.fileio import OutputError

CELLS = "cells"  # under a grid's root: the run folders of cells in progress


def cell_folder(root: str, key: str) -> str:
    """Where a cell in progress keeps its checkpoint (bnn.train's run folder), so that a grid stopped by
    a kill or a machine's end continues it from its last finished epoch; removed once it is journaled."""
    return os.path.join(root, CELLS, key.replace("/", "_"))


def check_cells(root: str) -> None:
    """Before any cell trains: refuse a cells folder, or an entry in it, that is a symbolic link or not a
    folder. Cells write their checkpoints there and the grid removes their folders; through a planted
    link that would write and delete in someone else's folder."""
    base = os.path.join(root, CELLS)
    try:
        names = os.listdir(base) if stat.S_ISDIR(os.lstat(base).st_mode) else []
    except FileNotFoundError:
        return
    for path in [base, *(os.path.join(base, name) for name in names)]:
        mode = os.lstat(path).st_mode
        if not stat.S_ISDIR(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
            raise OutputError(f"refusing to use {path}: it is {kind}, where this grid keeps the folders of cells "
                              "in progress; move it out of the root")


def earlier_run(cfg) -> tuple[float, float]:
    """(wall, CPU) seconds that earlier, interrupted runs of this cell spent up to its checkpoint."""
    from ..train import CHECKPOINT, load_checkpoint  # torch: only where a cell trains

    path = os.path.join(cfg.out_dir, CHECKPOINT) if cfg.out_dir else None
    if path is None or not os.path.isfile(path):
        return 0.0, 0.0
    try:
        last = (load_checkpoint(path).get("history") or [{}])[-1]
        return float(last.get("wall_s") or 0.0), float(last.get("cpu_s") or 0.0)
    except Exception:  # noqa: BLE001 - bnn.train refuses a bad checkpoint itself; the time is a detail
        return 0.0, 0.0


def forget_cell(root: str, key: str) -> None:
    """A journaled cell's run folder, and the cells folder once empty."""
    shutil.rmtree(cell_folder(root, key), ignore_errors=True)
    try:
        os.rmdir(os.path.join(root, CELLS))
    except OSError:
        pass  # other cells in progress, or none was ever made

