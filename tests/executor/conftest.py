"""The executor's tests start pools of worker processes: every core for them (tests/conftest.py
pins each xdist worker to one)."""
import pytest

from tests.conftest import all_cores


@pytest.fixture(autouse=True, scope="module")
def _every_core():
    with all_cores():
        yield
