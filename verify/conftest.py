"""Hypothesis profiles, and the docs/design.md section 5 report of relaxed elements."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# Passive OpenMP waiting when test processes share the cores: tests/conftest.py says why.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# deadline=None: the first example of a test pays Numba compile time (seconds).
settings.register_profile(
    "dev", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
# CI runs must be repeatable: the same examples every run.
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_terminal_summary(terminalreporter):
    """Report how many composed-genome elements rule 4 relaxed and the largest rule-2 deviation."""
    from verify.tolerance import RELAXED

    if RELAXED["elements"]:
        terminalreporter.write_line(
            f"docs/design.md section 5: relaxed {RELAXED['relaxed']} of {RELAXED['elements']} composed-genome elements "
            "(within rounding of a singularity); largest single-operator deviation "
            f"{RELAXED['max_ulps']:.1f} ulp"
        )
