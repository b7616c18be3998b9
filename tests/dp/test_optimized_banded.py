"""The optimised banded mechanism ("banded_opt", ``fedpriv/dp/optimized_banded.py``): a new
mechanism added in one library file (issue 25's acceptance), checked like the built-in ones.

* its coefficients are jax_privacy's optimum: lower prefix-sum error at unit sensitivity than
  the banded square root "banded" uses, at the same bands (the point of optimising);
* its accounting: ``privacy_event`` under a ``CyclicSampler`` is ``Gaussian(z / sens)`` with
  ``sens`` jax_privacy's own b-min-separation sensitivity of the same coefficients (McMahan et
  al. 2024, Thm. 2), participations counted as the sampler allows; amplified under an
  ``AmplifiedCyclicSampler`` as banded MF is; a min-separation below ``bands`` is refused;
* its noise: the privatizer streams exactly ``C^{-1} Z`` of those coefficients (jax_privacy's
  ``inverse_as_streaming_matrix`` on the same ``Z``), and it is under the privatizer contract
  (``tests/dp/test_privatizer_contract.py``, case "banded_opt");
* reachable by name from the configs (``algorithm=dp_mf_banded_opt``) and charged by the plans;
* broken versions are caught: noise from other coefficients than the accounted ones, and an
  accounting at another sensitivity.

Numerics: sensitivities in float64 (sums of <= n^2 O(1) terms: rtol 1e-9); the streamed noise
in float32 (recursion of ``bands`` terms over n steps: atol 1e-4 on O(1) values).
"""
from __future__ import annotations

import math

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.dp import matrix as M
from fedpriv.dp.accounting import compute_epsilon
from fedpriv.dp.matrix import MinSeparationError
from fedpriv.dp.mechanisms import MatrixDPConfig, get_mechanism, mechanism_names
from fedpriv.dp.optimized_banded import OptimizedBandedMechanism, optimized_banded_strategy
from fedpriv.fl.samplers import AmplifiedCyclicSampler, CyclicSampler, amplified_banded_event

T = pytest.importorskip("jax_privacy.matrix_factorization.toeplitz")

N, BANDS, CLIENTS, COHORT = 32, 4, 40, 5      # 8 groups: min-separation 8 >= bands
DELTA = 1e-6


def _mech(bands=BANDS, sep=8, rounds=N, z=1.7) -> OptimizedBandedMechanism:
    return MatrixDPConfig(clip_norm=1.0, noise_multiplier=z, mechanism="banded_opt", bands=bands,
                          min_separation=sep, mf_rounds=rounds)


def _their_sens(coeffs, sep, k, n=N) -> float:
    with jax.enable_x64(True):
        return math.sqrt(float(T.minsep_sensitivity_squared(jnp.asarray(coeffs, jnp.float64), sep, k, n=n)))


def test_registered_and_built_by_name():
    assert "banded_opt" in mechanism_names() and get_mechanism("banded_opt") is OptimizedBandedMechanism
    m = _mech()
    assert type(m) is OptimizedBandedMechanism and isinstance(m, MatrixDPConfig) and m.banded
    assert MatrixDPConfig(1.0, 1.0, mechanism="banded_opt", bands=2, min_separation=2,
                          mf_rounds=8).__class__ is OptimizedBandedMechanism
    with pytest.raises(ValueError, match="min_separation >= 4"):
        _mech(sep=3)
    with pytest.raises(ValueError, match="mf_rounds"):
        _mech(rounds=0)


def test_coefficients_beat_the_banded_square_root():
    """Mean squared prefix-sum error at unit sensitivity (b = bands min-separation, the worst
    pattern): the optimum is below the BSR's, and both strategies are b-banded with c_0 > 0."""
    opt, bsr = optimized_banded_strategy(BANDS, N), M.banded_strategy(BANDS)
    assert opt.bands == bsr.bands == BANDS and opt.coeffs[0] > 0
    assert np.linalg.norm(opt.coeffs) == pytest.approx(1.0, rel=1e-9)   # jax_privacy's normalisation

    def err(s):
        return M.prefix_noise_variance(s, N).mean() * s.sensitivity(N, BANDS) ** 2
    assert err(opt) < 0.99 * err(bsr)
    assert optimized_banded_strategy(BANDS, N) is opt      # cached: engine and accounting share it


def test_event_is_a_gaussian_at_jax_privacys_sensitivity():
    m, s = _mech(), CyclicSampler(CLIENTS, COHORT, seed=0)
    assert s.min_separation == 8
    for rounds in (N, 20):
        k = s.max_participations(rounds)
        sens = _their_sens(m.strategy.coeffs, 8, k, n=rounds)
        ev = m.privacy_event(s, rounds)
        assert isinstance(ev, dpa.GaussianDpEvent)
        assert ev.noise_multiplier == pytest.approx(m.noise_multiplier / sens, rel=1e-9)
    # a sampler that cannot guarantee the min-separation is refused (fails closed)
    with pytest.raises(MinSeparationError):
        _mech(bands=8, sep=8).privacy_event(CyclicSampler(CLIENTS, 8, seed=0), N)  # 5 groups < 8


def test_amplified_as_banded_mf():
    s = AmplifiedCyclicSampler(CLIENTS, 8, 0.6, seed=0)
    m = _mech(sep=s.min_separation)
    ev = m.privacy_event(s, N)
    want = amplified_banded_event(m.strategy, m.noise_multiplier, N, s.min_separation, s.sampling_rate)
    assert ev == want
    cyclic = m.privacy_event(CyclicSampler(CLIENTS, COHORT, seed=0), N)
    assert compute_epsilon(ev, DELTA)[0] < compute_epsilon(cyclic, DELTA)[0]


def _stream(tx, z):
    """Releases of ``tx`` on zero input ``[N, d]``."""
    state = tx.init(jnp.zeros((z.shape[1],), jnp.float32))
    out = []
    for _ in range(z.shape[0]):
        w, state = tx.update(jnp.zeros((z.shape[1],), jnp.float32), state)
        out.append(np.asarray(w))
    return np.stack(out)


def _their_noise(coeffs, std, key, d):
    """``C^{-1} Z`` by jax_privacy's streaming ``C^{-1}`` of ``coeffs``, on fedpriv's ``Z_t``
    (``N(0, std^2)`` from ``fold_in(key, t)``, one ``split`` per leaf: ``matrix.py``), ``[N, d]``."""
    cinv = T.inverse_as_streaming_matrix(jnp.asarray(coeffs, jnp.float32))
    state, out = cinv.init_multiply(jnp.zeros((d,))), []
    for t in range(N):
        z = std * jax.random.normal(jax.random.split(jax.random.fold_in(key, t), 1)[0], (d,), jnp.float32)
        w, state = cinv.multiply_next(z, state)
        out.append(np.asarray(w, np.float64))
    return np.stack(out)


def test_noise_is_c_inverse_z_of_the_accounted_coefficients():
    m, std, key, d = _mech(), 0.9, jax.random.key(3), 6
    ours = _stream(m.privatizer(std, key), np.zeros((N, d)))
    np.testing.assert_allclose(ours, _their_noise(m.strategy.coeffs, std, key, d), atol=1e-4)


def test_broken_versions_are_caught():
    """(a) noise from the BSR coefficients while accounting the optimised ones, (b) accounting
    at the single-participation sensitivity: each fails the checks above."""
    m, std, key, d = _mech(), 0.9, jax.random.key(3), 6
    bsr_noise = _stream(M.banded_privatizer(std, key, M.banded_strategy(BANDS)), np.zeros((N, d)))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(bsr_noise, _their_noise(m.strategy.coeffs, std, key, d), atol=1e-4)
    s = CyclicSampler(CLIENTS, COHORT, seed=0)
    single = _their_sens(m.strategy.coeffs, 8, 1)
    assert m.privacy_event(s, N).noise_multiplier != pytest.approx(m.noise_multiplier / single, rel=1e-3)


def test_reachable_from_the_configs_and_plans():
    from experiments import common
    from fedpriv.recipes import plans
    cfg = common.load_config("configs/lm_fl.py:smoke,algorithm=dp_mf_banded_opt,target_epsilon=30,"
                             "noise_multiplier=None")
    run = plans.lm_fl_plan(cfg).runs[0]
    ev = run.charges[-1].event
    assert isinstance(ev, dpa.GaussianDpEvent) and compute_epsilon(ev, cfg.delta)[0] <= 30 * (1 + 1e-6)
