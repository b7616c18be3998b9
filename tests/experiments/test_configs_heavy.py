"""The slowest scale accounting of tests/experiments/test_configs.py (``HEAVY``): one file per
accounting, so that pytest-xdist (``--dist loadfile``) can run them on different workers."""
from tests.experiments.test_configs import HEAVY, PAIRS, check_accounted


def test_heavy_pairs_are_real_scales_and_each_has_its_test():
    assert all(p in PAIRS for p in HEAVY)
    assert set(HEAVY) == {("population_expansion", "small"), ("iw_regime", "small")}  # the two tests here


def test_population_expansion_small_is_accounted():
    check_accounted("population_expansion", "small")
