"""Participation-aware client sampling for matrix-factorization DP-FTRL, and its accounting.

``CyclicSampler`` (Choquette-Choo et al. 2023, "Multi-epoch matrix factorization", §2: the
"(k, b)-participation" schema; the cyclic Poisson-free setting of "(Amplified) banded matrix
factorization", §3) fixes a seeded partition of the ``N`` clients into ``b = N // m`` groups of
``m`` (the remainder never participates) and serves group ``t mod b`` at round ``t``. So every
client participates at most ``ceil(T / b)`` times in ``T`` rounds, exactly ``b`` rounds apart:
its **min-separation** is ``b``. Like ``fedpriv.fl.samplers`` it is a pure function of
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

import dp_accounting as dpa
import numpy as np

from fedpriv.dp import accounting
from fedpriv.dp.matrix import BandedStrategy, MinSeparationError, matrix_event
from fedpriv.errors import FedprivError
from fedpriv.fl.samplers import FixedCohortSampler, periodic_event


class AmplificationError(FedprivError, ValueError):
    """A mechanism the sampler's amplification theorem does not cover (fails closed)."""


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


def amplified_banded_event(strategy, noise_multiplier: float, rounds: int, num_groups: int,
                           sampling_rate: float, fresh: dpa.DpEvent | None = None) -> dpa.DpEvent:
    """Choquette-Choo et al. 2023 ("(Amplified) banded MF", Thm. 4 with Alg. 2's cyclic Poisson
    sampling): ``rounds`` rounds of a ``BandedStrategy`` with ``bands <= num_groups`` are as
    private as ``ceil(rounds / num_groups)`` steps of DP-SGD at sampling probability
    ``sampling_rate`` and multiplier ``noise_multiplier / max_j ||C[:, j]||`` (the first
    column of the Toeplitz ``C``; add/remove). ``fresh`` (a per-round release beside the MF
    noise, e.g. the adaptive clip count) is refused: the theorem as stated covers the MF
    release alone (fail closed; use a fixed clip norm or ``CyclicSampler``)."""
    if fresh is not None:
        raise AmplificationError("amplified banded MF accounts for the MF release only "
                                 "(Choquette-Choo et al. 2023, Thm. 4): no adaptive clipping count "
                                 "beside it; use a fixed clip norm or CyclicSampler")
    if not isinstance(strategy, BandedStrategy):
        raise AmplificationError(f"amplified cyclic Poisson accounting holds for banded C only "
                                 f"(Choquette-Choo et al. 2023, Thm. 4), not {type(strategy).__name__}")
    rounds = accounting.check_rounds(rounds)
    if strategy.bands > num_groups:
        raise MinSeparationError(f"a {strategy.bands}-banded strategy needs >= {strategy.bands} "
                                 f"groups for amplification, got {num_groups}")
    col_norm = strategy.sensitivity(rounds, int(num_groups), 1)  # max column norm (column 0)
    inner = dpa.GaussianDpEvent(float(noise_multiplier) / col_norm)
    k = -(-rounds // int(num_groups))
    return accounting.poisson_sampled_event(inner, sampling_rate, k)


def matrix_privacy_event(dp, sampler, rounds: int, noise_multiplier: float,
                         fresh: dpa.DpEvent | None = None) -> dpa.DpEvent:
    """The event of ``rounds`` rounds of a banded/BLT ``dp`` (a ``DPConfig``) under ``sampler``.

    Fails closed: ``MinSeparationError`` unless the sampler guarantees a min-separation
    ``>= dp.min_separation`` (an attribute ``min_separation`` and ``max_participations``).
    With an ``AmplifiedCyclicSampler`` the event is the amplified one (``amplified_banded_event``:
    ``ceil(T / b)`` x ``PoissonSampled(q, Gaussian(z / max column norm))``) for a banded ``C``
    (``dp.banded``: "banded", "banded_opt"); ``AmplificationError`` otherwise, e.g. "blt" (the
    theorem needs a banded ``C``)."""
    rounds = accounting.check_rounds(rounds)
    sep = getattr(sampler, "min_separation", None)
    maxp = getattr(sampler, "max_participations", None)
    if not isinstance(sep, int) or not callable(maxp):
        raise MinSeparationError(f"{type(sampler).__name__} guarantees no min-separation: the "
                                 f"{dp.mechanism} strategy's accounting refuses it (use CyclicSampler)")
    if sep < dp.min_separation:
        raise MinSeparationError(f"the {dp.mechanism} strategy was built for min-separation "
                                 f"{dp.min_separation} but {type(sampler).__name__} only "
                                 f"guarantees {sep}")
    if isinstance(sampler, AmplifiedCyclicSampler) and not dp.banded:
        raise AmplificationError(f"AmplifiedCyclicSampler's amplification holds for banded MF only "
                                 f"(Choquette-Choo et al. 2023, Thm. 4), not {dp.mechanism!r}: "
                                 f"use CyclicSampler")
    strategy = dp.strategy
    if isinstance(sampler, AmplifiedCyclicSampler):
        return amplified_banded_event(strategy, noise_multiplier, rounds, sep,
                                      sampler.sampling_rate, fresh)
    k = int(maxp(rounds))
    event = matrix_event(strategy, noise_multiplier, rounds, dp.min_separation, k)
    if fresh is None:
        return event
    return dpa.ComposedDpEvent([event, dpa.SelfComposedDpEvent(fresh, k)])
