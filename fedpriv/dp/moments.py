"""Gaussian releases of clipped moments (a mean and a second moment) under secure aggregation.

The mechanism of FreD's private side (Hou et al. 2023, Algorithm 1 and Prop. 3.1;
``papers/fred_hou2023.md``), usable for any per-client vectors:

1. **mean sum**: every client clips each vector to norm ``c`` (Def. 2.4) and contributes
   ``weight * sum_j clip_c(e_j)``; each of the ``m`` participating clients adds a noise share
   ``N(0, tau_1^2 / m)`` per coordinate, so the securely aggregated sum carries exactly
   ``N(0, tau_1^2)`` (:func:`secure_sum_mean`).
2. **second-moment sum**: clients centre their clipped vectors on a released centre, clip again
   to ``c_cov`` and contribute ``weight * upper(sum_j b_j b_j^T)`` (upper triangle with the
   diagonal, ``P = d (d + 1) / 2`` entries), noised the same way with ``tau_2``
   (:func:`secure_sum_cov`; :func:`from_upper` mirrors it back to ``[d, d]``).

Sensitivities of the released *sums* (:func:`moment_sensitivities`; ``||upper(M)||_2 <=
||M||_F`` for symmetric ``M``): add/remove ``(c, c_cov^2)``, replace-one ``(2c, sqrt(2)
c_cov^2)`` -- replacing ``b`` by ``b'`` moves ``b b^T`` by ``||b b^T - b' b'^T||_F^2 = ||b||^4
+ ||b'||^4 - 2 (b.b')^2 <= 2 c_cov^4``; the same holds for a user's average of PSD outer
products (``<A, A'> >= 0``).

Noise calibration: ``tau = sigma(eps, delta) * sensitivity`` with ``sigma`` from the analytic
Gaussian mechanism (Balle & Wang 2018; ``dp_accounting.get_sigma_gaussian``, the noise for L2
sensitivity 1), exact for every ``eps > 0``. The classic ``sqrt(2 ln(1.25/delta)) / eps`` of
Prop. 3.1 (Dwork & Roth Thm. A.1) is exposed for comparison and only allowed for ``eps < 1``.
Each release is one ``GaussianDpEvent(sigma)`` (:func:`moment_events`), relative to the
sensitivity under the release's own neighbouring relation; a ledger is charged with their
composition (:func:`release_event`) and :func:`composed_epsilons` reports the RDP and PLD
epsilons of the pair through :func:`fedpriv.dp.accounting.compute_epsilon`.

JAX runs the per-client math: written for one client chunk, ``jax.vmap``-ped over ``GROUP``
chunks at a time and ``lax.scan``-ned over the groups to bound memory. Chunks of one client
share its ``client_id``; exactly one chunk per real client carries ``share = 1`` (its noise
share), padding chunks have ``share = 0`` and an all-zero mask.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.dp import accounting
from fedpriv.dp.clipping import check_sensitivity_clip

__all__ = ["CALIBRATIONS", "RELATIONS", "GROUP", "analytic_gaussian_sigma", "classic_gaussian_sigma",
           "gaussian_sigma", "check_epsilon_delta", "moment_sensitivities", "moment_events", "release_event",
           "composed_epsilons", "clip_rows", "upper_indices", "from_upper",
           "client_mean_contribution", "client_cov_contribution", "noise_share",
           "secure_sum_mean", "secure_sum_cov"]

CALIBRATIONS = ("analytic", "classic")
RELATIONS = accounting.NEIGHBORING  # ("add_remove", "replace_one")
# Chunks are processed ``GROUP`` at a time (vmap), groups sequentially (scan).
GROUP = 8


# ============================================================================================
# Calibration, sensitivities, events
# ============================================================================================


def check_epsilon_delta(epsilon, delta) -> tuple[float, float]:
    """``(epsilon, delta)`` as floats through ``accounting.check_epsilon/check_delta`` (NumPy
    scalars accepted): ``epsilon`` in (0, ``MAX_RELEASE_EPSILON``], ``delta`` in (0, ``accounting.MAX_DELTA``]."""
    as_py = (lambda x: float(x) if isinstance(x, np.floating) else x)
    epsilon, delta = accounting.check_epsilon(as_py(epsilon)), accounting.check_delta(as_py(delta))
    if epsilon > MAX_RELEASE_EPSILON:  # the analytic solver's function turns NaN long before 1e300
        raise ValueError(f"epsilon must be <= {MAX_RELEASE_EPSILON:g} for a Gaussian release (beyond it there "
                         f"is no privacy to calibrate), got {epsilon:g}")
    return epsilon, delta


# Largest epsilon of one Gaussian release calibrated here (the analytic solver fails near 1e300).
MAX_RELEASE_EPSILON = 1e6


def analytic_gaussian_sigma(epsilon: float, delta: float) -> float:
    """Noise std for L2 sensitivity 1 giving exactly (eps, delta)-DP (Balle & Wang 2018)."""
    epsilon, delta = check_epsilon_delta(epsilon, delta)
    return float(dpa.get_sigma_gaussian(epsilon, delta))


def classic_gaussian_sigma(epsilon: float, delta: float) -> float:
    """Prop. 3.1's ``sqrt(2 ln(1.25/delta)) / eps`` (Dwork & Roth Thm. A.1; only for eps < 1)."""
    epsilon, delta = check_epsilon_delta(epsilon, delta)
    if epsilon >= 1:
        raise ValueError(
            f"the classic Gaussian calibration holds only for epsilon < 1 (got {epsilon}); "
            "use calibration='analytic'"
        )
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def gaussian_sigma(epsilon: float, delta: float, calibration: str = "analytic") -> float:
    """Noise multiplier of one (eps, delta)-DP Gaussian release: "analytic" or "classic"."""
    if calibration == "analytic":
        return analytic_gaussian_sigma(epsilon, delta)
    if calibration == "classic":
        return classic_gaussian_sigma(epsilon, delta)
    raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")


def moment_sensitivities(clip: float, cov_clip: float, relation: str) -> tuple[float, float]:
    """L2 sensitivities ``(mean_sum, second_moment_sum_upper_triangle)`` of one contribution
    bounded by ``clip`` (and ``cov_clip^2`` for the second moment): add/remove
    ``(c, c_cov^2)``, replace-one ``(2c, sqrt(2) c_cov^2)`` (module docstring). Both bounds
    must be finite numbers > 0 (``ClipNormError``)."""
    clip, cov_clip = check_sensitivity_clip(clip, "clip"), check_sensitivity_clip(cov_clip, "cov_clip")
    if relation == "add_remove":
        return float(clip), float(cov_clip) ** 2
    if relation == "replace_one":
        return 2.0 * float(clip), math.sqrt(2.0) * float(cov_clip) ** 2
    raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")


def moment_events(sigma: float) -> tuple[dpa.GaussianDpEvent, dpa.GaussianDpEvent]:
    """The two releases' events (mean, second moment), both ``GaussianDpEvent(sigma)``."""
    return dpa.GaussianDpEvent(sigma), dpa.GaussianDpEvent(sigma)


def release_event(events: Sequence[dpa.DpEvent]) -> dpa.ComposedDpEvent:
    """What a ledger is charged with for the releases ``events`` on the same users."""
    return dpa.ComposedDpEvent(list(events))


def composed_epsilons(events: Sequence[dpa.DpEvent], delta: float) -> dict[str, float]:
    """Epsilon at ``delta`` of the composition of ``GaussianDpEvent``s: ``{"rdp", "pld"}``.

    Through :func:`fedpriv.dp.accounting.compute_epsilon` (add/remove accountants: the events'
    noise multipliers are relative to the sensitivity under the release's own neighbouring
    relation, i.e. a Gaussian of sensitivity 1). PLD is NaN where that accountant declines
    (noise multipliers below 0.3: its discretisation would need tens of GiB).
    """
    for e in events:
        if not isinstance(e, dpa.GaussianDpEvent):
            raise TypeError(f"expected GaussianDpEvent, got {type(e).__name__}")
    events = [dpa.GaussianDpEvent(float(e.noise_multiplier)) for e in events]
    out = {"rdp": accounting.compute_epsilon(events, delta, accountant="rdp")[0],
           "pld": float("nan")}
    try:
        out["pld"] = accounting.compute_epsilon(events, delta, accountant="pld")[0]
    except dpa.UnsupportedEventError:
        pass
    return out


# ============================================================================================
# Per-client math in JAX (one client chunk, unbatched), then vmap + scan over padded chunks
# ============================================================================================


def clip_rows(x: jax.Array, clip) -> jax.Array:
    """Clip each row of ``[S, d]`` to L2 norm ``clip`` (Def. 2.4: ``v / max(1, ||v|| / c)``)."""
    norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x * jnp.minimum(1.0, clip / jnp.maximum(norm, 1e-30))


def upper_indices(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Row/column indices of the upper triangle with diagonal, ``P = d (d + 1) / 2`` entries."""
    return np.triu_indices(d)


def from_upper(vec: np.ndarray, d: int) -> np.ndarray:
    """``[P] -> [d, d]`` symmetric matrix mirrored from its upper triangle (float64)."""
    iu = upper_indices(d)
    m = np.zeros((d, d), np.float64)
    m[iu] = np.asarray(vec, np.float64)
    return m + np.triu(m, 1).T


def client_mean_contribution(emb: jax.Array, mask: jax.Array, weight, clip) -> jax.Array:
    """One client's contribution to the mean sum: ``weight * sum_j mask_j clip_c(e_j)``.

    Args:
      emb: ``[S, d]`` vectors (padded rows arbitrary), mask: ``[S]`` 0/1, weight: scalar
        (1 at sample level, ``1/k_u`` at user level), clip: scalar ``c``.
    Returns:
      ``[d]``.
    """
    x = clip_rows(emb, clip) * mask[:, None]
    return weight * jnp.sum(x, axis=0)


def client_cov_contribution(
    emb: jax.Array, mask: jax.Array, weight, center: jax.Array, clip, cov_clip
) -> jax.Array:
    """One client's contribution to the second-moment sum, upper triangle only.

    ``b_j = clip_{c_cov}(clip_c(e_j) - center)``; returns ``weight * upper(sum_j mask_j b_j
    b_j^T)`` as ``[P]``, ``P = d (d + 1) / 2``.  ``emb: [S, d]``, ``mask: [S]``, ``center: [d]``.
    """
    d = emb.shape[-1]
    b = clip_rows(clip_rows(emb, clip) - center[None, :], cov_clip) * mask[:, None]
    iu = upper_indices(d)
    return weight * (b.T @ b)[iu]


def noise_share(key, client_id, share, size: int, total_std, num_clients) -> jax.Array:
    """Client ``client_id``'s share ``N(0, total_std^2 / m)`` per coordinate (0 if ``share=0``),
    drawn from ``fold_in(key, client_id)``: ``[size]`` float32."""
    k = jax.random.fold_in(key, client_id)
    std = total_std / jnp.sqrt(jnp.asarray(num_clients, jnp.float32))
    return share * std * jax.random.normal(k, (size,), jnp.float32)


def _scan_sum(per_chunk: Callable, xs: tuple, group: int, size: int) -> jax.Array:
    """Sum of ``vmap(per_chunk)`` over the leading (chunk) axis, ``group`` chunks at a time."""
    num = xs[0].shape[0]
    grouped = tuple(x.reshape((num // group, group) + x.shape[1:]) for x in xs)

    def body(acc, g):
        return acc + jnp.sum(jax.vmap(per_chunk)(*g), axis=0), None

    total, _ = jax.lax.scan(body, jnp.zeros((size,), jnp.float32), grouped)
    return total


@jax.jit
def secure_sum_mean(emb, mask, weight, client_id, share, clip, noise_std, num_clients, key):
    """Noisy securely aggregated mean sum (step 1 of Algorithm 1), jitted.

    Args:
      emb: ``[C, S, d]`` padded chunks of client vectors; mask ``[C, S]``; weight ``[C]``;
      client_id ``[C]`` int32 (chunks of one client share it); share ``[C]`` 1.0 on exactly one
      chunk per real client, 0 elsewhere; clip ``c``; noise_std ``tau_1`` of the *aggregate*
      (0 gives the pre-noise sum); num_clients ``m``; key: PRNG key.
      ``C`` must be a multiple of :data:`GROUP`.
    Returns:
      ``[d]`` float32: ``sum_u contribution_u + sum_u share_u``, shares ``N(0, tau_1^2/m)``.
    """
    d = emb.shape[-1]

    def per_chunk(e, m, w, cid, s):
        return client_mean_contribution(e, m, w, clip) + noise_share(
            key, cid, s, d, noise_std, num_clients
        )

    return _scan_sum(per_chunk, (emb, mask, weight, client_id, share), GROUP, d)


@jax.jit
def secure_sum_cov(
    emb, mask, weight, client_id, share, center, clip, cov_clip, noise_std, num_clients, key
):
    """Noisy securely aggregated second-moment sum, upper triangle ``[P]`` (step 2), jitted.

    Same arguments as :func:`secure_sum_mean` plus ``center [d]`` (the released DP mean) and
    ``cov_clip``; one noise draw per upper-triangle entry.
    """
    d = emb.shape[-1]
    size = d * (d + 1) // 2

    def per_chunk(e, m, w, cid, s):
        return client_cov_contribution(e, m, w, center, clip, cov_clip) + noise_share(
            key, cid, s, size, noise_std, num_clients
        )

    return _scan_sum(per_chunk, (emb, mask, weight, client_id, share), GROUP, size)
