"""``python -m bnn.evidence``: runs the evidence grid's command line (bnn.evidence.grid.main)."""
import sys

from .grid import main

sys.exit(main())
