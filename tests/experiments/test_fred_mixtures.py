"""Prefinetuning mixtures (Hou et al. 2023 Table 2 / Fig. 2): exact Y% composition and nesting,
FreD ordering on a constructed case, the units of privacy and their ledgers (a sample-level
release never on the user-level ledger; the plan states the ledgers the run opens), and the
smoke experiment end to end (files, verdicts, ledgers)."""
import json
import os

import numpy as np
import pytest

from experiments import common, fred_mixtures
from fedpriv.data.errors import ConfigError
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.dp.plan import account
from fedpriv.fred.embed import HELD_OUT
from fedpriv.fred.mixtures import PUBLIC, RELEASE, fred_vs_y, mixture, mixture_counts, separation_verdict
from fedpriv.recipes import plans

YS = (0, 25, 50, 75, 99, 100)


def test_mixtures_exact_composition_and_nesting():
    priv = [f"p{i}" for i in range(300)]
    pub = [f"w{i}" for i in range(300)]
    total = 200
    mixes = {y: mixture(priv, pub, y, total) for y in YS}
    for y, m in mixes.items():
        assert len(m) == total and len(set(m)) == total
        assert sum(s.startswith("p") for s in m) == y * total // 100  # exactly Y%
    # nested: 99% and 100% share 99% of their sentences; every mixture is two prefixes
    assert len(set(mixes[99]) & set(mixes[100])) == 99 * total // 100
    assert mixes[100] == priv[:total] and mixes[0] == pub[:total]
    assert set(mixes[25]) <= set(mixes[50]) | set(pub[:total])
    # arrays (embeddings) follow the same rows as the texts
    ep, ew = np.arange(300)[:, None] * 1.0, -np.arange(1, 301)[:, None] * 1.0
    arr = mixture(ep, ew, 75, total)
    assert arr.shape == (total, 1) and int((arr >= 0).sum()) == 150
    assert mixture_counts(99, 150_000) == (148_500, 1500)
    with pytest.raises(ValueError):
        mixture_counts(101, 100)
    with pytest.raises(ValueError):
        mixture(priv[:10], pub, 50, total)  # pool too small


def test_fred_orders_mixtures_on_constructed_embeddings():
    """Users and the private-distribution pool share a Gaussian, the public pool is shifted:
    non-private FreD must fall strictly with Y, private FreD must put 100% below 0%; only trial
    0's release is charged."""
    rng = np.random.default_rng(0)
    d, shift = 8, np.r_[1.5, np.zeros(7)]
    users = {f"u{i}": 0.2 * rng.standard_normal((5, d)) for i in range(400)}
    pools = {HELD_OUT: 0.2 * rng.standard_normal((1000, d)),
             PUBLIC: 0.2 * rng.standard_normal((1000, d)) + shift}
    ledger = PrivacyLedger(100.0, 1e-6, unit="user")
    fr = fred_vs_y(users, pools, YS, 500, trials=3, clip=5.0, epsilon=2.0, delta=1e-6, unit="user",
                   seed=0, pca_dims=None, n_public=400, ledger=ledger)  # 400 users, declared
    assert all(a > b for a, b in zip(fr["nonprivate"], fr["nonprivate"][1:]))
    assert fr["nonprivate"][0] > 1.0 > 0.05 > fr["nonprivate"][-1]
    priv = np.asarray(fr["private"])
    assert priv.shape == (3, len(YS)) and np.all(priv[:, -1] < priv[:, 0])
    assert [e["charged"] for e in fr["releases"]] == [True, False, False]
    assert len(ledger.entries) == 1 and ledger.spent() > 0
    v = separation_verdict("c", priv[:, -1], priv[:, 0], ("100%", "0%"))
    assert v.status == "reproduced"


def test_fred_mixtures_smoke(tmp_path):
    cfg = common.load_config("configs/fred_mixtures.py:smoke")
    assert (cfg.fred_unit, cfg.pca_dims) == ("sample", None)  # as the paper's Figure 2
    s = fred_mixtures.run(cfg, str(tmp_path), progress=False)
    for f in ("fred_mixtures.md", "fred_mixtures.csv", "fred_vs_y.png", "summary.json", "verdicts.json"):
        assert os.path.getsize(tmp_path / f) > 0, f
    verdicts = json.load(open(tmp_path / "verdicts.json"))
    from fedpriv.verdicts import NOT_RUN, NOT_TESTABLE, STATUSES
    # five on FreD (no PCA-basis or user-weighted diagnostics at sample level in 384-d), three on Table 2's
    # trends, two on its Y = 99 vs 100 rows (issue 50); the smoke scale FL-finetunes Y = 99 and 100 only
    # if its fl_y_percents has them ("not run yet" with the rerun otherwise)
    pair = [v for v in verdicts if "lower at Y=100 than at Y=99" in v["claim"]]
    assert len(verdicts) == 10 and len(pair) == 2
    assert all(v["status"] in STATUSES and v["status"] not in (NOT_RUN, NOT_TESTABLE)
               for v in verdicts if v not in pair)
    assert all((v["status"] == NOT_RUN) == (not {99, 100} <= set(cfg.fl_y_percents)) for v in pair)
    # the exact claims (non-private FreD of fixed data, every observed trial) are decided
    assert all(v["status"] in ("reproduced", "not reproduced") for v in verdicts if v["kind"] == "exact")
    # the private claims say their unit, space and sizes
    sep = next(v for v in verdicts if v["claim"].startswith("private FreD separates 99% from 100%"))
    assert "sample level, full 384-d embedding, mixtures of 100 sentences (99% and 100% differ by 1)" in sep["claim"]
    # FreD on every Y and trial, FL on fl_y_percents x seeds; the release is 384-d, sample level
    assert s["fred"]["y"] == list(cfg.y_percents)
    assert np.asarray(s["fred"]["private"]).shape == (cfg.fred_trials, len(cfg.y_percents))
    assert all((r["unit"], r["relation"], r["dim"]) == ("sample", "replace_one", 384) for r in s["fred"]["releases"])
    assert s["fred"]["fred_n"] == s["fred"]["releases"][0]["n"] > s["fred"]["private_users"]  # sentences
    assert [(r["y"], r["seed"]) for r in s["runs"]] == [(y, sd) for sd in cfg.seeds for y in cfg.fl_y_percents]
    # two ledgers: FreD's own (sample level) and the FL runs' (user level), as the plan states
    check_ledgers_match_plan(cfg, s)
    for r in s["runs"]:
        assert r["test_ppl_before_fl"] > 1 and r["test_ppl_after_fl"] > 1
        assert r["pipeline_epsilon"] <= cfg.total_epsilon * (1 + 1e-9)
    md = open(tmp_path / "fred_mixtures.md").read()
    assert "Hou et al. Table 2" in md and "SAMPLE level, in the full 384-d embedding" in md


def check_ledgers_match_plan(cfg, s):
    """The run's ledgers (the summary's FL ledger and FreD's own) are the plan's runs: budgets,
    deltas, relations, units, entry names and epsilons; the FL ledger holds no FreD entry."""
    plan = plans.fred_mixtures_plan(cfg)
    fred_run, fl_run = plan.runs
    fred_acc, fl_acc = account(plan)
    led_f, led_l = s["fred_ledger"], s["ledger"]
    assert (led_f["unit"], led_f["neighboring"]) == ("sample", fred_run.neighboring) == ("sample", "replace_one")
    assert (led_f["budget_epsilon"], led_f["delta"]) == (fred_run.epsilon, fred_run.delta) == \
        (2 * cfg.fred_epsilon, 2 * cfg.fred_delta)
    assert [e["name"] for e in led_f["entries"]] == [c.name for c in fred_run.charges] == [RELEASE]
    assert led_f["spent_epsilon"] == pytest.approx(fred_acc.epsilon_dp, rel=1e-9)
    assert (led_l["unit"], led_l["neighboring"]) == ("user", fl_run.neighboring)
    assert (led_l["budget_epsilon"], led_l["delta"]) == (fl_run.epsilon, fl_run.delta) == \
        (cfg.total_epsilon, cfg.lm.delta)
    names = [e["name"] for e in led_l["entries"]]
    assert len(names) == len(fl_run.charges) == 1 and names[0].startswith("DP-FTRL")
    assert not any(n.startswith("FreD") for n in names)
    assert led_l["spent_epsilon"] == pytest.approx(fl_acc.epsilon_dp, rel=1e-9)
    assert fl_run.copies == len(cfg.fl_y_percents) * len(cfg.seeds) and fred_run.copies == 1


def test_a_sample_level_release_is_never_charged_to_a_user_level_ledger(tmp_path):
    """fred_unit="sample": the FreD stage charges its own sample-level ledger and leaves the
    pipeline's user-level ledger (from which every FL-finetuning starts) empty; a sample-level
    release offered the user-level ledger is refused before anything is charged; the plan opens
    exactly these two kinds of ledger. fred_unit="user" keeps the release on the pipeline ledger."""
    from fedpriv.fl.stages import StageContext
    from fedpriv.recipes import fred_mixtures as recipe
    rng = np.random.default_rng(0)
    users = {f"u{i}": rng.standard_normal((3, 8)) for i in range(40)}
    pools = {HELD_OUT: rng.standard_normal((60, 8)), PUBLIC: rng.standard_normal((60, 8)) + 1.0}
    user_ledger = PrivacyLedger(100.0, 1e-6, unit="user")
    kw = dict(trials=2, clip=1.0, epsilon=0.6, delta=2e-6, seed=0, pca_dims=None)
    # refused whatever the relation: the unit (at the ledger's add/remove) or the relation
    for relation, n_public, why in (("add_remove", 120, "sample-level release cannot be charged to a user-level"),
                                    ("replace_one", None, "differs from the ledger's 'add_remove'")):
        with pytest.raises(ValueError, match=why):
            fred_vs_y(users, pools, (0, 100), 50, unit="sample", relation=relation, n_public=n_public,
                      ledger=user_ledger, **kw)
    assert user_ledger.entries == []
    cfg = common.load_config("configs/fred_mixtures.py:smoke")
    own = recipe.fred_ledger(cfg, user_ledger)
    assert own is not user_ledger and (own.unit, own.neighboring) == ("sample", "replace_one")
    fr = fred_vs_y(users, pools, (0, 100), 50, ledger=own, **recipe.fred_release_args(cfg), **kw)
    assert [e.name for e in own.entries] == [RELEASE] and user_ledger.entries == []
    assert fr["releases"][0]["n"] == 120 and [r["charged"] for r in fr["releases"]] == [True, False]
    # the FreD stage itself, with the user-level pipeline ledger in its context
    stage = recipe._fred_stage(cfg, {HELD_OUT: [f"s{i}" for i in range(100)], PUBLIC: [f"w{i}" for i in range(100)]},
                               {f"u{i}": ["a b", "c d e"] for i in range(30)}, False)
    fake = lambda emb, priv, cand, *a, **k: ({u: rng.standard_normal((len(t), 8)) for u, t in priv.items()},  # noqa: E731
                                            {n: rng.standard_normal((len(t), 8)) for n, t in cand.items()}, 0.0)
    pipe = PrivacyLedger(cfg.total_epsilon, cfg.lm.delta, unit="user")
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(recipe, "embed_all", fake)
        mp.setattr(recipe.bert, "load_embedder", lambda **_: None)
        out = stage(StageContext("FreD", str(tmp_path / "f"), pipe, {}, lambda _: None, str(tmp_path), ["FreD"]))
        assert pipe.entries == [] and PrivacyLedger.from_dict(out["ledger_after_fred"]).entries == []
        assert [e["name"] for e in out["fred_ledger"]["entries"]] == [RELEASE]
        # fred_unit=user: the release is the pipeline ledger's first entry
        user_cfg = common.load_config("configs/fred_mixtures.py:smoke,fred_unit=user")
        assert recipe.fred_ledger(user_cfg, pipe) is pipe
        stage = recipe._fred_stage(user_cfg, {HELD_OUT: [f"s{i}" for i in range(100)],
                                              PUBLIC: [f"w{i}" for i in range(100)]},
                                   {f"u{i}": ["a b", "c d e"] for i in range(30)}, False)
        stage(StageContext("FreD", str(tmp_path / "u"), pipe, {}, lambda _: None, str(tmp_path), ["FreD"]))
        assert [e.name for e in pipe.entries] == [RELEASE]
    finally:
        mp.undo()
    # the plans: sample level opens FreD's own ledger and FL-only user-level ledgers; user level one
    # pipeline ledger with FreD first
    sample_plan, user_plan = plans.fred_mixtures_plan(cfg), plans.fred_mixtures_plan(user_cfg)
    assert [[c.name for c in r.charges] for r in sample_plan.runs] == [[RELEASE], ["fl-training"]]
    assert [r.neighboring for r in sample_plan.runs] == ["replace_one", "add_remove"]
    assert [[c.name for c in r.charges] for r in user_plan.runs] == [[RELEASE, "fl-training"]]
    for plan in (sample_plan, user_plan):
        assert all(a.epsilon_dp <= a.budget * (1 + 1e-9) for a in account(plan))


def test_paper_config_accounts_within_budget():
    """configs/fred_mixtures.py:paper: sample-level FreD's two releases at (0.6, 2e-6) each on their
    own ledger, (1.2, 4e-6); the FL stage at epsilon 1.26 (delta 1e-6) on the user-level ledger."""
    from fedpriv.dp import moments
    # the paper's 150K-sentence candidates are not packaged: the paper scale refuses in one line
    # (issue 23 item 1); its accounting, which does not depend on the candidates' size, is checked
    # at the largest size the packaged pools hold
    with pytest.raises(ConfigError, match="pool has 19,782"):
        common.load_config("configs/fred_mixtures.py:paper")
    cfg = common.load_config("configs/fred_mixtures.py:paper,num_sentences=19782")
    assert cfg.lm.noise_multiplier is None and cfg.lm.target_epsilon == cfg.total_epsilon == 1.26
    assert (cfg.fred_unit, cfg.pca_dims, cfg.fred_epsilon, cfg.fred_delta, cfg.lm.delta) == \
        ("sample", None, 0.6, 2e-6, 1e-6)
    fred_event = moments.release_event(moments.moment_events(moments.gaussian_sigma(cfg.fred_epsilon,
                                                                                     cfg.fred_delta)))
    plan = plans.fred_mixtures_plan(cfg)
    fred_acc, fl_acc = account(plan)
    assert fred_acc.budget == pytest.approx(1.2) and fred_acc.delta == pytest.approx(4e-6)
    assert [c.event for c in plan.runs[0].charges] == [fred_event] and fred_acc.epsilon_dp <= 1.2
    assert fl_acc.charges == ("fl-training",) and 0 < fl_acc.epsilon_dp <= 1.26 * (1 + 1e-9)


def test_agreement_verdict_separates_resolution_from_direction():
    """The release's resolution check: reproduced iff every trial orders every consecutive pair of
    Ys as the noise-free FreD does -- also where the noise-free FreD itself rises (99 -> 100 in
    the published run), and not reproduced when one trial flips one pair."""
    from fedpriv.fred.mixtures import AGREEMENT_CLAIM
    from fedpriv.verdicts import orders_agree
    agreement_verdict = lambda *a: orders_agree(AGREEMENT_CLAIM, *a, label="Y")  # noqa: E731
    ys, nonprivate = (0, 50, 99, 100), [0.35, 0.10, 0.0086, 0.0087]  # rises at 99 -> 100
    private = [[0.89 + t * 1e-3, 0.66 + t * 1e-3, 0.5935 + t * 1e-3, 0.5937 + t * 1e-3] for t in range(5)]
    v = agreement_verdict(ys, nonprivate, private)
    assert v.claim == AGREEMENT_CLAIM and v.status == "reproduced" and v.source == "project"
    assert "Y=99->100: noise-free +0.0001, agrees in 5/5" in v.measured
    private[3][3] = private[3][2] - 1e-5  # trial 3 puts 100 % below 99 %
    v = agreement_verdict(ys, nonprivate, private)
    assert v.status == "not reproduced" and "Y=99->100: noise-free +0.0001, agrees in 4/5" in v.measured
    with pytest.raises(ValueError, match="replicates must be"):
        agreement_verdict(ys, nonprivate, [row[:3] for row in private])
