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


def test_benchmarks_phases_sums_each_run_once(tmp_path):
    """benchmarks.phases: the phases of every run under a workdir, a run linked in twice counted once."""
    import json
    import os

    from benchmarks.phases import collect, markdown
    for i, (tr, ev) in enumerate(((10.0, 2.0), (20.0, 3.0))):
        d = tmp_path / "pieces" / f"run{i}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"wall_clock_s": tr + ev, "phase_seconds": {
            "training": {"wall": tr, "cpu": tr / 2}, "evaluation": {"wall": ev, "cpu": ev / 2}}}))
    (tmp_path / "pieces" / "not_a_run").mkdir()
    os.symlink(tmp_path / "pieces" / "run0", tmp_path / "pieces" / "again")   # the same run, linked
    c = collect(str(tmp_path))
    assert c["runs"] == 2 and c["run_wall_s"] == 35.0
    assert c["phases"] == {"training": {"wall": 30.0, "cpu": 15.0}, "evaluation": {"wall": 5.0, "cpu": 2.5}}
    md = markdown(str(tmp_path), c)
    assert "| training | 30 | 85.7 % | 15 | 85.7 % |" in md and "| **sum over runs** | 35 |" in md
