"""The comparison rule itself must be able to fail (verify/tolerance.py)."""
from __future__ import annotations

import numpy as np

from verify.tolerance import ULPS, _box_bound, specials_match, ulp, violations


def test_rule_two_accepts_ulps_and_rejects_more():
    r = np.array([1.0, 3.0, 1e-30], dtype=np.float32)
    tol = ULPS * ulp(r, np.float32)
    near = r + (ULPS - 1) * ulp(r, np.float32)
    far = r + (ULPS + 1) * ulp(r, np.float32)
    assert not violations(near, r, tol).any()
    assert violations(far, r, tol).all()


def test_special_values_must_match_exactly():
    r = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert specials_match(r, r).all()
    assert not specials_match(np.array([1.0, np.inf, np.inf, 1.0]), r)[[0, 2]].any()
    assert violations(np.array([np.nan, -np.inf, -np.inf, np.nan]), r, np.full(4, 1e9))[[1, 3]].all()


def test_box_bound_is_the_forward_error_of_the_operator():
    # x - y with operands off by 1e-3 each: the change over the box is 2e-3.
    bound, singular = _box_bound(1, np.array([5.0]), np.array([2.0]), np.array([1e-3]), np.array([1e-3]), np.float64)
    assert np.isclose(bound[0], 2e-3) and not singular[0]
    # Identical operands: no propagated error at all.
    bound, _ = _box_bound(4, np.array([5.0]), np.array([2.0]), np.zeros(1), np.zeros(1), np.float64)
    assert bound[0] == 0.0


def test_box_reaching_a_pole_is_singular():
    # x / y with y within its own error of 0: no finite bound exists; the element is relaxed.
    _, singular = _box_bound(4, np.array([1.0]), np.array([0.5]), np.array([0.0]), np.array([0.5]), np.float64)
    assert singular[0]
    _, singular = _box_bound(4, np.array([1.0]), np.array([0.5]), np.array([0.0]), np.array([0.25]), np.float64)
    assert not singular[0]
