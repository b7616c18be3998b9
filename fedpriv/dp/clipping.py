"""Per-client L2 clipping of model updates (McMahan et al. 2018, DP-FedAvg; Kairouz et al. 2021).

A client's update is a pytree; it is clipped to global L2 norm ``C`` as one vector:
``clip(v) = v * min(1, C / ||v||)``. Non-finite updates (NaN/inf anywhere) are replaced by
zeros and flagged, so they are never summed (a zero update is always within the sensitivity).
Clipping runs per client (unbatched) and is ``jax.vmap``-ped over a cohort by the engine.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


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
      clip_norm: scalar C > 0; ``jnp.inf`` disables clipping.

    Returns:
      ``(clipped, norm, finite)``: the clipped pytree (zeros if the update had a non-finite
      entry), the pre-clip global norm (``inf`` for a non-finite update), and a bool scalar
      that is False for non-finite updates.
    """
    norm = global_norm(update)
    finite = jnp.isfinite(norm)
    scale = jnp.where(finite, jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-30)), 0.0)
    clipped = jax.tree_util.tree_map(
        lambda x: jnp.where(finite, x * scale.astype(x.dtype), jnp.zeros_like(x)), update)
    return clipped, jnp.where(finite, norm, jnp.inf), finite
