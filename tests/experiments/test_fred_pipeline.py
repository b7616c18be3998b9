"""The FreD three-stage pipeline: one ledger, FreD then FL-finetuning (smoke run, resumed), and the
paper config's ledger (no training)."""
import dataclasses

import pytest

from experiments import common, fred_pipeline
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger
from fedpriv.fred.pipeline import RELEASE, pipeline_events, run_pipeline


def test_fred_pipeline_smoke(tmp_path):
    """The smoke pipeline, run with a simulated noise cohort (4x the trained one) so one run
    also checks issue 16 item 8: the executed epsilon is shown beside the simulated one; then
    run again in the same workdir: every stage is resumed, nothing is charged twice."""
    cfg = common.load_config("configs/fred_pipeline.py:smoke")
    cfg = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, noise_cohort_size=4 * cfg.lm.cohort_size))
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
        # issue 16 item 7: the noise-free FreD is marked, never a DP column
        assert "fred_nonprivate" not in r and "nonprivate/fred" in r
        # item 8: the executed run's epsilon beside the simulated population's, larger
        assert r["fl_epsilon_executed_alone"] > r["fl_epsilon_alone"]
    assert chosen[0]["pipeline_epsilon_executed"] > 1.5 * chosen[0]["pipeline_epsilon"]
    assert s["ledger"]["spent_epsilon_executed"] == pytest.approx(chosen[0]["pipeline_epsilon_executed"])
    assert any(x.startswith("nonprivate/fred") for x in s["outputs"]["not_covered"])
    md = open(tmp_path / "fred_pipeline.md").read()
    assert "pipeline_epsilon_executed" in md and "SIMULATED" in md
    # resumed per stage (fedpriv.fl.stages): results and the one ledger come from stages.json
    again = run_pipeline(cfg, str(tmp_path), progress=False)
    assert again["resumed"] == ["FreD", "no prefinetuning", "rank 1"]
    assert again["ledger"].report()["entries"] == s["ledger"]["entries"]
    assert [r["fl_noise_multiplier"] for r in again["rows"]] == [r["fl_noise_multiplier"] for r in s["rows"]]


def test_paper_config_accounts_within_budget():
    """configs/fred_pipeline.py:paper calibrates the FL stage's z to what FreD left of the
    budget (the inherited lm_fl paper z = 8.83 would be refused by the ledger)."""
    cfg = common.load_config("configs/fred_pipeline.py:paper")
    assert cfg.lm.noise_multiplier is None and cfg.lm.target_epsilon == cfg.total_epsilon
    train_clients = 526  # 80% of the 658 private chitchat senders
    (fred_event, fl_event), z = pipeline_events(cfg, train_clients)
    ledger = PrivacyLedger(cfg.total_epsilon, cfg.lm.delta, unit="user")
    ledger.spend(RELEASE, fred_event)
    ledger.spend("DP-FTRL FL-finetune", fl_event)
    assert z > 8.83 and ledger.spent() <= cfg.total_epsilon * (1 + 1e-9)
    fixed = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, noise_multiplier=8.83))
    (fred_event, fl_event), _ = pipeline_events(fixed, train_clients)
    ledger = PrivacyLedger(cfg.total_epsilon, cfg.lm.delta, unit="user")
    ledger.spend(RELEASE, fred_event)
    with pytest.raises(PrivacyBudgetExceeded):
        ledger.spend("DP-FTRL FL-finetune", fl_event)
