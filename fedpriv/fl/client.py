"""Local client training (FedAvg's ClientUpdate, McMahan et al. 2017), written for ONE client.

``make_client_update(loss_fn, optimizer)`` returns
``update(params, batches, rng) -> (delta, aux_sums, num_examples)`` which runs the optax
``optimizer`` over the client's padded batches with ``lax.scan``. ``batches`` holds arrays
``[S, B, ...]`` and ``batches['mask']: float32[S, B]``; a step whose mask is all zero is a
no-op (``jnp.where(step_is_real, new, old)`` on parameters and optimizer state), so padding
never changes the result. ``delta = params_after - params``.

Model contract: ``loss_fn(params, batch, rng) -> (scalar loss, aux)`` with ``batch`` a dict of
``[B, ...]`` arrays including ``mask: float32[B]``; ``aux`` is a dict of per-batch *sums*.
The engine ``jax.vmap``s ``update`` over the cohort.

``make_local_step(loss_fn, optimizer)`` is the same local SGD as ONE step, ``step(params,
opt_state, batch, rng) -> (params, opt_state, aux)``; the packed-lane engine
(``fedpriv.fl.aggregate.packed_sum``) drives it over a lane of real steps only.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax


def _where(pred, new, old):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), new, old)


def make_client_update(loss_fn: Callable, optimizer: optax.GradientTransformation,
                       local_epochs: int = 1):
    if local_epochs < 1:
        raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def update(params, batches, rng):
        steps = batches["mask"].shape[0]
        step_real = jnp.sum(batches["mask"], axis=1) > 0            # [S]
        opt_state = optimizer.init(params)

        def step(carry, xs):
            p, s = carry
            batch, real, i = xs
            (_, aux), g = grad_fn(p, batch, jax.random.fold_in(rng, i))
            upd, s_new = optimizer.update(g, s, p)
            p_new = optax.apply_updates(p, upd)
            aux = jax.tree_util.tree_map(lambda a: jnp.where(real, a, jnp.zeros_like(a)), aux)
            return (_where(real, p_new, p), _where(real, s_new, s)), aux

        carry = (params, opt_state)
        aux_total = None
        for e in range(local_epochs):
            idx = jnp.arange(steps) + e * steps
            carry, aux = jax.lax.scan(step, carry, (batches, step_real, idx))
            aux = jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), aux)
            aux_total = aux if aux_total is None else jax.tree_util.tree_map(jnp.add, aux_total, aux)
        delta = jax.tree_util.tree_map(jnp.subtract, carry[0], params)
        return delta, aux_total, jnp.sum(batches["mask"])

    return update


def cast_floats(tree, dtype):
    """``tree`` with its floating-point leaves cast to ``dtype`` (others untouched)."""
    return jax.tree_util.tree_map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def make_local_step(loss_fn: Callable, optimizer: optax.GradientTransformation,
                    compute_dtype=None):
    """One local step of ``optimizer`` on ``loss_fn``: ``(params, opt_state, batch[B, ...], rng)
    -> (params, opt_state, aux_sums)``. Identical math to one step of ``make_client_update``.

    ``compute_dtype`` (e.g. ``jnp.bfloat16``): the forward/backward pass runs on parameters cast
    to it (mixed precision); the parameters, their gradients (the cast's transpose returns them
    in float32), the optimizer update, and everything after (clipping, sums, noise) stay float32.
    """
    if compute_dtype is None:
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    else:
        grad_fn = jax.value_and_grad(
            lambda p, b, r: loss_fn(cast_floats(p, compute_dtype), b, r), has_aux=True)

    def step(params, opt_state, batch, rng):
        (_, aux), g = grad_fn(params, batch, rng)
        upd, opt_state = optimizer.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, aux

    return step
