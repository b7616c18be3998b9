"""Central public training loop and mid-training hand-off into a running DP-FTRL job."""
import json

import jax
import numpy as np
import optax
import pytest

from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.algorithms import dp_ftrl, server_optimizer
from fedpriv.fl.loop import METRICS, load_run, replace_params, train
from fedpriv.fl.samplers import ShuffledPassSampler
from fedpriv.public.pretrain import train_central
from tests.fl.helpers import init_params, loss_fn, make_dataset


def _central_data(seed=0, n=200):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    return {"x": x, "y": (x @ np.arange(1, 6) + 0.5).astype(np.float32)}


def test_central_training_learns_and_resumes_exactly(tmp_path):
    data = _central_data()
    opt = optax.adam(0.3)
    full, hist = train_central(loss_fn, init_params(), data, steps=60, batch_size=16, seed=3,
                               optimizer=opt, progress=False)
    assert hist[-1]["loss"] < 0.05 * hist[0]["loss"]
    wd = str(tmp_path / "c")
    train_central(loss_fn, init_params(), data, steps=25, batch_size=16, seed=3, optimizer=opt,
                  workdir=wd, progress=False)
    resumed, hist2 = train_central(loss_fn, init_params(), data, steps=60, batch_size=16, seed=3,
                                   optimizer=opt, workdir=wd, progress=False)
    for a, b in zip(jax.tree_util.tree_leaves(full), jax.tree_util.tree_leaves(resumed)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    assert [h["step"] for h in hist2] == list(range(1, 61))
    with pytest.raises(ValueError, match="empty"):
        train_central(loss_fn, init_params(), {"x": np.zeros((0, 5)), "y": np.zeros(0)}, steps=1,
                      batch_size=4, seed=0)


def test_mid_training_handoff_continues_tree_and_records_post_processing(tmp_path):
    data = make_dataset(num_clients=30, seed=2)
    ids = list(data)
    s = ShuffledPassSampler(30, 5, seed=0)
    alg = dp_ftrl(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=0.5,
                  noise_multiplier=1.0, expected_cohort_size=5, rounds_per_epoch=s.rounds_per_epoch)
    ledger = PrivacyLedger(1e4, 1e-6)
    wd = str(tmp_path / "run")
    kw = dict(rounds=10, batch_size=4, seed=1, max_steps=8, progress=False, workdir=wd)
    train(alg, init_params(), data, ids, s, stop_after=5, ledger=ledger, **kw)
    template = alg.init(init_params(), jax.random.key(0))
    before = load_run(wd, template).state
    replace_params(wd, template, lambda p: jax.tree_util.tree_map(lambda x: x + 1.0, p),
                         ledger_note="public mid-training")
    run = load_run(wd, template)
    after, led = run.state, run.ledger
    assert run.round == 5 and int(after.round) == 5
    assert int(after.noise_state.step) == int(before.noise_state.step)  # the tree continues
    np.testing.assert_allclose(np.asarray(after.params["w"]), np.asarray(before.params["w"]) + 1.0)
    assert [e.name for e in led.entries] == ["fl-training", "public mid-training"]
    eps_before = led.spent()
    res = train(alg, init_params(), data, ids, s, **kw)
    assert res.resumed_from == 5 and int(res.state.round) == 10
    assert res.ledger.spent() == pytest.approx(eps_before)  # no extra privacy cost
    rows = [json.loads(l) for l in open(f"{wd}/{METRICS}")]
    assert [r["round"] for r in rows] == list(range(1, 11))
    with pytest.raises(ValueError, match="structure"):
        replace_params(wd, template, lambda p: {"w": p["w"]})
