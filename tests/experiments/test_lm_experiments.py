"""Smoke tests of the LM experiments: the demo (main job) and the privacy-utility table."""
import json
import os

import pytest

from experiments import common, demo, privacy_utility
from fedpriv.fl.loop import load_run


@pytest.fixture(scope="module")
def smoke_cfg():
    return common.load_config("configs/demo.py:smoke")


def test_demo_runs_end_to_end_and_resumes(tmp_path, capsys, smoke_cfg):
    wd = str(tmp_path / "demo")
    demo.main(["--config", "configs/demo.py:smoke", "--workdir", wd])
    out = capsys.readouterr().out
    assert "val accuracy" in out and "epsilon spent" in out and "user-level" in out
    for f in ("metrics.jsonl", "summary.md", "summary.json", "learning_curve.png"):
        assert os.path.getsize(os.path.join(wd, f)) > 0, f
    assert load_run(wd).round == smoke_cfg.rounds  # the atomic checkpoint (fedpriv.fl.checkpoint)
    s = json.load(open(os.path.join(wd, "summary.json")))
    assert s["epsilon"] <= smoke_cfg.target_epsilon * (1 + 1e-6)
    assert s["ledger"]["spent_epsilon"] == pytest.approx(s["epsilon"], rel=1e-6)
    assert s["seed"] == smoke_cfg.seed and s["config"]["rounds"] == smoke_cfg.rounds
    rows = [json.loads(l) for l in open(os.path.join(wd, "metrics.jsonl"))]
    assert [r["round"] for r in rows] == list(range(1, smoke_cfg.rounds + 1))
    assert all(r["num_clients"] == smoke_cfg.cohort_size for r in rows)
    # a second run resumes from the final checkpoint: no rounds retrained, same numbers
    demo.main(["--config", "configs/demo.py:smoke", "--workdir", wd])
    s2 = json.load(open(os.path.join(wd, "summary.json")))
    assert s2["resumed_from_round"] == smoke_cfg.rounds
    assert s2["test_accuracy"] == s["test_accuracy"]


def test_privacy_utility_table(tmp_path, smoke_cfg):
    import dataclasses
    cfg = dataclasses.replace(smoke_cfg, rounds=2, eval_every=2)
    rows = privacy_utility.run(cfg, str(tmp_path), progress=False)
    methods = [r["method"] for r in rows]
    assert methods == ["FedAvg (non-private)", "DP-FTRL eps~18.7", "DP-FTRL eps~1.8", "most frequent token"]
    eps = {r["method"]: r.get("epsilon") for r in rows}
    assert eps["FedAvg (non-private)"] is None
    assert eps["DP-FTRL eps~1.8"] <= 1.77 + 1e-9 and eps["DP-FTRL eps~18.7"] <= 18.71 + 1e-9
    z = {r["method"]: r.get("noise_multiplier") for r in rows}
    assert z["DP-FTRL eps~1.8"] > z["DP-FTRL eps~18.7"] > 0
    table = privacy_utility.aggregate(rows)
    assert len(table) == 4 and sum(r["best_on_val"] for r in table) == 4
