"""Every unit test that `watch`es a dataset fails when anything under it was written (see datatree)."""

import pytest
from datatree import refresh_watched, verify_watched


@pytest.fixture(autouse=True)
def _watched_datasets_are_untouched():
    refresh_watched()
    yield
    changed = verify_watched()
    assert not changed, f"written under a dataset: {changed}"
