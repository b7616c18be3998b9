"""Client hooks (issue 25 item 2): init / step / final, clipping outside the hooks, and two
algorithms in one file each (FedProx, client learning-rate decay), with DP, through ``train``."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.dp.ledger import PrivacyLedger, event_to_json
from fedpriv.fl.aggregate import packed_sum
from fedpriv.fl.algorithms import DPConfig, build_algorithm, privacy_event, server_optimizer
from fedpriv.fl.client import ClientHooks, ServerView, default_client, params_delta
from fedpriv.fl.client_lr_decay import client_lr_decay, decayed_client
from fedpriv.fl.cohort import pack_cohort
from fedpriv.fl.fedprox import fedprox, fedprox_client
from fedpriv.fl.loop import train
from fedpriv.fl.samplers import PoissonSampler, ShuffledPassSampler
from tests.fl.helpers import init_params, loss_fn, make_dataset

N, COHORT, ROUNDS, LR = 24, 6, 3, 0.05
MECHS = {"gaussian": (DPConfig(0.5, 1.3, "gaussian"),
                      lambda: PoissonSampler(N, COHORT / N, seed=1)),
         "tree": (DPConfig(0.5, 1.7, "tree", 4), lambda: ShuffledPassSampler(N, COHORT, seed=1))}


def _train(alg, sampler, tmp_path, rounds=ROUNDS):
    data = make_dataset(num_clients=N, seed=2)
    ledger = PrivacyLedger(1e6, 1e-6, neighboring="add_remove")
    res = train(alg, init_params(), data, list(data), sampler, rounds=rounds, ledger=ledger,
                batch_size=4, seed=1, max_steps=3, progress=False, log=None, workdir=str(tmp_path))
    return res, ledger


def _events(ledger):
    return [event_to_json(e.event) for e in ledger.entries]


def _leaves(tree):
    is_key = lambda x: jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
    return [np.asarray(jax.random.key_data(x) if is_key(x) else x)
            for x in jax.tree_util.tree_leaves(tree)]


def _server(round_=0):
    return ServerView({"w": jnp.full((5,), 0.3), "b": jnp.asarray(-0.2)}, None,
                      jnp.asarray(round_, jnp.int32))


def _run_client(hooks, server, client, steps=6):
    """One client's hooks driven by hand over its batches: its final delta."""
    carry = hooks.init(server)
    for j in range(steps):
        sl = slice(4 * j, 4 * j + 4)
        x, y = client["x"][sl], client["y"][sl]
        batch = {"x": x, "y": y, "mask": np.ones(len(x), np.float32)}
        carry, _ = hooks.step(server, carry, batch, jax.random.key(j))
    return hooks.final(server, carry)


def _norm(tree):
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(tree))))


# ----------------------------------------------------------------------------- the engine
def test_a_hook_cannot_bypass_clipping():
    """A ``final`` hook returning a huge update is still clipped to C before the sum."""
    opt = optax.sgd(LR)
    base = default_client(loss_fn, opt)
    huge = ClientHooks(base.init, base.step,
                       lambda s, c: jax.tree_util.tree_map(lambda d: 1e6 * d + 1e3,
                                                           params_delta(s, c)))
    data = make_dataset(num_clients=8, seed=3)
    ids = list(data)
    packed = pack_cohort(data, ids, 4, lanes=1, capacity=8, max_steps=3,
                         rng=np.random.default_rng(0))
    clip = 0.5
    run = jax.jit(lambda ln: packed_sum(huge, None, _server(), ln, 8, jax.random.key(0), clip))
    total, stats = run(packed.lanes)
    norms = np.asarray(stats["norms"])
    assert norms.min() > 1e3  # the hook really returned huge updates
    assert float(stats["num_clipped"]) == len(ids)
    # each contribution has norm exactly C (float32): the sum has norm <= K C
    assert _norm(total) <= len(ids) * clip * (1 + 1e-5)
    # and it is the sum of the clipped deltas
    leaves = jax.tree_util.tree_leaves(total)
    assert np.isfinite(np.concatenate([np.ravel(x) for x in leaves])).all()


def test_default_hooks_equal_the_plain_local_step():
    """``packed_sum`` driven by ``default_client`` equals the ``make_local_step`` form, bitwise."""
    from fedpriv.fl.client import make_local_step
    opt = optax.sgd(LR)
    data = make_dataset(num_clients=8, seed=3)
    packed = pack_cohort(data, list(data), 4, lanes=1, capacity=8, max_steps=3,
                         rng=np.random.default_rng(0))
    srv = _server()
    a = jax.jit(lambda ln: packed_sum(default_client(loss_fn, opt), None, srv, ln, 8,
                                      jax.random.key(0), 0.5))(packed.lanes)
    b = jax.jit(lambda ln: packed_sum(make_local_step(loss_fn, opt), opt.init, srv.params, ln, 8,
                                      jax.random.key(0), 0.5))(packed.lanes)
    for x, y in zip(_leaves(a), _leaves(b)):
        np.testing.assert_array_equal(x, y)


# ----------------------------------------------------------------------------- FedProx
@pytest.mark.parametrize("mech", list(MECHS))
def test_fedprox_mu0_is_dp_fedavg_exactly_and_is_charged_the_same_event(mech, tmp_path):
    dp, sampler = MECHS[mech]
    srv = server_optimizer("sgdm", 1.0)
    ref = build_algorithm(loss_fn, optax.sgd(LR), srv, dp, sampler().expected_cohort_size)
    alg = fedprox(loss_fn, optax.sgd(LR), srv, dp, sampler().expected_cohort_size, mu=0.0)
    r0, l0 = _train(ref, sampler(), tmp_path / "ref")
    r1, l1 = _train(alg, sampler(), tmp_path / "prox")
    for x, y in zip(_leaves(r0.state), _leaves(r1.state)):  # params, noise and clip state, round
        np.testing.assert_array_equal(x, y)
    ev = event_to_json(privacy_event(dp, sampler(), ROUNDS))
    assert _events(l0) == _events(l1) == [ev]
    # mu > 0 trains, is charged the same event, and moves the model differently
    prox5 = fedprox(loss_fn, optax.sgd(LR), srv, dp, sampler().expected_cohort_size, mu=5.0)
    r2, l2 = _train(prox5, sampler(), tmp_path / "prox5")
    assert _events(l2) == [ev]
    assert all(np.isfinite(x).all() for x in _leaves(r2.state.params))
    assert not np.array_equal(_leaves(r2.state.params)[1], _leaves(r0.state.params)[1])


def test_fedprox_pulls_the_local_model_towards_the_server_model():
    """Property: the local update's distance from the server model shrinks as mu grows."""
    data = make_dataset(num_clients=6, seed=4, min_n=24, max_n=30)
    srv = _server()
    for cid, client in data.items():
        dists = [_norm(_run_client(fedprox_client(loss_fn, optax.sgd(0.1), mu), srv, client))
                 for mu in (0.0, 0.5, 2.0, 8.0)]
        assert dists[0] > 0
        assert all(a > b for a, b in zip(dists, dists[1:])), (cid, dists)


def test_fedprox_mu0_client_equals_the_default_client_bitwise():
    data = make_dataset(num_clients=3, seed=4, min_n=24, max_n=30)
    for client in data.values():
        a = _run_client(fedprox_client(loss_fn, optax.adam(0.05), 0.0), _server(), client)
        b = _run_client(default_client(loss_fn, optax.adam(0.05)), _server(), client)
        for x, y in zip(_leaves(a), _leaves(b)):
            np.testing.assert_array_equal(x, y)


def test_fedprox_rejects_negative_mu():
    with pytest.raises(ValueError):
        fedprox_client(loss_fn, optax.sgd(LR), -1.0)


# ----------------------------------------------------------------------------- client lr decay
@pytest.mark.parametrize("t", [0, 1, 4])
def test_decayed_client_at_round_t_is_sgd_at_lr_decay_to_the_t(t):
    data = make_dataset(num_clients=3, seed=5, min_n=24, max_n=30)
    for client in data.values():
        got = _run_client(decayed_client(loss_fn, optax.sgd(0.1), 0.5), _server(t), client)
        want = _run_client(default_client(loss_fn, optax.sgd(0.1 * 0.5 ** t)), _server(t), client)
        for x, y in zip(_leaves(got), _leaves(want)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_client_lr_decay_trains_with_dp_and_is_charged_dp_fedavg_s_event(tmp_path):
    dp, sampler = MECHS["gaussian"]
    srv = server_optimizer("sgdm", 1.0)
    ref = build_algorithm(loss_fn, optax.sgd(LR), srv, dp, sampler().expected_cohort_size)
    r0, l0 = _train(ref, sampler(), tmp_path / "ref")
    cohort = sampler().expected_cohort_size
    one = client_lr_decay(loss_fn, optax.sgd(LR), srv, dp, cohort, decay=1.0)
    r1, l1 = _train(one, sampler(), tmp_path / "one")
    for x, y in zip(_leaves(r0.state.params), _leaves(r1.state.params)):  # decay 1 = DP-FedAvg
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    half = client_lr_decay(loss_fn, optax.sgd(LR), srv, dp, cohort, decay=0.5)
    r2, l2 = _train(half, sampler(), tmp_path / "half")
    ev = [event_to_json(privacy_event(dp, sampler(), ROUNDS))]
    assert _events(l2) == ev == _events(l0)
    assert not np.allclose(_leaves(r2.state.params)[1], _leaves(r0.state.params)[1])


@pytest.mark.parametrize("lanes,first", [(3, False), (1, True), (3, True)])
def test_hooks_give_the_same_sum_on_every_lane_layout(lanes, first):
    """FedProx's and the decayed client's hooks through vmapped lanes and batched first steps
    equal one sequential lane (float rounding only)."""
    data = make_dataset(num_clients=9, seed=6)
    srv = _server(2)
    for hooks in (fedprox_client(loss_fn, optax.sgd(LR), 1.0),
                  decayed_client(loss_fn, optax.sgd(LR), 0.7)):
        def run(n, f, clip):
            packed = pack_cohort(data, list(data), 4, lanes=n, capacity=12, max_steps=4,
                                 rng=np.random.default_rng(1), first_steps=f)
            fn = jax.jit(lambda ln, fs: packed_sum(hooks, None, srv, ln, 12, jax.random.key(3),
                                                   clip, first=fs))
            return fn(packed.lanes, packed.first)
        clip = float(np.median(np.asarray(run(1, False, jnp.inf)[1]["norms"])[:9]))
        (ref, ref_stats), (got, stats) = run(1, False, clip), run(lanes, first, clip)
        for x, y in zip(_leaves(got), _leaves(ref)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(stats["norms"]), np.asarray(ref_stats["norms"]),
                                   rtol=1e-5)
        assert 0 < float(ref_stats["num_clipped"]) < 9
