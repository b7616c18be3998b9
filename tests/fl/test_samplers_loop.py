"""Samplers, adaptive clipping, privacy events, the round loop (ledger, resume), sharding."""
import json
import os
import subprocess
import sys
import textwrap

import dp_accounting as dpa
import jax
import numpy as np
import optax
import pytest

from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger
from fedpriv.fl.algorithms import dp_fedavg, dp_ftrl, privacy_event, server_optimizer
from fedpriv.fl.loop import METRICS, load_run, train
from fedpriv.fl.samplers import PoissonSampler, ShuffledPassSampler, UniformSampler
from tests.conftest import xla_flags
from tests.fl.helpers import init_params, loss_fn, make_dataset


def test_shuffled_passes_are_disjoint_within_an_epoch_and_reshuffle():
    s = ShuffledPassSampler(103, 10, seed=3)
    assert s.rounds_per_epoch == 10
    epoch0 = np.concatenate([s.sample(r) for r in range(10)])
    assert len(set(epoch0)) == 100
    assert not np.array_equal(s.sample(0), s.sample(10))
    np.testing.assert_array_equal(s.sample(7), ShuffledPassSampler(103, 10, seed=3).sample(7))
    assert s.steps_per_epoch(25) == [10, 10, 5]


def test_poisson_and_uniform_samplers():
    p = PoissonSampler(2000, 0.05, seed=0)
    sizes = [len(p.sample(r)) for r in range(200)]
    assert abs(np.mean(sizes) - 100) < 3
    assert max(sizes) <= p.max_cohort_size
    u = UniformSampler(50, 7, seed=1)
    assert all(len(set(u.sample(r))) == 7 for r in range(20))
    with pytest.raises(ValueError, match="cohort size"):
        UniformSampler(5, 6)
    with pytest.raises(ValueError, match="empty"):
        PoissonSampler(0, 0.1)


def test_adaptive_clipping_tracks_the_target_quantile():
    import jax.numpy as jnp
    ac = AdaptiveClipping(initial_clip=0.01, target_quantile=0.3, learning_rate=0.2, count_stddev=0.0)
    st = ac.init(jax.random.key(0))
    norms = jnp.asarray(np.random.default_rng(0).lognormal(0.0, 0.5, size=400), jnp.float32)
    mask = jnp.ones(400)
    for t in range(300):
        st, _ = ac.update(st, norms, mask, 400.0, t)
    frac_below = float(np.mean(np.asarray(norms) <= float(st.clip_norm)))
    assert abs(frac_below - 0.3) < 0.03


def test_privacy_events_per_sampler_and_adaptive_cost():
    s = ShuffledPassSampler(100, 10)
    alg = dp_ftrl(loss_fn, optax.sgd(0.1), optax.sgd(1.0), clip_norm=1.0, noise_multiplier=3.0,
                  expected_cohort_size=10, rounds_per_epoch=s.rounds_per_epoch)
    ev = privacy_event(alg.dp, s, 25)
    assert ev == dpa.ComposedDpEvent([dpa.SingleEpochTreeAggregationDpEvent(3.0, n) for n in [10, 10, 5]])
    with pytest.raises(ValueError, match="ShuffledPassSampler"):
        privacy_event(alg.dp, PoissonSampler(100, 0.1), 25)
    ad = dp_fedavg(loss_fn, optax.sgd(0.1), optax.sgd(1.0), clip_norm=1.0, noise_multiplier=1.0,
                   expected_cohort_size=10, adaptive=AdaptiveClipping(count_stddev=0.5))
    p = PoissonSampler(100, 0.1)
    from fedpriv.dp.accounting import compute_epsilon
    e_ad = compute_epsilon(privacy_event(ad.dp, p, 50), 1e-5)[0]
    plain = dp_fedavg(loss_fn, optax.sgd(0.1), optax.sgd(1.0), clip_norm=1.0, noise_multiplier=1.0,
                      expected_cohort_size=10)
    assert e_ad > compute_epsilon(privacy_event(plain.dp, p, 50), 1e-5)[0]  # counts are not free
    # noise-cohort simulation: the run actually executed is much less private
    sim = dp_fedavg(loss_fn, optax.sgd(0.1), optax.sgd(1.0), clip_norm=1.0, noise_multiplier=1.0,
                    expected_cohort_size=10, noise_cohort_size=40)
    assert compute_epsilon(privacy_event(sim.dp, p, 50, simulated=False), 1e-5)[0] > \
        compute_epsilon(privacy_event(sim.dp, p, 50), 1e-5)[0]


def _setup(rounds_per_epoch=None):
    data = make_dataset(num_clients=30, seed=11)
    ids = list(data)
    s = ShuffledPassSampler(len(ids), 5, seed=2)
    alg = dp_ftrl(loss_fn, optax.sgd(0.05), server_optimizer("sgdm", 0.5), clip_norm=0.5,
                  noise_multiplier=0.3, expected_cohort_size=5, rounds_per_epoch=s.rounds_per_epoch,
                  adaptive=AdaptiveClipping(initial_clip=0.5, count_stddev=0.25))
    return data, ids, s, alg


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    data, ids, s, alg = _setup()
    kw = dict(rounds=14, batch_size=4, seed=9, max_steps=8, checkpoint_every=3, progress=False,
              eval_fn=lambda p: {"w0": float(p["w"][0])}, eval_every=5, nonprivate_ok=True)
    full = train(alg, init_params(), data, ids, s, workdir=str(tmp_path / "a"), **kw)
    part = train(alg, init_params(), data, ids, s, workdir=str(tmp_path / "b"), stop_after=8, **kw)
    assert int(part.state.round) == 8
    resumed = train(alg, init_params(), data, ids, s, workdir=str(tmp_path / "b"), **kw)
    assert resumed.resumed_from == 8
    for a, b in zip(jax.tree_util.tree_leaves(full.state.params), jax.tree_util.tree_leaves(resumed.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(full.state.clip_state.clip_norm) == float(resumed.state.clip_state.clip_norm)
    rows_a = [json.loads(l) for l in open(tmp_path / "a" / METRICS)]
    rows_b = [json.loads(l) for l in open(tmp_path / "b" / METRICS)]
    assert [r["round"] for r in rows_b] == list(range(1, 15))
    assert rows_a == rows_b


def test_loop_spends_ledger_first_and_refuses_over_budget(tmp_path):
    data, ids, s, alg = _setup()
    small = PrivacyLedger(0.5, 1e-5)
    called = []
    with pytest.raises(PrivacyBudgetExceeded):
        train(alg, init_params(), data, ids, s, rounds=14, batch_size=4, seed=0, progress=False,
              ledger=small, workdir=str(tmp_path),
              eval_fn=lambda p: called.append(1) or {})
    assert not called and not os.path.exists(tmp_path / METRICS)
    big = PrivacyLedger(1e6, 1e-5)
    res = train(alg, init_params(), data, ids, s, rounds=3, batch_size=4, seed=0, progress=False,
                ledger=big, workdir=str(tmp_path / "ok"))
    assert res.ledger.entries[0].name == "fl-training"
    assert load_run(str(tmp_path / "ok")).ledger.entries[0].name == "fl-training"


def test_expected_cohort_size_disagreeing_with_the_sampler_is_refused(tmp_path):
    """Issue 24 item 3: with ``noise_cohort_size`` the noise follows the algorithm's expected
    cohort and the executed-run accounting the sampler's; cohort 8 built for 2 gave 4x the
    signal at the same noise while ``spent_executed()`` reported the correct run's epsilon."""
    from fedpriv.data.errors import ConfigError
    from fedpriv.dp.accounting import compute_epsilon
    data = make_dataset(num_clients=32, seed=5)
    ids = list(data)
    s = PoissonSampler(32, 0.25, seed=1)  # expected cohort 8.0 (a float)
    kw = dict(clip_norm=0.5, noise_multiplier=1.0, noise_cohort_size=64)
    wrong = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0),
                      expected_cohort_size=2, **kw)
    led = PrivacyLedger(1e6, 1e-6)
    run = dict(rounds=2, batch_size=4, seed=0, progress=False, ledger=led, log=None)
    with pytest.raises(ConfigError, match=r"expected_cohort_size=2 but the sampler draws 8 "):
        train(wrong, init_params(), data, ids, s, workdir=str(tmp_path / "w"), **run)
    assert led.entries == [] and not os.path.exists(tmp_path / "w")
    right = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0),
                      expected_cohort_size=8, **kw)
    train(right, init_params(), data, ids, s, **run)
    executed = compute_epsilon(privacy_event(right.dp, s, 2, simulated=False), 1e-6)[0]
    assert led.spent_executed() == pytest.approx(executed, rel=1e-9)
    assert led.spent_executed() > led.spent()  # the executed run is noised less than simulated


SHARD_SCRIPT = textwrap.dedent("""
    import os, sys, json
    sys.path.insert(0, os.getcwd())
    import jax, numpy as np, optax
    from fedpriv.fl.aggregate import client_mesh
    from fedpriv.fl.algorithms import dp_ftrl, server_optimizer
    from fedpriv.fl.loop import train
    from fedpriv.fl.samplers import ShuffledPassSampler
    from tests.fl.helpers import init_params, loss_fn, make_dataset
    data = make_dataset(num_clients=32, seed=5); ids = list(data)
    s = ShuffledPassSampler(32, 8, seed=1)
    alg = dp_ftrl(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=0.5,
                  noise_multiplier=0.5, expected_cohort_size=8, rounds_per_epoch=s.rounds_per_epoch)
    mesh = client_mesh() if sys.argv[1] == "sharded" else None
    res = train(alg, init_params(), data, ids, s, rounds=6, batch_size=4, seed=3, max_steps=8,
                progress=False, mesh=mesh, nonprivate_ok=True)
    print(json.dumps({"devices": jax.device_count(),
                      "params": [np.asarray(x).tolist() for x in jax.tree_util.tree_leaves(res.state.params)]}))
""")


def test_sharded_over_4_devices_equals_single_device(tmp_path):
    script = tmp_path / "shard.py"
    script.write_text(SHARD_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = {}
    for mode, flags in [("sharded", "--xla_force_host_platform_device_count=4"), ("single", "")]:
        env = dict(os.environ, XLA_FLAGS=xla_flags(flags), JAX_PLATFORMS="cpu")
        p = subprocess.run([sys.executable, str(script), mode], cwd=root, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        out[mode] = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["sharded"]["devices"] == 4 and out["single"]["devices"] == 1
    for a, b in zip(out["sharded"]["params"], out["single"]["params"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_every_library_sampler_is_a_sampler_and_an_incomplete_one_is_refused():
    from fedpriv.fl.samplers import AmplifiedCyclicSampler, CyclicSampler, Sampler, check_sampler
    for s in (PoissonSampler(40, 0.2), UniformSampler(40, 8), ShuffledPassSampler(40, 8),
              CyclicSampler(40, 8), AmplifiedCyclicSampler(40, 4, 0.5)):
        assert isinstance(s, Sampler)
        check_sampler(s)
    assert PoissonSampler(40, 0.2).variable_cohort and not UniformSampler(40, 8).variable_cohort

    class NoAccounting:  # draws cohorts but cannot say what they cost
        num_clients, expected_cohort_size, max_cohort_size = 24, 4.0, 4

        def sample(self, r):
            return np.arange(4)

    data, ids, _, alg = _setup()
    with pytest.raises(TypeError, match="NoAccounting is not a fedpriv Sampler: it lacks "
                                        "variable_cohort, neighboring, amplified_event"):
        train(alg, init_params(), data, ids, NoAccounting(), rounds=2, batch_size=4, seed=0,
              progress=False, nonprivate_ok=True)
