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
No amplification by sampling is claimed.
"""
from __future__ import annotations

import dataclasses

import dp_accounting as dpa
import numpy as np

from fedpriv.dp import accounting
from fedpriv.dp.matrix import MinSeparationError, matrix_event, strategy_for
from fedpriv.fl.samplers import FixedCohortSampler


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
        if isinstance(release, dpa.DpEvent):
            release = accounting.RoundRelease(fresh=release)
        k = self.max_participations(rounds)
        parts = []
        if release.is_tree:
            if release.restart_every != self.min_separation:
                raise ValueError(f"tree restarts every {release.restart_every} rounds but a "
                                 f"client returns every {self.min_separation}: twice in one tree")
            parts.append(accounting.dp_ftrl_event(release.tree_noise_multiplier, rounds,
                                                  self.min_separation))
        if release.fresh is not None:
            parts.append(dpa.SelfComposedDpEvent(release.fresh, k))
        return parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)


def matrix_privacy_event(dp, sampler, rounds: int, noise_multiplier: float,
                         fresh: dpa.DpEvent | None = None) -> dpa.DpEvent:
    """The event of ``rounds`` rounds of a banded/BLT ``dp`` (a ``DPConfig``) under ``sampler``.

    Fails closed: ``MinSeparationError`` unless the sampler guarantees a min-separation
    ``>= dp.min_separation`` (an attribute ``min_separation`` and ``max_participations``)."""
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
    strategy = strategy_for(dp.mechanism, dp.bands, dp.blt_buffers, dp.mf_rounds, dp.blt_params)
    k = int(maxp(rounds))
    event = matrix_event(strategy, noise_multiplier, rounds, dp.min_separation, k)
    if fresh is None:
        return event
    return dpa.ComposedDpEvent([event, dpa.SelfComposedDpEvent(fresh, k)])
