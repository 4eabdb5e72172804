"""The slow tier's list (tests/conftest.py SLOW) names tests that exist, so the fast tier stays fast."""
import re

import pytest

from tests.conftest import REPO, SLOW


@pytest.mark.parametrize("entry", SLOW)
def test_every_slow_entry_names_a_test(entry):
    path, _, name = entry.partition("::")
    assert (REPO / path).is_file(), entry
    if name:
        assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(), re.M), entry
