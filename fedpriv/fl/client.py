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

**Client hooks** (docs/design.md principle 10; fedjax's ``for_each_client`` init/step/final):
``ClientHooks(init, step, final)`` is what ONE client does in a round, written unbatched:

* ``init(server) -> carry``: the client's starting state from ``server: ServerView`` (the
  server model, the server optimizer state and the round index: everything the server
  broadcasts; never the noise state, whose keys are secret);
* ``step(server, carry, batch[B, ...], rng) -> (carry, aux_sums)``: one local step;
* ``final(server, carry) -> delta``: the client's model update (a params-shaped pytree).

The engine (``fedpriv.fl.aggregate``) then clips ``delta`` to the mechanism's clip norm,
weights and sums it: that part is NOT a hook, so no algorithm can change the sum's sensitivity
or send anything but its clipped update. ``default_client(loss_fn, optimizer)`` is local SGD
(carry ``(params, opt_state)``, delta ``params - server.params``): today's computation.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct


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


def value_and_grad(loss_fn: Callable, compute_dtype=None):
    """``jax.value_and_grad(loss_fn, has_aux=True)``, the pass run at ``compute_dtype`` if given
    (see ``make_local_step``)."""
    if compute_dtype is None:
        return jax.value_and_grad(loss_fn, has_aux=True)
    return jax.value_and_grad(
        lambda p, b, r: loss_fn(cast_floats(p, compute_dtype), b, r), has_aux=True)


def make_local_step(loss_fn: Callable, optimizer: optax.GradientTransformation,
                    compute_dtype=None):
    """One local step of ``optimizer`` on ``loss_fn``: ``(params, opt_state, batch[B, ...], rng)
    -> (params, opt_state, aux_sums)``. Identical math to one step of ``make_client_update``.

    ``compute_dtype`` (e.g. ``jnp.bfloat16``): the forward/backward pass runs on parameters cast
    to it (mixed precision); the parameters, their gradients (the cast's transpose returns them
    in float32), the optimizer update, and everything after (clipping, sums, noise) stay float32.
    """
    grad_fn = value_and_grad(loss_fn, compute_dtype)

    def step(params, opt_state, batch, rng):
        (_, aux), g = grad_fn(params, batch, rng)
        upd, opt_state = optimizer.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, aux

    return step


@struct.dataclass
class ServerView:
    """What the server broadcasts to the clients of a round (all of it public to them: the
    model, the server optimizer's state and the round index are post-processing of earlier
    private releases). Never the noise state."""
    params: object
    opt_state: object
    round: jax.Array  # int32


@dataclasses.dataclass(frozen=True)
class ClientHooks:
    """One client's work in a round (module docstring): ``init(server) -> carry``,
    ``step(server, carry, batch, rng) -> (carry, aux)``, ``final(server, carry) -> delta``.
    The engine clips, weights and sums ``delta``; a hook cannot skip that."""
    init: Callable
    step: Callable
    final: Callable


def params_delta(server: ServerView, carry):
    """The default ``final``: the local model (``carry[0]``) minus the server model."""
    return jax.tree_util.tree_map(jnp.subtract, carry[0], server.params)


def step_hooks(local_step: Callable, opt_init: Callable) -> ClientHooks:
    """Hooks of a plain ``local_step(params, opt_state, batch, rng) -> (params, opt_state,
    aux)`` whose clients start from ``(server.params, opt_init(server.params))``."""
    def init(server):
        return server.params, opt_init(server.params)

    def step(server, carry, batch, rng):
        p, s, aux = local_step(carry[0], carry[1], batch, rng)
        return (p, s), aux

    return ClientHooks(init, step, params_delta)


def default_client(loss_fn: Callable, optimizer: optax.GradientTransformation,
                   compute_dtype=None) -> ClientHooks:
    """Local ``optimizer`` steps on ``loss_fn`` (FedAvg's ClientUpdate): the engine's default."""
    return step_hooks(make_local_step(loss_fn, optimizer, compute_dtype), optimizer.init)
