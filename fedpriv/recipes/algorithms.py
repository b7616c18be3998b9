"""The LM-FL algorithms a config chooses among (``configs/lm_fl.py``'s ``algorithm`` field): each
one :class:`LMAlgorithm` object in the registry :data:`ALGORITHMS` -- its DP mechanism, its
client sampler, its client hooks and its server and client optimizers (docs/design.md §1,
principle 10; docs/extending.md, "An algorithm").

This module is light (it imports no JAX): the built-ins are declared by the *names* of their
parts, each resolved through its own registry (``fedpriv.registry``) when a run is built
(``fedpriv.recipes.lm_build.build_algorithm``), so configs validate their choice cheaply. A
researcher's algorithm is one file that calls :func:`register_algorithm`; a config then names it
as ``algorithm=<module>:<name>`` (the module is imported first; ``fedpriv.registry``,
"Plugins"). Its parts may be names or objects:

* ``mechanism``: a registered mechanism name (``fedpriv.registry.MECHANISMS``) or a
  ``DPConfig`` subclass; ``None`` for no noise (FedAvg);
* ``sampler``: a registered sampler name or ``factory(num_clients, cohort_size, seed)``;
* ``server_optimizer`` / ``client_optimizer``: a registered optimizer name or
  ``factory(learning_rate, **options)``; ``server_optimizer=None`` takes the config's
  ``server_optimizer`` field;
* ``client``: ``factory(loss_fn, client_optimizer, compute_dtype, cfg) -> ClientHooks`` (None:
  local SGD, ``fedpriv.fl.client.default_client``);
* ``server``: ``factory(server_optimizer, cfg, num_clients) -> ServerHooks`` (None: the server
  optimizer on the noisy average, ``fedpriv.fl.client.optimizer_server``).

The privacy event is always the mechanism's under the sampler (the loop derives it from the
objects that run): client and server hooks cannot change it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fedpriv.registry import MECHANISMS, OPTIMIZERS, SAMPLERS, Registry, UnknownName

__all__ = ["LMAlgorithm", "ALGORITHMS", "register_algorithm", "get_algorithm", "algorithm_names",
           "check_algorithm"]


@dataclasses.dataclass(frozen=True)
class LMAlgorithm:
    """One LM-FL algorithm (module docstring for each part)."""
    mechanism: str | type | None
    sampler: str | Callable
    server_optimizer: str | Callable | None = None
    client_optimizer: str | Callable = "sgd"
    client: Callable | None = None
    server: Callable | None = None
    description: str = ""

    @property
    def private(self) -> bool:
        """Whether it adds noise (has a mechanism)."""
        return self.mechanism is not None


def _check(name: str, obj: Any) -> None:
    if not isinstance(obj, LMAlgorithm):
        raise ValueError(f"LM-FL algorithm {name!r}: register an LMAlgorithm, got {type(obj).__name__}")


ALGORITHMS = Registry("LM-FL algorithm", check=_check)


def register_algorithm(name: str, algorithm: LMAlgorithm) -> LMAlgorithm:
    """Register ``algorithm`` under ``name`` (a name is bound once); returns it."""
    return ALGORITHMS.register(name, algorithm)


def get_algorithm(name: str) -> LMAlgorithm:
    """The algorithm named ``name`` (``"<module>:<name>"`` imports a plugin first); an unknown
    name raises ``fedpriv.registry.UnknownName`` listing the registered ones."""
    return ALGORITHMS.get(name)


def algorithm_names() -> tuple[str, ...]:
    return ALGORITHMS.names()


for _name, _mech, _sampler, _what in (
        ("fedavg", None, "shuffled", "FedAvg: no noise, shuffled passes"),
        ("dp_fedavg", "gaussian", "poisson", "DP-FedAvg, Poisson cohorts (McMahan et al. 2018)"),
        ("dp_ftrl", "tree", "shuffled", "DP-FTRL, one tree per shuffled pass (Kairouz et al. 2021)"),
        ("dp_mf_banded", "banded", "cyclic", "banded matrix-factorization DP-FTRL, cyclic cohorts"),
        ("dp_mf_blt", "blt", "cyclic", "BLT matrix-factorization DP-FTRL, cyclic cohorts"),
        ("dp_fedavg_fixed", "gaussian", "uniform", "central Gaussian, fixed-size cohorts (replace-one)"),
        ("dp_ddg", "ddg", "uniform", "distributed discrete Gaussian under secure aggregation"),
        ("dp_mf_banded_opt", "banded_opt", "cyclic", "banded MF, coefficients optimised (jax_privacy)")):
    register_algorithm(_name, LMAlgorithm(_mech, _sampler, description=_what))


def check_algorithm(name: str) -> LMAlgorithm:
    """The algorithm ``name``, with every part it names bound in its registry (cheap: no lazy
    built-in is resolved); ``ConfigError`` naming the algorithm and the unknown part."""
    alg = get_algorithm(name)
    parts = ((alg.mechanism, MECHANISMS), (alg.sampler, SAMPLERS),
             (alg.server_optimizer, OPTIMIZERS), (alg.client_optimizer, OPTIMIZERS))
    for part, registry in parts:
        if isinstance(part, str) and not registry.known(part):
            raise UnknownName(f"algorithm {name!r}: unknown {registry.kind} {part!r}; registered: "
                              f"{', '.join(sorted(registry.names()))}")
    return alg
