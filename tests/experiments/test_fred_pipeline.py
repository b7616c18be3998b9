"""Smoke test of the FreD three-stage pipeline: one ledger, FreD then FL-finetuning."""
import os


from experiments import common, fred_pipeline


def test_fred_pipeline_smoke(tmp_path):
    cfg = common.load_config("configs/fred_pipeline.py:smoke")
    s = fred_pipeline.run(cfg, str(tmp_path), progress=False)
    rows = {r["prefinetune data"]: r for r in s["rows"]}
    chosen = [r for r in s["rows"] if r["chosen_by_fred"]]
    assert set(rows) == {fred_pipeline.NONE, chosen[0]["prefinetune data"]}  # smoke: compare_all=False
    assert len(chosen) == 1 and chosen[0]["private_rank"] == 1
    # the pipeline's ledger: FreD release first, then the chosen FL-finetuning, within budget
    names = [e["name"] for e in s["ledger"]["entries"]]
    assert names[0].startswith("FreD") and names[1].startswith("DP-FTRL") and len(names) == 2
    assert s["ledger"]["spent_epsilon"] <= cfg.total_epsilon * (1 + 1e-9)
    # the baseline ran no FreD, so it can afford less noise for the same budget
    assert rows[fred_pipeline.NONE]["fl_noise_multiplier"] < chosen[0]["fl_noise_multiplier"]
    assert chosen[0]["fl_epsilon_alone"] < rows[fred_pipeline.NONE]["fl_epsilon_alone"]
    for r in s["rows"]:
        assert r["pipeline_epsilon"] <= cfg.total_epsilon * (1 + 1e-9)
    assert os.path.exists(tmp_path / "fred_pipeline.md")
