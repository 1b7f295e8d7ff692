"""Every unit test is in the quick tier (`./run-tests.sh --quick`, marker
`quick`); integration/conftest.py names the end-to-end tests that are."""
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)     # before -m deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.quick)
