"""An algorithm with server state and client state (issue 52 item 3): SCAFFOLD-style control
variates (``fedpriv.fl.scaffold``) -- the server's ``c`` in the server hooks' state, each client's
``c_i`` on the client (``ClientHooks.state_init``), the control-variate change in the clipped
release beside the model delta (not in the params), through ``train`` with a ledger."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.dp.ledger import PrivacyLedger, event_to_json
from fedpriv.fl.aggregate import packed_sum
from fedpriv.fl.algorithms import DPConfig, build_algorithm, privacy_event, server_optimizer
from fedpriv.fl.client import ServerView
from fedpriv.fl.cohort import pack_cohort
from fedpriv.fl.loop import train
from fedpriv.fl.samplers import PoissonSampler, UniformSampler
from fedpriv.fl.scaffold import scaffold, scaffold_client
from tests.fl.helpers import init_params, loss_fn, make_dataset

N, COHORT, ROUNDS, LR = 24, 6, 4, 0.05
KW = dict(batch_size=4, seed=1, max_steps=3, progress=False, log=None)


def _leaves(tree):
    is_key = lambda x: jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
    return [np.asarray(jax.random.key_data(x) if is_key(x) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def _alg(dp):
    return scaffold(loss_fn, LR, server_optimizer("sgd", 1.0), dp, COHORT, N)


def test_dp_scaffold_is_charged_the_mechanism_s_own_event_and_keeps_c_i_on_the_clients(tmp_path):
    data = make_dataset(num_clients=N, seed=2)
    sampler = PoissonSampler(N, COHORT / N, seed=1)
    dp = DPConfig(1.0, 1.1, "gaussian")
    ledger = PrivacyLedger(1e6, 1e-6)
    res = train(_alg(dp), init_params(), data, list(data), sampler, rounds=ROUNDS, ledger=ledger,
                workdir=str(tmp_path / "run"), **KW)
    # one release per round (model delta + control change, one clipped vector): the mechanism's event
    assert [event_to_json(e.event) for e in ledger.entries] == [
        event_to_json(privacy_event(dp, sampler, ROUNDS))]
    # the server's control variate is in its state (post-processing of the releases) ...
    c = res.state.opt_state["c"]
    assert jax.tree_util.tree_structure(c) == jax.tree_util.tree_structure(init_params())
    assert any(np.abs(x).sum() > 0 for x in _leaves(c))
    # ... each client's c_i is not: it is kept per client, changed exactly for the clients sampled
    table = res.client_states
    sampled = sorted({int(i) for r in range(ROUNDS) for i in sampler.sample(r)})
    moved = [i for i in range(N) if np.abs(np.asarray(table["w"][i])).sum() > 0]
    assert moved == sampled and 0 < len(sampled) < N
    n_server = sum(x.size for x in _leaves(res.state))
    assert n_server < N * sum(x.size for x in _leaves(init_params()))  # no per-client table there


def test_a_resumed_run_continues_the_clients_states_bit_for_bit(tmp_path):
    data = make_dataset(num_clients=N, seed=2)
    sampler = UniformSampler(N, COHORT, seed=3)
    dp = DPConfig(1.0, 0.7, "gaussian")
    whole = train(_alg(dp), init_params(), data, list(data), sampler, rounds=ROUNDS,
                  ledger=PrivacyLedger(1e6, 1e-6, neighboring="replace_one"),
                  workdir=str(tmp_path / "whole"), **KW)
    wd = str(tmp_path / "split")
    train(_alg(dp), init_params(), data, list(data), sampler, rounds=ROUNDS, stop_after=2,
          ledger=PrivacyLedger(1e6, 1e-6, neighboring="replace_one"), workdir=wd, **KW)
    again = train(_alg(dp), init_params(), data, list(data), sampler, rounds=ROUNDS,
                  ledger=PrivacyLedger(1e6, 1e-6, neighboring="replace_one"), workdir=wd, **KW)
    assert again.resumed_from == 2
    for x, y in zip(_leaves((whole.state, whole.client_states)), _leaves((again.state, again.client_states))):
        np.testing.assert_array_equal(x, y)


def test_with_zero_control_variates_the_first_round_is_fedavg():
    """Round 1 (every c_i = c = 0, no noise, no clipping): the model moves as FedAvg's does."""
    data = make_dataset(num_clients=N, seed=2)
    sampler = UniformSampler(N, COHORT, seed=3)
    dp = DPConfig()  # no noise, clip inf
    ref = build_algorithm(loss_fn, optax.sgd(LR), server_optimizer("sgd", 1.0), dp, COHORT)
    a = train(_alg(dp), init_params(), data, list(data), sampler, rounds=1, **KW)
    b = train(ref, init_params(), data, list(data), sampler, rounds=1, **KW)
    for x, y in zip(_leaves(a.state.params), _leaves(b.state.params)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert any(np.abs(x).sum() > 0 for x in _leaves(a.state.opt_state["c"]))


def test_the_release_is_clipped_as_one_vector_with_the_control_change():
    """The engine clips {model delta, control change} together: each client's contribution has
    norm <= C whatever the control variates, so the sensitivity is C."""
    data = make_dataset(num_clients=8, seed=3)
    ids = list(data)
    packed = pack_cohort(data, ids, 4, lanes=1, capacity=8, max_steps=3, rng=np.random.default_rng(0))
    hooks = scaffold_client(loss_fn, LR)
    big = {"w": jnp.full((5,), 50.0), "b": jnp.asarray(-50.0)}
    server = ServerView(init_params(), {"c": big}, jnp.asarray(0, jnp.int32))
    states = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(-x, (8,) + x.shape), big)
    clip = 0.5
    total, stats, new = jax.jit(lambda ln: packed_sum(hooks, None, server, ln, 8, jax.random.key(0),
                                                      clip, client_states=states))(packed.lanes)
    assert float(stats["num_clipped"]) == len(ids)
    assert set(total) == {"model", "control"}
    norm = np.sqrt(sum(float(jnp.sum(x ** 2)) for x in jax.tree_util.tree_leaves(total)))
    assert norm <= len(ids) * clip * (1 + 1e-5)
    assert np.abs(np.asarray(new["w"]) - np.asarray(states["w"])).sum() > 0  # c_i moved, on the client


def test_stateful_hooks_refuse_batched_first_steps_and_a_missing_state():
    data = make_dataset(num_clients=4, seed=3)
    packed = pack_cohort(data, list(data), 4, lanes=1, capacity=4, max_steps=2,
                         rng=np.random.default_rng(0), first_steps=True)
    server = ServerView(init_params(), {"c": init_params()}, jnp.asarray(0, jnp.int32))
    hooks = scaffold_client(loss_fn, LR)
    with pytest.raises(ValueError, match="pass client_states"):
        packed_sum(hooks, None, server, packed.lanes, 4, jax.random.key(0), 1.0)
    states = jax.tree_util.tree_map(lambda x: jnp.zeros((4,) + x.shape), init_params())
    with pytest.raises(ValueError, match="first steps"):
        packed_sum(hooks, None, server, packed.lanes, 4, jax.random.key(0), 1.0,
                   first=packed.first, client_states=states)
