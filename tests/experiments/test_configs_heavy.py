"""The slowest scale accountings of tests/experiments/test_configs.py (``HEAVY``), in a file of
their own so that pytest-xdist (``--dist loadfile``) runs them beside the rest."""
import pytest

from tests.experiments.test_configs import HEAVY, PAIRS, check_accounted


def test_heavy_pairs_are_real_scales():
    assert HEAVY and all(p in PAIRS for p in HEAVY)


@pytest.mark.parametrize("name,scale", HEAVY)
def test_every_scale_is_accounted(name, scale):
    check_accounted(name, scale)
