"""Cohort aggregation: the per-client update + clipping, ``jax.vmap``-ped over a padded cohort.

``cohort_sum`` returns the masked sum of clipped (and weighted) client updates — the query
whose L2 sensitivity to one client is the clip norm C (each contribution has norm <= w_i C
with w_i <= 1) — plus summed metrics and clipping statistics. With ``chunk_size`` the cohort
is processed as a ``lax.scan`` over vmapped chunks that accumulates running sums, so memory
holds ``chunk_size`` updates instead of the whole cohort. When the cohort arrays are sharded
over devices along their leading axis (``shard_cohort``), XLA partitions the vmap and turns
the sum into an all-reduce: the same code on 1 CPU, several GPUs or a TPU slice.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedpriv.dp.clipping import clip_update

WEIGHTINGS = ("uniform", "num_examples")


def client_weight(num_examples, weighting: str, weight_cap: float):
    """w_i in [0, 1]: 1 (uniform) or min(n_i, cap) / cap (example-count weighting)."""
    if weighting == "uniform":
        return jnp.ones_like(num_examples, dtype=jnp.float32)
    if weighting == "num_examples":
        return jnp.minimum(num_examples.astype(jnp.float32), weight_cap) / weight_cap
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def cohort_sum(client_update, params, batches, client_mask, rng, clip_norm,
               weighting: str = "uniform", weight_cap: float = 256.0, chunk_size: int | None = None):
    """Sum of clipped, weighted client updates over a padded cohort.

    Args:
      client_update: ``(params, batches[S,B,...], rng) -> (delta, aux, num_examples)``.
      params: server parameters (replicated).
      batches: dict of ``[K, S, B, ...]`` arrays incl. ``mask``.
      client_mask: float32[K], 1 for real clients.
      rng: PRNG key of the round; client k uses ``fold_in(rng, k)``.
      clip_norm: scalar C (``inf`` = no clipping).

    Returns:
      ``(sum_tree, stats)``: ``sum_tree = sum_k keep_k w_k clip(delta_k)``; ``stats`` has the
      summed ``aux`` metrics (real clients only), ``weight_sum``, ``norm_sum``,
      ``num_clipped``, ``num_nonfinite``, ``num_clients`` and per-client ``norms: float32[K]``.
    """
    K = client_mask.shape[0]

    def one(xs):
        b, cmask, idx = xs
        delta, aux, nex = client_update(params, b, jax.random.fold_in(rng, idx))
        clipped, norm, finite = clip_update(delta, clip_norm)
        w = client_weight(nex, weighting, weight_cap) * cmask * finite.astype(jnp.float32)
        contrib = jax.tree_util.tree_map(lambda x: x * w.astype(x.dtype), clipped)
        aux = jax.tree_util.tree_map(lambda a: a * cmask.astype(a.dtype), aux)
        stats = {"weight_sum": w, "norm_sum": jnp.where(finite, norm, 0.0) * cmask,
                 "num_clipped": (finite & (norm > clip_norm)).astype(jnp.float32) * cmask,
                 "num_nonfinite": (~finite).astype(jnp.float32) * cmask, "num_clients": cmask}
        return contrib, aux, stats, norm

    xs = (batches, client_mask, jnp.arange(K))
    if chunk_size is None or chunk_size >= K:
        contrib, aux, stats, norms = jax.vmap(one)(xs)
        total = jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), (contrib, aux, stats))
    else:
        if K % chunk_size:
            raise ValueError(f"cohort capacity {K} must be a multiple of chunk_size {chunk_size}")
        chunked = jax.tree_util.tree_map(lambda a: a.reshape((K // chunk_size, chunk_size) + a.shape[1:]), xs)

        def body(carry, chunk):
            c, a, s, n = jax.vmap(one)(chunk)
            part = jax.tree_util.tree_map(lambda v: jnp.sum(v, axis=0), (c, a, s))
            return jax.tree_util.tree_map(jnp.add, carry, part), n

        zero = jax.eval_shape(lambda: jax.tree_util.tree_map(
            lambda v: jnp.sum(v, axis=0), jax.vmap(one)(jax.tree_util.tree_map(lambda a: a[0], chunked))[:3]))
        zero = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), zero)
        total, norms = jax.lax.scan(body, zero, chunked)
        norms = norms.reshape(K)
    contrib_sum, aux_sum, stats = total
    stats = dict(stats, norms=norms, **{"aux": aux_sum})
    return contrib_sum, stats


def client_mesh(devices=None) -> Mesh:
    """A 1-D mesh named ``clients`` over ``devices`` (default: all)."""
    devices = np.asarray(jax.devices() if devices is None else devices)
    return Mesh(devices, ("clients",))


def shard_cohort(tree, mesh: Mesh):
    """Place every array of ``tree`` with its leading (cohort) axis split over ``mesh``."""
    n = mesh.devices.size

    def put(a):
        if a.shape[0] % n:
            raise ValueError(f"cohort axis {a.shape[0]} is not divisible by {n} devices; "
                             f"pad the cohort capacity to a multiple of the device count")
        return jax.device_put(a, NamedSharding(mesh, P("clients")))
    return jax.tree_util.tree_map(put, tree)


def replicate(tree, mesh: Mesh):
    return jax.tree_util.tree_map(lambda a: jax.device_put(a, NamedSharding(mesh, P())), tree)
