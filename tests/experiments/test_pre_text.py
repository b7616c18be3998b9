"""The PrE-Text comparison (issue 26): its smoke run end to end -- each arm's ledger holds
exactly the charges its privacy plan accounts, at the arm's epsilon -- a finished arm is read
back, not rerun, and the config refuses what would make the comparison unequal."""
import json
import os

import pytest

from configs.pre_text import privacy_plan
from experiments import common, pre_text
from fedpriv.data.errors import ConfigError
from fedpriv.dp.plan import account
from fedpriv.recipes import pretext


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    wd = str(tmp_path_factory.mktemp("pre_text"))
    pre_text.main(["--config", "configs/pre_text.py:smoke", "--workdir", wd])
    return wd


def test_smoke_writes_the_tables_and_every_arm_spends_what_its_plan_accounts(smoke):
    for f in ("pre_text.md", "fred.md", "phases.md", "samples.md", "verdicts.json", "summary.json"):
        assert os.path.exists(os.path.join(smoke, f)), f
    cfg = common.load_config("configs/pre_text.py:smoke")
    planned = {a.name: a for a in account(privacy_plan(cfg))}
    names = {"ondevice": "ondevice DP-FTRL", "synthetic": "PrE-Text votes",
             "synthetic_ft": "PrE-Text votes + DP-FTRL"}
    rows = json.load(open(os.path.join(smoke, "summary.json")))["rows"]
    assert {r["arm_key"] for r in rows} == set(names)
    for r in rows:
        s = json.load(open(os.path.join(r["workdir"], "summary.json")))
        plan = planned[f"{names[r['arm_key']]} eps {r['epsilon']:g}"]
        entries = s["ledger"]["entries"]
        assert [e["name"] for e in entries] == list(plan.charges)
        assert s["ledger"]["spent_epsilon"] == pytest.approx(plan.epsilon_dp, rel=1e-6)
        assert s["ledger"]["spent_epsilon"] <= r["epsilon"] * (1 + 1e-6)
        if r["arm_key"] != "ondevice":
            assert s["synthetic_samples"] > 0 and s["generated_tokens"] > 0
    verdicts = json.load(open(os.path.join(smoke, "verdicts.json")))
    assert any("equal epsilon" in v["claim"] for v in verdicts)


def test_a_finished_arm_is_read_back(smoke):
    before = {f: os.path.getmtime(os.path.join(smoke, d, "summary.json"))
              for d in os.listdir(smoke) if os.path.isdir(os.path.join(smoke, d)) and d.startswith("seed")
              for f in [d]}
    cfg = common.load_config("configs/pre_text.py:smoke")
    rows = pretext.run_arms(cfg, smoke, progress=False, log=lambda *_: None)
    assert len(rows) == 3
    for d, t in before.items():
        assert os.path.getmtime(os.path.join(smoke, d, "summary.json")) == t


@pytest.mark.parametrize("spec,match", [
    ("smoke,noise_cohort_size=100", "SPENT"),
    ("smoke,simulated_population=wang_stackoverflow", "simulated population|SPENT"),
    ("smoke,target_epsilon=3", "each arm sets it"),
    ("smoke,ft_vote_share=1.0", "ft_vote_share"),
    ("smoke,arms=ondevice/ondevice", "distinct"),
    ("smoke,vote_cohort=100000", "vote_cohort"),
])
def test_unequal_or_bad_settings_are_refused(spec, match):
    with pytest.raises(ConfigError, match=match):
        account(privacy_plan(common.load_config(f"configs/pre_text.py:{spec}")))


def test_cost_model_counts_votes_and_model_bytes():
    cfg = common.load_config("configs/pre_text.py:small")
    c = pretext.client_costs(cfg, "synthetic_ft", 500_000, 12.0, 28.0, cfg.lm.rounds)
    assert c["votes"]["up_bytes"] == 4 * cfg.num_samples and c["votes"]["rounds"] == cfg.pe_rounds
    assert c["fl"]["up_bytes"] == c["fl"]["down_bytes"] == 2_000_000 and c["fl"]["rounds"] == cfg.lm.rounds
    u = pretext.client_costs(cfg, "synthetic_ft", 500_000, 12.0, 28.0, cfg.lm.rounds, 1000)
    assert u["fl"]["per_user"] == cfg.lm.rounds * cfg.lm.cohort_size / 1000
    assert u["votes"]["per_user"] == cfg.pe_rounds * cfg.vote_cohort / 1000 <= 1  # one vote each


def test_a_finished_arm_with_other_settings_is_refused_not_read_back(smoke):
    other = common.load_config("configs/pre_text.py:smoke,num_samples=6")
    with pytest.raises(ConfigError, match="other settings .*num_samples"):
        pretext.run_arms(other, smoke, progress=False, log=lambda *_: None)
