"""The paper-noise protocol (fedpriv.dp.population): a declared population's epsilon beside the
epsilon spent on our users; with the paper's own population the two coincide."""
import pytest

from fedpriv.data.errors import ConfigError
from fedpriv.dp import accounting
from fedpriv.dp.population import PAPER_POPULATIONS, SimulatedPopulation, paper_noise
from fedpriv.fl import algorithms as algs
from fedpriv.fl.samplers import ShuffledPassSampler

WANG = PAPER_POPULATIONS["wang_stackoverflow"]


@pytest.mark.parametrize("z,eps", WANG.paper_epsilons)
def test_wang_population_gives_the_papers_epsilons(z, eps):
    """Wang et al. state eps 1.77 at z 8.83 and 18.71 at z 1.13 (delta 1e-6, 1600 rounds, 100 of
    342K users per round, one pass): the paper prints 3-4 significant digits, so agreement is
    to half a unit of its last printed digit (plus RDP's order grid, far below that)."""
    assert WANG.epsilon(z) == pytest.approx(eps, abs=0.005)


def test_with_the_papers_population_simulated_and_executed_coincide():
    """A run on the real 342,477 users (engine's sampler + event) spends what the declaration
    claims: same_population and equal epsilons; on a 1,053-user corpus it spends far more."""
    z, T = 8.83, 1600
    dp_of = lambda s: algs.DPConfig(0.3, z, "tree", s.rounds_per_epoch)  # noqa: E731
    real = ShuffledPassSampler(WANG.users, WANG.cohort, seed=0)
    ev = algs.privacy_event(dp_of(real), real, T)
    pn = paper_noise(WANG, z, T, ev, "stackoverflow", WANG.users, 1e-6)
    assert pn.same_population and pn.epsilon_executed == pytest.approx(pn.epsilon_simulated, rel=1e-9)
    small = ShuffledPassSampler(1053, 100, seed=0)
    pn2 = paper_noise(WANG, z, T, algs.privacy_event(dp_of(small), small, T), "chitchat", 1053, 1e-6)
    assert not pn2.same_population
    assert pn2.epsilon_simulated == pytest.approx(pn.epsilon_simulated, rel=1e-12)
    assert pn2.epsilon_executed > 10 * pn2.epsilon_simulated       # ~18.15 vs 1.77
    line = pn2.line()
    assert "SIMULATED" in line and "342,477 users" in line and "SPENT on chitchat (1,053" in line


def test_calibration_round_trip():
    z = WANG.noise_multiplier(1.77)
    assert WANG.epsilon(z) <= 1.77 * (1 + 1e-6)
    assert WANG.epsilon(z * 0.99) > 1.77                       # the smallest such z (1 %)


def test_participation_and_passes():
    once = SimulatedPopulation("x", 1000, 100, "once", 25, "tree", "dp_ftrl", "test")
    assert once.rounds_per_epoch == 10 and "3 passes" in once.describe()
    assert once.event(2.0) == accounting.dp_ftrl_event(2.0, 25, 10)
    pois = SimulatedPopulation("y", 1000, 100, "poisson", 25, "gaussian", "dp_fedavg", "test")
    assert pois.event(2.0) == accounting.dp_fedavg_poisson_event(2.0, 0.1, 25)
    # more users at the same noise and cohort: never more epsilon (amplification)
    big = SimulatedPopulation("z", 10_000, 100, "once", 25, "tree", "dp_ftrl", "test")
    assert big.epsilon(2.0) < once.epsilon(2.0)


@pytest.mark.parametrize("kw,match", [
    (dict(users=10, cohort=100), "cohort"),
    (dict(participation="sometimes"), "participation"),
    (dict(mechanism="laplace"), "mechanism"),
])
def test_bad_population_is_refused(kw, match):
    base = dict(name="x", users=1000, cohort=100, participation="once", rounds=10,
                mechanism="tree", algorithm="dp_ftrl", source="test")
    with pytest.raises(ConfigError, match=match):
        SimulatedPopulation(**{**base, **kw})


def test_protocol_accepts_the_populations_noise_cohort_only():
    """The per-round noise on the average is the population's z C / m either with its cohort m,
    or with a smaller cohort trained at the noise of m; any other combination is refused."""
    from fedpriv.dp.population import check_protocol
    ok = dict(algorithm="dp_ftrl")
    check_protocol(WANG, cohort_size=100, noise_cohort_size=None, **ok)
    check_protocol(WANG, cohort_size=16, noise_cohort_size=100, **ok)
    for cohort, noise, match in ((16, None, "cohort_size=100"), (16, 200, "two simulations"),
                                 (100, 50, "two simulations"), (120, 100, "exceeds")):
        with pytest.raises(ConfigError, match=match):
            check_protocol(WANG, cohort_size=cohort, noise_cohort_size=noise, **ok)
    with pytest.raises(ConfigError, match="not dp_fedavg"):
        check_protocol(WANG, cohort_size=16, noise_cohort_size=100, algorithm="dp_fedavg")
