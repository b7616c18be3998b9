"""Clipping and noise mechanisms: norms, non-finite handling, noise scales, tree prefix sums."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedpriv.dp.clipping import clip_update, global_norm
from fedpriv.dp.noise import (
    gaussian_privatizer,
    node_noise,
    num_tree_levels,
    tree_increment_noise,
    tree_privatizer,
)
from tests.oracles import distributed_noise_share, tree_prefix_noise


def test_clip_bounds_norm_and_keeps_small_updates():
    upd = {"a": jnp.full((3, 4), 2.0), "b": jnp.ones((5,))}
    f = jax.jit(clip_update)
    clipped, norm, finite = f(upd, 1.0)
    assert bool(finite)
    np.testing.assert_allclose(float(norm), np.sqrt(12 * 4 + 5), rtol=1e-6)
    np.testing.assert_allclose(float(global_norm(clipped)), 1.0, rtol=1e-5)
    same, n2, _ = f(upd, 100.0)
    for k in upd:
        np.testing.assert_array_equal(np.asarray(same[k]), np.asarray(upd[k]))
    # direction preserved
    np.testing.assert_allclose(np.asarray(clipped["b"]) / np.asarray(clipped["a"])[0, 0], 0.5, rtol=1e-5)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_update_is_zeroed_and_flagged(bad):
    upd = {"a": jnp.array([1.0, bad]), "b": jnp.ones((2,))}
    clipped, norm, finite = jax.jit(clip_update)(upd, 1.0)
    assert not bool(finite) and np.isinf(float(norm))
    assert all(np.all(np.asarray(v) == 0) for v in jax.tree_util.tree_leaves(clipped))


def test_gaussian_noise_std_is_z_times_c():
    z, c = 1.3, 0.7
    mech = gaussian_privatizer(z * c, jax.random.key(0))
    like = {"w": jnp.zeros((20000,))}
    noised, state = jax.jit(mech.update)(like, mech.init(like))
    x = np.asarray(noised["w"])
    # KS test against N(0, (zC)^2) and fresh noise each round
    assert stats.kstest(x / (z * c), "norm").pvalue > 1e-3
    noised2, _ = jax.jit(mech.update)(like, state)
    assert abs(np.corrcoef(x, np.asarray(noised2["w"]))[0, 1]) < 0.05


def test_every_tree_node_has_std_z_times_c():
    z, c = 0.9, 2.0
    key = jax.random.key(3)
    like = jnp.zeros((8000,))
    for level in range(4):
        for index in range(3):
            x = np.asarray(node_noise(key, level, index, like, z * c))
            assert stats.kstest(x / (z * c), "norm").pvalue > 1e-4, (level, index)
    # distinct nodes are independent
    a = np.asarray(node_noise(key, 0, 0, like, 1.0))
    b = np.asarray(node_noise(key, 1, 0, like, 1.0))
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05


def test_tree_prefix_noise_variance_is_popcount_times_node_variance():
    std = 1.5
    like = jnp.zeros((20000,))
    for t in [1, 2, 3, 7, 12]:
        x = np.asarray(tree_prefix_noise(jax.random.key(1), jnp.int32(t), like, std, num_tree_levels(16)))
        expected = bin(t).count("1") * std ** 2
        assert abs(x.var() / expected - 1) < 0.05, (t, x.var(), expected)


def test_tree_increments_telescope_to_prefix_noise():
    like = {"a": jnp.zeros((3,)), "b": jnp.zeros((2, 2))}
    key = jax.random.key(7)
    levels = num_tree_levels(37)
    inc = jax.jit(tree_increment_noise, static_argnums=(4,))
    acc = jax.tree_util.tree_map(jnp.zeros_like, like)
    for t in range(1, 38):
        acc = jax.tree_util.tree_map(jnp.add, acc, inc(key, jnp.int32(t), like, 1.0, levels))
        pre = tree_prefix_noise(key, jnp.int32(t), like, 1.0, levels)
        for k in like:
            np.testing.assert_allclose(np.asarray(acc[k]), np.asarray(pre[k]), atol=1e-4)


def _unrolled_increment(key, t, like, std, num_levels):
    """The increment as it was drawn until 2026-11-27 (a Python loop over the levels): the oracle
    that the fori_loop version moves no noise of stored runs."""
    from fedpriv.dp.noise import node_noise
    h0 = jax.lax.population_count((t & -t) - 1)
    total = jax.tree_util.tree_map(jnp.zeros_like, like)
    for h in range(num_levels):
        coef = jnp.where(h == h0, 1.0, jnp.where(h < h0, -1.0, 0.0))
        idx = jnp.where(h == h0, (t >> h) - 1, ((t - 1) >> h) - 1)

        def add(total, h=h, coef=coef, idx=idx):
            z = node_noise(key, h, jnp.maximum(idx, 0), like, std)
            return jax.tree_util.tree_map(lambda a, b: a + coef.astype(b.dtype) * b, total, z)

        total = jax.lax.cond(coef != 0, add, lambda total: total, total)
    return total


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tree_increment_is_bit_identical_to_the_unrolled_levels(dtype):
    like = {"a": jnp.zeros((5, 3), dtype), "b": jnp.zeros((7,), dtype), "c": jnp.zeros((), dtype)}
    key = jax.random.key(11)
    levels = num_tree_levels(40)
    new = jax.jit(tree_increment_noise, static_argnums=(4,))
    old = jax.jit(_unrolled_increment, static_argnums=(4,))
    for t in [1, 2, 3, 4, 5, 8, 12, 16, 31, 32, 40]:
        a, b = new(key, jnp.int32(t), like, 0.7, levels), old(key, jnp.int32(t), like, 0.7, levels)
        for k in like:
            assert np.array_equal(np.asarray(a[k], np.float32), np.asarray(b[k], np.float32)), (t, k)


def test_noise_free_tree_reproduces_exact_prefix_sums():
    mech = tree_privatizer(0.0, jax.random.key(0), restart_every=5)
    xs = np.random.default_rng(0).normal(size=(12, 4)).astype(np.float32)
    state = mech.init(jnp.asarray(xs[0]))
    released = []
    for x in xs:
        inc, state = mech.update(jnp.asarray(x), state)
        released.append(np.asarray(inc))
    np.testing.assert_allclose(np.cumsum(released, 0), np.cumsum(xs, 0), rtol=1e-5, atol=1e-5)


def test_tree_noise_on_prefix_sums_and_restarts():
    """Within a tree the cumulative released noise is n(t) (popcount nodes); a restart uses a
    fresh tree whose noise is independent of the previous one."""
    std, R = 1.0, 4
    mech = tree_privatizer(std, jax.random.key(5), restart_every=R)
    like = jnp.zeros((20000,))
    state = mech.init(like)
    step = jax.jit(mech.update)
    cums, cum = [], np.zeros(20000)
    for t in range(2 * R):
        inc, state = step(like, state)
        cum = (0 if t % R == 0 else cum) + np.asarray(inc)  # prefix within the current tree
        cums.append(cum.copy())
    for t in range(2 * R):
        expected = bin(t % R + 1).count("1") * std ** 2
        assert abs(cums[t].var() / expected - 1) < 0.06, (t, cums[t].var(), expected)
    assert abs(np.corrcoef(cums[R - 1], cums[R])[0, 1]) < 0.05  # new tree, new noise


def test_distributed_shares_add_up_to_required_variance():
    std, m = 2.0, 50
    like = jnp.zeros((4000,))
    keys = jax.random.split(jax.random.key(0), m)
    shares = jax.vmap(lambda k: distributed_noise_share(k, like, std, m))(keys)
    total = np.asarray(shares.sum(0))
    assert abs(total.std() / std - 1) < 0.05
    assert abs(np.asarray(shares).std() / (std / np.sqrt(m)) - 1) < 0.02


def test_mechanism_rejects_bad_arguments():
    with pytest.raises(ValueError, match="std"):
        tree_privatizer(-1.0, None, 1)
    with pytest.raises(ValueError, match="restart_every"):
        tree_privatizer(1.0, None, restart_every=0)
