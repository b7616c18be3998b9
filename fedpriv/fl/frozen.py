"""A federated algorithm whose loss reads large frozen arrays (a frozen base model) passed to the
jitted round as an argument (issue 53: DP federated LoRA of the public LLM).

``build_algorithm(loss_fn, ...)`` jits its round over ``loss_fn``; arrays that ``loss_fn``
closes over become *constants* of the compiled program. For a frozen 135M-parameter LLM that
embeds ~10^8 floats in the HLO (measured: a 113 MB matrix closed over by one jitted gradient
gave 226 MB of HLO text and 13 s of compilation, every compile, and a second copy in memory).
``build_frozen_algorithm(make_loss, frozen, ...)`` instead traces
``build_algorithm(make_loss(frozen_tracer), ..., jit=False)`` inside one ``jax.jit`` whose first
argument is ``frozen``: the same round (the engine's clipping, sums, noise, server step), the
frozen arrays an argument of the executable.

Privacy: unchanged. ``params`` (the trainable pytree, e.g. LoRA adapters) is what the clients
train and the engine clips to C, sums and noises; ``frozen`` is public (the public LLM), the
same in every round, and is no part of any update or release. The algorithm's ``dp`` is the
mechanism it is built with, so ``train`` charges exactly its event.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax

from fedpriv.fl import algorithms as algs


def build_frozen_algorithm(make_loss: Callable[[Any], Callable], frozen: Any, client_optimizer,
                           server_optimizer, dp, expected_cohort_size: float,
                           **kwargs) -> algs.FederatedAlgorithm:
    """``fedpriv.fl.algorithms.build_algorithm`` for a loss that needs ``frozen`` arrays.

    Args:
      make_loss: ``frozen -> loss_fn(params, batch, rng)`` (called at trace time with the traced
        ``frozen``; e.g. ``lambda fz: lambda p, b, r: task.loss_with(fz, p, b, r)``).
      frozen: a pytree of arrays, passed to the jitted round as its first argument.
      client_optimizer, server_optimizer, dp, expected_cohort_size, **kwargs: as
        ``build_algorithm`` (``local_epochs``, ``chunk_size``, ``compute_dtype``; ``client``
        hooks are not supported here: they would close over the loss).
    Returns:
      a ``FederatedAlgorithm`` whose ``apply`` takes the usual arguments (packed or padded cohort).
    """
    if "client" in kwargs or "jit" in kwargs:
        raise ValueError("build_frozen_algorithm builds its own jitted round from make_loss "
                         "(client hooks and jit= are not supported)")
    build = functools.partial(algs.build_algorithm, client_optimizer=client_optimizer,
                              server_optimizer=server_optimizer, dp=dp,
                              expected_cohort_size=expected_cohort_size, jit=False, **kwargs)
    base = build(make_loss(frozen))  # init, dp and the fields (init never calls the loss)

    def apply(fz, state, cohort, client_mask, key, first=None, client_states=None):
        return build(make_loss(fz)).apply(state, cohort, client_mask, key, first, client_states)

    return dataclasses.replace(base, apply=functools.partial(jax.jit(apply), frozen))
