"""IW regime study (experiments/iw_regime.py): the private target unigrams of IW / IWPT carry
signal only for large target populations; a trained cohort larger than its population is refused."""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from absl import logging

from configs import iw_regime as iw_config, population_expansion as pe_config
from configs.common import ConfigError
from experiments import iw_regime
from fedpriv import expansion
from fedpriv.data.tokenizers import BOS_ID, EOS_ID
from fedpriv.dp import geometric
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger
from fedpriv.expansion import regime, unigrams

logging.set_verbosity(logging.ERROR)

V = 40
BUDGET = pe_config.TOTAL_BUDGET


def zipf_population(n: int, seed: int, shift: int = 0, rows: int = 8) -> dict:
    """``n`` users with ``rows`` App. A rows each, words drawn from a Zipf law over ids 4..V-1
    (``shift`` rotates it: another domain)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V - 3)
    p /= p.sum()
    out = {}
    for u in range(n):
        words = 4 + (rng.choice(V - 4, size=(rows, 10), p=p) + shift) % (V - 4)
        out[f"u{u}"] = np.concatenate([np.full((rows, 1), BOS_ID), words], 1).astype(np.int32)
    return out


T_POP, S_POP = zipf_population(1000, 0), zipf_population(1000, 1, shift=1)


def tv_at(n: int, eps: float, seed: int = 0, source=S_POP, ledger=None) -> dict:
    return regime.measure_release(regime.subsample_clients(T_POP, n, seed), source, V, eps, seed,
                                  ledger=ledger or PrivacyLedger(*BUDGET))


def test_tv_shrinks_as_the_target_population_grows():
    tv = [np.mean([tv_at(n, 0.8, s)["tv_noise"] for s in range(3)]) for n in (25, 250, 1000)]
    assert tv[0] > tv[1] > tv[2]
    # ~1 / N_T (the back-of-envelope): 40x the users, >= 10x less noise
    assert tv[2] < tv[0] / 10
    big, small = tv_at(1000, 0.8), tv_at(25, 0.8)
    assert big["carries_signal"] and not small["carries_signal"]
    assert big["tv_release"] < big["tv_signal"] < small["tv_release"]


def test_tv_shrinks_with_eps0_and_matches_the_prediction():
    m = {e: tv_at(1000, e) for e in (0.2, 0.8, 1.6)}
    assert m[0.2]["tv_noise"] > m[0.8]["tv_noise"] > m[1.6]["tv_noise"]
    # every word has a large count here, so the noise is unclipped: measured ~ predicted
    for e, r in m.items():
        assert 0.5 < r["tv_noise"] / r["tv_predicted"] < 1.5, (e, r)


def test_an_under_noised_release_is_caught(monkeypatch):
    """A broken mechanism (noise calibrated to Delta = 1 instead of 50) is 50x too precise: the
    measured TV falls far below the prediction of the real mechanism."""
    real = geometric.geometric_mechanism
    monkeypatch.setattr(unigrams.geometric, "geometric_mechanism",
                        lambda x, rng, eps, sens: real(x, rng, eps, 1))
    r = tv_at(1000, 0.8)
    assert not 0.5 < r["tv_noise"] / r["tv_predicted"] < 1.5


def test_every_release_is_charged_to_the_ledger_before_the_data_is_read():
    led = PrivacyLedger(*BUDGET)
    r = tv_at(100, 0.8, ledger=led)
    entry = led.entry(unigrams.unigram_entry_name("T"))
    assert entry is not None and entry.populations == ("T",)
    # the pure (0.8, 0) release at the ledger's delta: 0.8 up to the accountant's rounding
    assert r["ledger_epsilon"] == pytest.approx(0.8, abs=1e-4) == led.spent()

    class Untouchable(dict):
        def __iter__(self):
            raise AssertionError("data read before the ledger accepted the release")
    small = PrivacyLedger(0.5, 1e-6)
    with pytest.raises(PrivacyBudgetExceeded):
        regime.measure_release(Untouchable(), S_POP, V, 0.8, 0, ledger=small)
    assert small.entries == []


def test_tv_distance_and_subsample_refuse_bad_input():
    assert regime.tv_distance([0.5, 0.5], [1.0, 0.0]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        regime.tv_distance([0.5, 0.6], [0.5, 0.5])
    with pytest.raises(ValueError):
        regime.subsample_clients(T_POP, 1001, 0)


# ----------------------------------------------------------------- cohort <= population


def tiny_dataset(n_s: int, n_t: int):
    row = np.asarray([[BOS_ID, 4, 5, EOS_ID]], np.int32)
    return expansion.assemble_domain_dataset({f"s{i}": row for i in range(n_s)},
                                             {f"t{i}": row for i in range(n_t)}, seed=0)


def test_a_cohort_larger_than_its_population_is_refused():
    ds = tiny_dataset(90, 10)  # 6 T training clients, 60 S
    cfg = pe_config.get_config("smoke,train_cohort=8,schemes=T w. C/S u T")
    with pytest.raises(ConfigError) as err:
        expansion.check_cohorts(ds, cfg)
    assert "T w. C" in str(err.value) and "\n" not in str(err.value)
    # ... and at training time too, never capping the sampling rate at 1
    with pytest.raises(ConfigError):
        expansion.plan_stages(pe_config.SCHEMES_BY_NAME["T w. C"], ds, cfg, 0)
    ok = pe_config.get_config("smoke,train_cohort=6,schemes=T w. C/S u T")
    expansion.check_cohorts(ds, ok)  # 6 of 6: allowed
    plan = expansion.plan_stages(pe_config.SCHEMES_BY_NAME["T w. C"], ds, ok, 0)
    assert plan[0].sampler.sampling_rate == pytest.approx(1.0)


def test_paper_scale_cohort_fits_its_population():
    # iw_regime's paper scale trains C = 400 on chat_target (alpha 0.25), whose target population
    # holds it; population_expansion:paper itself (Table 1's datasets at alpha 0.1) refuses
    cfg = dataclasses.replace(iw_config.get_config("paper").training_config(), vocab_words=100,
                              progress=False)
    assert cfg.datasets == ("chat_target",)
    prep = expansion.prepare_dataset("chat_target", cfg)  # refuses if any cohort > population
    assert prep.stats["train_T_clients"] >= cfg.train_cohort
    # Table 1's datasets at the paper's cohort are refused at data prep
    with pytest.raises(ConfigError):
        expansion.prepare_dataset("topics", dataclasses.replace(cfg, datasets=("topics",), alpha=0.1))


# ----------------------------------------------------------------- the experiment


def test_config_scales():
    small, paper = iw_config.get_config("small"), iw_config.get_config("paper")
    assert set(small.schemes) >= {"T w. alpha*C", "T w. C", "S u T", "IW", "PT", "IWPT"}
    assert len(small.seeds) >= 3 and len(small.regime_seeds) >= 3
    t = paper.training_config()
    assert t.datasets == ("chat_target",) and (t.train_cohort, t.rounds) == (400, 2000)
    with pytest.raises(ConfigError):
        iw_config.get_config("smoke,bounds=5by10")
    with pytest.raises(ConfigError):
        iw_config.get_config("smoke,schemes=nope")


def test_smoke_run_measures_the_regime(tmp_path):
    out = iw_regime.run(iw_config.get_config("smoke"), str(tmp_path), log=lambda *_: None)
    rows = {r["N_T"]: r for r in out["regime"] if r["sweep"] == "eps0"}
    assert rows[25]["tv_release"] > rows[400]["tv_release"]
    assert all(r["ledger_eps"] == pytest.approx(0.8, abs=1e-4) for r in out["regime"])
    for f in ("regime.md", "regime.csv", "regime_runs.csv", "regime_eps0.png", "summary.json"):
        assert os.path.exists(tmp_path / f), f
    with open(tmp_path / "summary.json") as f:
        assert json.load(f)["config"]["n_targets"] == [25, 400]


def test_each_arm_tests_the_claims_of_the_schemes_it_trains():
    """The table arm (the study's schemes) tests every claim; the control arm (control_schemes)
    only those whose two schemes it trains: the others are not part of it, so they are not
    reported there as "not run yet"."""
    cfg = iw_config.get_config("small")
    assert iw_regime.claims_of(cfg.schemes) == list(iw_regime.CLAIMS)
    assert iw_regime.claims_of(cfg.control_schemes) == [("IW", "S u T")]
    assert iw_regime.claims_of(("IW",)) == []
