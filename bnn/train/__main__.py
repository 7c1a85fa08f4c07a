"""``python -m bnn.train``: runs the training command line (bnn.train.cli.main)."""
import sys

from .cli import main

sys.exit(main())
