"""Optimised banded matrix-factorization DP-FTRL: a new mechanism in one file.

``OptimizedBandedMechanism`` ("banded_opt") is banded MF DP-FTRL whose ``bands`` Toeplitz
coefficients are *optimised* for the prefix-sum workload of the run's ``mf_rounds`` rounds
(Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization: a unified approach to
private training", NeurIPS, §4: minimise the mean squared error of the noisy prefix sums over
banded Toeplitz ``C`` normalised to unit sensitivity), instead of the banded square root that
``"banded"`` uses (Kalinin & Lampert 2024). The optimisation is jax_privacy's own
(``jax_privacy.matrix_factorization.toeplitz.optimize_banded_toeplitz``, by the paper's authors):
fedpriv does not re-implement it. jax_privacy is an optional dependency (``pip install
fedpriv[mf]``); without it this mechanism refuses to build, naming the missing package.

Everything else is inherited, which is the point of this file: the streaming privatizer
(``matrix.banded_privatizer``: ``w_t = (sigma Z_t - sum_k c_k w_{t-k}) / c_0``, keys from
``fold_in(key, t)``), the exact sensitivity under b-min-separation (``BandedStrategy.sensitivity``:
for any banded lower-triangular Toeplitz ``C`` the column norms are non-increasing, so the
worst participation pattern is ``0, b, 2b, ...``; it refuses ``b < bands``), the event
(``samplers.matrix_privacy_event``) and the amplification of ``AmplifiedCyclicSampler``
(Thm. 4 holds for any banded ``C``; ``banded = True``). Shapes: the coefficients are ``[bands]``;
the privatizer's buffers ``[bands - 1, *leaf]`` per parameter leaf.

Use: ``DPConfig(C, z, "banded_opt", ...)`` or ``OptimizedBandedMechanism(...)``, or
``algorithm=dp_mf_banded_opt`` in the LM-FL configs (``fedpriv.recipes.algorithms``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import numpy as np

from fedpriv.data.errors import MissingResourceError
from fedpriv.dp.matrix import BandedStrategy
from fedpriv.dp.mechanisms import MatrixDPConfig, register_mechanism
from fedpriv.errors import FedprivError

__all__ = ["OptimizedBandedMechanism", "optimized_banded_strategy"]


@functools.lru_cache(maxsize=32)
def optimized_banded_strategy(bands: int, rounds: int, steps: int = 250) -> BandedStrategy:
    """The ``bands``-banded Toeplitz ``C`` minimising the mean squared prefix-sum error over
    ``rounds`` rounds at unit single-participation sensitivity (jax_privacy's L-BFGS, float64,
    from its max-error initialisation; deterministic). Coefficients ``[bands]``, ``c_0 > 0``,
    L2 norm 1. Cached: the engine and the accounting share one object."""
    for name, v, lo in (("bands", bands, 1), ("rounds", rounds, 1), ("steps", steps, 1)):
        if isinstance(v, bool) or int(v) != v or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if bands > rounds:
        raise ValueError(f"bands={bands} > rounds={rounds}: a banded C has at most `rounds` bands")
    try:
        import jax
        from jax_privacy.matrix_factorization import toeplitz
    except ImportError:
        raise MissingResourceError("package `jax_privacy` (mechanism 'banded_opt')",
                                   hint="pip install 'fedpriv[mf]'") from None
    # a compile-time constant: evaluated eagerly even when the privatizer is built in a trace
    with jax.ensure_compile_time_eval(), jax.enable_x64(True):
        coef = np.asarray(toeplitz.optimize_banded_toeplitz(int(rounds), int(bands),
                                                            max_optimizer_steps=int(steps)), np.float64)
    if not (np.all(np.isfinite(coef)) and coef[0] > 0):
        raise FedprivError(f"the banded optimisation returned unusable coefficients {coef[:4]}...")
    return BandedStrategy(tuple(float(c) for c in coef))


@dataclasses.dataclass(frozen=True)
class OptimizedBandedMechanism(MatrixDPConfig):
    """Banded MF with optimised coefficients (module docstring). Fields as ``MatrixDPConfig``:
    ``bands`` (<= ``min_separation``, which the sampler must guarantee) and ``mf_rounds`` (the
    workload the coefficients are optimised for; ``run_fields`` sets both from the sampler)."""
    mechanism: str = "banded_opt"
    banded: ClassVar[bool] = True

    @property
    def strategy(self) -> BandedStrategy:
        if self.mf_rounds < 1:
            raise ValueError("banded_opt needs the planned rounds (mf_rounds >= 1) to optimise for")
        # more bands than rounds never act: optimise the ones that do (the min-separation the
        # accounting requires stays >= self.bands, the stricter)
        return optimized_banded_strategy(min(self.bands, self.mf_rounds), self.mf_rounds)


register_mechanism("banded_opt", OptimizedBandedMechanism)
