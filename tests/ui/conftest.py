"""Fixtures shared by the UI tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def restore_flags():
    """Torch's numeric flags put back as they were after the test (the controls apply them)."""
    import mixprec

    before = mixprec.snapshot()
    yield
    mixprec.restore(before)
