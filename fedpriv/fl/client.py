"""Local client training (FedAvg's ClientUpdate, McMahan et al. 2017), written for ONE client.

Model contract: ``loss_fn(params, batch, rng) -> (scalar loss, aux)`` with ``batch`` a dict of
``[B, ...]`` arrays including ``mask: float32[B]``; ``aux`` is a dict of per-batch *sums*.
The engine runs clients in lanes of local steps (``fedpriv.fl.aggregate.packed_sum``).

``make_local_step(loss_fn, optimizer)`` is local SGD as ONE step, ``step(params, opt_state,
batch, rng) -> (params, opt_state, aux)``; the packed-lane engine
(``fedpriv.fl.aggregate.packed_sum``) drives it over a lane of real steps only (the whole-client
``lax.scan`` over padded batches it equals is the tests' oracle, ``tests/oracles.py``).

**Client hooks** (docs/design.md §1 principle 10; fedjax's ``for_each_client`` init/step/final):
``ClientHooks(init, step, final)`` is what ONE client does in a round, written unbatched:

* ``init(server) -> carry``: the client's starting state from ``server: ServerView`` (the
  server model, the server hooks' state and the round index: everything the server
  broadcasts; never the noise state, whose keys are secret);
* ``step(server, carry, batch[B, ...], rng) -> (carry, aux_sums)``: one local step;
* ``final(server, carry) -> release``: what the client sends: its model delta (a params-shaped
  pytree, ``params_delta``) or any pytree of floats (e.g. ``{"model": delta, "control":
  delta_c}``: a SCAFFOLD-style control-variate update rides beside the model delta, not in the
  params); the server's hooks (``ServerHooks``) read it after the privatized release.

The engine (``fedpriv.fl.aggregate``) then clips ``release`` -- the whole pytree, as ONE vector --
to the mechanism's clip norm, weights and sums it: that part is NOT a hook, so no algorithm can
change the sum's sensitivity or send anything but its clipped release. ``default_client(loss_fn,
optimizer)`` is local SGD (carry ``(params, opt_state)``, release ``params - server.params``).

**What stays on the client.** The carry lives for one round on the client. State a client keeps
*across* the rounds it takes part in (SCAFFOLD's control variate ``c_i``) is declared with
``ClientHooks(..., state_init=f)``: ``f(params) -> client_state`` (a pytree; every client starts
from it), and then ``init(server, client_state) -> carry`` and ``final(server, carry) ->
(release, client_state)``. The engine keeps each client's state for that client alone
(``fedpriv.fl.loop.train`` stores it per population member and checkpoints it with the run);
it never enters the sum, the server's state, the metrics or any other client's hooks, so it
releases nothing (only ``release`` leaves the client, clipped). Such hooks cannot use the
batched first steps (``CohortExecutor(first_steps=True)``).

**The server's hooks** (``ServerHooks(init, update)``, pfl-research's
``process_aggregated_statistics``): ``init(params) -> server_state`` and ``update(params,
server_state, release_avg, round) -> (params, server_state)``, run after the privatized release
on ``release_avg`` -- the noisy sum of the clipped releases divided by the public expected
cohort size. A function of the DP release (and of earlier, already public, server state) is
**post-processing**: it costs no privacy and the run's event is the mechanism's alone.
``optimizer_server(tx)`` (the default) takes ``-release_avg`` as the server optimizer's
gradient (FedAvg / FedAvgM / FedAdam / FedYogi); its state is the optimizer's.
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
    model, the server hooks' state -- the server optimizer's by default -- and the round index
    are post-processing of earlier private releases). Never the noise state."""
    params: object
    opt_state: object
    round: jax.Array  # int32


@dataclasses.dataclass(frozen=True)
class ClientHooks:
    """One client's work in a round (module docstring): ``init(server) -> carry``,
    ``step(server, carry, batch, rng) -> (carry, aux)``, ``final(server, carry) -> release``.
    The engine clips, weights and sums ``release``; a hook cannot skip that.

    ``state_init``: ``params -> client_state`` for a client that keeps state across rounds on
    the client (module docstring, "What stays on the client"); then ``init(server,
    client_state)`` and ``final(server, carry) -> (release, client_state)``."""
    init: Callable
    step: Callable
    final: Callable
    state_init: Callable | None = None

    @property
    def stateful(self) -> bool:
        """Whether the clients keep state across rounds (``state_init`` is set)."""
        return self.state_init is not None


@dataclasses.dataclass(frozen=True)
class ServerHooks:
    """The server's side of an algorithm after the privatized release (module docstring):
    ``init(params) -> server_state``; ``update(params, server_state, release_avg, round) ->
    (params, server_state)``, post-processing of the DP release ``release_avg`` (the noisy
    average of the clients' clipped releases). ``server_state`` is broadcast to the clients
    (``ServerView.opt_state``) and checkpointed with the run."""
    init: Callable
    update: Callable


def optimizer_server(optimizer: optax.GradientTransformation) -> ServerHooks:
    """The default server: ``optimizer`` (optax) takes ``-release_avg`` (a params-shaped noisy
    average delta) as its gradient. With SGD at learning rate 1 this is FedAvg; momentum
    FedAvgM, Adam FedAdam, Yogi FedYogi (Reddi et al. 2021)."""
    def update(params, opt_state, release_avg, round_idx):
        del round_idx
        grad = jax.tree_util.tree_map(jnp.negative, release_avg)
        updates, opt_state = optimizer.update(grad, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    return ServerHooks(optimizer.init, update)


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
