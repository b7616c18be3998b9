"""The paper-noise protocol: a declared simulated population beside the users a run spends on.

The papers train on large populations (Wang et al. 2023: TFF StackOverflow, 342,477 training
users, 100 per round, each user in at most one round of a 1,600-round single-epoch DP-FTRL
tree: z = 8.83 gives epsilon 1.77 at delta 1e-6, App. C / §2). On a packaged corpus of ~1K
users, the same epsilon needs a far larger noise (z ~ 67.5 on chitchat), so a reproduction
runs the paper's *per-round* noise on the averaged update instead -- the noise std
``z * C / m`` with the paper's ``z`` and cohort ``m`` -- and reports two epsilons side by side
(docs/privacy.md, "The paper-noise protocol"):

* ``epsilon_simulated``: the epsilon of the paper's population under the paper's participation
  at that noise, for the rounds the run executes -- a *declared simulation*, always printed
  with the population it assumes (:meth:`SimulatedPopulation.describe`);
* ``epsilon_executed``: the epsilon actually spent on our users -- what the run's ledger
  charges (its own event, built by the engine from the sampler and mechanism that ran).

With the papers' own data (e.g. ``corpus=stackoverflow``, all 342,477 users) the two coincide:
the run *is* the paper's population. A config never labels an epsilon it does not spend: the
simulated one is named as such, the executed one is the budget.

:class:`SimulatedPopulation` is one frozen record; :data:`PAPER_POPULATIONS` holds the papers'
(keyed by name, as configs refer to them); :func:`paper_noise` computes the side-by-side pair
(:class:`PaperNoise`) that every DP output (summary.json / .md, privacy plans, docs/fidelity.md)
states. Accounting goes through :mod:`fedpriv.dp.accounting` (the builders the engine uses).
"""
from __future__ import annotations

import dataclasses
import math

import dp_accounting as dpa

from fedpriv.data.errors import ConfigError
from fedpriv.dp import accounting

__all__ = ["SimulatedPopulation", "PaperNoise", "PAPER_POPULATIONS", "PARTICIPATIONS",
           "get_population", "paper_noise", "check_protocol"]

# "once": shuffled single pass, each user in at most one round per epoch (DP-FTRL's tree; a
# run longer than users / cohort rounds starts another epoch, as ShuffledPassSampler);
# "poisson": each user in each round independently with probability cohort / users.
PARTICIPATIONS = ("once", "poisson")
MECHANISMS = ("tree", "gaussian")


@dataclasses.dataclass(frozen=True)
class SimulatedPopulation:
    """A paper's population and participation, declared (never inferred from our data).

    Attributes:
      name: the population as the paper names it, e.g. "TFF StackOverflow (train)".
      users: its training users, e.g. 342,477.
      cohort: users per round m (the noise std on the *average* is ``z * C / m``).
      participation: "once" (shuffled passes, each user at most once per epoch) or "poisson".
      rounds: the paper's rounds T (the claim is computed for the rounds a run executes; a run
        of fewer rounds says so).
      mechanism: "tree" (DP-FTRL, one tree per epoch) or "gaussian" (fresh noise per round).
      algorithm: the ``configs/lm_fl.py`` algorithm this mechanism is (``dp_ftrl`` /
        ``dp_fedavg``), checked by :func:`check_protocol`.
      source: where the numbers come from (paper, section).
      paper_epsilons: ``{z: epsilon}`` the paper states (delta ``delta``), tested against the
        accounting (tests/dp/test_population.py), never used as a result.
    """
    name: str
    users: int
    cohort: int
    participation: str
    rounds: int
    mechanism: str
    algorithm: str
    source: str
    delta: float = 1e-6
    paper_epsilons: tuple = ()

    def __post_init__(self):
        if self.participation not in PARTICIPATIONS:
            raise ConfigError(f"participation must be one of {PARTICIPATIONS}, got {self.participation!r}")
        if self.mechanism not in MECHANISMS:
            raise ConfigError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if not (isinstance(self.users, int) and isinstance(self.cohort, int)
                and 1 <= self.cohort <= self.users):
            raise ConfigError(f"need integers 1 <= cohort ({self.cohort}) <= users ({self.users})")
        accounting.check_rounds(self.rounds)

    @property
    def rounds_per_epoch(self) -> int:
        """Rounds in one pass over the population (each user once): ``users // cohort``."""
        return self.users // self.cohort

    def describe(self, rounds: int | None = None) -> str:
        """One line naming the population it assumes, e.g. ``"TFF StackOverflow (train), 342,477
        users, cohort 100, each user at most once (single pass), 1,600 rounds (DP-FTRL tree)"``."""
        rounds = self.rounds if rounds is None else rounds
        if self.participation == "once":
            epochs = math.ceil(rounds / self.rounds_per_epoch)
            part = ("each user at most once (single pass)" if epochs == 1 else
                    f"each user at most once per pass ({epochs} passes)")
        else:
            part = f"Poisson sampling q = {self.cohort / self.users:.3g}"
        mech = "DP-FTRL tree" if self.mechanism == "tree" else "Gaussian per round"
        return (f"{self.name}, {self.users:,} users, cohort {self.cohort}, {part}, {rounds:,} rounds "
                f"({mech}; {self.source})")

    def event(self, noise_multiplier: float, rounds: int | None = None,
              count_noise: float | None = None) -> dpa.DpEvent:
        """The ``dp_accounting`` event of ``rounds`` (default: the paper's) rounds on this
        population at noise multiplier ``z`` (noise std on the cohort's sum / clip norm):
        ``dp_ftrl_event(z, T, users // cohort)`` for "once" + tree, one Gaussian per epoch for
        "once" + gaussian, ``T`` x ``PoissonSampled(m / N, Gaussian(z))`` for "poisson".
        ``count_noise``: the adaptive clip count's multiplier (``2 sigma_b``), released on the
        same cohort as the sum (docs/privacy.md): one more Gaussian per participation -- inside
        the sampled mechanism under Poisson, once per pass beside the tree or the per-epoch
        Gaussian under "once"."""
        rounds = accounting.check_rounds(self.rounds if rounds is None else rounds)
        z = float(accounting.check_noise_multiplier(noise_multiplier))
        count = None if count_noise is None else dpa.GaussianDpEvent(
            float(accounting.check_noise_multiplier(count_noise)))
        if self.participation == "poisson":
            if self.mechanism == "tree":
                raise ConfigError("a DP-FTRL tree under Poisson participation has no accounting here")
            if count is None:
                return accounting.dp_fedavg_poisson_event(z, self.cohort / self.users, rounds)
            return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(
                self.cohort / self.users, dpa.ComposedDpEvent([dpa.GaussianDpEvent(z), count])), rounds)
        epochs = len(accounting.epoch_lengths(rounds, self.rounds_per_epoch))
        base = (accounting.dp_ftrl_event(z, rounds, self.rounds_per_epoch) if self.mechanism == "tree"
                else dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), epochs))
        return base if count is None else dpa.ComposedDpEvent([base, dpa.SelfComposedDpEvent(count, epochs)])

    def epsilon(self, noise_multiplier: float, delta: float | None = None,
                rounds: int | None = None, count_noise: float | None = None) -> float:
        """Epsilon (add/remove one user) of :meth:`event` at ``delta`` (default: the paper's)."""
        return accounting.compute_epsilon(self.event(noise_multiplier, rounds, count_noise),
                                          self.delta if delta is None else delta)[0]

    def noise_multiplier(self, epsilon: float, delta: float | None = None,
                         rounds: int | None = None, count_noise: float | None = None) -> float:
        """The smallest z at which this population's epsilon is ``epsilon`` (e.g. Wang et al.'s
        8.83 for 1.77 over 1,600 rounds): the paper's noise for the paper's epsilon. With an
        adaptive clip count (``count_noise``) the sum's z is raised so that sum and count
        together meet ``epsilon`` (refused when the count alone exceeds it)."""
        delta = self.delta if delta is None else delta
        if count_noise is not None and self.epsilon(1e6, delta, rounds, count_noise) > epsilon:
            raise ConfigError(f"the adaptive clip count alone (multiplier {count_noise:g}) spends more than "
                              f"epsilon {epsilon:g} on {self.name}: raise clip_count_stddev")
        return accounting.calibrate_noise_multiplier(
            lambda z: self.event(z, rounds, count_noise), epsilon, delta, accountant="best")


@dataclasses.dataclass(frozen=True)
class PaperNoise:
    """The two epsilons of a run under the paper-noise protocol, side by side.

    ``epsilon_simulated``: of ``population`` (declared) at the run's z and rounds;
    ``epsilon_executed``: charged on ``our_users`` (the run's ledger); ``same_population``:
    the run's users are the paper's population (real data), so the two coincide."""
    population: str
    epsilon_simulated: float
    our_users: str
    epsilon_executed: float
    delta: float
    noise_multiplier: float
    rounds: int
    same_population: bool = False

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def line(self) -> str:
        """One line for summaries and plans."""
        if self.same_population:
            return (f"epsilon {self.epsilon_executed:.3g} (delta {self.delta:g}, user level) on "
                    f"{self.our_users}: the paper's population itself (z = {self.noise_multiplier:.4g})")
        return (f"epsilon {self.epsilon_simulated:.3g} SIMULATED for {self.population} | epsilon "
                f"{self.epsilon_executed:.3g} SPENT on {self.our_users} (the run executed on them; "
                f"z = {self.noise_multiplier:.4g}, delta {self.delta:g}, user level)")


PAPER_POPULATIONS: dict[str, SimulatedPopulation] = {
    # Wang et al. 2023 §2, App. B.1, App. C: 342K training clients, 100 per round from the
    # shuffled pool, disjoint across rounds, T = 1600 DP-FTRL rounds; eps 1.77 (z 8.83) and
    # 18.71 (z 1.13) at delta 1e-6.
    "wang_stackoverflow": SimulatedPopulation(
        "TFF StackOverflow (train)", 342_477, 100, "once", 1600, "tree", "dp_ftrl",
        "Wang et al. 2023, §2 and App. C", 1e-6, ((8.83, 1.77), (1.13, 18.71))),
}


def get_population(name: str) -> SimulatedPopulation:
    if name not in PAPER_POPULATIONS:
        raise ConfigError(f"unknown simulated population {name!r}; choose one of {sorted(PAPER_POPULATIONS)}")
    return PAPER_POPULATIONS[name]


def check_protocol(pop: SimulatedPopulation, *, algorithm: str, cohort_size: int,
                   noise_cohort_size: int | None, name: str = "") -> None:
    """Refuse (``ConfigError``) a run whose per-round noise on the averaged update is not the
    population's, or whose mechanism is another: the simulated epsilon would then describe
    some other run. Two ways match the population's noise ``z * C / m`` on the average:

    * train the population's cohort ``m`` (``cohort_size == m``, no ``noise_cohort_size``);
    * train a smaller cohort with the noise of ``m`` (``noise_cohort_size == m``,
      ``cohort_size <= m``; McMahan et al. 2018): the noise std on the cohort's *sum* is
      ``z * C * cohort / m``, so on the average it is the population's ``z * C / m``, while the
      average itself is over fewer clients (more sampling variance, the same expectation).
      The epsilon SPENT on our users is then that of the run executed (multiplier
      ``z * cohort / m``), reported beside the simulated one."""
    where = f"{name}: " if name else ""
    if algorithm != pop.algorithm:
        raise ConfigError(f"{where}simulated population {pop.name!r} runs {pop.algorithm}, not {algorithm}")
    if noise_cohort_size is not None:
        if noise_cohort_size != pop.cohort:
            raise ConfigError(
                f"{where}a simulated population ({pop.name}, cohort {pop.cohort}) and noise_cohort_size="
                f"{noise_cohort_size} are two simulations: the noise cohort must be the population's "
                f"({pop.cohort}), or none with cohort_size={pop.cohort}")
        if cohort_size > pop.cohort:
            raise ConfigError(f"{where}cohort_size={cohort_size} exceeds the simulated population's "
                              f"cohort {pop.cohort} (its noise cohort)")
        return
    if cohort_size != pop.cohort:
        raise ConfigError(f"{where}simulated population {pop.name!r} has cohort {pop.cohort}: the "
                          f"per-round noise on the average matches only at cohort_size={pop.cohort} "
                          f"(or a smaller cohort with noise_cohort_size={pop.cohort}), got {cohort_size}")


def paper_noise(pop: SimulatedPopulation, noise_multiplier: float, rounds: int,
                executed_event: dpa.DpEvent, our_users: str, num_users: int, delta: float,
                neighboring: str = "add_remove", count_noise: float | None = None) -> PaperNoise:
    """Both epsilons of a run of ``rounds`` rounds at ``noise_multiplier`` that simulates
    ``pop``: the population's (declared) and ``executed_event``'s on ``num_users`` of our
    users named ``our_users`` (the ledger's charge). ``same_population`` when ``num_users``
    equals the population's size (the papers' own data). ``count_noise``: an adaptive clip
    count's multiplier, charged to the simulated population with the sum."""
    sim = pop.epsilon(noise_multiplier, delta, rounds, count_noise)
    exe = accounting.compute_epsilon(executed_event, delta, neighboring)[0]
    same = num_users == pop.users
    return PaperNoise(pop.describe(rounds), sim, f"{our_users} ({num_users:,} training users)", exe,
                      delta, float(noise_multiplier), int(rounds), same)
