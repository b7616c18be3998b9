"""Host-side client samplers (NumPy, explicit seeds).

Every sampler is a pure function of ``(seed, round)``: ``sampler.sample(round)`` returns the
indices (into the population ``0..N-1``) of that round's cohort. There is no hidden state, so
a resumed run samples exactly the cohorts an uninterrupted run would.

* ``UniformSampler``: ``m`` clients uniformly without replacement, fresh every round.
* ``PoissonSampler``: each client independently with probability ``q`` (McMahan et al. 2018).
* ``ShuffledPassSampler``: disjoint cohorts from a fresh permutation per epoch, so each client
  participates at most once per epoch — what DP-FTRL's accounting needs (Kairouz et al. 2021);
  ``rounds_per_epoch = N // m`` (the remainder of each permutation sits out that epoch).

Every sampler also knows what its sampling does to privacy: ``neighboring`` (the relation its
accounting uses) and ``amplified_event(release, rounds)``, which turns what one round releases
about its cohort (``fedpriv.dp.accounting.RoundRelease``, or a plain ``DpEvent`` of fresh
noise) into the ``dp_accounting`` event of ``rounds`` rounds:

* Poisson: ``rounds`` x ``PoissonSampledDpEvent(q, release)`` (add/remove);
* uniform without replacement: ``rounds`` x ``SampledWithoutReplacementDpEvent(N, m,
  release at the replace-one multiplier)`` (replace-one);
* shuffled passes: one release per client per epoch, composed over the epochs (no
  amplification): the DP-FTRL trees (``accounting.dp_ftrl_event``) and the fresh releases
  once per epoch (add/remove; REPLACE_SPECIAL for the trees).

Only shuffled passes accept a tree release (each client at most once per tree).

Participation-aware sampling for matrix-factorization DP-FTRL, and its accounting:

``CyclicSampler`` (Choquette-Choo et al. 2023, "Multi-epoch matrix factorization", §2: the
"(k, b)-participation" schema; the cyclic Poisson-free setting of "(Amplified) banded matrix
factorization", §3) fixes a seeded partition of the ``N`` clients into ``b = N // m`` groups of
``m`` (the remainder never participates) and serves group ``t mod b`` at round ``t``. So every
client participates at most ``ceil(T / b)`` times in ``T`` rounds, exactly ``b`` rounds apart:
its **min-separation** is ``b``. Like the samplers above it is a pure function of
``(seed, round)`` (resumes sample the same cohorts) and knows its own privacy event.

``matrix_privacy_event`` is what ``algorithms.privacy_event`` charges for ``mechanism="banded"``
or ``"blt"``: it asks the sampler for the min-separation it *guarantees*
(``sampler.min_separation``) and the participations it allows
(``sampler.max_participations(rounds)``), refuses (``MinSeparationError``) a sampler that
declares none or less than the strategy was built for (``dp.min_separation``), and returns
``GaussianDpEvent(z / sens)`` with the strategy's sensitivity at ``dp.min_separation`` —
composed with any fresh per-round release (adaptive clip count) once per participation.
No amplification by sampling is claimed for ``CyclicSampler``.

``AmplifiedCyclicSampler`` is the cyclic Poisson scheme of Choquette-Choo et al. 2023,
"(Amplified) banded matrix factorization" (NeurIPS; arXiv:2306.08153), Alg. 2 / Thms. 4-5:
the ``N`` clients are split once (seeded) into ``b`` groups of ``N // b``, and round ``t``
Poisson-samples group ``t mod b`` with probability ``q``. A client can only be sampled in rounds
``b`` apart (min-separation ``b``, at most ``ceil(T / b)`` of them), and a ``bands``-banded
lower-triangular ``C`` with ``bands <= b`` is then as private as DP-SGD run for ``ceil(T / b)``
steps with sampling probability ``q`` and noise multiplier ``z / max_j ||C[:, j]||`` (add/remove
one client): ``matrix_privacy_event`` returns ``ceil(T / b)`` x ``PoissonSampledDpEvent(q,
Gaussian(z / col_norm))`` for this sampler and a banded ``dp`` (the convention of
``jax_privacy.accounting.amplified_bandmf_event``, which assumes unit max column norm). The
theorem is for banded ``C``: BLT (not banded) is refused.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol, runtime_checkable

import dp_accounting as dpa
import numpy as np

from fedpriv.dp import accounting
from fedpriv.dp.accounting import as_release as _as_release, periodic_event
from fedpriv.dp.matrix_events import (  # noqa: F401 (the samplers' MF accounting, re-exported)
    AmplificationError,
    amplified_banded_event,
    matrix_privacy_event,
)


@runtime_checkable
class Sampler(Protocol):
    """What ``fedpriv.fl.loop.train`` and the accounting read from a client sampler (structural:
    any class with these members is one; ``check_sampler`` names what a class lacks).

    ``num_clients``: the population N (``sample`` returns indices into ``0..N-1``);
    ``expected_cohort_size``: E[cohort] (the algorithm divides the noised sum by it);
    ``max_cohort_size``: the padding capacity of a round; ``variable_cohort``: whether cohort
    sizes vary (the executor then pads to powers of two); ``neighboring``: the relation its
    accounting uses; ``sample(round_idx)``: the round's cohort, a pure function of (seed,
    round); ``amplified_event(release, rounds)``: the ``dp_accounting`` event of ``rounds``
    rounds of ``release`` under this sampling.
    """
    num_clients: int
    variable_cohort: bool

    @property
    def expected_cohort_size(self) -> float: ...

    @property
    def max_cohort_size(self) -> int: ...

    @property
    def neighboring(self) -> str: ...

    def sample(self, round_idx: int) -> np.ndarray: ...

    def amplified_event(self, release, rounds: int) -> dpa.DpEvent: ...


SAMPLER_MEMBERS = ("num_clients", "expected_cohort_size", "max_cohort_size", "variable_cohort",
                   "neighboring", "sample", "amplified_event")


def check_sampler(sampler) -> None:
    """Raise ``TypeError`` naming the `Sampler` members ``sampler`` lacks (fail closed: a
    sampler the loop cannot account is refused before anything runs)."""
    missing = [m for m in SAMPLER_MEMBERS if not hasattr(sampler, m)]
    if missing:
        raise TypeError(f"{type(sampler).__name__} is not a fedpriv Sampler: it lacks "
                        f"{', '.join(missing)} (see fedpriv.fl.samplers.Sampler)")


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), *map(int, stream)]))


def _no_tree(release: accounting.RoundRelease, sampler) -> None:
    if release.is_tree:
        raise ValueError(f"DP-FTRL's tree accounting needs each client at most once per tree; "
                         f"{type(sampler).__name__} can sample a client twice: use "
                         f"ShuffledPassSampler")


def _check(num_clients, cohort_size=None):
    if num_clients < 1:
        raise ValueError(f"the population is empty (num_clients={num_clients})")
    if cohort_size is not None and not 1 <= cohort_size <= num_clients:
        raise ValueError(f"cohort size {cohort_size} must be in [1, population={num_clients}]")


@dataclasses.dataclass(frozen=True)
class FixedCohortSampler:
    """Base of the samplers that draw exactly ``cohort_size`` of ``num_clients`` every round."""
    num_clients: int
    cohort_size: int
    seed: int = 0
    variable_cohort = False  # class attribute (not a field): every cohort has cohort_size

    def __post_init__(self):
        _check(self.num_clients, self.cohort_size)

    @property
    def max_cohort_size(self) -> int:
        return self.cohort_size

    @property
    def expected_cohort_size(self) -> float:
        return float(self.cohort_size)


@dataclasses.dataclass(frozen=True)
class UniformSampler(FixedCohortSampler):
    def sample(self, round_idx: int) -> np.ndarray:
        return np.sort(_rng(self.seed, 0, round_idx).choice(self.num_clients, self.cohort_size, replace=False))

    @property
    def neighboring(self) -> str:
        return "replace_one"  # fixed-size sampling: the population size is public

    def amplified_event(self, release, rounds: int) -> dpa.DpEvent:
        """``rounds`` x ``SampledWithoutReplacementDpEvent(N, m, inner)``, ``inner`` = the
        round's fresh release with every Gaussian multiplier halved (replace-one)."""
        release = _as_release(release)
        _no_tree(release, self)
        return accounting.wor_sampled_event(release.fresh, self.num_clients, self.cohort_size,
                                            rounds)


@dataclasses.dataclass(frozen=True)
class PoissonSampler:
    num_clients: int
    sampling_rate: float
    seed: int = 0
    variable_cohort = True  # class attribute (not a field): the executor pads the cohort

    def __post_init__(self):
        _check(self.num_clients)
        if not 0 < self.sampling_rate <= 1:
            raise ValueError(f"sampling rate must be in (0, 1], got {self.sampling_rate}")

    @property
    def expected_cohort_size(self) -> float:
        return self.sampling_rate * self.num_clients

    @property
    def max_cohort_size(self) -> int:
        """A padding capacity exceeded with probability < 1e-9 per round (Chernoff-style)."""
        mu = self.expected_cohort_size
        return int(min(self.num_clients, np.ceil(mu + 6.5 * np.sqrt(mu) + 6)))

    def sample(self, round_idx: int) -> np.ndarray:
        u = _rng(self.seed, 1, round_idx).random(self.num_clients)
        return np.flatnonzero(u < self.sampling_rate)

    @property
    def neighboring(self) -> str:
        return "add_remove"

    def amplified_event(self, release, rounds: int) -> dpa.DpEvent:
        """``rounds`` x ``PoissonSampledDpEvent(q, fresh release)``: one subsampled mechanism
        per round on everything the round computes from its cohort."""
        release = _as_release(release)
        _no_tree(release, self)
        return accounting.poisson_sampled_event(release.fresh, self.sampling_rate, rounds)


@dataclasses.dataclass(frozen=True)
class ShuffledPassSampler(FixedCohortSampler):

    @property
    def rounds_per_epoch(self) -> int:
        return self.num_clients // self.cohort_size

    def epoch_of(self, round_idx: int) -> int:
        return round_idx // self.rounds_per_epoch

    def steps_per_epoch(self, rounds: int) -> list[int]:
        """Rounds in each epoch (tree) for a run of ``rounds`` rounds."""
        return accounting.epoch_lengths(rounds, self.rounds_per_epoch)

    @property
    def neighboring(self) -> str:
        return "add_remove"

    def amplified_event(self, release, rounds: int) -> dpa.DpEvent:
        """Each client is in one round per epoch: per epoch, one tree (DP-FTRL, restarting
        every epoch) and one fresh release; composed over the epochs of ``rounds``."""
        return periodic_event(release, rounds, self.rounds_per_epoch, len(self.steps_per_epoch(rounds)))

    def sample(self, round_idx: int) -> np.ndarray:
        epoch, pos = divmod(round_idx, self.rounds_per_epoch)
        perm = _rng(self.seed, 2, epoch).permutation(self.num_clients)
        return np.sort(perm[pos * self.cohort_size:(pos + 1) * self.cohort_size])


@dataclasses.dataclass(frozen=True)
class CyclicSampler(FixedCohortSampler):
    """Fixed groups of ``cohort_size`` served cyclically: min-separation ``num_clients //
    cohort_size`` (the number of groups)."""

    @property
    def min_separation(self) -> int:
        """Rounds between two participations of one client (= number of groups)."""
        return self.num_clients // self.cohort_size

    rounds_per_epoch = min_separation

    def max_participations(self, rounds: int) -> int:
        return -(-accounting.check_rounds(rounds) // self.min_separation)

    @property
    def neighboring(self) -> str:
        return "add_remove"  # zero-out of one user's contributions (their rows of x)

    def sample(self, round_idx: int) -> np.ndarray:
        g = int(round_idx) % self.min_separation
        perm = np.random.default_rng(np.random.SeedSequence([int(self.seed), 3])).permutation(
            self.num_clients)
        return np.sort(perm[g * self.cohort_size:(g + 1) * self.cohort_size])

    def amplified_event(self, release, rounds: int) -> dpa.DpEvent:
        """Fresh releases once per participation; a tree only if it restarts every ``b`` rounds
        (each client once per tree). Matrix mechanisms go through ``matrix_privacy_event``."""
        return periodic_event(release, rounds, self.min_separation, self.max_participations(rounds))


@dataclasses.dataclass(frozen=True)
class AmplifiedCyclicSampler:
    """Cyclic Poisson sampling (Choquette-Choo et al. 2023, "(Amplified) banded matrix
    factorization", Alg. 2): a seeded partition of ``num_clients`` into ``num_groups`` groups of
    ``group_size = num_clients // num_groups`` (the remainder never participates); round ``t``
    includes each client of group ``t mod num_groups`` independently with probability
    ``sampling_rate``. ``sample(t)`` is a pure function of ``(seed, t)``: sorted client indices,
    ``[cohort]`` with ``cohort ~ Binomial(group_size, q)``.

    Min-separation ``num_groups``, at most ``ceil(T / num_groups)`` participations in ``T``
    rounds; add/remove neighbouring. Its privacy event with banded MF is
    ``matrix_privacy_event``'s amplified branch (Thm. 4); with fresh per-round noise only
    (DP-FedAvg), ``ceil(T / b)`` Poisson-sampled rounds (``amplified_event``).
    """
    num_clients: int
    num_groups: int
    sampling_rate: float
    seed: int = 0

    variable_cohort = True  # cohort sizes vary: the executor pads to powers of two
    # its cohorts make banded MF's release amplified (Thm. 4): matrix_events.matrix_privacy_event
    # claims amplification only for a sampler that says so (fails closed)
    amplifies_banded_mf = True

    def __post_init__(self):
        if self.num_clients < 1:
            raise ValueError(f"the population is empty (num_clients={self.num_clients})")
        if (isinstance(self.num_groups, bool) or int(self.num_groups) != self.num_groups
                or not 1 <= self.num_groups <= self.num_clients):
            raise ValueError(f"num_groups must be an integer in [1, num_clients={self.num_clients}],"
                             f" got {self.num_groups!r}")
        accounting.check_sampling_rate(self.sampling_rate)

    @property
    def group_size(self) -> int:
        return self.num_clients // int(self.num_groups)

    @property
    def min_separation(self) -> int:
        """Rounds between two possible participations of one client (= number of groups)."""
        return int(self.num_groups)

    rounds_per_epoch = min_separation

    def max_participations(self, rounds: int) -> int:
        return -(-accounting.check_rounds(rounds) // self.min_separation)

    @property
    def neighboring(self) -> str:
        return "add_remove"  # Poisson sampling within a group: the theorem's relation

    @property
    def expected_cohort_size(self) -> float:
        return float(self.sampling_rate) * self.group_size

    @property
    def max_cohort_size(self) -> int:
        """A padding capacity exceeded with probability < 1e-9 per round (as ``PoissonSampler``)."""
        mu = self.expected_cohort_size
        return int(min(self.group_size, np.ceil(mu + 6.5 * np.sqrt(mu) + 6)))

    def group(self, g: int) -> np.ndarray:
        """The clients of group ``g`` (sorted, ``[group_size]``)."""
        perm = np.random.default_rng(np.random.SeedSequence([int(self.seed), 5])).permutation(
            self.num_clients)
        gs = self.group_size
        return np.sort(perm[g * gs:(g + 1) * gs])

    def sample(self, round_idx: int) -> np.ndarray:
        members = self.group(int(round_idx) % self.min_separation)
        u = np.random.default_rng(np.random.SeedSequence([int(self.seed), 6, int(round_idx)])).random(
            members.size)
        return members[u < self.sampling_rate]

    def amplified_event(self, release, rounds: int) -> dpa.DpEvent:
        """Fresh per-round noise only (DP-FedAvg): a client is exposed in at most ``ceil(T / b)``
        rounds, each Poisson-sampled: ``ceil(T / b)`` x ``PoissonSampled(q, fresh)``. Trees are
        refused; matrix mechanisms go through ``matrix_privacy_event``."""
        if isinstance(release, dpa.DpEvent):
            release = accounting.RoundRelease(fresh=release)
        if release.is_tree:
            raise AmplificationError("AmplifiedCyclicSampler has no tree accounting: use banded "
                                     "MF (mechanism='banded') or CyclicSampler")
        if release.fresh is None:
            return dpa.NoOpDpEvent()
        return accounting.poisson_sampled_event(release.fresh, self.sampling_rate,
                                                self.max_participations(rounds))


# ----------------------------------------------------------------------------- registry factories
# ``factory(num_clients, cohort_size, seed) -> sampler`` (``fedpriv.registry.SAMPLERS``: the names
# an LM-FL algorithm names, ``fedpriv.recipes.algorithms``)
def shuffled_sampler(num_clients: int, cohort_size: int, seed: int) -> ShuffledPassSampler:
    """Shuffled passes of ``cohort_size`` clients (DP-FTRL: one tree per epoch)."""
    return ShuffledPassSampler(num_clients, cohort_size, seed=seed)


def poisson_sampler(num_clients: int, cohort_size: int, seed: int) -> PoissonSampler:
    """Poisson sampling at ``q = cohort_size / num_clients`` (DP-FedAvg)."""
    return PoissonSampler(num_clients, cohort_size / num_clients, seed=seed)


def uniform_sampler(num_clients: int, cohort_size: int, seed: int) -> UniformSampler:
    """Fixed-size cohorts, uniformly without replacement (replace-one)."""
    return UniformSampler(num_clients, cohort_size, seed=seed)


def cyclic_sampler(num_clients: int, cohort_size: int, seed: int) -> CyclicSampler:
    """Fixed groups served cyclically (matrix-factorization DP-FTRL: min-separation)."""
    return CyclicSampler(num_clients, cohort_size, seed=seed)
