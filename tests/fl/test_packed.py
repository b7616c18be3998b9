"""Packed-lane cohort execution: equals the padded path, pays only for real steps, bounded shapes."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.fl.aggregate import cohort_sum, packed_sum
from fedpriv.fl.algorithms import dp_fedavg, server_optimizer
from fedpriv.fl.client import make_client_update, make_local_step
from fedpriv.fl.cohort import assign_lanes, build_cohort, pack_cohort
from fedpriv.fl.execution import CohortExecutor, balanced_lanes
from fedpriv.fl.samplers import PoissonSampler
from tests.fl.helpers import init_params, loss_fn, make_dataset

B = 4


def lognormal_dataset(num_clients, seed=0, dim=5):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(2.5, 1.0, num_clients)), 1, 120).astype(int)
    w = rng.normal(size=(dim,))
    data = {}
    for i, n in enumerate(sizes):
        x = rng.normal(size=(n, dim)).astype(np.float32)
        data[f"c{i:03d}"] = {"x": x, "y": (x @ w).astype(np.float32)}
    return data


@pytest.mark.parametrize("lanes,epochs,weighting,first", [
    (1, 1, "uniform", False), (3, 1, "num_examples", False), (1, 2, "num_examples", False),
    (4, 2, "uniform", False), (1, 1, "num_examples", True), (3, 2, "uniform", True)])
def test_packed_sum_equals_padded_cohort_sum(lanes, epochs, weighting, first):
    data = lognormal_dataset(11, seed=lanes + epochs)
    ids = list(data)[:9]
    params = {"w": jnp.full((5,), 0.3), "b": jnp.asarray(-0.2)}
    rng = jax.random.key(7)
    padded = build_cohort(data, ids, B, capacity=12, max_steps=8, rng=np.random.default_rng(3))
    ref_fn = jax.jit(lambda b, m, c: cohort_sum(make_client_update(loss_fn, optax.sgd(0.05), epochs),
                                                params, b, m, rng, c, weighting, 20.0))
    norms = np.asarray(ref_fn(padded.batches, padded.client_mask, jnp.inf)[1]["norms"])[:9]
    clip = float(np.median(norms))  # clipping active for about half the clients
    ref, ref_stats = ref_fn(padded.batches, padded.client_mask, clip)
    packed = pack_cohort(data, ids, B, lanes=lanes, capacity=12, max_steps=8, local_epochs=epochs,
                         rng=np.random.default_rng(3), first_steps=first)
    if first and epochs == 1:
        assert 0 < float(packed.first.single.sum()) < 9  # some clients have only their first step
    opt = optax.sgd(0.05)
    got, stats = jax.jit(lambda ln, f: packed_sum(make_local_step(loss_fn, opt), opt.init, params, ln, 12,
                                                  rng, clip, weighting, 20.0, first=f))(packed.lanes, packed.first)
    for k in ref:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), rtol=1e-5, atol=1e-6)
    assert 0 < float(stats["num_clipped"]) < 9  # clipping is active for some clients only
    for k in ("weight_sum", "norm_sum", "num_clipped", "num_nonfinite", "num_clients"):
        np.testing.assert_allclose(float(stats[k]), float(ref_stats[k]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(stats["norms"])[:9], np.asarray(ref_stats["norms"])[:9], rtol=1e-5)
    np.testing.assert_allclose(float(stats["aux"]["num_tokens"]), float(ref_stats["aux"]["num_tokens"]))


def test_one_lane_executes_exactly_the_real_steps():
    data = lognormal_dataset(40, seed=1)
    ids = list(data)
    steps = [-(-len(data[c]["y"]) // B) for c in ids]
    packed = pack_cohort(data, ids, B, lanes=1)
    assert packed.real_steps == sum(steps) == packed.executed_steps
    padded = build_cohort(data, ids, B, capacity=40)
    assert padded.batches["mask"].shape[1] * 40 > 2 * sum(steps)  # what padding would have cost
    assert packed.lanes.src.shape[1] & (packed.lanes.src.shape[1] - 1) == 0  # power-of-two depth


def test_lpt_lanes_are_balanced_within_one_client():
    rng = np.random.default_rng(0)
    steps = [int(s) for s in np.clip(np.round(rng.lognormal(1.0, 1.0, 100)), 1, 16)]
    for lanes in (2, 4, 8):
        members = assign_lanes(steps, lanes)
        assert sorted(i for m in members for i in m) == list(range(100))
        loads = [sum(steps[i] for i in m) for m in members]
        assert max(loads) - min(loads) <= max(steps)
    w = balanced_lanes(steps)
    assert w & (w - 1) == 0 and w <= sum(steps) // max(steps)


def _executor(data, z, cohort=6):
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=1.0,
                    noise_multiplier=z, expected_cohort_size=cohort)
    return alg, CohortExecutor(alg, data, batch_size=B, capacity=16, variable_cohort=True, lanes=1)


def test_empty_cohort_releases_the_noisy_zero_sum():
    """A Poisson round that samples nobody must still release sum + noise (what is accounted)."""
    dim = 4000
    data = make_dataset(num_clients=4, dim=dim)
    z, m = 2.0, 6
    alg, ex = _executor(data, z, m)
    state = alg.init(init_params(dim), jax.random.key(0))
    packed = ex.pack([])
    assert packed.real_steps == 0
    new, metrics = ex.run(state, packed, jax.random.key(1))
    assert float(metrics["num_clients"]) == 0
    moved = np.asarray(new.params["w"] - state.params["w"])
    assert abs(moved.std() / (z * 1.0 / m) - 1) < 0.05  # noise std z C / m per coordinate
    alg0, ex0 = _executor(data, 0.0, m)
    s0 = alg0.init(init_params(dim), jax.random.key(0))
    n0, _ = ex0.run(s0, ex0.pack([]), jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(n0.params["w"]), np.asarray(s0.params["w"]))


def test_compiled_shapes_stay_bounded_over_variable_cohorts():
    data = lognormal_dataset(200, seed=2)
    ids = list(data)
    sampler = PoissonSampler(200, 0.04, seed=0)
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=1.0,
                    noise_multiplier=0.5, expected_cohort_size=sampler.expected_cohort_size)
    ex = CohortExecutor(alg, data, batch_size=B, capacity=sampler.max_cohort_size,
                        variable_cohort=True, lanes=1)
    state = alg.init(init_params(), jax.random.key(0))
    shapes = set()
    for r in range(30):
        packed = ex.pack([ids[i] for i in sampler.sample(r)])
        shapes.add((packed.lanes.src.shape, packed.capacity))
        state, _ = ex.run(state, packed, jax.random.key(r))
    depths = {s[0][1] for s in shapes}
    assert all(d & (d - 1) == 0 for d in depths)
    assert all(c & (c - 1) == 0 or c == sampler.max_cohort_size for _, c in shapes)
    assert alg.apply_packed._cache_size() == len(shapes) <= 12
    assert ex.executed_steps == ex.real_steps > 0


def test_bf16_client_compute_keeps_float32_sums_and_tracks_float32():
    data = lognormal_dataset(12, seed=4)
    ids = list(data)[:8]
    kw = dict(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=8)
    ref = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), **kw)
    half = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), compute_dtype=jnp.bfloat16, **kw)
    packed = pack_cohort(data, ids, B)
    outs = []
    for alg in (ref, half):
        st = alg.init(init_params(), jax.random.key(0))
        st, _ = alg.apply_packed(st, packed.lanes, packed.client_mask, jax.random.key(1))
        outs.append(st.params)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(outs[1]))
    moved = np.asarray(outs[0]["w"])
    np.testing.assert_allclose(np.asarray(outs[1]["w"]), moved, rtol=0.05, atol=0.02 * np.abs(moved).max())
    assert not np.array_equal(np.asarray(outs[1]["w"]), moved)  # bf16 really ran
