"""The built-in optimizers a config names (``fedpriv.registry.OPTIMIZERS``): ``factory(learning_rate,
**options) -> optax.GradientTransformation``, for the server (``client.optimizer_server``: FedAvg =
SGD at lr 1, FedAvgM = SGD with momentum, FedAdam = Adam; Reddi et al. 2021, ICLR, "Adaptive
Federated Optimization") and for the clients. A new one is one registration, e.g. FedYogi::

    OPTIMIZERS.register("yogi", lambda learning_rate, **_: optax.yogi(learning_rate, eps=1e-3))

``options`` are what the caller has (the LM recipe passes ``momentum=cfg.server_momentum`` to the
server's); a factory takes the ones it needs and ignores the rest.
"""
from __future__ import annotations

import optax

__all__ = ["sgd", "sgdm", "adam"]


def sgd(learning_rate: float, **_) -> optax.GradientTransformation:
    """Plain SGD (FedAvg's server at lr 1; local SGD)."""
    return optax.sgd(learning_rate)


def sgdm(learning_rate: float, momentum: float = 0.9, **_) -> optax.GradientTransformation:
    """SGD with heavy-ball momentum (FedAvgM)."""
    return optax.sgd(learning_rate, momentum=momentum)


def adam(learning_rate: float, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3,
         **_) -> optax.GradientTransformation:
    """Adam with Reddi et al. 2021's FedAdam defaults (eps = 1e-3)."""
    return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
