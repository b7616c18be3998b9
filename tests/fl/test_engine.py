"""Engine properties (docs/design.md §1.8): FedAvg equivalence, sensitivity, padding, non-finite."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.dp.clipping import global_norm
from fedpriv.fl.algorithms import DPConfig, build_algorithm, dp_fedavg, server_optimizer
from fedpriv.fl.cohort import build_cohort
from tests.fl.helpers import init_params, loss_fn, make_dataset
from tests.oracles import cohort_sum, make_client_update

B = 4


def _reference_fedavg_round(params, dataset, ids, lr_client, lr_server, batch_size, steps):
    """Plain Python FedAvg: each client runs SGD over its batches; average the deltas."""
    grad = jax.grad(lambda p, b: loss_fn(p, b, None)[0])
    deltas = []
    for cid in ids:
        x, y = dataset[cid]["x"], dataset[cid]["y"]
        p = params
        for s in range(steps):
            sl = slice(s * batch_size, (s + 1) * batch_size)
            if len(x[sl]) == 0:
                break
            b = {"x": jnp.asarray(x[sl]), "y": jnp.asarray(y[sl]), "mask": jnp.ones(len(x[sl]))}
            g = grad(p, b)
            p = jax.tree_util.tree_map(lambda a, d: a - lr_client * d, p, g)
        deltas.append(jax.tree_util.tree_map(jnp.subtract, p, params))
    avg = jax.tree_util.tree_map(lambda *d: sum(d) / len(d), *deltas)
    return jax.tree_util.tree_map(lambda a, d: a + lr_server * d, params, avg)


def test_no_clip_no_noise_equals_plain_fedavg():
    data = make_dataset()
    ids = list(data)[:6]
    cohort = build_cohort(data, ids, B, capacity=8)  # 2 padded clients
    steps = cohort.batches["mask"].shape[1]
    alg = build_algorithm(loss_fn, optax.sgd(0.05), optax.sgd(0.7), DPConfig(), expected_cohort_size=6)
    state = alg.init(init_params(), jax.random.key(0))
    state, metrics = alg.apply(state, cohort.batches, cohort.client_mask, jax.random.key(1))
    ref = _reference_fedavg_round(init_params(), data, ids, 0.05, 0.7, B, steps)
    for k in ref:
        np.testing.assert_allclose(np.asarray(state.params[k]), np.asarray(ref[k]), rtol=2e-5, atol=1e-6)
    assert float(metrics["num_clients"]) == 6
    assert float(metrics["num_tokens"]) == sum(len(data[c]["y"]) for c in ids)


@pytest.mark.parametrize("weighting", ["uniform", "num_examples"])
def test_replacing_one_client_moves_sum_by_at_most_clip(weighting):
    data = make_dataset(seed=1)
    adversary = {"x": np.full((40, 5), 50.0, np.float32), "y": np.full((40,), -1e3, np.float32)}
    ids = list(data)[:7]
    upd = make_client_update(loss_fn, optax.sgd(0.01))
    clip = 0.3
    f = jax.jit(lambda b, m: cohort_sum(upd, init_params(), b, m, jax.random.key(0), clip,
                                        weighting, 16.0)[0])
    base = build_cohort(data, ids, B, 8, max_steps=16)
    swapped = build_cohort({**data, "adv": adversary}, ids[:-1] + ["adv"], B, 8, max_steps=16)
    removed = build_cohort(data, ids[:-1], B, 8, max_steps=16)
    s0 = f(base.batches, base.client_mask)
    for other in (swapped, removed):
        if other.batches["mask"].shape != base.batches["mask"].shape:
            other = build_cohort({**data, "adv": adversary}, other.client_ids, B, 8,
                                 max_steps=base.batches["mask"].shape[1])
        s1 = f(other.batches, other.client_mask)
        diff = float(global_norm(jax.tree_util.tree_map(jnp.subtract, s0, s1)))
        bound = 2 * clip if other is swapped else clip   # replace-one vs add/remove
        assert diff <= bound * (1 + 1e-5), (diff, bound)
        assert diff > 0.5 * clip  # the test is not vacuous


def test_padded_steps_examples_and_clients_change_nothing():
    data = make_dataset(seed=2)
    ids = list(data)[:3]
    alg = build_algorithm(loss_fn, optax.sgd(0.05), optax.sgd(1.0), DPConfig(clip_norm=0.5),
                          expected_cohort_size=3)
    st = alg.init(init_params(), jax.random.key(0))
    small = build_cohort(data, ids, B, capacity=3)
    big = build_cohort(data, ids, B, capacity=8, max_steps=32)
    # more steps by padding a client's own steps dimension
    s1, m1 = alg.apply(st, small.batches, small.client_mask, jax.random.key(1))
    s2, m2 = alg.apply(st, big.batches, big.client_mask, jax.random.key(1))
    for k in s1.params:
        np.testing.assert_allclose(np.asarray(s1.params[k]), np.asarray(s2.params[k]), rtol=1e-5, atol=1e-7)
    assert float(m1["loss_sum"]) == pytest.approx(float(m2["loss_sum"]), rel=1e-5)


def test_nonfinite_client_is_dropped_and_counted():
    data = make_dataset(seed=3)
    bad = {"x": np.full((8, 5), np.nan, np.float32), "y": np.zeros((8,), np.float32)}
    ids = list(data)[:4]
    alg = build_algorithm(loss_fn, optax.sgd(0.05), optax.sgd(1.0), DPConfig(clip_norm=1.0),
                          expected_cohort_size=5)
    st = alg.init(init_params(), jax.random.key(0))
    with_bad = build_cohort({**data, "bad": bad}, ids + ["bad"], B, 5, max_steps=8)
    without = build_cohort(data, ids, B, 5, max_steps=8)
    s1, m1 = alg.apply(st, with_bad.batches, with_bad.client_mask, jax.random.key(1))
    s2, _ = alg.apply(st, without.batches, without.client_mask, jax.random.key(1))
    assert float(m1["num_nonfinite"]) == 1
    assert all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree_util.tree_leaves(s1.params))
    for k in s1.params:
        np.testing.assert_allclose(np.asarray(s1.params[k]), np.asarray(s2.params[k]), rtol=1e-5, atol=1e-7)


def test_chunked_aggregation_equals_vmapped():
    data = make_dataset(seed=4)
    ids = list(data)[:8]
    cohort = build_cohort(data, ids, B, 8, max_steps=8)
    kw = dict(clip_norm=0.2, noise_multiplier=0.5, expected_cohort_size=8)
    a = dp_fedavg(loss_fn, optax.sgd(0.05), optax.sgd(1.0), **kw)
    c = dp_fedavg(loss_fn, optax.sgd(0.05), optax.sgd(1.0), chunk_size=2, **kw)
    sa, _ = a.apply(a.init(init_params(), jax.random.key(0)), cohort.batches, cohort.client_mask, jax.random.key(1))
    sc, _ = c.apply(c.init(init_params(), jax.random.key(0)), cohort.batches, cohort.client_mask, jax.random.key(1))
    for k in sa.params:
        np.testing.assert_allclose(np.asarray(sa.params[k]), np.asarray(sc.params[k]), rtol=1e-5, atol=1e-6)


def test_server_noise_std_and_noise_cohort_scaling():
    """With zero-update clients the server step is pure noise: std = z*C*scale/expected."""
    zero_loss = lambda p, b, r: (0.0 * jnp.sum(p["w"]), {"n": jnp.sum(b["mask"])})
    data = make_dataset(seed=5)
    ids = list(data)[:4]
    cohort = build_cohort(data, ids, B, 4, max_steps=8)
    params = {"w": jnp.zeros((20000,))}
    for noise_cohort, scale in [(None, 1.0), (40, 0.1)]:
        alg = dp_fedavg(zero_loss, optax.sgd(0.1), optax.sgd(1.0), clip_norm=0.5, noise_multiplier=2.0,
                        expected_cohort_size=4, noise_cohort_size=noise_cohort)
        st, _ = alg.apply(alg.init(params, jax.random.key(0)), cohort.batches, cohort.client_mask, jax.random.key(1))
        std = float(np.std(np.asarray(st.params["w"])))
        assert std == pytest.approx(2.0 * 0.5 * scale / 4, rel=0.03)


def _zero_loss(p, b, r):
    return 0.0 * jnp.sum(p["w"]), {"n": jnp.sum(b["mask"])}


def test_adaptive_clipping_noise_std_is_z_times_the_current_clip_every_round():
    """Adaptive clipping (Andrew et al. 2021) with the Gaussian mechanism: the noise released in
    round t has std ``z C_t`` on the sum (the clip of that round, ``metrics['clip_norm']``), not
    ``z C_0``, and is fresh every round. Zero-update clients make the server step pure noise,
    ``N(0, (z C_t / m)^2)`` per coordinate; every client is below C, so C_t shrinks by
    ~``exp(-eta / 2)`` a round (to below a fifth of C_0 in 6 rounds). Each round's sample std
    over 16384 coordinates is within 5 sd (``5 / sqrt(2 * 16384)`` = 2.8 %) of ``z C_t / m``,
    and any two rounds' noise has a sample correlation within ``5 / sqrt(16384)`` of 0 (an
    engine that does not advance its noise state repeats one draw: correlation 1)."""
    data = make_dataset(seed=5)
    cohort = build_cohort(data, list(data)[:4], B, 4, max_steps=8)
    ac = AdaptiveClipping(initial_clip=1.0, target_quantile=0.5, learning_rate=1.0, count_stddev=0.5)
    alg = dp_fedavg(_zero_loss, optax.sgd(0.1), optax.sgd(1.0), clip_norm=1.0, noise_multiplier=2.0,
                    expected_cohort_size=4, adaptive=ac)
    state = alg.init({"w": jnp.zeros((16384,))}, jax.random.key(0))
    clips, noise = [], []
    for t in range(6):
        before = np.asarray(state.params["w"], np.float64)
        state, metrics = alg.apply(state, cohort.batches, cohort.client_mask, jax.random.key(1 + t))
        clip = float(metrics["clip_norm"])
        noise.append(np.asarray(state.params["w"], np.float64) - before)
        std = float(np.std(noise[-1]))
        assert abs(std / (2.0 * clip / 4) - 1) < 5 / np.sqrt(2 * 16384), (t, clip, std)
        clips.append(clip)
    assert clips[0] == 1.0 and clips[-1] < 0.2 and np.all(np.diff(clips) < 0), clips
    corr = np.corrcoef(np.stack(noise))[~np.eye(6, dtype=bool)]
    assert np.abs(corr).max() < 5 / np.sqrt(16384), np.abs(corr).max()


def test_adaptive_clipping_releases_the_sum_clipped_to_the_current_clip():
    """Issue 54 (a survivor of benchmarks/mutants/dp.toml: the sum normalised by C_0 before the
    noise and scaled back by C_t). With adaptive clipping the engine's release in round t is
    the cohort's sum clipped to C_t (noise 0 here): ``m`` times the server step equals the
    oracle's ``cohort_sum`` at ``C_t`` (``tests/oracles.py``), in round 0 and in round 1, after C
    grew by ~exp(eta gamma) (most clients above C_0: their sum moves with C; normalising by
    C_0 would scale it by C_1 / C_0 ~ 1.6)."""
    data = make_dataset(seed=3)
    ids = list(data)[:6]
    cohort = build_cohort(data, ids, B, 8, max_steps=4)
    ac = AdaptiveClipping(initial_clip=0.05, target_quantile=0.5, learning_rate=1.0, count_stddev=0.0)
    alg = build_algorithm(loss_fn, optax.sgd(0.05), optax.sgd(1.0),
                          DPConfig(clip_norm=0.05, noise_multiplier=0.0, adaptive=ac), expected_cohort_size=6)
    oracle = jax.jit(lambda p, c: cohort_sum(make_client_update(loss_fn, optax.sgd(0.05)), p,
                                             cohort.batches, cohort.client_mask, jax.random.key(1), c)[0])
    state = alg.init(init_params(), jax.random.key(0))
    clips = []
    for _ in range(2):
        clip = float(state.clip_state.clip_norm)
        want = oracle(state.params, clip)
        new, metrics = alg.apply(state, cohort.batches, cohort.client_mask, jax.random.key(1))
        assert float(metrics["clip_norm"]) == clip and float(metrics["frac_clipped"]) > 0.5
        for k in want:
            np.testing.assert_allclose(6 * (np.asarray(new.params[k]) - np.asarray(state.params[k])),
                                       np.asarray(want[k]), rtol=1e-4, atol=1e-7)
        clips.append(clip)
        state = new
    assert clips[1] > 1.5 * clips[0], clips


def test_adaptive_clip_count_counts_the_real_clients_only():
    """The clip count the engine releases (``AdaptiveClipping.update``: ``sum_i (b_i - 1/2)``
    over the cohort's real clients) ignores padded slots: 5 real clients of 8 slots, every real
    client below C, count noise 0, give ``unclipped_estimate = 2.5 / m + 1/2`` (3 padded slots
    counted would give 4 / m + 1/2), with the update ``C_1 = C_0 exp(-eta (b - gamma))``."""
    data = make_dataset(seed=5)
    cohort = build_cohort(data, list(data)[:5], B, 8, max_steps=8)
    ac = AdaptiveClipping(initial_clip=1.0, target_quantile=0.5, learning_rate=0.2, count_stddev=0.0)
    alg = dp_fedavg(_zero_loss, optax.sgd(0.1), optax.sgd(1.0), clip_norm=1.0, noise_multiplier=1.0,
                    expected_cohort_size=6, adaptive=ac)
    state = alg.init({"w": jnp.zeros((8,))}, jax.random.key(0))
    state, metrics = alg.apply(state, cohort.batches, cohort.client_mask, jax.random.key(1))
    assert float(metrics["num_clients"]) == 5
    assert float(metrics["unclipped_estimate"]) == pytest.approx(2.5 / 6 + 0.5, rel=1e-6)
    assert float(state.clip_state.clip_norm) == pytest.approx(math.exp(-0.2 * (2.5 / 6)), rel=1e-6)


def test_fedadam_and_momentum_servers_build_and_learn():
    data = make_dataset(seed=6)
    ids = list(data)[:8]
    cohort = build_cohort(data, ids, B, 8, max_steps=8)
    for name, lr in [("sgdm", 0.5), ("adam", 0.1)]:
        alg = build_algorithm(loss_fn, optax.sgd(0.05), server_optimizer(name, lr), DPConfig(), 8)
        st = alg.init(init_params(), jax.random.key(0))
        losses = []
        for r in range(15):
            st, m = alg.apply(st, cohort.batches, cohort.client_mask, jax.random.key(r))
            losses.append(float(m["loss_sum"] / m["num_tokens"]))
        assert losses[-1] < 0.3 * losses[0], (name, losses)
    with pytest.raises(ValueError):
        server_optimizer("rmsprop", 1.0)


def test_dpconfig_validation():
    with pytest.raises(ValueError, match="finite clip"):
        DPConfig(clip_norm=math.inf, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="mechanism"):
        DPConfig(mechanism="laplace")
    with pytest.raises(ValueError, match="weighting"):
        DPConfig(weighting="sqrt")


def test_empty_client_is_a_clear_error():
    data = make_dataset(seed=7)
    data["empty"] = {"x": np.zeros((0, 5), np.float32), "y": np.zeros((0,), np.float32)}
    with pytest.raises(ValueError, match="'empty' has no examples"):
        build_cohort(data, ["empty"], B, 2)
