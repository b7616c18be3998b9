"""The second slowest scale accounting (``HEAVY``; see test_configs_heavy.py)."""
from tests.experiments.test_configs import check_accounted


def test_iw_regime_small_is_accounted():
    check_accounted("iw_regime", "small")
