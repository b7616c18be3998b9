"""The engine's privacy events pinned to raw ``dp_accounting`` (issue 16, items 1 and 6).

Every (sampler x algorithm x adaptive clipping) combination: ``privacy_event`` + the
sampler's ``neighboring`` must give the epsilon that raw ``dp_accounting`` gives for the
mechanism that runs, written out by hand here. Adaptive clipping's count and sum are computed
on one sampled cohort: one subsampled mechanism on the pair, whose multiplier is
``z_eff = (z^-2 + (2 sigma_b)^-2)^-1/2`` (their joint L2 sensitivity over the noise).
"""

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import logging as absl_logging
from dp_accounting import pld, rdp

from fedpriv.dp import accounting as acc
from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.fl.algorithms import DPConfig, neighboring_for, privacy_event
from fedpriv.fl.samplers import PoissonSampler, ShuffledPassSampler, UniformSampler

absl_logging.set_verbosity(absl_logging.ERROR)
Rel = dpa.NeighboringRelation


def _raw_rdp(event, delta, rel):
    a = rdp.RdpAccountant(neighboring_relation=rel)
    a.compose(event)
    return a.get_epsilon(delta)


def _raw_pld(event, delta):
    a = pld.PLDAccountant(Rel.ADD_OR_REMOVE_ONE)
    a.compose(event)
    return a.get_epsilon(delta)


def _z_eff(*zs):
    return sum(float(z) ** -2 for z in zs) ** -0.5


def _engine_eps(dp, sampler, rounds, delta, accountant="best"):
    return acc.compute_epsilon(privacy_event(dp, sampler, rounds), delta, neighboring_for(sampler),
                               accountant)[0]


# ------------------------------------------------------------------ item 1: the issue's numbers
@pytest.mark.parametrize("z, sigma_b, q, rounds, issue_eps", [
    (1.0, 0.5, 0.1, 50, 10.48),
    (0.8, 1.0, 0.05, 500, 14.29),
])
def test_adaptive_poisson_is_one_subsampled_event_on_sum_and_count(z, sigma_b, q, rounds, issue_eps):
    dp = DPConfig(1.0, z, adaptive=AdaptiveClipping(count_stddev=sigma_b))
    s = PoissonSampler(1000, q)
    ev = privacy_event(dp, s, rounds)
    assert ev == dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.ComposedDpEvent(
        [dpa.GaussianDpEvent(z), dpa.GaussianDpEvent(2 * sigma_b)])), rounds)
    raw = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(_z_eff(z, 2 * sigma_b))),
                                  rounds)
    expected = min(_raw_pld(raw, 1e-5), _raw_rdp(raw, 1e-5, Rel.ADD_OR_REMOVE_ONE))
    got = _engine_eps(dp, s, rounds, 1e-5)
    assert got == pytest.approx(expected, rel=1e-9)
    assert got == pytest.approx(issue_eps, abs=0.01)  # the audit's figure, from raw dp_accounting


def test_adaptive_fixed_size_cohorts_are_one_wor_event_at_replace_one_multipliers():
    dp = DPConfig(1.0, 1.0, adaptive=AdaptiveClipping(count_stddev=0.5))
    s = UniformSampler(1000, 100)
    assert neighboring_for(s) == "replace_one"
    # replace-one: the sum moves by 2C (multiplier z/2), the centred count by 1 (sigma_b / 1)
    raw = dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(
        1000, 100, dpa.ComposedDpEvent([dpa.GaussianDpEvent(0.5), dpa.GaussianDpEvent(0.5)])), 50)
    got = _engine_eps(dp, s, 50, 1e-5)
    assert got == pytest.approx(_raw_rdp(raw, 1e-5, Rel.REPLACE_ONE), rel=1e-9)
    assert got == pytest.approx(215.4, abs=0.1)


def test_integer_multipliers_are_not_miscounted():
    """dp_accounting 0.6 reduces ``Composed([Gaussian(1), Gaussian(1)])`` under a sampled event
    to ``Gaussian(1)`` when the multipliers are ints; ours must give Gaussian(1/sqrt 2)."""
    ints = dpa.PoissonSampledDpEvent(0.1, dpa.ComposedDpEvent([dpa.GaussianDpEvent(1), dpa.GaussianDpEvent(1)]))
    floats = dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(2 ** -0.5))
    for accountant in ("rdp", "best"):
        assert acc.compute_epsilon(dpa.SelfComposedDpEvent(ints, 20), 1e-5, accountant=accountant)[0] == \
            pytest.approx(acc.compute_epsilon(dpa.SelfComposedDpEvent(floats, 20), 1e-5,
                                              accountant=accountant)[0], rel=1e-9)


# ------------------------------------------------------------------ sampler x algorithm x adaptive
N, M, T, DELTA = 200, 20, 25, 1e-5   # shuffled passes: 10 rounds per epoch -> trees [10, 10, 5]
Z, SB = 1.5, 2.0                     # count multiplier 2 sigma_b = 4


def _raw_expected(sampler_kind, mechanism, adaptive):
    """The epsilon of the mechanism that runs, from raw dp_accounting (written out by hand)."""
    zs = [Z] + ([2 * SB] if adaptive else [])
    if sampler_kind == "poisson":
        ev = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(M / N, dpa.GaussianDpEvent(_z_eff(*zs))), T)
        return min(_raw_pld(ev, DELTA), _raw_rdp(ev, DELTA, Rel.ADD_OR_REMOVE_ONE))
    if sampler_kind == "uniform":
        ev = dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(
            N, M, dpa.GaussianDpEvent(_z_eff(*zs) / 2)), T)
        return _raw_rdp(ev, DELTA, Rel.REPLACE_ONE)
    epochs = [10, 10, 5]
    if mechanism == "tree":
        evs = [dpa.SingleEpochTreeAggregationDpEvent(Z, n) for n in epochs]
        if adaptive:
            evs += [dpa.GaussianDpEvent(2 * SB)] * len(epochs)  # one count per client per epoch
        return _raw_rdp(dpa.ComposedDpEvent(evs), DELTA, Rel.REPLACE_SPECIAL)
    ev = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(_z_eff(*zs)), len(epochs))
    return min(_raw_pld(ev, DELTA), _raw_rdp(ev, DELTA, Rel.REPLACE_SPECIAL))


SAMPLERS = {"poisson": lambda: PoissonSampler(N, M / N), "uniform": lambda: UniformSampler(N, M),
            "shuffled": lambda: ShuffledPassSampler(N, M)}


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("mechanism", ["gaussian", "tree"])
@pytest.mark.parametrize("sampler_kind", ["poisson", "uniform", "shuffled"])
def test_engine_epsilon_equals_raw_dp_accounting(sampler_kind, mechanism, adaptive):
    s = SAMPLERS[sampler_kind]()
    dp = DPConfig(1.0, Z, mechanism, 10 if mechanism == "tree" else 1,
                  adaptive=AdaptiveClipping(count_stddev=SB) if adaptive else None)
    if mechanism == "tree" and sampler_kind != "shuffled":
        with pytest.raises(ValueError, match="at most once per tree"):
            privacy_event(dp, s, T)
        return
    assert _engine_eps(dp, s, T, DELTA) == pytest.approx(_raw_expected(sampler_kind, mechanism, adaptive),
                                                         rel=1e-9)


@pytest.mark.parametrize("mechanism,sampler_kind", [("gaussian", "poisson"), ("gaussian", "uniform"),
                                                    ("gaussian", "shuffled"), ("tree", "shuffled")])
def test_the_executed_run_is_charged_the_noise_it_adds(mechanism, sampler_kind):
    """Issue 54 (a survivor of benchmarks/mutants/dp.toml: the executed run charged the simulated
    multiplier). With ``noise_cohort_size`` (a simulation of a larger noise cohort, McMahan et al.
    2018) the engine adds noise at ``z s``, ``s = m / noise_cohort_size`` (tests/fl/test_engine.py
    measures it): the executed run's event (``simulated=False``, what ``spent_executed`` reports)
    has the epsilon of the same mechanism at ``z s`` without simulation, above the simulated
    run's (the event at ``z``)."""
    s = SAMPLERS[sampler_kind]()
    r = 10 if mechanism == "tree" else 1
    sim = DPConfig(1.0, Z, mechanism, r, noise_cohort_size=2 * M)
    scale = s.expected_cohort_size / (2 * M)
    executed = _engine_eps(DPConfig(1.0, Z * scale, mechanism, r), s, T, DELTA)
    simulated = _engine_eps(DPConfig(1.0, Z, mechanism, r), s, T, DELTA)
    got = {flag: acc.compute_epsilon(privacy_event(sim, s, T, simulated=flag), DELTA,
                                     neighboring_for(s))[0] for flag in (False, True)}
    assert got[False] == pytest.approx(executed, rel=1e-9) and got[True] == pytest.approx(simulated, rel=1e-9)
    assert got[False] > 1.3 * got[True]


def test_noise_free_count_and_unknown_samplers_fail_closed():
    s = PoissonSampler(100, 0.1)
    assert privacy_event(DPConfig(1.0, 1.0, adaptive=AdaptiveClipping(count_stddev=0.0)), s, 5) == \
        dpa.NonPrivateDpEvent()

    class MySampler:
        expected_cohort_size = 10.0

        def sample(self, r):
            return np.arange(10)

    with pytest.raises(ValueError, match="no privacy accounting for sampler MySampler"):
        privacy_event(DPConfig(1.0, 1.0), MySampler(), 5)
    with pytest.raises(ValueError, match="no neighbouring relation for sampler MySampler"):
        neighboring_for(MySampler())
    assert [neighboring_for(f()) for f in SAMPLERS.values()] == ["add_remove", "replace_one", "add_remove"]


def test_tree_restart_must_equal_the_epoch():
    """A shuffled pass (a client once per epoch) and a cyclic sampler (once per min-separation
    cycle) both account a tree only when it restarts with their period; the accepted events are
    the restarted-tree event, composed with the fresh releases of each participation."""
    from fedpriv.fl.samplers import CyclicSampler
    for s, period, k in ((ShuffledPassSampler(200, 20), 10, 3), (CyclicSampler(200, 20), 10, 3)):
        for restart in (period // 2, 2 * period):
            with pytest.raises(ValueError, match="a client could appear twice in one tree"):
                privacy_event(DPConfig(1.0, 1.0, "tree", restart), s, 25)
        ev = privacy_event(DPConfig(1.0, 1.0, "tree", period), s, 25)
        assert ev == acc.dp_ftrl_event(1.0, 25, period)
        fresh = s.amplified_event(dpa.GaussianDpEvent(2.0), 25)
        assert fresh == dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), k)  # 25 rounds: 3 periods


def test_sampler_amplifies_any_per_round_event():
    inner = dpa.ComposedDpEvent([dpa.GaussianDpEvent(2.0), dpa.GaussianDpEvent(3.0)])
    assert PoissonSampler(100, 0.07).amplified_event(inner, 9) == \
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.07, inner), 9)
    assert UniformSampler(100, 7).amplified_event(inner, 9) == dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(100, 7, dpa.ComposedDpEvent(
            [dpa.GaussianDpEvent(1.0), dpa.GaussianDpEvent(1.5)])), 9)
    assert ShuffledPassSampler(100, 10).amplified_event(inner, 25) == dpa.SelfComposedDpEvent(inner, 3)
    with pytest.raises(ValueError, match="replace-one"):
        UniformSampler(100, 7).amplified_event(dpa.LaplaceDpEvent(1.0), 3)


# ------------------------------------------------------------------ the count really is noised at sigma_b
def test_adaptive_count_noise_std_is_sigma_b():
    sigma_b, m = 3.0, 40
    ac = AdaptiveClipping(initial_clip=1.0, count_stddev=sigma_b, learning_rate=0.0)
    state = ac.init(jax.random.key(7))
    norms = jnp.asarray(np.linspace(0.1, 2.0, m), jnp.float32)  # 19 of 40 below C = 1
    mask = jnp.ones(m)
    count = float(np.sum((np.asarray(norms) <= 1.0) - 0.5))
    upd = jax.jit(lambda st, t: ac.update(st, norms, mask, float(m), t)[1])
    noise = np.array([(float(upd(state, t)) - 0.5) * m - count for t in range(3000)])
    assert abs(noise.std() / sigma_b - 1) < 0.05, noise.std()
    assert abs(noise.mean()) < 0.2
