"""A test that always skips, for conftest.py's STRATA_TEST_NO_SKIP (CTest python.skip_reported and
python.skip_fails_under_no_skip): reported as skipped, or a failure under STRATA_TEST_NO_SKIP=1.
Not collected by the one-process run (the name is not test_*.py)."""

import pytest


def test_always_skips():
    pytest.skip("this test always skips (tests/python/skip_mode_check.py)")
