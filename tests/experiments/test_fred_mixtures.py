"""Prefinetuning mixtures (Hou et al. 2023 Table 2 / Fig. 2): exact Y% composition and nesting,
FreD ordering on a constructed case, and the smoke experiment end to end (files, verdicts,
ledger)."""
import json
import os

import numpy as np
import pytest

from experiments import common, fred_mixtures
from fedpriv.data.errors import ConfigError
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fred.embed import HELD_OUT
from fedpriv.fred.mixtures import PUBLIC, fred_vs_y, mixture, mixture_counts, separation_verdict

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
    s = fred_mixtures.run(cfg, str(tmp_path), progress=False)
    for f in ("fred_mixtures.md", "fred_mixtures.csv", "fred_vs_y.png", "summary.json", "verdicts.json"):
        assert os.path.getsize(tmp_path / f) > 0, f
    verdicts = json.load(open(tmp_path / "verdicts.json"))
    from fedpriv.verdicts import NOT_RUN, NOT_TESTABLE, STATUSES
    # ten on FreD and Table 2's trends, two on Table 2's Y = 99 vs 100 rows (issue 50); the smoke scale
    # FL-finetunes Y = 99 and 100 only if its fl_y_percents has them ("not run yet" with the rerun otherwise)
    pair = [v for v in verdicts if "lower at Y=100 than at Y=99" in v["claim"]]
    assert len(verdicts) == 12 and len(pair) == 2
    assert all(v["status"] in STATUSES and v["status"] not in (NOT_RUN, NOT_TESTABLE)
               for v in verdicts if v not in pair)
    assert all((v["status"] == NOT_RUN) == (not {99, 100} <= set(cfg.fl_y_percents)) for v in pair)
    # the exact claims (non-private FreD of fixed data, every observed trial) are decided
    assert all(v["status"] in ("reproduced", "not reproduced") for v in verdicts if v["kind"] == "exact")
    # FreD on every Y and trial, FL on fl_y_percents x seeds
    assert s["fred"]["y"] == list(cfg.y_percents)
    assert np.asarray(s["fred"]["private"]).shape == (cfg.fred_trials, len(cfg.y_percents))
    assert [(r["y"], r["seed"]) for r in s["runs"]] == [(y, sd) for sd in cfg.seeds for y in cfg.fl_y_percents]
    # the ledger charged FreD (one release) and the FL-finetuning, within the budget
    names = [e["name"] for e in s["ledger"]["entries"]]
    assert len(names) == 2 and names[0].startswith("FreD release") and names[1].startswith("DP-FTRL")
    assert s["ledger"]["spent_epsilon"] <= cfg.total_epsilon * (1 + 1e-9)
    for r in s["runs"]:
        assert r["test_ppl_before_fl"] > 1 and r["test_ppl_after_fl"] > 1
        assert r["pipeline_epsilon"] <= cfg.total_epsilon * (1 + 1e-9)
    assert "Hou et al. Table 2" in open(tmp_path / "fred_mixtures.md").read()


def test_paper_config_accounts_within_budget():
    """configs/fred_mixtures.py:paper: FreD's two releases at (0.6, 2e-6) each, then the FL stage
    with z calibrated to what they left of the budget; both fit it under one ledger."""
    from fedpriv.dp import moments
    from fedpriv.recipes import lm as lm_recipe
    # the paper's 150K-sentence candidates are not packaged: the paper scale refuses in one line
    # (issue 23 item 1); its accounting, which does not depend on the candidates' size, is checked
    # at the largest size the packaged pools hold
    with pytest.raises(ConfigError, match="pool has 19,782"):
        common.load_config("configs/fred_mixtures.py:paper")
    cfg = common.load_config("configs/fred_mixtures.py:paper,num_sentences=19782")
    assert cfg.lm.noise_multiplier is None and cfg.lm.target_epsilon == cfg.total_epsilon
    assert (cfg.fred_epsilon, cfg.fred_delta, cfg.num_sentences, cfg.lm.delta) == (0.6, 2e-6, 19_782, 1e-6)
    fred_event = moments.release_event(moments.moment_events(moments.gaussian_sigma(cfg.fred_epsilon,
                                                                                     cfg.fred_delta)))
    task = lm_recipe.build_task(cfg.lm, cfg.lm.vocab_size)
    _, _, fl_event, z = lm_recipe.build_algorithm(cfg.lm, 526, task.loss_fn, [fred_event])
    ledger = PrivacyLedger(cfg.total_epsilon, cfg.lm.delta, unit="user")
    ledger.spend("FreD", fred_event)
    ledger.spend("DP-FTRL FL-finetune", fl_event)
    assert z > 0 and ledger.spent() <= cfg.total_epsilon * (1 + 1e-9)
