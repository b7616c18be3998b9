"""fedpriv.dp's optax-native privatizers: the engine's noise, usable in any optax chain."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.dp import gaussian_privatizer, tree_privatizer
from fedpriv.fl import algorithms as algs
from fedpriv.fl.cohort import build_cohort
from tests.oracles import tree_prefix_noise

DIM, CLIP, Z, R, ROUNDS = 6, 0.5, 1.3, 4, 7


def linear_loss(params, batch, rng):
    # gradient -mean(x): each client's delta is independent of the params, so the round's
    # clipped sum is the same whatever the noise did before
    n = jnp.maximum(jnp.sum(batch["mask"]), 1.0)
    loss = -jnp.sum((batch["x"] @ params["w"]) * batch["mask"]) / n
    return loss, {"loss_sum": loss * n, "num_tokens": n}


def _data(num_clients=5):
    rng = np.random.default_rng(0)
    return {f"c{i}": {"x": rng.normal(size=(int(rng.integers(3, 9)), DIM)).astype(np.float32)}
            for i in range(num_clients)}


def _engine(z, server_opt):
    return algs.build_algorithm(linear_loss, optax.sgd(0.7), server_opt,
                                algs.DPConfig(CLIP, z, "tree", R), expected_cohort_size=5.0)


def test_dp_ftrl_noise_in_a_users_optax_chain_equals_the_engines():
    data, key = _data(), jax.random.key(42)
    cohort = build_cohort(data, list(data), batch_size=4, capacity=5)
    params = {"w": jnp.zeros((DIM,), jnp.float32)}
    server = optax.sgd(0.3, momentum=0.9)

    # the round's clipped sum, from a noise-free run (server SGD lr 1: params move by sum / m)
    plain = _engine(0.0, optax.sgd(1.0))
    s0 = plain.init(params, key)
    s1, _ = plain.apply(s0, cohort.batches, cohort.client_mask, jax.random.key(1))
    clipped_sum = jax.tree_util.tree_map(lambda a, b: (a - b) * 5.0, s1.params, s0.params)
    assert float(jnp.linalg.norm(clipped_sum["w"])) > CLIP  # several clients, some clipped

    engine = _engine(Z, server)
    state = engine.init(params, key)
    k_noise = jax.random.split(key)[0]  # what the engine's init gives its noise (documented)
    chain = optax.chain(tree_privatizer(Z * CLIP, k_noise, R), optax.scale(-1 / 5.0), server)
    user_params, user_state = params, chain.init(params)
    for r in range(ROUNDS):  # crosses a tree restart at round R
        state, _ = engine.apply(state, cohort.batches, cohort.client_mask, jax.random.key(100 + r))
        upd, user_state = chain.update(clipped_sum, user_state, user_params)
        user_params = optax.apply_updates(user_params, upd)
        np.testing.assert_allclose(np.asarray(state.params["w"]), np.asarray(user_params["w"]),
                                   rtol=2e-5, atol=2e-5)
    # and the noise is really there: far from the noise-free trajectory
    free = _engine(0.0, server)
    fs = free.init(params, key)
    for r in range(ROUNDS):
        fs, _ = free.apply(fs, cohort.batches, cohort.client_mask, jax.random.key(100 + r))
    assert float(jnp.max(jnp.abs(fs.params["w"] - state.params["w"]))) > 1e-2


def test_tree_privatizer_releases_noisy_prefix_sums():
    key, std, like = jax.random.key(3), 2.0, {"a": jnp.zeros((3,)), "b": jnp.zeros((2, 2))}
    tx = tree_privatizer(std, key, restart_every=8)
    state, total, xs = tx.init(like), None, []
    for t in range(1, 8):
        x = jax.tree_util.tree_map(lambda z, t=t: z + t, like)
        inc, state = jax.jit(tx.update)(x, state)
        total = inc if total is None else jax.tree_util.tree_map(jnp.add, total, inc)
        xs.append(x)
        # sum of released increments = true prefix sum + the tree's prefix noise n(t)
        true = jax.tree_util.tree_map(lambda *v: sum(v), *xs)
        noise = tree_prefix_noise(jax.random.fold_in(key, 0), t, like, std, num_levels=4)
        for k in like:
            np.testing.assert_allclose(total[k], true[k] + noise[k], rtol=1e-5, atol=1e-5)


def test_gaussian_privatizer_std_and_freshness():
    tx = gaussian_privatizer(0.5, jax.random.key(0))
    zeros = {"w": jnp.zeros((20000,))}
    state = tx.init(zeros)
    a, state = tx.update(zeros, state)
    b, state = tx.update(zeros, state)
    assert float(jnp.std(a["w"])) == pytest.approx(0.5, rel=0.03)
    assert abs(float(jnp.corrcoef(a["w"], b["w"])[0, 1])) < 0.05  # fresh noise every update
    with pytest.raises(ValueError, match="without a key"):
        gaussian_privatizer(0.5, None).init(zeros)
