"""``python -m bnn.diagnose``: runs the diagnosis's command line (bnn.diagnose.cli.main)."""
import sys

from .cli import main

sys.exit(main())
