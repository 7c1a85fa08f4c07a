"""Why a measure diverges: ``python -m bnn.diagnose``.

``cli`` (the command line: it imports no torch before its arguments are checked), ``run`` (the
first training steps, exactly as ``bnn.train`` runs them, instrumented: ``diagnose``), ``probe``
(a probe per binary layer: every value and gradient of the measure graph), ``report`` (where a
value or a gradient first stops being finite, and the report).
"""
from .cli import main

__all__ = ["diagnose", "main"]


def __getattr__(name: str):
    if name == "diagnose":  # loads torch: only on use
        from .run import diagnose

        return diagnose
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
