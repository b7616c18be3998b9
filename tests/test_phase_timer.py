"""recipes.lm.PhaseTimer: per-phase wall/CPU seconds, accumulated, nested phases not double counted."""
import time

from fedpriv.recipes.lm import PhaseTimer


def _busy(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_phases_accumulate_and_exclude_nested():
    ph = PhaseTimer()
    ev = ph.timed("evaluation", lambda: _busy(0.05))
    with ph("training", exclude=("evaluation",)):
        _busy(0.05)
        ev()
        ev()
    with ph("evaluation"):
        _busy(0.05)
    d = ph.as_dict()
    assert set(d) == {"training", "evaluation"}
    assert d["evaluation"]["cpu"] >= 0.15 - 1e-3          # three evaluations, accumulated
    assert 0.05 - 1e-3 <= d["training"]["cpu"] < 0.1     # its nested evaluations are excluded
    assert all(v["wall"] > 0 for v in d.values())
