# Lab fixtures and hooks live in tests/lab/fixtures.py; importing them here
# registers them for the whole test suite.
import pytest

from tests.lab.fixtures import (  # noqa: F401
    db,
    db_factory,
    goclient,
    mariadb,
    mariadb_factory,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_setup,
    pytest_terminal_summary,
    tidb,
    tidb_factory,
)


@pytest.fixture
def autojump(autojump_clock):
    """Tests that sleep run on trio's autojump clock: timeouts pass in no real time."""
    return autojump_clock
