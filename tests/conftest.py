# Lab fixtures and hooks live in tests/lab/fixtures.py; importing them here
# registers them for the whole test suite.
from tests.lab.fixtures import (  # noqa: F401
    db,
    db_factory,
    goclient,
    mariadb,
    mariadb_factory,
    tidb,
    tidb_factory,
    pytest_configure,
    pytest_collection_modifyitems,
    pytest_runtest_setup,
)


import pytest  # noqa: E402


@pytest.fixture
def autojump(autojump_clock):
    """Tests that sleep run on trio's autojump clock: timeouts pass in no real time."""
    return autojump_clock
