"""``python -m bnn.export``: runs the export command line (bnn.export.cli.main)."""
import sys

from .cli import main

sys.exit(main())
