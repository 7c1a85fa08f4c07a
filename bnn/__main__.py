"""``python -m bnn``: the project's commands, one line each (each has its own ``--help``)."""
import sys

from refimpl.cli import COMMANDS as REFIMPL_COMMANDS
from refimpl.cli import command_index

COMMANDS = (
    ("bnn.train", "train one BNN with a measure (default: digits, digits_net, XNOR, CPU)"),
    ("bnn.search", "the paper's GA over measures, journaled and resumable (default: digits, CPU)"),
    ("bnn.evidence", "full-recipe trainings over seeds: does a measure beat XNOR, paired by seed"),
    ("bnn.search.cost", "where a search's time went; how its fitness ranks against an evidence grid"),
    ("bnn.search.calibrate", "which fitness design ranks measures as the full recipe does"),
    ("bnn.diagnose", "where and why a measure's training diverges"),
    ("bnn.export", "a bnn.train checkpoint to a .bnn file for the CPU engine"),
    ("bnn.reproduce", "the paper's evaluation tables, one bnn.train run per cell"),
) + REFIMPL_COMMANDS[:2]

if __name__ == "__main__":
    sys.exit(command_index("bnn", "Commands (python -m NAME --help for each):", COMMANDS, sys.argv[1:]))
