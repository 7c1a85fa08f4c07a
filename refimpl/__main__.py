"""``python -m refimpl``: the reference's commands, one line each (each has its own ``--help``); no PyTorch."""
import sys

from .cli import COMMANDS, command_index

if __name__ == "__main__":
    sys.exit(command_index("refimpl", "Commands (python -m NAME --help for each; training, search and export: "
                           "python -m bnn):", COMMANDS, sys.argv[1:]))
