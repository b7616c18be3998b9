"""Host-side client samplers (NumPy, explicit seeds).

Every sampler is a pure function of ``(seed, round)``: ``sampler.sample(round)`` returns the
indices (into the population ``0..N-1``) of that round's cohort. There is no hidden state, so
a resumed run samples exactly the cohorts an uninterrupted run would.

* ``UniformSampler``: ``m`` clients uniformly without replacement, fresh every round.
* ``PoissonSampler``: each client independently with probability ``q`` (McMahan et al. 2018).
* ``ShuffledPassSampler``: disjoint cohorts from a fresh permutation per epoch, so each client
  participates at most once per epoch — what DP-FTRL's accounting needs (Kairouz et al. 2021);
  ``rounds_per_epoch = N // m`` (the remainder of each permutation sits out that epoch).
"""
from __future__ import annotations

import dataclasses

import numpy as np


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), *map(int, stream)]))


def _check(num_clients, cohort_size=None):
    if num_clients < 1:
        raise ValueError(f"the population is empty (num_clients={num_clients})")
    if cohort_size is not None and not 1 <= cohort_size <= num_clients:
        raise ValueError(f"cohort size {cohort_size} must be in [1, population={num_clients}]")


@dataclasses.dataclass(frozen=True)
class UniformSampler:
    num_clients: int
    cohort_size: int
    seed: int = 0

    def __post_init__(self):
        _check(self.num_clients, self.cohort_size)

    @property
    def max_cohort_size(self) -> int:
        return self.cohort_size

    @property
    def expected_cohort_size(self) -> float:
        return float(self.cohort_size)

    def sample(self, round_idx: int) -> np.ndarray:
        return np.sort(_rng(self.seed, 0, round_idx).choice(self.num_clients, self.cohort_size, replace=False))


@dataclasses.dataclass(frozen=True)
class PoissonSampler:
    num_clients: int
    sampling_rate: float
    seed: int = 0

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


@dataclasses.dataclass(frozen=True)
class ShuffledPassSampler:
    num_clients: int
    cohort_size: int
    seed: int = 0

    def __post_init__(self):
        _check(self.num_clients, self.cohort_size)

    @property
    def rounds_per_epoch(self) -> int:
        return self.num_clients // self.cohort_size

    @property
    def max_cohort_size(self) -> int:
        return self.cohort_size

    @property
    def expected_cohort_size(self) -> float:
        return float(self.cohort_size)

    def epoch_of(self, round_idx: int) -> int:
        return round_idx // self.rounds_per_epoch

    def steps_per_epoch(self, rounds: int) -> list[int]:
        """Rounds in each epoch (tree) for a run of ``rounds`` rounds."""
        r = self.rounds_per_epoch
        return [r] * (rounds // r) + ([rounds % r] if rounds % r else [])

    def sample(self, round_idx: int) -> np.ndarray:
        epoch, pos = divmod(round_idx, self.rounds_per_epoch)
        perm = _rng(self.seed, 2, epoch).permutation(self.num_clients)
        return np.sort(perm[pos * self.cohort_size:(pos + 1) * self.cohort_size])
