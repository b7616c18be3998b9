"""SCAFFOLD-style control variates (Karimireddy et al. 2020, ICML, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", Alg. 1, option II), with any DP mechanism: an
algorithm with server state and client state, in one file (docs/extending.md, "An algorithm").

Round t, client i with control variate ``c_i`` (its own state, kept on the client across the
rounds it takes part in) and the server's ``c`` (broadcast in ``ServerView.opt_state["c"]``):

    y <- x;  K times:  y <- y - eta (g_i(y) - c_i + c)                  (Alg. 1, line 10)
    c_i+ = c_i - c + (x - y) / (K eta)                                  (line 12, option II)
    release = {"model": y - x, "control": c_i+ - c_i}                   (line 13)

The server (``ServerHooks``) takes the noisy average ``{"model": D_x, "control": D_c}`` of the
releases: the server optimizer steps on ``-D_x`` (FedAvg with SGD at lr 1), and
``c <- c + control_scale * D_c`` (line 17: ``control_scale = |S| / N``, public: the expected
cohort over the population).

Privacy:

* **What leaves the client**: ``release`` only -- the model delta and the control-variate
  change, concatenated into ONE vector that the engine clips to the mechanism's clip norm C,
  weights and sums (``fedpriv.fl.aggregate``: not a hook). The sum's sensitivity is C, as for
  DP-FedAvg; ``train`` charges exactly the mechanism's event under the sampler.
* **What stays on the client**: ``c_i`` (``ClientHooks.state_init``; kept per client by the round
  loop, ``fedpriv.fl.client_state``), and the carry. Neither enters the sum or the server state.
* **The server's control variate** ``c`` is a function of the DP releases only: post-processing.

Unlike the paper (no DP), ``c_i``'s change is clipped and noised with the model delta, so the
control variates carry noise; ``control_scale`` and the clip norm trade that off.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedpriv.fl.algorithms import FederatedAlgorithm, build_algorithm
from fedpriv.fl.client import ClientHooks, ServerHooks, value_and_grad

__all__ = ["scaffold_client", "scaffold_server", "scaffold"]

tmap = jax.tree_util.tree_map


def scaffold_client(loss_fn: Callable, learning_rate: float, compute_dtype=None) -> ClientHooks:
    """SCAFFOLD's client (module docstring), local SGD at ``learning_rate`` on ``loss_fn(params,
    batch, rng) -> (loss, aux)``. Client state ``c_i`` (params-shaped, zeros at first);
    carry ``(y, c_i, c, steps)``; release ``{"model", "control"}``."""
    grad_fn = value_and_grad(loss_fn, compute_dtype)

    def state_init(params):
        return tmap(jnp.zeros_like, params)

    def init(server, c_i):
        return server.params, c_i, server.opt_state["c"], jnp.zeros((), jnp.float32)

    def step(server, carry, batch, rng):
        y, c_i, c, k = carry
        (_, aux), g = grad_fn(y, batch, rng)
        y = tmap(lambda w, gi, ci, cs: w - learning_rate * (gi - ci + cs), y, g, c_i, c)
        return (y, c_i, c, k + 1.0), aux

    def final(server, carry):
        y, c_i, c, k = carry
        scale = 1.0 / (jnp.maximum(k, 1.0) * learning_rate)
        new_c_i = tmap(lambda ci, cs, x, w: ci - cs + scale * (x - w), c_i, c, server.params, y)
        release = {"model": tmap(jnp.subtract, y, server.params),
                   "control": tmap(jnp.subtract, new_c_i, c_i)}
        return release, new_c_i

    return ClientHooks(init, step, final, state_init=state_init)


def scaffold_server(optimizer: optax.GradientTransformation, control_scale: float) -> ServerHooks:
    """SCAFFOLD's server on the privatized release (post-processing): ``optimizer`` steps on
    ``-D_x``; ``c <- c + control_scale * D_c``. State ``{"opt": optimizer state, "c": c}``."""
    def init(params):
        return {"opt": optimizer.init(params), "c": tmap(jnp.zeros_like, params)}

    def update(params, state, release_avg, round_idx):
        del round_idx
        grad = tmap(jnp.negative, release_avg["model"])
        updates, opt = optimizer.update(grad, state["opt"], params)
        c = tmap(lambda cs, d: cs + control_scale * d, state["c"], release_avg["control"])
        return optax.apply_updates(params, updates), {"opt": opt, "c": c}

    return ServerHooks(init, update)


def scaffold(loss_fn: Callable, learning_rate: float, server_opt: optax.GradientTransformation,
             dp, expected_cohort_size: float, num_clients: int, **kw) -> FederatedAlgorithm:
    """DP SCAFFOLD with mechanism ``dp`` (any ``DPConfig``); ``control_scale = expected cohort /
    num_clients`` (Alg. 1, line 17). ``kw``: ``build_algorithm``'s other options."""
    return build_algorithm(None, None, None, dp, expected_cohort_size,
                           client=scaffold_client(loss_fn, learning_rate, kw.pop("compute_dtype", None)),
                           server=scaffold_server(server_opt, expected_cohort_size / num_clients), **kw)
