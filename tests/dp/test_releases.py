"""Each DP release adds the noise its charge claims, under the ledger's relation, with its own
key (issue 16, items 3, 4 and 6): tests that fail on the mutants the privacy audit found."""
import math

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp

from configs.population_expansion import SCHEMES_BY_NAME, TRAINING_SCHEMES
from fedpriv import expansion, fred as F
from fedpriv.dp import accounting as acc, geometric, moments as M
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.dp.noise import tree_privatizer

PAD, BOS = 0, 2


# ------------------------------------------------------------------ unigram releases
def _unigram_users(num_tokens=800, users_per_token=10):
    """Users of 5 rows x 10 copies of one token (id 4 + j): every token counted exactly 500
    times, far from 0, so the released frequencies give back the noise exactly."""
    users = {}
    for j in range(num_tokens):
        for u in range(users_per_token):
            x = np.full((5, 11), 4 + j, np.int32)
            x[:, 0] = BOS
            users[f"{j}-{u}"] = x
    return users, num_tokens + 4


def _released_noise(u, vocab, counted=500, smoothing=1.0):
    total = smoothing / u[PAD]          # PAD gets only the floor: u[PAD] = beta / total
    noisy = u * total - smoothing
    return noisy[4:vocab] - counted


@pytest.mark.parametrize("relation, sensitivity", [("add_remove", 50), ("replace_one", 100)])
def test_unigram_noise_and_charge_follow_the_ledgers_relation(relation, sensitivity):
    users, vocab = _unigram_users()
    led = PrivacyLedger(5.0, 1e-6, neighboring=relation)
    u = expansion.private_unigram_frequencies(users, vocab, 2.0, np.random.default_rng(0), population="T",
                                       ledger=led)
    (entry,) = led.entries
    assert entry.event == geometric.geometric_dp_event(2.0, sensitivity)
    assert led.spent() == pytest.approx(2.0)  # eps0 under the ledger's own relation
    noise = _released_noise(u, vocab)
    var = geometric.geometric_variance(2.0, sensitivity)
    assert abs(noise.mean()) < 4 * math.sqrt(var / noise.size)
    assert 0.75 < noise.var() / var < 1.33, (noise.var(), var)  # not halved, not another Delta


def test_unigram_relation_must_agree_with_the_ledger():
    with pytest.raises(ValueError, match="differs from the ledger"):
        expansion.private_unigram_frequencies({}, 10, 0.8, np.random.default_rng(0), population="T",
                                       ledger=PrivacyLedger(2.0, 1e-6, neighboring="replace_one"),
                                       neighboring="add_remove")


def test_unigram_releases_from_one_seed_draw_independent_noise():
    users, vocab = _unigram_users(num_tokens=400)
    rel = {pop: _released_noise(expansion.private_unigram_frequencies(users, vocab, 2.0, 0, population=pop), vocab)
           for pop in ("S", "T")}
    again = _released_noise(expansion.private_unigram_frequencies(users, vocab, 2.0, 0, population="S"), vocab)
    np.testing.assert_allclose(again, rel["S"], atol=1e-6)  # tagged keys are deterministic ...
    assert not np.allclose(rel["S"], rel["T"])               # ... and carry the population
    assert abs(np.corrcoef(rel["S"], rel["T"])[0, 1]) < 0.2


# ------------------------------------------------------------------ FreD
def test_fred_covariance_noise_has_its_own_std_and_key():
    """Zero embeddings: the mean sum is pure noise (std tau_1 = sigma c), the covariance sum is
    n b b^T + noise (std tau_2 = sigma c^2, c = 3 != 1). Sharing the mean's key would make the
    first d covariance noises proportional to the mean's (prefixes of one stream)."""
    d, users, clip = 128, 40, 3.0
    clients = [np.zeros((2, d), np.float32) for _ in range(users)]
    rel = F.private_stats(clients, clip, 1.0, 1e-5, "user", jax.random.key(0), n_public=users)
    assert rel.mean_noise_std == pytest.approx(rel.noise_multiplier * clip)
    assert rel.cov_noise_std == pytest.approx(rel.noise_multiplier * clip ** 2)
    mean_noise = rel.mean * rel.n_divisor
    assert 0.75 < mean_noise.std() / rel.mean_noise_std < 1.33
    b = -rel.mean * min(1.0, clip / np.linalg.norm(rel.mean))
    iu = M.upper_indices(d)
    cov_noise = (rel.cov_raw * rel.n_divisor - users * np.outer(b, b))[iu]
    assert 0.9 < cov_noise.std() / rel.cov_noise_std < 1.1, (cov_noise.std(), rel.cov_noise_std)
    assert abs(np.corrcoef(mean_noise, cov_noise[:d])[0, 1]) < 0.4
    k_mean, k_cov = F.fred_noise_keys(jax.random.key(0))
    assert not np.array_equal(jax.random.key_data(k_mean), jax.random.key_data(k_cov))


# ------------------------------------------------------------------ tree restarts
def test_restarted_tree_draws_fresh_noise_at_every_leaf():
    """Leaf t of tree k and leaf t of tree k+1 must not share noise (a restart that reused the
    previous tree's key would release the very same increments again)."""
    R = 4
    mech = tree_privatizer(1.0, jax.random.key(3), restart_every=R)
    like = jnp.zeros((4000,))
    state = mech.init(like)
    step = jax.jit(mech.update)
    incs = []
    for _ in range(3 * R):
        inc, state = step(like, state)
        incs.append(np.asarray(inc))
    for t in range(R):
        for k in range(2):
            a, b = incs[k * R + t], incs[(k + 1) * R + t]
            assert not np.allclose(a, b)
            assert abs(np.corrcoef(a, b)[0, 1]) < 0.1, (t, k)


# ------------------------------------------------------------------ ledger
def test_ledger_epsilon_is_at_its_own_delta():
    ev = acc.dp_fedavg_poisson_event(1.2, 0.05, 200)
    for delta in (1e-7, 1e-4):
        led = PrivacyLedger(100.0, delta, accountant="rdp")
        led.spend("train", ev)
        raw = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
        raw.compose(ev)
        assert led.spent() == pytest.approx(raw.get_epsilon(delta), rel=1e-9)
        assert led.report()["entries"][0]["epsilon_alone"] == pytest.approx(raw.get_epsilon(delta), rel=1e-9)
    assert acc.compute_epsilon(ev, 1e-7, accountant="rdp")[0] > 1.2 * acc.compute_epsilon(ev, 1e-4, accountant="rdp")[0]


# ------------------------------------------------------------------ stages of two populations
def test_every_stage_is_charged_to_every_population_it_samples():
    for scheme in TRAINING_SCHEMES:
        plan = [p for p in scheme.privacy_plan() if "/stage" in p.name]
        assert len(plan) == len(scheme.stages)
        for stage, spend in zip(scheme.stages, plan):
            assert set(spend.populations) == {"S" if p == expansion.SOURCE else "T" for p in stage.populations}
            assert set(stage.population_labels) == set(spend.populations)
    union = SCHEMES_BY_NAME["S u T"]
    led = PrivacyLedger(10.0, 1e-6)
    ev = acc.dp_fedavg_poisson_event(1.0, 0.05, 20)
    for spend in union.privacy_plan():
        led.spend(spend.name, ev, spend.populations)
    assert set(led.epsilon_by_population()) == {"S", "T"}
