"""Per-client L2 clipping of model updates (McMahan et al. 2018, DP-FedAvg; Kairouz et al. 2021).

A client's update is a pytree; it is clipped to global L2 norm ``C`` as one vector:
``clip(v) = v * min(1, C / ||v||)``. Non-finite updates (NaN/inf anywhere) are replaced by
zeros and flagged, so they are never summed (a zero update is always within the sensitivity).
Clipping runs per client (unbatched) and is ``jax.vmap``-ped over a cohort by the engine.

The clip norm must be a positive number (``inf`` = no clipping). A concrete bad value (``<= 0``
or NaN) raises :class:`ClipNormError`; a traced one (adaptive clipping passes C as a traced
scalar under ``jit``) cannot raise, so the update fails closed instead: it is zeroed and flagged
not finite, exactly like a non-finite update. Without this, ``C = -1`` returned ``-u`` scaled to
norm 1 and ``C = NaN`` a NaN update flagged finite.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.errors import FedprivError

# how a client's clipped update is weighted in the sum (w_i in [0, 1], so the sensitivity stays C):
# the same for every client, or by its example count capped at ``weight_cap``
# (``fedpriv.fl.aggregate.client_weight``; ``DPConfig.weighting``)
WEIGHTINGS = ("uniform", "num_examples")


class ClipNormError(FedprivError, ValueError):
    """The clip norm is not a positive number (zero, negative or NaN)."""


def check_clip_norm(clip_norm) -> None:
    """Raise :class:`ClipNormError` if ``clip_norm`` is concrete and not ``> 0`` (NaN, 0,
    negative); a traced value is left to :func:`clip_update`'s in-graph check."""
    if isinstance(clip_norm, jax.core.Tracer):
        return
    try:
        c = float(np.asarray(clip_norm))
    except (TypeError, ValueError) as e:
        raise ClipNormError(f"clip_norm must be a positive number (inf = no clipping), got "
                            f"{clip_norm!r}") from e
    if not c > 0 or math.isnan(c):
        raise ClipNormError(f"clip_norm must be a positive number (inf = no clipping), got {c}")


def check_sensitivity_clip(clip, name: str = "clip_norm") -> float:
    """``clip`` as a float where a sensitivity is claimed from it (the L2 bound of one
    contribution): a finite number > 0. ``inf`` is no clipping (fine for :func:`clip_update`
    without noise), so no sensitivity can be stated: :class:`ClipNormError` naming ``name``."""
    try:
        c = float(np.asarray(clip))
    except (TypeError, ValueError) as e:
        raise ClipNormError(f"{name} must be a finite number > 0 (it bounds the sensitivity), got {clip!r}") from e
    if not (c > 0 and math.isfinite(c)):
        raise ClipNormError(f"{name} must be a finite number > 0 (it bounds the sensitivity; inf = no "
                            f"clipping has none), got {c}")
    return c


def global_norm(tree) -> jax.Array:
    """L2 norm of all leaves of ``tree`` taken as one flat vector (float32 scalar)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def clip_update(update, clip_norm):
    """Clip one client's update to global L2 norm ``clip_norm``.

    Args:
      update: pytree of arrays (one client, no cohort axis).
      clip_norm: scalar C > 0; ``jnp.inf`` disables clipping. May be traced (adaptive C).

    Returns:
      ``(clipped, norm, finite)``: the clipped pytree (zeros if the update had a non-finite
      entry or C is not a positive number), the pre-clip global norm (``inf`` for a non-finite
      update), and a bool scalar that is False for non-finite updates and for a bad traced C:
      the update is then never summed.

    Raises:
      ClipNormError: ``clip_norm`` is concrete and ``<= 0`` or NaN.
    """
    check_clip_norm(clip_norm)
    norm = global_norm(update)
    c = jnp.asarray(clip_norm, jnp.float32)
    norm_finite = jnp.isfinite(norm)
    finite = norm_finite & (c > 0)  # NaN > 0 is False: a NaN / non-positive C fails closed
    scale = jnp.where(finite, jnp.minimum(1.0, c / jnp.maximum(norm, 1e-30)), 0.0)
    clipped = jax.tree_util.tree_map(
        lambda x: jnp.where(finite, x * scale.astype(x.dtype), jnp.zeros_like(x)), update)
    return clipped, jnp.where(norm_finite, norm, jnp.inf), finite
