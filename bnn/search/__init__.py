"""The paper's genetic-algorithm search over similarity measures (docs/design.md section 7).

``python -m bnn.search --help`` for the command line. The pieces, each usable alone:
``variation`` (the GA's variation operators: selection, crossover, mutation on 7-gene arrays with
an explicit Generator),
``ga`` (Algorithm 1 as a propose/tell state machine), ``fitness`` (cache, functional equivalence,
screening, the worker that trains), ``journal`` (append-only JSONL), ``evaluators`` (serial,
local processes, Ray), ``loop`` (the search loop and resume), ``report`` (leaderboard, plot).
"""
from .ga import BASELINE, GeneticSearch, Thresholds
from .loop import Search, SearchConfig

__all__ = ["BASELINE", "GeneticSearch", "Search", "SearchConfig", "Thresholds"]
