"""``python -m bnn.search``: runs the search's command line (bnn.search.cli.main)."""
import sys

from .cli import main

sys.exit(main())
