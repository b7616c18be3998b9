"""PrE-Text's vote mechanism (fedpriv.synth): the votes, their sensitivity, the noise scale of
the secure-aggregation release, fresh noise per round, the ledger charge -- and, for each
property, a broken version (a mutant written here) that the same check rejects.

Random vectors stand in for the embedder's (no model is loaded)."""
import math

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv import synth as S
from fedpriv.dp import accounting, moments
from fedpriv.dp.keys import tagged_key
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger
from fedpriv.fl.samplers import PoissonSampler, UniformSampler

D, N = 6, 16
PAD = 256  # every client padded to PAD rows: one compiled shape per vote function


def _users(rng, count, max_msgs=30):
    return [rng.normal(size=(int(rng.integers(0, max_msgs + 1)), D)) for _ in range(count)]


# ------------------------------------------------------------------------------ the votes


def test_votes_nearest_k_and_normalised():
    synth = jnp.eye(4, D)  # 4 synthetic points on the axes
    emb = jnp.asarray([[0.9, 0, 0, 0, 0, 0], [0.8, 0.1, 0, 0, 0, 0], [0, 0, 1.1, 0, 0, 0],
                       [0, 0, 0, 5.0, 0, 0]], jnp.float32)
    mask = jnp.asarray([1.0, 1.0, 1.0, 0.0])  # the last row is padding: votes nothing
    h = S.vote_histogram(emb, mask, synth, 1)
    np.testing.assert_allclose(h, [2, 0, 1, 0])
    v = jax.jit(S.client_votes, static_argnums=3)(emb, mask, synth, 1)
    np.testing.assert_allclose(v, np.array([2, 0, 1, 0]) / math.sqrt(5), rtol=1e-6)
    # two votes per message; equidistant second choices go to the smaller index (lax.top_k)
    np.testing.assert_allclose(S.vote_histogram(emb, mask, synth, 2), [3, 2, 1, 0])
    np.testing.assert_allclose(np.linalg.norm(S.client_votes(emb, mask, synth, 2)), 1, rtol=1e-6)
    np.testing.assert_array_equal(S.client_votes(emb, jnp.zeros(4), synth, 1), 0)  # no message
    with pytest.raises(ValueError):
        S.nearest(emb, synth, 5)


def test_chunked_votes_equal_the_unsplit_reference():
    rng = np.random.default_rng(1)
    users = [rng.normal(size=(n, D)) for n in (0, 3, 600, 17, 0, 64)]  # a user with many msgs
    synth = rng.normal(size=(N, D)).astype(np.float32)
    emb, mask, owner, slots = S.pack_messages(users, D, chunk_size=64)
    assert emb.shape[1] == 64 and slots == 8 and emb.shape[0] == 16  # 0+1+10+1+0+1 = 13 -> 16
    for k in (1, 3):
        got = np.asarray(S.chunked_votes(emb, mask, owner, synth, k, slots))
        ref = np.asarray(S.cohort_votes(*map(jnp.asarray, S.pad_cohort(users, D)), synth, k))
        np.testing.assert_allclose(got[: len(users)], ref, atol=1e-6)
        np.testing.assert_array_equal(got[len(users):], 0)


# ------------------------------------------------------------------------------ sensitivity


def _sum_fn(vote_fn):
    """Cohort sum of ``vote_fn`` over clients padded to PAD rows, jitted once."""
    batched = jax.jit(jax.vmap(vote_fn, in_axes=(0, 0, None, None)), static_argnums=3)

    def total(users, synth, k):
        if not users:
            return np.zeros(N)
        emb = np.zeros((len(users), PAD, D), np.float32)
        mask = np.zeros((len(users), PAD), np.float32)
        for i, u in enumerate(users):
            emb[i, : len(u)], mask[i, : len(u)] = u, 1.0
        return np.asarray(batched(emb, mask, jnp.asarray(synth, jnp.float32), k), np.float64).sum(0)
    return total


def worst_shifts(vote_fn, trials=12, seed=0):
    """Largest L2 move of the pre-noise cohort sum over random draws when one user (few or many
    messages, up to PAD) is added/removed, and when one user is replaced by another."""
    total = _sum_fn(vote_fn)
    rng = np.random.default_rng(seed)
    add, rep = 0.0, 0.0
    for t in range(trials):
        synth = rng.normal(size=(N, D))
        users = _users(rng, 5)
        n_new = [1, 7, PAD][t % 3]  # incl. a user with many messages
        new = rng.normal(size=(n_new, D)) * 0.3 + synth[rng.integers(N)]  # concentrated votes
        other = rng.normal(size=(int(rng.integers(1, PAD)), D))
        k = 1 + t % 2
        base = total(users, synth, k)
        add = max(add, np.linalg.norm(total(users + [new], synth, k) - base))
        rep = max(rep, np.linalg.norm(total(users[:-1] + [new], synth, k)
                                      - total(users[:-1] + [other], synth, k)))
    return add, rep


def sensitivity_ok(vote_fn) -> tuple[bool, float, float]:
    add, rep = worst_shifts(vote_fn)
    return (add <= S.SENSITIVITY + 1e-5 and rep <= S.REPLACE_ONE_SENSITIVITY + 1e-5), add, rep


def test_sensitivity_of_the_vote_sum():
    ok, add, rep = sensitivity_ok(S.client_votes)
    print(f"sensitivity: worst add/remove shift {add:.6f} (bound 1), replace {rep:.6f} "
          f"(bound sqrt 2 = {math.sqrt(2):.6f})")
    assert ok, (add, rep)
    assert add > 0.999  # attained: a non-empty user moves the sum by exactly 1


def test_broken_unnormalised_votes_fail_the_sensitivity_check():
    def mutant(emb, mask, synth, k):  # (a) raw counts, not bounded
        return S.vote_histogram(emb, mask, synth, k)
    ok, add, rep = sensitivity_ok(mutant)
    print(f"mutant (a) unnormalised votes: add/remove shift {add:.1f}, replace {rep:.1f}")
    assert not ok and add > 10


# ------------------------------------------------------------------------------ noise scale

Z, M_CLIENTS, N_BIG, ROUNDS = 2.0, 8, 512, 8


def measured_noise_std(noisy_sum_fn, z=Z, m=M_CLIENTS, n=N_BIG, rounds=ROUNDS, seed=0):
    """Empirical std of (released - true sum) over ``rounds`` x ``n`` coordinates for
    ``noisy_sum_fn(votes [m, n], z, key) -> [n]``, fresh round keys, random unit votes."""
    rng = np.random.default_rng(seed)
    root = jax.random.key(seed)
    diffs = []
    for t in range(rounds):
        votes = np.abs(rng.normal(size=(m, n))).astype(np.float32)
        votes /= np.linalg.norm(votes, axis=1, keepdims=True)
        out = np.asarray(noisy_sum_fn(votes, z, S.votes_noise_key(root, t)), np.float64)
        diffs.append(out - votes.astype(np.float64).sum(0))
    d = np.concatenate(diffs)
    return float(np.sqrt(np.mean(d ** 2))), d.size  # the mean is 0: no centring


def std_tolerance(samples: int, sigmas: float = 5.0) -> float:
    """Relative tolerance on the std of ``samples`` N(0, z^2) draws: the sample variance over
    z^2 is chi^2_n / n, of sd sqrt(2/n); ``sigmas`` of it on the variance, halved on the std."""
    return 0.5 * sigmas * math.sqrt(2.0 / samples)


def noise_scale_ok(noisy_sum_fn, z=Z) -> tuple[bool, float, float]:
    s, n = measured_noise_std(noisy_sum_fn, z)
    tol = std_tolerance(n)
    return abs(s / z - 1.0) <= tol, s, tol


def test_noise_scale_of_the_release():
    ok, s, tol = noise_scale_ok(S.noisy_vote_sum)
    print(f"noise scale: measured std {s:.4f} vs z={Z} (ratio {s / Z:.4f}, tolerance "
          f"±{tol:.4f}, {M_CLIENTS} shares, {N_BIG * ROUNDS} draws)")
    assert ok


def test_broken_shares_fail_the_noise_scale_check():
    def mutant_full_shares(votes, z, key):  # (c) each client adds N(0, z^2), not z^2/m
        v = jnp.asarray(votes)
        m, n = v.shape
        c = moments.GROUP * -(-m // moments.GROUP)
        emb = jnp.zeros((c, 1, n)).at[:m, 0].set(v)
        real = (jnp.arange(c) < m).astype(jnp.float32)
        return moments.secure_sum_mean(emb, real[:, None], jnp.ones(c), jnp.arange(c), real,
                                       1.0, z, 1, key)  # num_clients=1: every share is z^2

    def mutant_under_noised(votes, z, key):  # shares of z^2/m^2: aggregate std z/sqrt(m)
        return S.noisy_vote_sum(votes, z / math.sqrt(np.shape(votes)[0]), key)

    for mutant, want in ((mutant_full_shares, Z * math.sqrt(M_CLIENTS)),
                         (mutant_under_noised, Z / math.sqrt(M_CLIENTS))):
        ok, s, tol = noise_scale_ok(mutant)
        print(f"mutant {mutant.__name__}: std {s:.3f} (expected {want:.3f}), rejected={not ok}")
        assert not ok and s == pytest.approx(want, rel=0.1)


# ------------------------------------------------------------------------------ fresh noise


def noise_of_rounds(key_fn, rounds=(0, 1), n=N_BIG):
    """The noise released in each round for all-zero votes, with round keys from ``key_fn``."""
    root = jax.random.key(3)
    zeros = np.zeros((M_CLIENTS, n), np.float32)
    return [np.asarray(S.noisy_vote_sum(zeros, Z, key_fn(root, t)), np.float64) for t in rounds]


def fresh_noise_ok(key_fn, n=N_BIG) -> tuple[bool, float]:
    """Rounds 0 and 1 must draw independent noise: |corr| < 5/sqrt(n) (the sd of a sample
    correlation of n independent pairs is 1/sqrt(n))."""
    a, b = noise_of_rounds(key_fn, n=n)
    r = float(np.corrcoef(a, b)[0, 1])
    return abs(r) < 5.0 / math.sqrt(n), r


def test_fresh_noise_every_round_and_purpose_tagged():
    ok, r = fresh_noise_ok(S.votes_noise_key)
    print(f"fresh noise: corr(round 0, round 1) = {r:+.4f} (bound {5 / math.sqrt(N_BIG):.4f})")
    assert ok
    # other purposes from the same root draw other noise (FreD's mean key, another name)
    root = jax.random.key(3)
    from fedpriv.fred import fred_noise_keys
    for other in (fred_noise_keys(root)[0], S.votes_noise_key(root, 0, "other")):
        assert not np.array_equal(jax.random.key_data(other),
                                  jax.random.key_data(S.votes_noise_key(root, 0)))


def test_broken_noise_reused_across_rounds_is_detected():
    def mutant_key(key, round_idx):  # (b) the round is not folded in: same noise every round
        return tagged_key(key, S.VOTE_TAG, "pretext")
    ok, r = fresh_noise_ok(mutant_key)
    print(f"mutant (b) reused noise: corr = {r:+.4f}, rejected={not ok}")
    assert not ok and r == pytest.approx(1.0)


# ------------------------------------------------------------------------------ end to end


def test_release_round_end_to_end_noise_and_refusals():
    rng = np.random.default_rng(5)
    pop = _users(rng, 24, max_msgs=12)
    synth = rng.normal(size=(N_BIG, D))
    sampler = UniformSampler(24, M_CLIENTS, seed=2)
    ledger = PrivacyLedger(1e6, 1e-5, neighboring="replace_one")
    plan = S.plan_votes(ledger, sampler, ROUNDS, Z, jax.random.key(11), k=2, chunk_size=4)
    noise = []
    for t in range(ROUNDS):
        rel = S.release_round(plan, t, lambda i: pop[i], synth)
        assert rel.num_clients == M_CLIENTS and rel.noisy_votes.shape == (N_BIG,)
        true = S.vote_sum([pop[i] for i in sampler.sample(t)], synth, k=2)
        noise.append(rel.noisy_votes - true)
    d = np.concatenate(noise)
    s, tol = float(np.sqrt(np.mean(d ** 2))), std_tolerance(d.size)
    r = float(np.corrcoef(noise[0], noise[1])[0, 1])
    print(f"end to end: std {s:.4f} vs z={Z} (tolerance ±{tol:.4f}); corr rounds 0/1 {r:+.4f}")
    assert abs(s / Z - 1) <= tol and abs(r) < 5 / math.sqrt(N_BIG)
    with pytest.raises(ValueError, match="released already"):
        S.release_round(plan, 0, pop, synth)
    with pytest.raises(ValueError, match="outside"):
        S.release_round(plan, ROUNDS, pop, synth)
    with pytest.raises(TypeError):
        S.release_round(object(), 0, pop, synth)


def test_empty_poisson_cohort_still_carries_the_noise():
    sampler = PoissonSampler(3, 1e-9, seed=0)  # (practically) always empty
    plan = S.plan_votes(PrivacyLedger(1e6, 1e-5), sampler, 1, Z, jax.random.key(0))
    rel = S.release_round(plan, 0, [np.ones((2, D))] * 3, np.eye(N_BIG, D))
    assert rel.num_clients == 0 and np.std(rel.noisy_votes) == pytest.approx(Z, rel=0.25)


# ------------------------------------------------------------------------------ accounting


@pytest.mark.parametrize("kind", ["poisson", "uniform"])
def test_ledger_charge_equals_the_event(kind):
    rounds, z, delta = 5, 1.5, 1e-5
    if kind == "poisson":
        sampler, rel = PoissonSampler(100, 0.1), "add_remove"
        want = dpa.SelfComposedDpEvent(
            dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(z)), rounds)
    else:
        sampler, rel = UniformSampler(100, 10), "replace_one"
        want = accounting.wor_sampled_event(dpa.GaussianDpEvent(z), 100, 10, rounds)
    event = S.votes_event(sampler, rounds, z)
    assert event == want
    ledger = PrivacyLedger(50.0, delta, neighboring=rel)
    S.plan_votes(ledger, sampler, rounds, z, jax.random.key(0))
    eps, _ = accounting.compute_epsilon(event, delta, rel)
    assert ledger.spent() == pytest.approx(eps, rel=1e-9)
    assert ledger.entries[0].name == "pretext-votes" and ledger.entries[0].details["rounds"] == 5


def test_ledger_refuses_before_any_data_is_read():
    sampler = PoissonSampler(100, 0.5)
    ledger = PrivacyLedger(0.5, 1e-5)
    with pytest.raises(PrivacyBudgetExceeded):
        S.plan_votes(ledger, sampler, 2, 0.5, jax.random.key(0))
    assert ledger.entries == []  # nothing recorded; no plan, so no round can be released
    with pytest.raises(PrivacyBudgetExceeded):  # z = 0 is not private
        S.plan_votes(PrivacyLedger(1e6, 1e-5), sampler, 1, 0.0, jax.random.key(0))
    with pytest.raises(ValueError, match="neighbours"):  # Poisson on a replace-one ledger
        S.plan_votes(PrivacyLedger(1e6, 1e-5, neighboring="replace_one"), sampler, 1, 1.0,
                     jax.random.key(0))
    # T rounds compose: more rounds cost more
    e5 = accounting.compute_epsilon(S.votes_event(sampler, 5, 1.0), 1e-5, accountant="rdp")[0]
    e20 = accounting.compute_epsilon(S.votes_event(sampler, 20, 1.0), 1e-5, accountant="rdp")[0]
    assert e20 > e5


# ------------------------------------------------------------------------------ post-processing


def test_select_samples():
    v = np.array([0.1, 3.0, -1.0, 2.0, 2.5])
    np.testing.assert_array_equal(S.select_samples(v, keep_fraction=0.4), [1, 4])
    np.testing.assert_array_equal(S.select_samples(v, threshold=2.0), [1, 4, 3])
    assert len(S.select_samples(v, keep_fraction=0.01)) == 1
    with pytest.raises(ValueError):
        S.select_samples(v)
    with pytest.raises(ValueError):
        S.select_samples(v, keep_fraction=0.5, threshold=1.0)
