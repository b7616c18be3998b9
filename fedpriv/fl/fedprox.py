"""FedProx (Li et al. 2020, MLSys, "Federated Optimization in Heterogeneous Networks", Alg. 2),
with any DP mechanism: a new FL algorithm in one file (docs/extending.md, "An algorithm").

Each client minimises the proximal local objective

    h_k(w; w_t) = f_k(w) + mu/2 ||w - w_t||^2                                (Li et al. eq. 2)

from the server model ``w_t``, by the client optimizer on ``grad f_k(w) + mu (w - w_t)`` (the
proximal gradient is added in closed form, so the model's ``loss_fn`` and its metrics are
unchanged). ``mu = 0`` is FedAvg's local SGD exactly. Only the local objective changes:

* **What leaves the client**: its model delta ``w - w_t`` and nothing else, which the engine
  clips to the mechanism's clip norm C, weights and sums as for DP-FedAvg (not a hook:
  ``fedpriv.fl.aggregate._finish_client``).
* **Why the DP guarantee is unchanged**: the released sum still has L2 sensitivity C per client
  and the mechanism (its noise, its key, its privacy event) is the one passed in; ``w_t`` is
  the server model, already public to the clients. ``train`` charges the same event as for
  DP-FedAvg / DP-FTRL with the same mechanism and sampler.
"""
from __future__ import annotations

from typing import Callable

import jax
import optax

from fedpriv.fl.algorithms import FederatedAlgorithm, build_algorithm
from fedpriv.fl.client import ClientHooks, params_delta, value_and_grad


def fedprox_client(loss_fn: Callable, optimizer: optax.GradientTransformation, mu: float,
                   compute_dtype=None) -> ClientHooks:
    """FedProx's client: local ``optimizer`` steps on ``loss_fn + mu/2 ||w - w_server||^2``.

    Carry ``(params, opt_state)``; ``loss_fn(params, batch, rng) -> (loss, aux)`` as for
    ``build_algorithm``."""
    if not mu >= 0:
        raise ValueError(f"FedProx needs mu >= 0, got {mu!r}")
    grad_fn = value_and_grad(loss_fn, compute_dtype)

    def init(server):
        return server.params, optimizer.init(server.params)

    def step(server, carry, batch, rng):
        params, opt_state = carry
        (_, aux), g = grad_fn(params, batch, rng)
        g = jax.tree_util.tree_map(lambda gi, w, w0: gi + mu * (w - w0), g, params, server.params)
        upd, opt_state = optimizer.update(g, opt_state, params)
        return (optax.apply_updates(params, upd), opt_state), aux

    return ClientHooks(init, step, params_delta)


def fedprox(loss_fn: Callable, client_optimizer: optax.GradientTransformation,
            server_optimizer: optax.GradientTransformation, dp, expected_cohort_size: float, *,
            mu: float, compute_dtype=None, **kw) -> FederatedAlgorithm:
    """(DP-)FedProx: ``build_algorithm`` with ``fedprox_client`` hooks; ``dp`` is any mechanism
    object (``fedpriv.dp.mechanisms``), ``kw`` as for ``build_algorithm``."""
    client = fedprox_client(loss_fn, client_optimizer, mu, compute_dtype)
    return build_algorithm(loss_fn, client_optimizer, server_optimizer, dp, expected_cohort_size,
                           compute_dtype=compute_dtype, client=client, **kw)
