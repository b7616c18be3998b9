"""The paper-noise protocol (fedpriv.dp.population): a declared population's epsilon beside the
epsilon spent on our users; with the paper's own population the two coincide. A declared
population of several passes, and a noise-cohort simulation over several passes, are charged
per pass (issue 54)."""
import math

import pytest

from fedpriv.data.errors import ConfigError
from fedpriv.dp import accounting
from fedpriv.dp.population import PAPER_POPULATIONS, SimulatedPopulation, paper_noise
from fedpriv.fl import algorithms as algs
from fedpriv.fl.samplers import ShuffledPassSampler
from tests.oracles import gaussian_epsilon, per_pass_event, rdp_epsilon

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
    dp_of = lambda s: algs.DPConfig(0.3, z, "tree", s.rounds_per_epoch)
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


# ------------------------------------------------------------------ issue 54: charged per pass
@pytest.mark.parametrize("rounds", [10, 11, 25, 30])  # 10 rounds a pass: 1, 2, 3, 3 passes
def test_a_multi_pass_declared_population_is_charged_per_pass(rounds):
    """Each user of a declared single-participation population is in one round of every pass:
    a run of several passes releases one tree (DP-FTRL) or one Gaussian (fresh noise) per pass
    about them, never one release for the whole run. Trees: ``dp_accounting``'s RDP of the
    passes written out one by one; Gaussians: the exact epsilon of ``k`` composed Gaussians,
    one Gaussian of multiplier ``z / sqrt(k)`` (Balle & Wang 2018), which PLD ("best") meets
    from above within its discretisation."""
    z, delta = 2.0, 1e-6
    tree = SimulatedPopulation("x", 1000, 100, "once", 30, "tree", "dp_ftrl", "test")
    want = rdp_epsilon([per_pass_event(z, rounds, 10, "tree")], delta)
    assert tree.epsilon(z, delta, rounds) == pytest.approx(want, rel=1e-9)
    gauss = SimulatedPopulation("y", 1000, 100, "once", 30, "gaussian", "dp_fedavg", "test")
    passes = -(-rounds // 10)
    exact = gaussian_epsilon(z / math.sqrt(passes), delta)
    got = gauss.epsilon(z, delta, rounds)
    assert exact * (1 - 1e-6) <= got <= exact * (1 + 1e-3), (passes, got, exact)
    if passes > 1:  # a second pass costs: more than one pass's epsilon
        assert got > 1.2 * gaussian_epsilon(z, delta)


@pytest.mark.parametrize("mechanism", ["tree", "gaussian"])
def test_a_noise_cohort_simulation_over_several_passes_is_charged_per_pass(mechanism):
    """A shuffled-pass run that trains ``m`` clients per round at the noise of ``M``
    (``noise_cohort_size``): the simulated event (multiplier z) and the executed one (z m / M)
    both release once per pass, for every pass of the run (here 2 passes of 6 rounds + 3)."""
    z, delta, rounds = 3.0, 1e-6, 15
    s = ShuffledPassSampler(30, 5, seed=0)  # 6 rounds a pass
    dp = algs.DPConfig(0.5, z, mechanism, s.rounds_per_epoch if mechanism == "tree" else 1,
                       noise_cohort_size=20)
    for simulated, mult in ((True, z), (False, z * 5 / 20)):
        ev = algs.privacy_event(dp, s, rounds, simulated=simulated)
        want = rdp_epsilon([per_pass_event(mult, rounds, s.rounds_per_epoch, mechanism)], delta)
        assert accounting.compute_epsilon(ev, delta, accountant="rdp")[0] == pytest.approx(want, rel=1e-9)
