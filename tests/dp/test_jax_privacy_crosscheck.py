"""fedpriv's matrix-factorization mechanisms (``fedpriv.dp.matrix``) cross-checked against the
maintained reference, jax_privacy 2.0.0 (``jax_privacy.matrix_factorization``, by the authors of
Choquette-Choo et al. 2023 and McMahan, Dvijotham et al. 2024); jax_privacy is a test-only
dependency (requirements.txt, pyproject's ``test`` extra).

The same strategies are built both ways (fedpriv's coefficients fed into jax_privacy's
constructors and vice versa) and compared on what the accounting and the noise depend on:

* sensitivity ``max_u ||C u||`` under single participation and b-min-separation (the
  separations the engine uses: ``min_separation = rounds per epoch``, ``bands = min(sep, 64)``,
  participations capped or not);
* the per-round noise covariance ``sigma^2 C^{-1} C^{-T}`` (what the privatizers add per round)
  and the prefix-sum variance ``diag(A C^{-1} C^{-T} A^T)``; and the streamed noise itself: the
  same i.i.d. ``Z`` pushed through fedpriv's privatizer and through jax_privacy's
  ``StreamingMatrix`` ``C^{-1}``.

Every difference found is asserted as exactly that difference, with its reason:

1. jax_privacy's default banded strategy (``banded.ColumnNormalizedBanded.default``) is the
   same BSR coefficients *column-normalised* (every column of ``C`` has norm 1); fedpriv's is
   the plain truncated Toeplitz. Same family, a different member: asserted column by column.
2. For a banded ``C`` with ``min_separation < bands`` fedpriv refuses (``MinSeparationError``,
   fail closed), as jax_privacy's banded code does; jax_privacy's Toeplitz routine
   (McMahan et al. 2024, Thm. 2: exact for non-negative, non-increasing coefficients) still
   gives the exact value. A coverage gap of fedpriv, not a value mismatch.
3. BLT multi-participation: fedpriv uses the general Alg. 4 upper bound of Choquette-Choo et al.
   2023 on the Gram ``C^T C`` (jax_privacy's ``get_min_sep_sensitivity_upper_bound`` gives the
   identical number), jax_privacy's BLT optimiser the exact Thm. 2 value. Equal when the
   participation count is not capped; with a cap fedpriv's bound is larger (its epsilon
   conservative): by 0.5% (fitted BLT) and 1.5% (RA-BLT) at n = 64, b = 8, k = 3.
4. A fitted fedpriv BLT can carry a buffer with ``theta_i = 0`` (NNLS); jax_privacy's closed-form
   ``BufferedToeplitz.inverse`` needs every ``output_scale != 0`` (it returns NaN otherwise), so
   such buffers are dropped before the conversion (the matrix ``C`` is unchanged).

5. The mechanism objects (``BandedMechanism`` / ``BLTMechanism`` of ``fedpriv.dp.mechanisms``,
   built as the recipes build them: ``run_fields`` from a ``CyclicSampler`` or an
   ``AmplifiedCyclicSampler``) give events whose epsilon, in jax_privacy's own RDP/PLD
   accountant, is jax_privacy's ``SingleReleaseTrainingAccountant`` (un-amplified MF) or
   ``DpsgdTrainingAccountant`` with ``cycle_length`` (amplified BandMF, whose convention is a
   unit max column norm: fedpriv divides z by its BSR's column norm instead of normalising
   ``C``). fedpriv's own ``compute_epsilon(accountant="rdp")`` evaluates dp_accounting's
   default RDP orders, jax_privacy its own grid (``accountants._DEFAULT_RDP_ORDERS``): two valid
   upper bounds 1e-6 .. 5e-6 apart (relative) on the un-amplified Gaussians here, equal on the
   amplified one; asserted as such.

Every comparison is a helper (``_assert_same_*``) that the agreement tests and
``test_the_comparisons_catch_broken_fedpriv_quantities`` share: deliberately broken fedpriv
quantities (a wrong min-separation, one participation too few, a band or a BLT weight
perturbed by 1e-6, the transposed covariance ``C^{-T} C^{-1}``, a privatizer streaming a
perturbed band, an epsilon under jax_privacy's unit-column-norm convention) must fail them.

jax_privacy 2.0 has no binary-tree (or Honaker) strategy; fedpriv's tree is checked through
jax_privacy's generic sensitivity code on ``tree_matrix`` (single epoch and one tree per epoch)
and against dp_accounting's tree event.

Numerics: jax_privacy's sensitivity and BLT code is run in float64 (``jax.enable_x64``, as its
docs require for BLTs); sums of at most ``n^2`` terms of size O(1) give the relative tolerance
``RTOL64 = n^2 eps64``. Epsilons come from the same accountant on the same events, with
noise multipliers ``z / sens`` that agree to ``RTOL64``; epsilon is smooth in them, so
``EPS_RTOL = 1e-9`` is loose by orders of magnitude. The privatizers stream in float32: the
recurrence for ``C^{-1} Z`` has at most ``n`` steps of at most ``bands`` (or ``buffers + 1``)
terms with coefficients <= 1 in absolute value, so the streamed noise agrees to
``n (bands + 1) eps32`` times its scale.
"""
import functools

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.dp import accounting, matrix as M, mechanisms
from fedpriv.dp.noise import num_tree_levels
from fedpriv.fl.samplers import AmplifiedCyclicSampler, CyclicSampler
from tests import oracles

jp = pytest.importorskip("jax_privacy.matrix_factorization")
T, S, BT, BD = jp.toeplitz, jp.sensitivity, jp.buffered_toeplitz, jp.banded
from jax_privacy import noise_addition  # noqa: E402
from jax_privacy.accounting import accountants as jp_accountants, analysis as jp_analysis  # noqa: E402

EPS64, EPS32 = float(np.finfo(np.float64).eps), float(np.finfo(np.float32).eps)
EPS_RTOL = 1e-9


def rtol64(n: int) -> float:
    return n * n * EPS64


# ----------------------------------------------------------------------------- the comparisons
# (shared by the agreement tests and the mutant test: a broken fedpriv quantity must fail them)
def _assert_same_sensitivity(ours: float, theirs: float, n: int, what=""):
    assert ours == pytest.approx(float(theirs), rel=rtol64(n)), (what, ours, float(theirs))


def _their_toeplitz_sensitivity(coefs, n: int, sep: int, max_part=None) -> float:
    """jax_privacy's exact min-sep sensitivity of a Toeplitz ``C`` (McMahan et al. 2024, Thm. 2:
    non-negative, non-increasing coefficients)."""
    return float(np.sqrt(T.minsep_sensitivity_squared(np.asarray(coefs), sep, max_part, n=n)))


def _assert_same_noise_covariance(ours: np.ndarray, cinv: np.ndarray, std: float, n: int):
    """``ours`` is ``std^2 C^{-1} C^{-T}`` with jax_privacy's ``C^{-1}`` (``[n, n]``), to
    ``RTOL64`` of its largest entry."""
    cov = std ** 2 * cinv @ cinv.T
    np.testing.assert_allclose(ours, cov, rtol=0, atol=rtol64(n) * np.abs(cov).max())


def _assert_same_stream(ours: np.ndarray, theirs: np.ndarray, width: int):
    """float32 streams ``[n, d]`` of a recurrence of ``width`` terms agree to
    ``n width eps32`` of their scale."""
    n = theirs.shape[0]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=n * width * EPS32 * np.abs(theirs).max())


def _assert_same_epsilon(ours: float, theirs: float, what=""):
    assert ours == pytest.approx(theirs, rel=EPS_RTOL), (what, ours, theirs)


def _epsilon_in(config, event: dpa.DpEvent, delta: float) -> float:
    """Epsilon of a fedpriv event in jax_privacy's accountant (``config``: its
    ``RdpAccountantConfig`` / ``PldAccountantConfig``; add-or-remove-one)."""
    acc = config.create_accountant()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def _to_jax_privacy_blt(strategy: M.BLTStrategy):
    """fedpriv's ``(theta, omega)`` as jax_privacy's ``BufferedToeplitz``: the same
    parameterisation (``c_0 = 1``, ``c_k = sum_i theta_i omega_i^(k-1)``: ``output_scale = theta``,
    ``buf_decay = omega``), dead buffers (``theta_i = 0``) dropped (difference 4)."""
    keep = [i for i, t in enumerate(strategy.theta) if t != 0.0]
    return BT.BufferedToeplitz.build(buf_decay=[strategy.omega[i] for i in keep],
                                     output_scale=[strategy.theta[i] for i in keep])


def _brute_sensitivity(C, sep, max_part=None):
    """``max ||C u||`` over all 0/1 ``u`` with ones ``>= sep`` apart, at most ``max_part``
    (exhaustive; small ``n`` only)."""
    n, best = C.shape[1], 0.0

    def rec(start, cols, count):
        nonlocal best
        if cols:
            best = max(best, float(np.linalg.norm(C[:, cols].sum(1))))
        if max_part is not None and count == max_part:
            return
        for j in range(start, n):
            rec(j + sep, cols + [j], count + 1)

    rec(0, [], 0)
    return best


# ----------------------------------------------------------------------------- banded (BSR)
# (rounds, bands, min_separation, max participations): the engine's bands = min(sep, 64) with
# sep = rounds per epoch; separations that divide the rounds or not; capped or not; one
# participation (single-participation sensitivity = max column norm).
BANDED_CASES = [(64, 8, 8, None), (64, 8, 8, 3), (64, 8, 11, None), (64, 4, 64, None),
                (64, 8, 8, 1)]


def test_bsr_coefficients_are_jax_privacys_optimal_toeplitz_strategy():
    n, b = 64, 16
    ours = M.banded_strategy(b)
    # Fichtenberger et al. 2023 / Dvijotham et al. 2024: jax_privacy's optimal max-error
    # Toeplitz strategy, truncated to b bands, is fedpriv's BSR
    np.testing.assert_allclose(ours.coeffs, np.asarray(T.optimal_max_error_strategy_coefs(b)),
                               rtol=rtol64(b), atol=0)
    C = ours.matrix(n)
    np.testing.assert_allclose(C, np.asarray(T.materialize_lower_triangular(ours.coeffs, n)),
                               rtol=0, atol=0)
    # difference 1: jax_privacy's default banded strategy is the column-normalised version
    cn = np.asarray(BD.ColumnNormalizedBanded.default(n, b).materialize())
    np.testing.assert_allclose(cn, C / np.linalg.norm(C, axis=0), rtol=rtol64(n), atol=1e-15)
    norms = np.linalg.norm(C, axis=0)
    assert np.all(norms[:n - b + 1] == norms[0]) and np.all(np.diff(norms[n - b:]) < 0)


@pytest.mark.parametrize("n,bands,sep,max_part", BANDED_CASES)
def test_banded_sensitivity_equals_jax_privacys(n, bands, sep, max_part):
    strategy = M.banded_strategy(bands)
    ours = strategy.sensitivity(n, sep, max_part)
    C = jnp.asarray(strategy.matrix(n))
    coef = np.asarray(strategy.coeffs)
    theirs = {
        "toeplitz (Thm. 2)": _their_toeplitz_sensitivity(coef, n, sep, max_part),
        "banded (diag of C^T C)": S.get_sensitivity_banded(C, sep, max_part),
        "Alg. 4 bound": S.get_min_sep_sensitivity_upper_bound(C, sep, max_part),
    }
    if max_part == 1:
        theirs["single participation"] = float(S.single_participation_sensitivity(C))
    for name, value in theirs.items():
        _assert_same_sensitivity(ours, value, n, name)
    _assert_same_sensitivity(M.gram_sensitivity(np.asarray(C), sep, max_part), ours, n, "gram")


def test_banded_below_its_bands_is_refused_by_fedpriv_and_exact_in_jax_privacys_toeplitz_code():
    # difference 2: min_separation 3 < 4 bands
    n, bands, sep = 12, 4, 3
    strategy = M.banded_strategy(bands)
    C = strategy.matrix(n)
    with pytest.raises(M.MinSeparationError):
        strategy.sensitivity(n, sep)
    with pytest.raises(ValueError, match="orthogonal"):  # jax_privacy's banded code refuses too
        S.get_sensitivity_banded(jnp.asarray(C), sep)
    exact = float(np.sqrt(T.minsep_sensitivity_squared(np.asarray(strategy.coeffs), sep, n=n)))
    assert exact == pytest.approx(_brute_sensitivity(C, sep), rel=rtol64(n))
    # fedpriv's general bound (what it would take for a non-banded C) is valid, and tight here
    assert M.gram_sensitivity(C, sep) >= exact * (1 - rtol64(n))


# ----------------------------------------------------------------------------- BLT
@functools.lru_cache(maxsize=None)
def _blts(n):
    """fedpriv's fitted BLT (NNLS on A^{1/2}) and jax_privacy's RA-BLT (rational approximation
    of 1 / sqrt(1 - x), Dvijotham et al. 2024, Prop. 4.5) taken into fedpriv."""
    ours = M.blt_strategy(n, 4)
    ra = BT.BufferedToeplitz.from_rational_approx_to_sqrt_x(4, max_buf_decay=0.999)
    theirs = M.BLTStrategy(tuple(map(float, ra.output_scale)), tuple(map(float, ra.buf_decay)))
    return {"fedpriv-nnls": ours, "jax_privacy-ra": theirs}


def test_blt_parameterisation_and_single_participation_sensitivity_agree():
    n = 64
    for name, strategy in _blts(n).items():
        blt = _to_jax_privacy_blt(strategy)
        np.testing.assert_allclose(np.asarray(blt.toeplitz_coefs(n)), strategy.coeffs(n),
                                   rtol=rtol64(n), atol=1e-15, err_msg=name)
        # McMahan et al. 2024, Lemma 5.3 (closed form) vs fedpriv's Alg. 4 with one participation
        single = float(np.sqrt(BT.sensitivity_squared(blt, n)))
        _assert_same_sensitivity(strategy.sensitivity(n, 1, 1), single, n, name)
    # difference 4: the NNLS fit leaves a dead buffer here (theta = 0: same C, one wasted buffer)
    assert 0.0 in M.blt_strategy(n, 4).theta


# (min_separation, max participations) over n = 64 rounds: the engine's min-separations
BLT_SEPARATIONS = [(1, None), (8, None), (64, None), (8, 3)]


def test_blt_multi_participation_sensitivity_is_jax_privacys_bound_and_at_least_the_exact_value():
    n = 64
    for name, strategy in _blts(n).items():
        C = strategy.matrix(n)
        coef = np.asarray(_to_jax_privacy_blt(strategy).toeplitz_coefs(n))
        assert np.all(coef >= 0) and np.all(np.diff(coef) <= 0)  # Thm. 2 applies
        for sep, k in BLT_SEPARATIONS:
            ours = strategy.sensitivity(n, sep, k)
            bound = S.get_min_sep_sensitivity_upper_bound(jnp.asarray(C), sep, k)
            _assert_same_sensitivity(ours, bound, n, (name, sep, k))
            exact = _their_toeplitz_sensitivity(coef, n, sep, k)
            if k is None:  # difference 3: uncapped, the bound is exact
                _assert_same_sensitivity(ours, exact, n, (name, sep, k))
            else:          # capped: conservative by a small, measured margin (0.5%, 1.5%)
                assert exact * (1 + 1e-4) < ours < exact * 1.02, (name, sep, k, ours / exact)
    # which of the two is exact: brute force on a small n (nnls fit, capped)
    small = M.blt_strategy(12, 3)
    coef12 = np.asarray(small.coeffs(12))
    exact = float(np.sqrt(T.minsep_sensitivity_squared(coef12, 3, 2, n=12)))
    assert exact == pytest.approx(_brute_sensitivity(small.matrix(12), 3, 2), rel=rtol64(12))
    assert small.sensitivity(12, 3, 2) >= exact * (1 - rtol64(12))


# ----------------------------------------------------------------------------- noise
def _their_noising_matrix(strategy, n):
    """jax_privacy's ``C^{-1}`` (the StreamingMatrix its privatizer streams), materialised."""
    if isinstance(strategy, M.BandedStrategy):
        cinv = T.inverse_as_streaming_matrix(jnp.asarray(strategy.coeffs))
    else:
        cinv = _to_jax_privacy_blt(strategy).inverse_as_streaming_matrix()
    return cinv, np.asarray(cinv.materialize(n))


NOISE_STRATEGIES = {"banded8": lambda n: M.banded_strategy(8),
                    "blt-nnls": lambda n: M.blt_strategy(n, 4),
                    "blt-ra": lambda n: _blts(n)["jax_privacy-ra"]}


@pytest.mark.parametrize("name", sorted(NOISE_STRATEGIES))
def test_noise_covariance_and_prefix_variance_equal_jax_privacys(name):
    n, std = 48, 1.7
    strategy = NOISE_STRATEGIES[name](n)
    _, cinv = _their_noising_matrix(strategy, n)
    np.testing.assert_allclose(cinv @ strategy.matrix(n), np.eye(n), atol=n * EPS64 * 100)
    _assert_same_noise_covariance(oracles.noise_covariance(strategy, n, std), cinv, std, n)
    # Toeplitz: jax_privacy's per-query error of the prefix sums from C^{-1}'s first column
    per_query = std ** 2 * np.asarray(T.per_query_error(noising_coef=jnp.asarray(cinv[:, 0])))
    np.testing.assert_allclose(M.prefix_noise_variance(strategy, n, std), per_query,
                               rtol=rtol64(n), atol=0)


@pytest.mark.parametrize("name", sorted(NOISE_STRATEGIES))
def test_streamed_noise_is_jax_privacys_streaming_inverse_on_the_same_z(name):
    """fedpriv's privatizer (float32, its own key scheme) and jax_privacy's StreamingMatrix
    ``C^{-1}`` (the object jax_privacy's ``matrix_factorization_privatizer`` streams) applied to
    the very same ``Z`` give the same noise, round by round."""
    n = 32
    strategy = NOISE_STRATEGIES[name](n)
    ours, theirs = _streams(strategy, strategy, n)
    _assert_same_stream(ours, theirs, _width(strategy))


def _width(strategy) -> int:
    return (strategy.bands if isinstance(strategy, M.BandedStrategy) else strategy.buffers) + 1


def _streams(ours_strategy, their_strategy, n, d=5, std=0.9, key=7):
    """``[n, d]`` noise: fedpriv's privatizer of ``ours_strategy`` (float32) and jax_privacy's
    ``StreamingMatrix`` ``C^{-1}`` of ``their_strategy`` on fedpriv's very ``Z``."""
    key = jax.random.key(key)
    with jax.enable_x64(False):
        tx = M.privatizer(ours_strategy, std, key)
        x = {"w": jnp.zeros((d,), jnp.float32)}
        state, ours = tx.init(x), []
        update = jax.jit(tx.update)
        for _ in range(n):
            out, state = update(x, state)
            ours.append(np.asarray(out["w"], np.float64))
        # fedpriv's Z_t: N(0, std^2) from fold_in(key, t), one split per leaf (matrix.py)
        z = [std * np.asarray(jax.random.normal(jax.random.split(jax.random.fold_in(key, t), 1)[0],
                                                (d,), jnp.float32), np.float64) for t in range(n)]
    cinv, _ = _their_noising_matrix(their_strategy, n)
    s, theirs = cinv.init_multiply(jnp.zeros((d,))), []
    for t in range(n):
        w, s = cinv.multiply_next(jnp.asarray(z[t]), s)
        theirs.append(np.asarray(w))
    return np.stack(ours), np.stack(theirs)


def test_jax_privacys_privatizer_on_our_strategy_has_our_noise_covariance():
    """jax_privacy's own privatizer (its key scheme) with fedpriv's banded ``C^{-1}``: the
    empirical covariance over ``d`` i.i.d. coordinates equals ``noise_covariance`` within
    ``4 x`` the expected relative Frobenius error ``sqrt(((tr S)^2 + ||S||_F^2) / d) / ||S||_F``
    of a Wishart estimate."""
    n, d, std = 8, 20_000, 1.3
    strategy = M.banded_strategy(4)
    with jax.enable_x64(False):
        cinv = T.inverse_as_streaming_matrix(jnp.asarray(strategy.coeffs, jnp.float32))
        tx = noise_addition.matrix_factorization_privatizer(cinv, stddev=std,
                                                            prng_key=jax.random.key(3))
        x = jnp.zeros((d,), jnp.float32)
        state, out = tx.init(x), []
        for _ in range(n):
            o, state = tx.update(x, state)
            out.append(np.asarray(o, np.float64))
    w = np.stack(out)
    emp, true = w @ w.T / d, oracles.noise_covariance(strategy, n, std)
    expected = np.sqrt((np.trace(true) ** 2 + (true ** 2).sum()) / d) / np.linalg.norm(true)
    assert np.linalg.norm(emp - true) / np.linalg.norm(true) < 4 * expected


# ----------------------------------------------------------------------------- tree
def test_tree_sensitivity_through_jax_privacys_generic_code():
    """No tree strategy in jax_privacy 2.0: fedpriv's ``tree_matrix`` goes through its generic
    sensitivity code. One tree: sqrt(depth) with depth = ``num_tree_levels`` (what
    dp_accounting's tree event uses); one tree per epoch (restart every R = ``leaves`` rounds,
    users every R rounds, 3 epochs): the block-diagonal ``C`` has sens^2 = epochs * depth, and
    the Gaussian at ``z / sens`` has exactly the epsilon of fedpriv's ``dp_ftrl_event`` (which
    composes one tree event per epoch)."""
    epochs, z = 3, 2.0
    for leaves in (5, 8):
        C = M.tree_matrix(leaves)
        depth = num_tree_levels(leaves)
        single = float(S.single_participation_sensitivity(jnp.asarray(C)))
        assert single ** 2 == pytest.approx(depth, rel=rtol64(leaves))
        big = np.kron(np.eye(epochs), C)
        sens = S.get_min_sep_sensitivity_upper_bound(jnp.asarray(big), leaves)
        assert sens ** 2 == pytest.approx(epochs * depth, rel=rtol64(epochs * leaves))
        assert M.gram_sensitivity(big, leaves) == pytest.approx(sens, rel=rtol64(epochs * leaves))
        eps = [accounting.compute_epsilon(ev, 1e-6, accountant="rdp")[0]
               for ev in (accounting.dp_ftrl_event(z, epochs * leaves, leaves),
                          M.gaussian_mf_event(z, sens))]
        assert eps[0] == pytest.approx(eps[1], rel=1e-9), leaves


# ----------------------------------------------------------------------------- mechanism objects
ROUNDS, Z, DELTA = 64, 3.0, 1e-6


def _mechanism(kind: str, sampler):
    """The ``BandedMechanism`` / ``BLTMechanism`` the recipes build for ``sampler`` and ``ROUNDS``
    rounds (``run_fields``; ``mf_bands = 64`` as in configs/lm_fl.py)."""
    cls = mechanisms.get_mechanism(kind)
    return cls(clip_norm=1.0, noise_multiplier=Z,
               **cls.run_fields(sampler, ROUNDS, {"mf_bands": 64}))


def _their_single_release_epsilon(strategy, sampler, config) -> float:
    """jax_privacy's un-amplified MF epsilon (``SingleReleaseTrainingAccountant``: one Gaussian
    at the given multiplier) at ``Z / sens``, sens its exact Toeplitz min-sep sensitivity."""
    coef = strategy.coeffs if isinstance(strategy, M.BandedStrategy) else strategy.coeffs(ROUNDS)
    sens = _their_toeplitz_sensitivity(coef, ROUNDS, sampler.min_separation,
                                       sampler.max_participations(ROUNDS))
    params = jp_analysis.DpParams(noise_multipliers=Z / sens, num_samples=sampler.num_clients,
                                  delta=DELTA, batch_size=sampler.cohort_size)
    return jp_analysis.SingleReleaseTrainingAccountant(config).compute_epsilon(ROUNDS, params)


def _their_amplified_epsilon(strategy, sampler, batch_size, config) -> float:
    """jax_privacy's amplified BandMF epsilon (``DpsgdTrainingAccountant`` with
    ``cycle_length``, Choquette-Choo et al. 2023, Thm. 4), whose convention is a unit max
    column norm: at ``Z / (max column norm of C)``."""
    col = float(S.single_participation_sensitivity(jnp.asarray(strategy.matrix(ROUNDS))))
    params = jp_analysis.DpParams(noise_multipliers=Z / col, num_samples=sampler.num_clients,
                                  delta=DELTA, batch_size=batch_size,
                                  cycle_length=sampler.num_groups)
    return jp_analysis.DpsgdTrainingAccountant(config).compute_epsilon(ROUNDS, params)


CYCLIC = CyclicSampler(800, 100, seed=0)                    # min-separation 8, 8 participations
AMPLIFIED = AmplifiedCyclicSampler(1000, 8, 0.2, seed=0)    # groups of 125, q = 25 / 125
AMPLIFIED_BATCH = 25


@pytest.mark.parametrize("kind", ["banded", "blt"])
def test_mechanism_objects_epsilon_equals_jax_privacys_single_release(kind):
    """``BandedMechanism`` / ``BLTMechanism`` under a ``CyclicSampler`` (8 rounds apart, 64
    rounds): the event fedpriv charges, in jax_privacy's RDP accountant, has exactly the
    epsilon of jax_privacy's ``SingleReleaseTrainingAccountant`` at z over jax_privacy's
    sensitivity. fedpriv's own RDP report differs only by its order grid (difference 5)."""
    dp = _mechanism(kind, CYCLIC)
    assert type(dp).__name__ == {"banded": "BandedMechanism", "blt": "BLTMechanism"}[kind]
    assert dp.min_separation == 8 and (dp.bands == 8 if kind == "banded" else True)
    event = dp.privacy_event(CYCLIC, ROUNDS)
    config = jp_accountants.RdpAccountantConfig()
    theirs = _their_single_release_epsilon(dp.strategy, CYCLIC, config)
    _assert_same_epsilon(_epsilon_in(config, event, DELTA), theirs, kind)
    # difference 5: dp_accounting's default RDP orders vs jax_privacy's grid (measured 1.1e-6
    # banded, 5.3e-6 blt); a grid artefact, not a mechanism difference
    own = accounting.compute_epsilon(event, DELTA, accountant="rdp")[0]
    assert abs(own / theirs - 1) < 1e-4, (own, theirs)


@pytest.mark.parametrize("config_cls", ["RdpAccountantConfig", "PldAccountantConfig"])
def test_amplified_banded_mechanism_epsilon_equals_jax_privacys_bandmf_accountant(config_cls):
    """``BandedMechanism`` under ``AmplifiedCyclicSampler`` (cyclic Poisson, 8 groups of 125,
    q = 0.2, 64 rounds): fedpriv's amplified event has jax_privacy's ``DpsgdTrainingAccountant``
    epsilon with ``cycle_length = 8``, batch 25, at z over the BSR's max column norm, in RDP
    and in PLD (jax_privacy's discretisation)."""
    dp = _mechanism("banded", AMPLIFIED)
    event = dp.privacy_event(AMPLIFIED, ROUNDS)
    config = getattr(jp_accountants, config_cls)()
    theirs = _their_amplified_epsilon(dp.strategy, AMPLIFIED, AMPLIFIED_BATCH, config)
    _assert_same_epsilon(_epsilon_in(config, event, DELTA), theirs, config_cls)


# ----------------------------------------------------------------------------- mutants
def _fails(check, *args, **kwargs) -> bool:
    try:
        check(*args, **kwargs)
    except AssertionError:
        return True
    return False


def test_the_comparisons_catch_broken_fedpriv_quantities(monkeypatch):
    """Each comparison above, fed a deliberately broken fedpriv quantity against jax_privacy's
    unbroken one, fails (and passes on the unbroken quantity): the tolerances are tight enough
    to see a 1e-6 perturbation of one coefficient."""
    n, bands, sep = 64, 8, 8
    bsr = M.banded_strategy(bands)
    theirs = _their_toeplitz_sensitivity(bsr.coeffs, n, sep)
    assert not _fails(_assert_same_sensitivity, bsr.sensitivity(n, sep), theirs, n)
    # 1. the sensitivity at a wrong min-separation (9 for the sampler's 8)
    assert _fails(_assert_same_sensitivity, bsr.sensitivity(n, sep + 1), theirs, n)
    # 2. one band perturbed by 1e-6 (relative): sensitivity and noise covariance
    bent = M.BandedStrategy(bsr.coeffs[:3] + (bsr.coeffs[3] * (1 + 1e-6),) + bsr.coeffs[4:])
    assert _fails(_assert_same_sensitivity, bent.sensitivity(n, sep), theirs, n)
    std, m = 1.7, 48
    _, cinv = _their_noising_matrix(bsr, m)
    assert not _fails(_assert_same_noise_covariance, oracles.noise_covariance(bsr, m, std), cinv, std, m)
    assert _fails(_assert_same_noise_covariance, oracles.noise_covariance(bent, m, std), cinv, std, m)
    # 3. the transposed covariance C^{-T} C^{-1} (the order of the factors swapped)
    ours_inv = np.linalg.inv(bsr.matrix(m))
    assert _fails(_assert_same_noise_covariance, std ** 2 * ours_inv.T @ ours_inv, cinv, std, m)
    # 4. a BLT weight perturbed by 1e-6: single-participation sensitivity and the Alg. 4 bound
    blt = M.blt_strategy(n, 4)
    bent_blt = M.BLTStrategy((blt.theta[0] * (1 + 1e-6),) + blt.theta[1:], blt.omega)
    single = float(np.sqrt(BT.sensitivity_squared(_to_jax_privacy_blt(blt), n)))
    assert _fails(_assert_same_sensitivity, bent_blt.sensitivity(n, 1, 1), single, n)
    bound = S.get_min_sep_sensitivity_upper_bound(jnp.asarray(blt.matrix(n)), sep)
    assert not _fails(_assert_same_sensitivity, blt.sensitivity(n, sep), bound, n)
    assert _fails(_assert_same_sensitivity, bent_blt.sensitivity(n, sep), bound, n)
    # 5. the privatizer streams a perturbed band (1e-3 of c_1) while the accounting uses BSR
    k = 32
    bent_stream = M.BandedStrategy((1.0, bsr.coeffs[1] * (1 + 1e-3)) + bsr.coeffs[2:])
    assert _fails(_assert_same_stream, *_streams(bent_stream, bsr, k), _width(bsr))
    # 6. the mechanism's epsilon under jax_privacy's unit-column-norm convention (fedpriv's BSR
    # column norm forgotten: z instead of z / ||C[:, 0]||)
    config = jp_accountants.RdpAccountantConfig()
    dp = _mechanism("banded", AMPLIFIED)
    theirs_eps = _their_amplified_epsilon(dp.strategy, AMPLIFIED, AMPLIFIED_BATCH, config)
    unit = accounting.poisson_sampled_event(dpa.GaussianDpEvent(Z), AMPLIFIED.sampling_rate,
                                            AMPLIFIED.max_participations(ROUNDS))
    assert _fails(_assert_same_epsilon, _epsilon_in(config, unit, DELTA), theirs_eps)
    # 7. one participation too few (an off-by-one in fedpriv's participation count): the banded
    # and BLT sensitivities and the mechanism's epsilon all fail
    dps = {kind: _mechanism(kind, CYCLIC) for kind in ("banded", "blt")}
    their_eps = {kind: _their_single_release_epsilon(d.strategy, CYCLIC, config)
                 for kind, d in dps.items()}
    good = M.max_participations
    monkeypatch.setattr(M, "max_participations",
                        lambda r, s, cap=None: max(good(r, s, cap) - 1, 1))
    assert _fails(_assert_same_sensitivity, bsr.sensitivity(n, sep), theirs, n)
    assert _fails(_assert_same_sensitivity, blt.sensitivity(n, sep), bound, n)
    for kind, d in dps.items():
        event = d.privacy_event(CYCLIC, ROUNDS)
        assert _fails(_assert_same_epsilon, _epsilon_in(config, event, DELTA), their_eps[kind])
    monkeypatch.undo()
    for kind, d in dps.items():
        assert not _fails(_assert_same_epsilon,
                          _epsilon_in(config, d.privacy_event(CYCLIC, ROUNDS), DELTA),
                          their_eps[kind])
