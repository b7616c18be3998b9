"""The distributed discrete Gaussian in the engine (``mechanism="ddg"``): the secure sum decodes
to the clipped sum, the ledger charges the DDG event (replace-one, no amplification), aborted
rounds change nothing, and a run resumes bit-identically."""
import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.dp import accounting, ddg
from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.dp.ledger import PrivacyLedger, event_from_json, event_to_json
from fedpriv.fl.algorithms import DDGDPConfig, DPConfig, build_algorithm, privacy_event, server_optimizer
from fedpriv.fl.loop import train
from fedpriv.fl.samplers import PoissonSampler, UniformSampler
from tests import oracles
from tests.fl.helpers import init_params, loss_fn, make_dataset

N, COHORT, DIM = 24, 6, 6  # the linear task has 5 weights + 1 bias
KW = dict(batch_size=4, seed=1, max_steps=3, progress=False, log=None)


def _alg(dp):
    return build_algorithm(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), dp,
                           expected_cohort_size=COHORT)


def _ddg(z=1.0, **kw):
    return DDGDPConfig(clip_norm=0.5, noise_multiplier=z, dim=DIM, **kw)


def test_the_secure_sum_decodes_to_the_clipped_sum_without_noise(tmp_path):
    data = make_dataset(num_clients=N, seed=2)
    ids, s = list(data), UniformSampler(N, COHORT, seed=1)
    plain = train(_alg(DPConfig(clip_norm=0.5)), init_params(), data, ids, s, rounds=4,
                  workdir=str(tmp_path / "plain"), **KW)
    for bits, tol in ((24, 1e-4), (8, None)):
        res = train(_alg(_ddg(0.0, bits=bits)), init_params(), data, ids, s, rounds=4,
                    workdir=str(tmp_path / f"ddg{bits}"), **KW)
        m = res.history[-1]
        assert m["nonprivate/ddg_overflow_coords"] == 0 and m["ddg_survivors"] == COHORT and m["ddg_released"] == 1
        diff = float(np.abs(np.asarray(res.state.params["w"]) - np.asarray(plain.state.params["w"])).max())
        if tol is not None:  # 24 bits: only the (tiny) rounding separates it from the plain sum
            assert diff < tol
        else:  # 8 bits: the granularity is coarse, the rounding error visible
            assert diff > 1e-4
    # the noise is there at z > 0 (and drawn from the noise key, not the clients' keys)
    noisy = train(_alg(_ddg(1.0, bits=16)), init_params(), data, ids, s, rounds=4,
                  workdir=str(tmp_path / "noisy"), nonprivate_ok=True, **KW)
    assert float(np.abs(np.asarray(noisy.state.params["w"]) - np.asarray(plain.state.params["w"])).max()) > 1e-2


def test_train_charges_the_ddg_event_and_resumes_bit_identically(tmp_path):
    data = make_dataset(num_clients=N, seed=2)
    ids, s = list(data), UniformSampler(N, COHORT, seed=1)
    alg = _alg(_ddg(2.0, bits=16))
    full = PrivacyLedger(1e6, 1e-6, neighboring="replace_one")
    ref = train(alg, init_params(), data, ids, s, rounds=6, ledger=full,
                workdir=str(tmp_path / "full"), **KW)
    ev = full.entry("fl-training").event
    assert event_to_json(ev) == event_to_json(privacy_event(alg.dp, s, 6))
    assert event_from_json(event_to_json(ev)) == ev  # the ledger's JSON round trip
    assert isinstance(ev, dpa.SelfComposedDpEvent) and ev.count == 6  # no amplification
    wd = str(tmp_path / "split")
    train(alg, init_params(), data, ids, s, rounds=6, workdir=wd, stop_after=2,
          ledger=PrivacyLedger(1e6, 1e-6, neighboring="replace_one"), **KW)
    res = train(alg, init_params(), data, ids, s, rounds=6, workdir=wd,
                ledger=PrivacyLedger(1e6, 1e-6, neighboring="replace_one"), **KW)
    assert res.resumed_from == 2
    for a, b in zip(jax.tree_util.tree_leaves(ref.state.params), jax.tree_util.tree_leaves(res.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # an add/remove ledger cannot account it (its sensitivities are stated for replace-one)
    with pytest.raises(dpa.UnsupportedEventError):
        accounting.compute_epsilon(ev, 1e-6, "add_remove")


def test_the_ddg_event_is_the_gaussian_of_its_doubled_rounded_sensitivity_at_many_bits():
    dp = _ddg(3.0, bits=20)
    cfg = dp.secure_sum(COHORT)
    eps = accounting.compute_epsilon(privacy_event(dp, UniformSampler(N, COHORT), 10), 1e-6,
                                     "replace_one")[0]
    # 20 bits: tau ~ 0, Prop. 14 is a Gaussian at sqrt(m) sigma / (2 Delta_2) (replace-one)
    z_eff = np.sqrt(COHORT) * cfg.local_sigma / (2 * cfg.l2_bound)
    gauss = accounting.compute_epsilon(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(float(z_eff)), 10),
                                       1e-6, "replace_one", "rdp")[0]
    assert eps == pytest.approx(gauss, rel=0.02)
    # a broken event with the zero-out sensitivity (Delta_2, not 2 Delta_2) would report less
    zero_out = ddg.ddg_epsilon(cfg, COHORT, 1e-6, rounds=10)
    assert eps > 1.5 * zero_out
    # and the rounding inflation is visible: above the continuous Gaussian's epsilon at z / 2
    cont = accounting.compute_epsilon(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.5), 10),
                                      1e-6, "replace_one", "rdp")[0]
    assert eps > cont


def test_dropout_below_min_survivors_aborts_the_round_and_the_event_uses_the_minimum(tmp_path):
    data = make_dataset(num_clients=N, seed=2)
    ids, s = list(data), UniformSampler(N, COHORT, seed=1)
    dp = _ddg(2.0, bits=16, dropout_rate=0.5, min_survivors=COHORT)  # every round needs all
    res = train(_alg(dp), init_params(), data, ids, s, rounds=5, workdir=str(tmp_path / "a"),
                nonprivate_ok=True, **KW)
    released = [h["ddg_released"] for h in res.history]
    assert sum(released) < 5 and all(h["ddg_survivors"] < COHORT for h, r in zip(res.history, released) if not r)
    if not any(released):  # nothing was released: the model is the initial one
        assert float(np.abs(np.asarray(res.state.params["w"])).max()) == 0.0
    low = _ddg(2.0, bits=16, dropout_rate=0.5, min_survivors=2)
    ev = privacy_event(low, s, 5).event
    assert (ev.min_shares, ev.max_shares) == (2, COHORT)
    e_low = accounting.compute_epsilon(privacy_event(low, s, 5), 1e-6, "replace_one")[0]
    e_high = accounting.compute_epsilon(privacy_event(_ddg(2.0, bits=16, dropout_rate=0.5, min_survivors=5),
                                                      s, 5), 1e-6, "replace_one")[0]
    assert e_low > e_high  # fewer guaranteed shares: less noise, more epsilon


def test_ddg_refuses_what_its_accounting_does_not_cover(tmp_path):
    with pytest.raises(ValueError, match="fixed-size cohort"):
        privacy_event(_ddg(), PoissonSampler(N, 0.25), 4)
    with pytest.raises(ValueError, match="adaptive"):
        DDGDPConfig(clip_norm=0.5, noise_multiplier=1.0, dim=DIM,
                    adaptive=AdaptiveClipping(initial_clip=0.5))
    with pytest.raises(ValueError, match="DDGDPConfig"):
        DPConfig(clip_norm=0.5, noise_multiplier=1.0, mechanism="ddg")
    data = make_dataset(num_clients=N, seed=2)
    wrong = _alg(DDGDPConfig(clip_norm=0.5, noise_multiplier=1.0, dim=DIM + 1))
    with pytest.raises(ValueError, match="dim=7"):
        train(wrong, init_params(), data, list(data), UniformSampler(N, COHORT), rounds=1,
              workdir=str(tmp_path / "w"), nonprivate_ok=True, **KW)


def test_engine_ddg_noise_is_fresh_every_round(tmp_path):
    """Property (issue 24, test gaps): in the engine, each round's DDG noise is drawn from a key
    of its own. With zero client updates (client lr 0) and a server step of 1, the model's
    change in round r is the decoded noise of round r alone; across 6 rounds of a 64-parameter
    model every change is non-zero and no two are equal or correlated (a cosine of independent
    64-d noise vectors has std 1/8; |cos| < 0.6 is 4.8 std, 15 pairs). Noise reused across
    rounds (a key not folded with the round, or folded with a stale one) gives cos = +-1."""
    d = 63  # 63 weights + 1 bias = 64 parameters
    data = make_dataset(num_clients=N, dim=d, seed=3)
    alg = build_algorithm(loss_fn, optax.sgd(0.0), server_optimizer("sgd", 1.0),
                          DDGDPConfig(clip_norm=0.5, noise_multiplier=1.0, dim=d + 1, bits=16),
                          expected_cohort_size=COHORT)
    seen = []

    def record(params):
        seen.append(np.concatenate([np.ravel(np.asarray(params["w"])), np.ravel(np.asarray(params["b"]))]))
        return {}

    res = train(alg, init_params(d), data, list(data), UniformSampler(N, COHORT, seed=1), rounds=6,
                workdir=str(tmp_path / "w"), nonprivate_ok=True, eval_fn=record, eval_every=1, **KW)
    assert all(h["ddg_released"] == 1 for h in res.history)
    params = np.stack([np.zeros(d + 1)] + seen[:6]).astype(np.float64)
    noise = np.diff(params, axis=0)  # [6, 64]: the decoded noise of each round
    norms = np.linalg.norm(noise, axis=1)
    assert np.all(norms > 0), norms
    cos = (noise @ noise.T) / np.outer(norms, norms)
    off = cos[~np.eye(6, dtype=bool)]
    assert np.all(np.abs(off) < 0.6), np.round(cos, 3)


# ----------------------------------------------------------------------------- issue 54: shares
M_SHARES, D_SHARES, ROUNDS_SHARES = 6, 4096, 4


def _codec_round(dp, m, d):
    """jit of ``(key, real[m]) -> (decoded [d], released, raw [m, D])``: one round of the
    engine's DDG codec (``DDGDPConfig.codec``: the clients' ``encode``, the secure sum of their
    messages as the engine's lanes add them -- uint32, wrapping -- and the server's ``decode``)
    on all-zero updates, so the decoded sum is the noise alone and each client's raw message is
    its share alone; ``real`` marks the clients that take part (the others send nothing)."""
    codec = dp.codec(m)

    def one(key, real):
        ctx = codec.begin(key, jnp.int32(0), d)
        (msgs, raw), stats = jax.vmap(lambda s, r: codec.encode(ctx, jnp.zeros(d, jnp.float32), s, r))(
            jnp.arange(m), real)
        summed = (jnp.sum(msgs, axis=0, dtype=msgs.dtype), jnp.sum(raw, axis=0, dtype=raw.dtype))
        noised, stats, released = codec.decode(ctx, summed, jax.tree_util.tree_map(jnp.sum, stats))
        return noised, released, raw
    return jax.jit(one)


def test_a_released_round_carries_the_noise_its_event_assumes_for_every_share_count():
    """For every number of shares n a round can have (1..m), the engine's DDG codec releases
    the round iff the run's event (``privacy_event(..., simulated=False)``, what the ledger
    charges for the executed run) allows n shares (``min_shares <= n <= max_shares``), and a
    released round's decoded noise, in integer units (over the granularity gamma), has the
    variance of n of the event's shares: ``n Var N_Z(0, local_sigma^2)``
    (``oracles.discrete_gaussian_variance``) per coordinate. Over 4 rounds of 4096 coordinates
    the sample variance is within 5 sd (``5 sqrt(2 / 16384)`` = 5.5 %, the noise being
    near-Gaussian: local_sigma ~ 1.7e3) of it; one share fewer than assumed at n = 6 is 17 % less."""
    dp = DDGDPConfig(clip_norm=0.5, noise_multiplier=1.0, dim=D_SHARES, bits=16, min_survivors=3)
    ev = dp.privacy_event(UniformSampler(4 * M_SHARES, M_SHARES), 1, simulated=False).event
    gamma = dp.secure_sum(M_SHARES).gamma
    run = _codec_round(dp, M_SHARES, D_SHARES)
    tol = 5 * np.sqrt(2 / (ROUNDS_SHARES * D_SHARES))
    released_at = []
    for n in range(1, M_SHARES + 1):
        real = jnp.asarray([1.0] * n + [0.0] * (M_SHARES - n))
        noise, released = [], []
        for r in range(ROUNDS_SHARES):
            out, rel, _ = run(jax.random.fold_in(jax.random.key(11), 100 * n + r), real)
            noise.append(np.asarray(out, np.float64) / gamma)
            released.append(bool(rel))
        assert len(set(released)) == 1
        if released[0]:
            released_at.append(n)
            assert ev.min_shares <= n <= ev.max_shares, (
                f"a round with {n} shares was released; the event assumes >= {ev.min_shares}")
            ratio = np.concatenate(noise).var() / (n * oracles.discrete_gaussian_variance(ev.local_sigma))
            assert abs(ratio - 1) < tol, (n, ratio)
    assert released_at == list(range(ev.min_shares, M_SHARES + 1)) and ev.max_shares == M_SHARES


def test_clients_shares_are_independent_across_clients():
    """The discrete Gaussian shares the engine's DDG clients add are independent across clients:
    at zero updates each client's message is its share alone, and every pair of clients' shares
    over 4 x 4096 coordinates has a sample correlation within ``5 / sqrt(16384)`` of 0 (15 pairs;
    two-sided 5.7e-7 each). Shares from one key (a client key not folded with the slot) are
    equal: correlation 1, and their sum's variance m^2 instead of m times a share's."""
    dp = DDGDPConfig(clip_norm=0.5, noise_multiplier=1.0, dim=D_SHARES, bits=16)
    run = _codec_round(dp, M_SHARES, D_SHARES)
    raw = np.concatenate([np.asarray(run(jax.random.fold_in(jax.random.key(5), r),
                                         jnp.ones(M_SHARES))[2], np.float64)
                          for r in range(ROUNDS_SHARES)], axis=1)   # [m, rounds * D]
    corr = np.corrcoef(raw)
    off = np.abs(corr[~np.eye(M_SHARES, dtype=bool)])
    assert np.all(raw.std(axis=1) > 0)
    assert off.max() < 5 / np.sqrt(raw.shape[1]), np.round(corr, 3)
