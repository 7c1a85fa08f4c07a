"""``python -m refimpl.codegen [--check]``: write the generated files, or check they are fresh."""
from . import main

raise SystemExit(main())
