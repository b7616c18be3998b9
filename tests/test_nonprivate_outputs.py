"""Issue 16 items 6-8: every output is covered by the ledger or marked non-private.

- item 6: a vocabulary from private text is public by default, or recorded in the ledger as a
  non-private release (epsilon = inf, the epsilon "if public" beside it);
- item 7: exact statistics of the private clients are written as ``nonprivate/<name>``;
- item 8: a simulated population's epsilon comes with the executed run's.
"""
import dataclasses
import json
import math

import dp_accounting as dpa
import numpy as np
import optax
import pytest

from fedpriv.dp import accounting
from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger
from fedpriv.fl.algorithms import dp_fedavg, privacy_event, server_optimizer
from fedpriv.fl.loop import DP_COVERED_METRICS, NONPRIVATE, nonprivate_key, read_metrics, train
from fedpriv.fl.samplers import PoissonSampler
from tests.fl.helpers import init_params, loss_fn, make_dataset

DELTA = 1e-6


def _poisson_run(tmp_path, *, noise_cohort_size=None, adaptive=None, rounds=3, ledger=None):
    data = make_dataset(num_clients=30, seed=3)
    ids = list(data)
    sampler = PoissonSampler(len(ids), 0.2, seed=0)
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=0.5,
                    noise_multiplier=1.0, expected_cohort_size=sampler.expected_cohort_size,
                    noise_cohort_size=noise_cohort_size, adaptive=adaptive)
    ledger = ledger if ledger is not None else PrivacyLedger(1e9, DELTA)
    res = train(alg, init_params(), data, ids, sampler, rounds=rounds, batch_size=4, seed=1,
                max_steps=2, progress=False, workdir=str(tmp_path), log=None, ledger=ledger,
                eval_fn=lambda p: {"loss": 0.0}, eval_every=1)
    return res, alg, sampler


# ----------------------------------------------------------------------------- item 7
def test_metrics_log_marks_every_exact_client_statistic_nonprivate(tmp_path):
    """metrics.jsonl: the DP-covered keys (clip norm, noised adaptive count) keep their names;
    every exact statistic of the sampled clients is ``nonprivate/...``; nothing else."""
    res, _, _ = _poisson_run(tmp_path, adaptive=AdaptiveClipping(0.5, 0.5, 0.2, 1.0))
    rows = read_metrics(str(tmp_path))
    assert len(rows) == 3 and rows == [json.loads(json.dumps(r)) for r in res.history]
    for row in rows:
        for key in ("frac_clipped", "mean_update_norm", "num_clients", "num_nonfinite",
                    "loss_sum", "num_tokens", "train_loss", "real_steps", "executed_steps"):
            assert NONPRIVATE + key in row, key
            assert key not in row, f"{key} published unmarked"
        assert "clip_norm" in row and "unclipped_estimate" in row
        assert np.isfinite(row["unclipped_estimate"])  # the noised count (adaptive clipping)
        unmarked = {k for k in row if not k.startswith(NONPRIVATE)}
        assert unmarked <= {"round", "epsilon_spent", *DP_COVERED_METRICS} | {
            k for k in row if k.startswith("eval_")}
    assert nonprivate_key("frac_clipped") == "nonprivate/frac_clipped"
    assert nonprivate_key("clip_norm") == "clip_norm"
    assert nonprivate_key("nonprivate/x") == "nonprivate/x"


def test_unigram_diagnostics_are_marked_nonprivate():
    from fedpriv import expansion

    rng = np.random.default_rng(0)
    clients = {f"c{i}": {"tokens": rng.integers(4, 20, size=(3, 6)).astype(np.int32),
                         "domain": np.full(3, (expansion.SOURCE, expansion.TARGET)[i % 2], np.int32)}
               for i in range(12)}

    class _DS:
        def clients(self, split, pops, doms):
            return {c: v for c, v in clients.items() if int(v["domain"][0]) in pops}

    u = [np.full(20, 1 / 16), np.full(20, 1 / 16)]
    out = expansion.unigram_diagnostics(_DS(), u, 20, 0.8, seed=0)
    for pop in ("S", "T"):
        assert set(out[pop]) == {"nonprivate/counted_tokens", "nonprivate/tv_distance_to_nonprivate",
                                 "noise_std_per_word"}
        assert out[pop]["nonprivate/counted_tokens"] == 6 * 3 * 5  # 6 users x 3 rows x 5 targets


# ----------------------------------------------------------------------------- item 8
def test_ledger_reports_the_executed_epsilon_of_a_simulated_run(tmp_path):
    led = PrivacyLedger(1e9, DELTA)
    led.spend("FreD", dpa.GaussianDpEvent(5.0))
    res, alg, sampler = _poisson_run(tmp_path, noise_cohort_size=60, ledger=led)
    sim = privacy_event(alg.dp, sampler, 3)
    executed = privacy_event(alg.dp, sampler, 3, simulated=False)
    assert led.simulated
    want_sim = accounting.compute_epsilon([dpa.GaussianDpEvent(5.0), sim], DELTA)[0]
    want_exe = accounting.compute_epsilon([dpa.GaussianDpEvent(5.0), executed], DELTA)[0]
    assert led.spent() == pytest.approx(want_sim)
    assert led.spent_executed() == pytest.approx(want_exe) and want_exe > 1.5 * want_sim
    rep = led.report()
    assert rep["spent_epsilon_executed"] == pytest.approx(want_exe)
    assert "simulated" in rep["simulated_note"]
    plain = PrivacyLedger(10.0, DELTA)
    plain.spend("g", dpa.GaussianDpEvent(5.0))
    assert plain.spent_executed() == plain.spent() and "spent_epsilon_executed" not in plain.report()


# ----------------------------------------------------------------------------- item 6
def test_ledger_records_a_nonprivate_choice_reports_inf_and_the_epsilon_if_public():
    led = PrivacyLedger(2.0, DELTA)
    led.spend("unigram", dpa.LaplaceDpEvent(1 / 0.8), ("T",))
    before = led.spent()
    led.record_nonprivate("vocabulary", ("T",), note="top-k words of T")
    assert led.spent() == math.inf and led.epsilon_by_population()["T"] == math.inf
    assert led.spent_if_public() == pytest.approx(before)
    assert led.nonprivate_entries == ["vocabulary"]
    # the budget still bounds the DP releases (taking the vocabulary as public) ...
    led.spend("train", dpa.GaussianDpEvent(20.0), ("T",))
    assert led.spent() == math.inf and before < led.spent_if_public() <= 2.0
    with pytest.raises(PrivacyBudgetExceeded):
        led.spend("too much", dpa.GaussianDpEvent(0.5), ("T",))
    # ... and a non-private event is never *spent*, only recorded on request
    with pytest.raises(PrivacyBudgetExceeded, match="record_nonprivate"):
        led.spend("no noise", dpa.NonPrivateDpEvent(), ("T",))
    rep = led.report()
    assert rep["spent_epsilon"] == math.inf
    assert rep["spent_epsilon_if_public"] == pytest.approx(led.spent_if_public())
    assert rep["nonprivate_entries"] == ["vocabulary"] and "NON-PRIVATE" in rep["nonprivate_note"]
    assert led.dp_events() == [e.event for e in led.entries if e.name != "vocabulary"]
    back = PrivacyLedger.from_dict(json.loads(json.dumps(led.to_dict())))
    assert back.nonprivate_entries == ["vocabulary"] and back.spent() == math.inf
    # a resumed run absorbing a checkpoint's ledger keeps one copy of the entry
    again = PrivacyLedger(2.0, DELTA)
    again.record_nonprivate("vocabulary", ("T",), note="top-k words of T")
    again.absorb(back)
    assert again.nonprivate_entries == ["vocabulary"]


def test_vocabularies_default_to_public_data():
    from configs.common import from_scale
    from configs.lm_fl import get_config as lm_config
    from configs.population_expansion import BASE, SCALES
    for scale in ("smoke", "small", "paper"):
        # from_scale: the paper scale's settings (get_config refuses it on the packaged data)
        assert from_scale(BASE, SCALES, scale).vocabulary == "public"
        assert lm_config(scale).tokenizer == "sentencepiece"


def test_population_expansion_vocabulary_public_by_default_private_only_on_request():
    from fedpriv import expansion as pe
    from fedpriv.data import load_public_pool
    from fedpriv.data.tokenizers import WordTokenizer

    class _Raw:  # T's training text: words no public text has
        def texts(self, split, dom):
            return ["zzqprivateword zzqprivateword only one user wrote this"]

    from configs.population_expansion import get_config
    cfg = get_config("smoke")
    tok, public = pe.build_vocabulary(cfg, _Raw())
    assert public
    want = WordTokenizer.fit(load_public_pool(progress=False).texts, k=cfg.vocab_words)
    assert tok._itos == want._itos and "zzqprivateword" not in tok._itos
    tok, public = pe.build_vocabulary(dataclasses.replace(cfg, vocabulary="target_train"), _Raw())
    assert not public and "zzqprivateword" in tok._itos
