"""Why a measure diverges: ``python -m bnn.diagnose``.

``cli`` (the first training steps, exactly as ``bnn.train`` runs them, instrumented; the command
line), ``probe`` (a probe per binary layer: every value and gradient of the measure graph),
``report`` (where a value or a gradient first stops being finite, and the report).
"""
from .cli import diagnose, main

__all__ = ["diagnose", "main"]
