"""tests/conftest.py runs the longest tests first (SLOW_FIRST): the order is the one it says, and every
entry still names a test, so a renamed test cannot silently fall back to the end of a worker's queue."""
import pytest
from conftest import SLOW_FIRST, slow_first


def test_slow_tests_come_first_in_the_lists_order_and_the_rest_keeps_its_order():
    ids = ["a.py::x", "tests/test_search_ray.py::t1", "b.py::y", SLOW_FIRST[0] + "_case", "tests/test_search_ray.py::t2"]
    assert slow_first(ids) == [3, 1, 4, 0, 2]


def test_the_session_runs_in_that_order_and_every_entry_names_a_test(request):
    ids = [item.nodeid for item in request.session.items]
    if not any(i.startswith("verify/") for i in ids) or not any(i.startswith(SLOW_FIRST[0]) for i in ids):
        pytest.skip("only a run of the whole suite (tests and verify) collects the tests SLOW_FIRST names")
    assert slow_first(ids) == list(range(len(ids)))  # already in that order: the hook ran
    missing = [prefix for prefix in SLOW_FIRST if not any(i.startswith(prefix) for i in ids)]
    assert not missing, f"SLOW_FIRST names no collected test: {missing}"
