"""Adaptive clipping to a target quantile (Andrew et al. 2021, "Differentially private
learning with adaptive clipping", Alg. 1, geometric update).

Each round every participating client reports ``b_i = 1[||Delta_i|| <= C]``. The server
releases the noised centred count ``sum_i (b_i - 1/2) + N(0, sigma_b^2)`` (L2 sensitivity 1/2
under add/remove-one-user), estimates the unclipped fraction
``b_bar = released / m + 1/2`` with the public expected cohort size ``m``, and updates

    C <- C * exp(-eta_C * (b_bar - gamma))

with target quantile ``gamma``. The count release is a Gaussian mechanism with noise
multiplier ``sigma_b / (1/2) = 2 sigma_b`` (``sigma_b`` under replace-one, sensitivity 1). It is
computed on the same sampled cohort as the noisy sum, so the accounting
(``fedpriv.fl.algorithms.privacy_event``) charges the pair as ONE subsampled mechanism,
``PoissonSampled(q, Composed([Gaussian(z), Gaussian(2 sigma_b)]))`` per round — equivalent to a
single Gaussian with ``z_eff = (z^-2 + (2 sigma_b)^-2)^-1/2`` — not as two independently sampled
events. It is not free.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ClipState:
    clip_norm: jax.Array   # float32 scalar: the current clip norm C
    key: jax.Array         # PRNG key for the count noise


@dataclasses.dataclass(frozen=True)
class AdaptiveClipping:
    """Configuration of quantile-based adaptive clipping.

    Attributes:
      initial_clip: C at round 0.
      target_quantile: gamma in (0, 1).
      learning_rate: eta_C (Andrew et al. use 0.2).
      count_stddev: sigma_b, std of the noise on the count; Andrew et al. suggest
        expected_cohort_size / 20.
    """
    initial_clip: float = 0.1
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_stddev: float = 0.0

    def __post_init__(self):
        if not 0 < self.target_quantile < 1:
            raise ValueError(f"target_quantile must be in (0, 1), got {self.target_quantile}")
        if not self.initial_clip > 0:
            raise ValueError(f"initial_clip must be > 0, got {self.initial_clip}")
        if self.count_stddev < 0:
            raise ValueError(f"count_stddev must be >= 0, got {self.count_stddev}")

    @property
    def count_noise_multiplier(self) -> float:
        """Noise std over the count's L2 sensitivity (1/2)."""
        return 2.0 * self.count_stddev

    def init(self, key) -> ClipState:
        return ClipState(jnp.asarray(self.initial_clip, jnp.float32), key)

    def update(self, state: ClipState, norms, client_mask, expected_cohort, step):
        """New clip state from this round's pre-clip norms.

        Args:
          state: current ``ClipState``.
          norms: float32[C] pre-clip norms of the cohort (padded clients arbitrary).
          client_mask: float32[C], 1 for real clients.
          expected_cohort: public denominator m (float).
          step: int32 round index (folded into the noise key).

        Returns:
          ``(new_state, unclipped_fraction_estimate)``.
        """
        below = (norms <= state.clip_norm).astype(jnp.float32) - 0.5
        count = jnp.sum(below * client_mask)
        noise = self.count_stddev * jax.random.normal(jax.random.fold_in(state.key, step))
        frac = (count + noise) / expected_cohort + 0.5
        new_clip = state.clip_norm * jnp.exp(-self.learning_rate * (frac - self.target_quantile))
        return ClipState(new_clip.astype(jnp.float32), state.key), frac
