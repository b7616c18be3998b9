"""Client learning-rate decay across rounds, with any DP mechanism: local steps at
``eta_t = eta * decay^t`` in round t (the client step-size decay of Reddi et al. 2021, ICLR,
"Adaptive Federated Optimization", §5/App. "learning rate decay", and of Li et al. 2020, ICLR,
"On the Convergence of FedAvg on Non-IID Data", whose FedAvg bound needs a decaying local step).

An algorithm whose clients need server state: ``init`` reads the round index ``t`` from the
server's broadcast (``ServerView.round``) and puts the round's step-size factor ``decay^t`` in
the client's carry ``(params, opt_state, factor)``; each step scales the client optimizer's
update by it (for SGD and Adam alike, exactly the optimizer at learning rate ``eta decay^t``).

* **What leaves the client**: its model delta ``w - w_t`` and nothing else, which the engine
  clips to the mechanism's clip norm C, weights and sums (not a hook); ``factor`` stays on the
  client.
* **Why the DP guarantee is unchanged**: the round index is public, the released sum still has
  L2 sensitivity C per client, and the mechanism (noise, key, event) is the one passed in; so
  ``train`` charges exactly the event of DP-FedAvg / DP-FTRL with that mechanism and sampler.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedpriv.fl.algorithms import FederatedAlgorithm, build_algorithm
from fedpriv.fl.client import ClientHooks, params_delta, value_and_grad


def decayed_client(loss_fn: Callable, optimizer: optax.GradientTransformation, decay: float,
                   compute_dtype=None) -> ClientHooks:
    """Local ``optimizer`` steps on ``loss_fn``, each update scaled by ``decay ** round``."""
    if not 0 < decay <= 1:
        raise ValueError(f"decay must be in (0, 1], got {decay!r}")
    grad_fn = value_and_grad(loss_fn, compute_dtype)

    def init(server):
        factor = jnp.asarray(decay, jnp.float32) ** server.round.astype(jnp.float32)
        return server.params, optimizer.init(server.params), factor

    def step(server, carry, batch, rng):
        params, opt_state, factor = carry
        (_, aux), g = grad_fn(params, batch, rng)
        upd, opt_state = optimizer.update(g, opt_state, params)
        upd = jax.tree_util.tree_map(lambda u: (factor * u).astype(u.dtype), upd)
        return (optax.apply_updates(params, upd), opt_state, factor), aux

    return ClientHooks(init, step, params_delta)


def client_lr_decay(loss_fn: Callable, client_optimizer: optax.GradientTransformation,
                    server_optimizer: optax.GradientTransformation, dp, expected_cohort_size: float,
                    *, decay: float, compute_dtype=None, **kw) -> FederatedAlgorithm:
    """(DP-)FedAvg with client learning-rate decay: ``build_algorithm`` with
    ``decayed_client`` hooks; ``dp`` is any mechanism object, ``kw`` as for ``build_algorithm``."""
    client = decayed_client(loss_fn, client_optimizer, decay, compute_dtype)
    return build_algorithm(loss_fn, client_optimizer, server_optimizer, dp, expected_cohort_size,
                           compute_dtype=compute_dtype, client=client, **kw)
