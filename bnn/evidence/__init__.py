"""The evidence grid: does a searched measure beat XNOR? ``python -m bnn.evidence``.

``protocol`` (the defaults per data set), ``grid`` (the cells, the workers and the command line;
its docstring: the run folder), ``cells`` (a cell's folder and checkpoints), ``journal`` (the
grid's journal, read and checked), ``report`` (statistics per measure, results.json, results.md,
the plot).
"""
from .grid import build_results, main, plan_cells, run_grid
from .journal import GridError, read_journal
from .protocol import PROTOCOLS, REAL_MEASURES, SEEDS

__all__ = ["PROTOCOLS", "REAL_MEASURES", "SEEDS", "GridError", "build_results", "main", "plan_cells", "read_journal",
           "run_grid"]
