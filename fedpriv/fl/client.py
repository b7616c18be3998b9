"""Local client training (FedAvg's ClientUpdate, McMahan et al. 2017), written for ONE client.

Model contract: ``loss_fn(params, batch, rng) -> (scalar loss, aux)`` with ``batch`` a dict of
``[B, ...]`` arrays including ``mask: float32[B]``; ``aux`` is a dict of per-batch *sums*.
The engine runs clients in lanes of local steps (``fedpriv.fl.aggregate.packed_sum``).

``make_local_step(loss_fn, optimizer)`` is local SGD as ONE step, ``step(params, opt_state,
batch, rng) -> (params, opt_state, aux)``; the packed-lane engine
(``fedpriv.fl.aggregate.packed_sum``) drives it over a lane of real steps only (the whole-client
``lax.scan`` over padded batches it equals is the tests' oracle, ``tests/oracles.py``).

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
    -> (params, opt_state, aux_sums)``. Identical math to one step of the tests' whole-client oracle.

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
