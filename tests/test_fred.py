"""FreD (Hou et al. 2023): Eq. 2 closed forms, PSD projection, noise scale, sensitivities,
calibration against dp_accounting, the ledger, reuse of one release and every error path."""

import dataclasses

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
import scipy.stats

from fedpriv import fred as F
from fedpriv.dp import moments as M
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger


def _rand_psd(rng, d, rank=None):
    a = rng.normal(size=(d, rank or d))
    return a @ a.T / d


def _orth(rng, d):
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return q


# ------------------------------------------------------------------------------ Eq. 2


def test_closed_forms():
    rng = np.random.default_rng(0)
    d = 12
    mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
    a, b = rng.uniform(0, 3, d), rng.uniform(0, 3, d)
    a[:3] = 0.0  # singular covariances are fine
    want = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert F.frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(want, rel=1e-12)
    # commuting covariances: same eigenvectors
    q = _orth(rng, d)
    c1, c2 = q @ np.diag(a) @ q.T, q @ np.diag(b) @ q.T
    # (singular: sqrt is not Lipschitz at 0, the 1e-16 rounding of c1, c2 shows as ~1e-8)
    assert F.frechet_distance(mu1, c1, mu2, c2) == pytest.approx(want, abs=1e-6)
    assert F.frechet_distance(mu1, c1 + np.eye(d), mu2, c2 + np.eye(d)) == pytest.approx(
        np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a + 1) - np.sqrt(b + 1)) ** 2), rel=1e-12)
    # identical distributions and pure translations
    c = _rand_psd(rng, d, rank=5)
    assert F.frechet_distance(mu1, c, mu1, c) == pytest.approx(0.0, abs=1e-6)
    assert F.frechet_distance(mu1, c, mu2, c) == pytest.approx(np.sum((mu1 - mu2) ** 2), abs=1e-6)
    c = _rand_psd(rng, d) + 0.1 * np.eye(d)  # well conditioned: near machine precision
    assert F.frechet_distance(mu1, c, mu1, c) == pytest.approx(0.0, abs=1e-12)
    assert F.frechet_distance(mu1, c, mu2, c) == pytest.approx(np.sum((mu1 - mu2) ** 2), rel=1e-12)
    # 1-D: (m1 - m2)^2 + (s1 - s2)^2
    assert F.frechet_distance([1.0], [[4.0]], [3.0], [[9.0]]) == pytest.approx(4.0 + 1.0)


def test_symmetry_nonnegativity_and_scipy_agreement():
    rng = np.random.default_rng(1)
    for d in (3, 20):
        for _ in range(5):
            mu1, mu2 = rng.normal(size=d), rng.normal(size=d)
            c1, c2 = _rand_psd(rng, d), _rand_psd(rng, d, rank=max(1, d // 3))
            f12 = F.frechet_distance(mu1, c1, mu2, c2)
            assert f12 == pytest.approx(F.frechet_distance(mu2, c2, mu1, c1), rel=1e-9, abs=1e-7)
            assert f12 >= 0
            # nearly identical full-rank covariances: still >= 0
            assert F.frechet_distance(mu1, c1, mu1, c1 + 1e-12 * np.eye(d)) >= 0
        c1, c2 = _rand_psd(rng, d) + np.eye(d), _rand_psd(rng, d) + np.eye(d)
        ref = np.trace(c1 + c2 - 2 * np.real(scipy.linalg.sqrtm(c1 @ c2)))
        assert F.frechet_distance(np.zeros(d), c1, np.zeros(d), c2) == pytest.approx(ref, rel=1e-8)
    with pytest.raises(ValueError, match="mismatch"):
        F.frechet_distance(np.zeros(2), np.eye(2), np.zeros(3), np.eye(3))


def test_project_psd():
    rng = np.random.default_rng(2)
    d = 10
    p = _rand_psd(rng, d, rank=4)
    np.testing.assert_allclose(F.project_psd(p), p, atol=1e-12)
    a = rng.normal(size=(d, d))
    a = (a + a.T) / 2
    w = np.linalg.eigvalsh(a)
    assert w.min() < 0
    pa = F.project_psd(a)
    np.testing.assert_array_equal(pa, pa.T)
    assert np.linalg.eigvalsh(pa).min() > -1e-12
    dist = np.linalg.norm(a - pa)
    assert dist == pytest.approx(np.sqrt(np.sum(w[w < 0] ** 2)), rel=1e-10)
    for _ in range(20):  # nearest: no random PSD matrix is closer
        assert np.linalg.norm(a - _rand_psd(rng, d, rank=rng.integers(1, d + 1))) >= dist


# ------------------------------------------------------------------------------ noise scale


def _zeros_packed(num_clients, d, samples_per_client=3, chunk_size=256):
    clients = [np.zeros((samples_per_client, d), np.float32) for _ in range(num_clients)]
    p = F.pack_clients(clients, "sample", chunk_size=chunk_size)
    return p, (p.emb, p.mask, p.weight, p.client_id, p.share)


@pytest.mark.parametrize("num_clients", [1, 4, 33])
def test_noise_shares_sum_to_required_variance(num_clients):
    """Zero data: the aggregate is noise only, N(0, tau^2) whatever the number of clients."""
    d, tau = 16, 2.5
    p, args = _zeros_packed(num_clients, d)
    mean_draws = np.concatenate([
        np.asarray(M.secure_sum_mean(*args, 1.0, tau, p.num_clients, jax.random.key(s)))
        for s in range(40)
    ])
    cov_draws = np.concatenate([
        np.asarray(M.secure_sum_cov(*args, jnp.zeros(d), 1.0, 1.0, tau, p.num_clients,
                                    jax.random.key(100 + s)))
        for s in range(8)
    ])
    for x in (mean_draws, cov_draws):
        n = x.size
        # std of the sample std of n normals is ~ tau / sqrt(2n); allow 4 of them
        assert abs(x.std() - tau) < 4 * tau / np.sqrt(2 * n)
        assert abs(x.mean()) < 4 * tau / np.sqrt(n)
        assert scipy.stats.kstest(x / tau, "norm").pvalue > 1e-3


def test_one_share_per_client_even_when_split_into_chunks():
    d, tau = 8, 1.0
    p, args = _zeros_packed(1, d, samples_per_client=40, chunk_size=8)  # 5 chunks, 1 client
    assert p.num_clients == 1 and p.share.sum() == 1.0 and (p.mask.sum(1) > 0).sum() == 5
    x = np.concatenate([
        np.asarray(M.secure_sum_mean(*args, 1.0, tau, 1, jax.random.key(s))) for s in range(200)
    ])
    assert abs(x.std() - tau) < 4 * tau / np.sqrt(2 * x.size)


def test_release_noise_std_end_to_end():
    """private_stats on zero data: n * pmean ~ N(0, tau_1^2) with tau_1 = sigma(eps, delta) c."""
    d, n_clients = 32, 10
    clients = [np.zeros((5, d), np.float32) for _ in range(n_clients)]
    r0 = None
    xs = []
    for s in range(25):
        r = F.private_stats(clients, clip=0.5, epsilon=2.0, delta=1e-5, unit="sample",
                            key=jax.random.key(s), n_public=5 * n_clients)
        xs.append(r.mean * r.n_divisor)
        r0 = r
    x = np.concatenate(xs)
    tau = M.analytic_gaussian_sigma(2.0, 1e-5) * 0.5
    assert r0.mean_noise_std == pytest.approx(tau)
    assert r0.events[0].noise_multiplier == pytest.approx(r0.mean_noise_std / r0.mean_sensitivity)
    assert abs(x.std() - tau) < 4 * tau / np.sqrt(2 * x.size)
    assert scipy.stats.kstest(x / tau, "norm").pvalue > 1e-3
    assert np.linalg.eigvalsh(r0.cov).min() > -1e-12


# ------------------------------------------------------------------------------ sensitivity


def _pre_noise(clients, unit, center, clip, cov_clip):
    p = F.pack_clients(clients, unit, chunk_size=16)
    args = (p.emb, p.mask, p.weight, p.client_id, p.share)
    key = jax.random.key(0)
    s1 = np.asarray(M.secure_sum_mean(*args, clip, 0.0, p.num_clients, key), np.float64)
    s2 = np.asarray(M.secure_sum_cov(*args, center, clip, cov_clip, 0.0, p.num_clients, key),
                    np.float64)
    return s1, s2


def _adversarial_clients(rng, d, sizes):
    """Huge-norm embeddings, many axis-aligned (they attain the covariance bound)."""
    out = []
    for k in sizes:
        x = rng.normal(size=(k, d)) * 50
        axis = rng.integers(0, d, size=k)
        aligned = rng.random(k) < 0.5
        x[aligned] = 0.0
        x[aligned, axis[aligned]] = 100.0 * rng.choice([-1, 1], size=aligned.sum())
        out.append(x.astype(np.float32))
    return out


@pytest.mark.parametrize("unit", ["sample", "user"])
def test_neighbour_sensitivity(unit):
    rng = np.random.default_rng(3)
    d, clip, cov_clip = 8, 0.7, 1.3
    center = jnp.asarray(rng.normal(size=d) * 0.3, jnp.float32)
    worst = {"add_remove": [0.0, 0.0], "replace_one": [0.0, 0.0]}
    for trial in range(6):
        clients = _adversarial_clients(rng, d, rng.integers(1, 30, size=6))
        base = _pre_noise(clients, unit, center, clip, cov_clip)
        if unit == "sample":  # remove one sample of one client / replace it
            i = int(rng.integers(len(clients)))
            j = int(rng.integers(len(clients[i])))
            removed = [c if k != i else np.delete(c, j, axis=0) for k, c in enumerate(clients)]
            replaced = [c.copy() for c in clients]
            replaced[i][j] = 0.0
            replaced[i][j][trial % d] = -100.0
        else:  # remove one user / replace a user by a completely different one
            i = int(rng.integers(len(clients)))
            if trial % 2 == 0:  # all of the user's samples equal: the user's average has norm c
                clients[i] = np.repeat(clients[i][:1], len(clients[i]), axis=0)
                base = _pre_noise(clients, unit, center, clip, cov_clip)
            removed = clients[:i] + clients[i + 1:]
            replaced = list(clients)
            replaced[i] = _adversarial_clients(rng, d, [int(rng.integers(1, 40))])[0]
        for rel, other in (("add_remove", removed), ("replace_one", replaced)):
            nb = _pre_noise(other, unit, center, clip, cov_clip)
            bound = F.sensitivities(clip, cov_clip, unit, rel)
            for k in range(2):
                delta = np.linalg.norm(base[k] - nb[k])
                assert delta <= bound[k] * (1 + 1e-5), (rel, k, delta, bound[k])
                worst[rel][k] = max(worst[rel][k], delta / bound[k])
    # the bounds are attained (up to float32) on these inputs at least once for add/remove
    assert worst["add_remove"][0] > 0.99 and worst["add_remove"][1] > 0.5


def test_sensitivity_table():
    assert F.sensitivities(2.0, 3.0, "sample", "add_remove") == (2.0, 9.0)
    assert F.sensitivities(2.0, 3.0, "user", "replace_one") == pytest.approx((4.0, 9.0 * 2**0.5))


# ------------------------------------------------------------------------------ calibration


@pytest.mark.parametrize("eps,delta", [(0.6, 1e-6), (0.1, 1e-5), (1.0, 1e-6), (4.0, 1e-8)])
def test_calibration_against_dp_accounting(eps, delta):
    sigma = M.analytic_gaussian_sigma(eps, delta)
    assert dpa.get_epsilon_gaussian(sigma, delta) <= eps * (1 + 1e-9)
    acc = dpa.pld.PLDAccountant()
    acc.compose(dpa.GaussianDpEvent(sigma))
    assert acc.get_epsilon(delta) <= eps * 1.01  # PLD's pessimistic discretisation
    assert acc.get_delta(eps * 1.01) <= delta
    if eps < 1:
        assert M.classic_gaussian_sigma(eps, delta) > sigma
    else:
        with pytest.raises(ValueError, match="epsilon < 1"):
            M.classic_gaussian_sigma(eps, delta)
    both = M.composed_epsilons([dpa.GaussianDpEvent(sigma)] * 2, 2 * delta)
    assert both["pld"] <= both["rdp"] * 1.001 and both["rdp"] <= 2 * eps


# ------------------------------------------------------------------------------ ledger


class FakeLedger:
    def __init__(self, budget=np.inf, neighboring="add_remove", unit=None, spy=None):
        self.calls, self.budget, self.neighboring, self.spy = [], budget, neighboring, spy
        if unit is not None:
            self.unit = unit

    def spend(self, name, event, populations=("users",)):
        assert self.spy is None or not self.spy.read, "private data read before spend()"
        if len(self.calls) >= self.budget:
            raise PrivacyBudgetExceeded("over budget")
        self.calls.append((name, event, tuple(populations)))


class Spy:
    """An embedding array that records when its values are read."""

    def __init__(self, arr, flag):
        self._arr, self._flag, self.shape = arr, flag, arr.shape

    def __array__(self, dtype=None, copy=None):
        self._flag.read = True
        return self._arr if dtype is None else self._arr.astype(dtype)

    def __getitem__(self, idx):
        self._flag.read = True
        return self._arr[idx]


class Flag:
    read = False


def _clients(rng, n=8, d=6, shift=0.0):
    return [(rng.normal(size=(int(rng.integers(2, 12)), d)) * 0.3 + shift).astype(np.float32)
            for _ in range(n)]


def test_ledger_charged_once_before_data_and_release_reused():
    rng = np.random.default_rng(4)
    flag = Flag()
    clients = [Spy(c, flag) for c in _clients(rng)]
    led = FakeLedger(spy=flag)
    rel = F.private_stats(clients, 1.0, 0.6, 1e-6, "user", jax.random.key(0), ledger=led,
                          max_samples_per_user=5, n_public=8)
    assert flag.read and len(led.calls) == 1
    name, event, pops = led.calls[0]
    assert name == "fred" and pops == ("users",)
    assert isinstance(event, dpa.ComposedDpEvent)
    assert [e.noise_multiplier for e in event.events] == [rel.noise_multiplier] * 2
    assert rel.unit == "user" and rel.relation == "add_remove" and rel.n == 8
    assert rel.epsilon_basic == 1.2 and rel.delta_total == 2e-6
    assert rel.epsilon_pld < rel.epsilon_rdp < rel.epsilon_basic
    cands = {f"c{k}": rng.normal(size=(50, 6)) * 0.3 + k for k in (3, 0, 1)}
    ranked = F.rank_candidates(cands, rel)
    assert [n for n, _ in ranked] == ["c0", "c1", "c3"]
    assert [s for _, s in ranked] == sorted(s for _, s in ranked)
    assert F.fred(cands["c0"], rel) == ranked[0][1]
    assert len(led.calls) == 1  # scoring any number of candidates is free


def test_budget_exceeded_reads_no_data():
    rng = np.random.default_rng(5)
    flag = Flag()
    clients = [Spy(c, flag) for c in _clients(rng)]
    led = PrivacyLedger(epsilon=0.5, delta=1e-5)  # two (0.6, 1e-6) releases exceed it
    with pytest.raises(PrivacyBudgetExceeded):
        F.private_stats(clients, 1.0, 0.6, 1e-6, "user", jax.random.key(0), ledger=led,
                        n_public=8)
    assert not flag.read


def test_real_ledger_records_release():
    rng = np.random.default_rng(6)
    led = PrivacyLedger(epsilon=3.0, delta=1e-5)
    rel = F.private_stats(_clients(rng), 1.0, 0.6, 1e-6, "user", jax.random.key(1), ledger=led,
                          n_public=8)
    spent = led.spent()
    assert spent == pytest.approx(
        min(M.composed_epsilons(rel.events, led.delta).values()), rel=1e-3)
    F.rank_candidates({"a": rng.normal(size=(20, 6)), "b": rng.normal(size=(20, 6))}, rel)
    assert len(led.entries) == 1 and led.spent() == spent
    led_r = PrivacyLedger(epsilon=3.0, delta=1e-5, neighboring="replace_one")
    rel_r = F.private_stats(_clients(rng), 1.0, 0.6, 1e-6, "user", jax.random.key(1), ledger=led_r)
    assert rel_r.relation == "replace_one" and rel_r.mean_sensitivity == 2.0


def test_add_remove_release_never_divides_by_the_exact_count():
    """Issue 24 item 8. Under add/remove the exact count differs between neighbouring datasets,
    so it is private: a release without a declared ``n_public`` is refused before the ledger is
    charged or any value is read; with one, ``n`` is the declared value (not the exact count),
    the mean is the noisy sum over *it* (zero data: ``mean * n_public ~ N(0, tau_1^2)``, which
    a division by the exact count would shrink by ``n_public / n``), and the ledger holds
    exactly the two Gaussian releases the release reports, at its noise multiplier."""
    rng = np.random.default_rng(11)
    flag = Flag()
    clients = [Spy(c, flag) for c in _clients(rng)]
    led = PrivacyLedger(epsilon=10.0, delta=1e-5)
    with pytest.raises(ValueError, match="exact count is private.*n_public"):
        F.private_stats(clients, 1.0, 0.6, 1e-6, "user", jax.random.key(0), ledger=led)
    assert not flag.read and not led.entries
    exact, declared = len(clients), 20
    rel = F.private_stats(clients, 1.0, 0.6, 1e-6, "user", jax.random.key(0), ledger=led,
                          n_public=declared)
    assert rel.n == rel.n_divisor == declared != exact and not rel.count_public
    assert "declared" in rel.privacy_summary()
    (entry,) = led.entries
    assert entry.event == dpa.ComposedDpEvent(list(rel.events))
    assert [e.noise_multiplier for e in rel.events] == [rel.noise_multiplier] * 2
    assert rel.mean_noise_std == rel.noise_multiplier * rel.mean_sensitivity
    zeros = [np.zeros((3, 16), np.float32) for _ in range(exact)]
    x = np.concatenate([F.private_stats(zeros, 1.0, 2.0, 1e-5, "user", jax.random.key(s),
                                        n_public=declared).mean * declared for s in range(20)])
    tau = M.gaussian_sigma(2.0, 1e-5) * 1.0
    assert abs(x.std() - tau) < 4 * tau / np.sqrt(2 * x.size)
    # replace-one: the exact count is public there (the same on neighbours)
    rel_r = F.private_stats(_clients(rng), 1.0, 0.6, 1e-6, "user", jax.random.key(1),
                            relation="replace_one")
    assert rel_r.n == 8 and rel_r.count_public


def test_ledger_mismatches_are_refused():
    rng = np.random.default_rng(7)
    with pytest.raises(ValueError, match="relation"):
        F.private_stats(_clients(rng), 1.0, 0.6, 1e-6, "sample", jax.random.key(0),
                        relation="replace_one", ledger=FakeLedger(neighboring="add_remove"))
    with pytest.raises(ValueError, match="user-level ledger"):
        F.private_stats(_clients(rng), 1.0, 0.6, 1e-6, "sample", jax.random.key(0),
                        ledger=FakeLedger(unit="user"))


# ------------------------------------------------------------------------------ accuracy


def test_private_stats_converge_to_nonprivate():
    rng = np.random.default_rng(8)
    clients = _clients(rng, n=30, d=6, shift=0.1)
    allx = np.concatenate(clients)
    # replace-one: the exact count is the same on neighbours, public
    # (epsilon 1e6, delta 5e-4 per release: the pair at accounting.MAX_DELTA = 1e-3; negligible noise)
    r = F.private_stats(clients, 5.0, 1e6, 5e-4, "sample", jax.random.key(0), relation="replace_one")
    st = F.gaussian_stats(allx)
    assert r.noise_multiplier < 1e-3 and np.isnan(r.epsilon_pld)
    np.testing.assert_allclose(r.mean, st.mean, atol=1e-3)
    np.testing.assert_allclose(r.cov, st.cov, atol=1e-3)  # centred on pmean ~ true mean
    pub = rng.normal(size=(200, 6)) * 0.5
    assert F.fred(pub, r) == pytest.approx(F.fred_nonprivate(pub, allx), rel=1e-2)
    # user level estimates the user-weighted mixture
    ru = F.private_stats(clients, 5.0, 1e6, 5e-4, "user", jax.random.key(0), relation="replace_one")
    np.testing.assert_allclose(ru.mean, np.mean([c.mean(0) for c in clients], 0), atol=1e-3)
    assert ru.n == 30 and r.n == len(allx)
    # add/remove: the declared n_public is the denominator
    rp = F.private_stats(clients, 5.0, 1e6, 5e-4, "sample", jax.random.key(0), n_public=2 * len(allx))
    np.testing.assert_allclose(rp.mean, st.mean / 2, atol=1e-3)
    assert not rp.count_public and r.count_public
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.epsilon = 3.0


def test_pca_basis():
    rng = np.random.default_rng(10)
    scales = np.array([5.0, 3.0, 1.0, 0.1, 0.1, 0.1])
    x = rng.normal(size=(4000, 6)) * scales @ _orth(rng, 6).T
    b = F.pca_basis(x, 2)
    np.testing.assert_allclose(b.T @ b, np.eye(2), atol=1e-12)
    var = np.var(x @ b, axis=0)
    assert var[0] > var[1] and var.sum() > 0.95 * (25 + 9)
    with pytest.raises(ValueError, match="k must be"):
        F.pca_basis(x, 7)


# ------------------------------------------------------------------------------ errors


def test_error_paths():
    rng = np.random.default_rng(9)
    clients = _clients(rng)
    key = jax.random.key(0)
    ok = dict(clip=1.0, epsilon=0.6, delta=1e-6, unit="sample", key=key, n_public=50)
    bad = [c.copy() for c in clients]
    bad[2][0, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        F.private_stats(bad, **ok)
    for kw, match in [(dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"),
                      (dict(delta=0.0), "delta"), (dict(delta=1.0), "delta"),
                      (dict(delta=1.5), "delta"), (dict(clip=0.0), "clip"),
                      (dict(clip=-2.0), "clip"), (dict(unit="household"), "unit"),
                      (dict(key=None), "key"), (dict(calibration="classic", epsilon=1.5), "epsilon < 1"),
                      (dict(n_public=None), "add_remove the exact count is private.*n_public"),
                      (dict(n_public=0), "n_public must be a finite number > 0"),
                      (dict(n_public=float("nan")), "n_public must be a finite number > 0"),
                      (dict(n_public=True), "n_public must be a finite number > 0"),
                      (dict(n_public="12"), "n_public must be a finite number > 0")]:
        with pytest.raises(ValueError, match=match):
            F.private_stats(clients, **{**ok, **kw})
    with pytest.raises(ValueError, match="at least 2"):
        F.private_stats([clients[0][:1], np.zeros((0, 6), np.float32)], **ok)
    with pytest.raises(ValueError, match="at least 2"):
        F.private_stats([clients[0]], **{**ok, "unit": "user"})
    with pytest.raises(ValueError, match="different embedding dimensions"):
        F.private_stats([clients[0], np.zeros((3, 5), np.float32)], **ok)
    rel = F.private_stats(clients, **ok)
    with pytest.raises(ValueError, match="dimension mismatch"):
        F.fred(np.zeros((10, 7)), rel)
    with pytest.raises(ValueError, match="dimension mismatch"):
        F.fred_nonprivate(np.zeros((10, 7)), np.zeros((10, 6)))
    pub = rng.normal(size=(10, 6))
    pub[3, 3] = np.inf
    with pytest.raises(ValueError, match="NaN"):
        F.fred(pub, rel)
    with pytest.raises(ValueError, match="at least 2"):
        F.fred(np.zeros((1, 6)), rel)


def test_mixture_monotone_verdict():
    """fedpriv.fred.mixtures.monotone_verdict: one deterministic value per Y (exact=True) is
    judged exactly; per-trial values by the 90 % interval of every adjacent pair (paired when
    keyed by trial), so a gap inside the noise is inconclusive, never reproduced."""
    from fedpriv.fred.mixtures import monotone_verdict
    assert monotone_verdict("c", [0, 50, 100], [[3.0], [2.0], [1.0]], exact=True).status == "reproduced"
    assert monotone_verdict("c", [0, 50, 100], [[3.0], [3.5], [1.0]], exact=True).status == "not reproduced"
    assert monotone_verdict("c", [0, 100], [[1.0], [2.0]], decreasing=False, exact=True).status == "reproduced"
    v = monotone_verdict("c", [0, 100], [[3.0, 3.2], [3.0, 3.1]])
    assert v.status == "inconclusive (interval contains 0)" and "Y=100" in v.measured
    v = monotone_verdict("c", [0, 100], [{0: 3.0, 1: 3.2, 2: 3.1}, {0: 2.0, 1: 2.3, 2: 2.05}])
    assert v.status == "reproduced" and "paired t" in v.measured
    assert monotone_verdict("c", [0, 100], [[3.0], [1.0]]).status == "inconclusive (too few seeds)"


def test_fred_table_verdicts_follow_the_releases():
    """Hou Table 1's claim per (space, unit): reproduced only if every release found the same
    closest candidate as non-private FreD."""
    from experiments.fred_table import verdicts
    rows = [{"space": "384-d", "unit": u, "candidate": c, "nonprivate/same_closest": top,
             "nonprivate/same_ranking": "1/3"}
            for u, top in (("sample", "3/3"), ("user", "2/3")) for c in ("a", "b")]
    v = verdicts(rows, 3)
    assert [x.status for x in v] == ["reproduced", "not reproduced"]
    assert "2/3 releases" in v[1].measured and "sample level" in v[0].claim
