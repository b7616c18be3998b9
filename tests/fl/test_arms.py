"""Arms in one program (fedpriv.fl.arms, issue 51): several runs on one cohort schedule, vmapped
over their server states, give each arm what it gets alone, ledgers included."""
import jax
import numpy as np
import optax
import pytest

from fedpriv.dp.ledger import PrivacyLedger, event_to_json
from fedpriv.fl.algorithms import DPConfig, build_algorithm, server_optimizer
from fedpriv.fl.arms import stack, train_arms, unstack
from fedpriv.fl.loop import train
from fedpriv.fl.run_records import PrivacyAccountingError
from fedpriv.fl.samplers import PoissonSampler, ShuffledPassSampler
from tests.fl.helpers import init_params, loss_fn, make_dataset

N, COHORT, ROUNDS = 24, 6, 4
MECHS = {"gaussian": (DPConfig(0.5, 1.3, "gaussian"), lambda: PoissonSampler(N, COHORT / N, seed=1)),
         "tree": (DPConfig(0.5, 1.7, "tree", 4), lambda: ShuffledPassSampler(N, COHORT, seed=1))}


def _inits(n=3):
    """Arms that differ in their initial parameters (e.g. a table's pre-training rows)."""
    base = init_params()
    return [jax.tree_util.tree_map(lambda x, a=a: x + 0.3 * a, base) for a in range(n)]


@pytest.mark.parametrize("mech", sorted(MECHS))
def test_arms_equal_each_arm_alone(mech):
    dp, sampler = MECHS[mech]
    alg = build_algorithm(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), dp, sampler().expected_cohort_size)
    data = make_dataset(num_clients=N, seed=2)
    eval_fn = lambda p: {"w0": float(p["w"][0])}  # noqa: E731
    kw = dict(rounds=ROUNDS, batch_size=4, seed=1, max_steps=3, progress=False, eval_fn=eval_fn, eval_every=2)
    inits = _inits()
    ledgers = [PrivacyLedger(1e6, 1e-6, neighboring="add_remove") for _ in inits]
    together = train_arms(alg, inits, data, list(data), sampler(), ledgers=ledgers, **kw)
    for a, p0 in enumerate(inits):
        alone_ledger = PrivacyLedger(1e6, 1e-6, neighboring="add_remove")
        alone = train(alg, p0, data, list(data), sampler(), ledger=alone_ledger, log=None, **kw)
        leaves = zip(jax.tree_util.tree_leaves(together[a].state.params), jax.tree_util.tree_leaves(alone.state.params))
        for x, y in leaves:
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)  # float order only
        # the same noise: the mechanism's state (its key) advanced exactly as alone
        assert [event_to_json(e.event) for e in ledgers[a].entries] == \
               [event_to_json(e.event) for e in alone_ledger.entries]
        assert ledgers[a].spent() == alone_ledger.spent()
        assert [e["round"] for e in together[a].evals] == [e["round"] for e in alone.evals] == [2, 4]
        np.testing.assert_allclose([e["eval_w0"] for e in together[a].evals], [e["eval_w0"] for e in alone.evals],
                                   rtol=1e-5, atol=1e-6)
    # the arms really differ (not one arm copied): their final parameters are distinct
    assert not np.allclose(np.asarray(together[0].state.params["w"]), np.asarray(together[1].state.params["w"]))


def test_arms_of_one_init_are_identical():
    """Two arms from the same parameters on one seed's schedule get the same cohorts, round keys
    and noise (as two runs alone would): bit for bit equal."""
    dp, sampler = MECHS["tree"]
    alg = build_algorithm(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), dp, sampler().expected_cohort_size)
    data = make_dataset(num_clients=N, seed=2)
    p = init_params()
    res = train_arms(alg, [p, p], data, list(data), sampler(), rounds=2, batch_size=4, seed=1, progress=False,
                     ledgers=[PrivacyLedger(1e6, 1e-6, neighboring="add_remove") for _ in range(2)])
    np.testing.assert_array_equal(np.asarray(res[0].state.params["w"]), np.asarray(res[1].state.params["w"]))


def test_refusals():
    dp, sampler = MECHS["gaussian"]
    alg = build_algorithm(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), dp, sampler().expected_cohort_size)
    data = make_dataset(num_clients=N, seed=2)
    kw = dict(rounds=2, batch_size=4, seed=1, progress=False)
    with pytest.raises(ValueError, match="one each"):
        train_arms(alg, _inits(2), data, list(data), sampler(), ledgers=[PrivacyLedger(1e6, 1e-6)], **kw)
    with pytest.raises(PrivacyAccountingError, match="needs a ledger"):
        train_arms(alg, _inits(2), data, list(data), sampler(), ledgers=[None, None], **kw)
    used = PrivacyLedger(1e6, 1e-6, neighboring="add_remove")
    fresh = PrivacyLedger(1e6, 1e-6, neighboring="add_remove")
    train_arms(alg, _inits(1), data, list(data), sampler(), ledgers=[used], **kw)
    with pytest.raises(PrivacyAccountingError, match="already has an entry"):
        train_arms(alg, _inits(2), data, list(data), sampler(), ledgers=[fresh, used], **kw)
    assert fresh.spent() == 0.0  # refused before anything was charged


def test_stack_unstack_roundtrip():
    trees = _inits(3)
    back = unstack(stack(trees), 3)
    for a, b in zip(trees, back):
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
