"""Two-sided Geometric (discrete Laplace) mechanism (Ghosh, Roughgarden & Sundararajan 2009).

Koga et al. 2023 (`population_expansion_koga2023.md`, Sec. 4.2) release the per-domain unigram
counts with this mechanism at (eps0, delta0) = (0.8, 0). Host-side NumPy; randomness is always an
explicit ``np.random.Generator``.

Mechanism. For an integer-valued query f with L1 sensitivity Delta (||f(D) - f(D')||_1 <= Delta
for neighbouring D, D'), release f(D) + Z with Z drawn i.i.d. per coordinate from

    P(Z = k) = (1 - a) / (1 + a) * a^|k|,      k in Z,   a = exp(-eps / Delta).        (pmf)

The normaliser follows from sum_k a^|k| = 1 + 2a/(1 - a) = (1 + a)/(1 - a). Writing
a = exp(-t) with t = eps/Delta, (1 - a)/(1 + a) = tanh(t/2), which is exactly the pmf
``exp(-t|k|) * tanh(t/2)`` of ``dp_event.DiscreteLaplaceDpEvent(noise_parameter=t,
sensitivity=Delta)``.

Privacy: for any output y and neighbours, P(y - f(D)) / P(y - f(D')) =
a^(|y - f(D)|_1 - |y - f(D')|_1) <= a^(-Delta) = e^eps (triangle inequality, coordinatewise), so
the mechanism is (eps, 0)-DP; equivalently P(k)/P(k + Delta) = e^eps for k >= 0.

Sampler. If G1, G2 are i.i.d. geometric on {0, 1, 2, ...} with P(G = g) = (1 - a) a^g, then
Z = G1 - G2 has, for k >= 0,

    P(Z = k) = sum_{g>=0} P(G1 = g + k) P(G2 = g) = (1 - a)^2 a^k sum_g a^(2g)
             = (1 - a)^2 a^k / (1 - a^2) = (1 - a)/(1 + a) a^k,

and by symmetry the same with |k| for k < 0: exactly (pmf). NumPy's ``Generator.geometric(p)``
counts trials up to and including the first success (support {1, 2, ...}); the +1 offsets cancel
in the difference, and its success probability is p = 1 - a = -expm1(-t) (computed with expm1 so
small eps keep full precision). Moments: E Z = 0, Var Z = 2 Var G = 2a/(1 - a)^2.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event

__all__ = [
    "geometric_alpha",
    "geometric_noise",
    "geometric_pmf",
    "geometric_log_pmf",
    "geometric_variance",
    "geometric_dp_event",
    "geometric_epsilon",
    "geometric_mechanism",
]


def _check_eps_sensitivity(epsilon: float, sensitivity: int) -> tuple[float, int]:
    epsilon = float(epsilon)
    if not math.isfinite(epsilon) or epsilon <= 0.0:
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if isinstance(sensitivity, bool) or int(sensitivity) != sensitivity or sensitivity < 1:
        raise ValueError(f"L1 sensitivity must be a positive integer, got {sensitivity!r}")
    return epsilon, int(sensitivity)


def _noise_parameter(epsilon: float, sensitivity: int) -> float:
    """t = eps / Delta, so that a = exp(-t)."""
    epsilon, sensitivity = _check_eps_sensitivity(epsilon, sensitivity)
    return epsilon / sensitivity


def geometric_alpha(epsilon: float, sensitivity: int = 1) -> float:
    """a = exp(-eps / Delta), the ratio P(k + 1) / P(k) of the two-sided Geometric pmf (k >= 0)."""
    return math.exp(-_noise_parameter(epsilon, sensitivity))


def geometric_noise(
    rng: np.random.Generator, epsilon: float, sensitivity: int = 1, size=None
) -> np.ndarray:
    """Two-sided Geometric noise, int64 array of shape ``size``: Z = G1 - G2 (see module doc).

    Args:
      rng: explicit NumPy generator (the only source of randomness).
      epsilon: pure-DP parameter of one release (> 0).
      sensitivity: L1 sensitivity Delta of the integer query the noise is added to.
      size: output shape (None for a scalar-shaped array).
    """
    t = _noise_parameter(epsilon, sensitivity)
    p = -math.expm1(-t)  # 1 - a, success probability of each geometric variable
    g1 = rng.geometric(p, size=size)
    g2 = rng.geometric(p, size=size)
    return np.asarray(g1, dtype=np.int64) - np.asarray(g2, dtype=np.int64)


def geometric_log_pmf(k, epsilon: float, sensitivity: int = 1) -> np.ndarray:
    """log P(Z = k) = log tanh(t/2) - t|k| with t = eps/Delta; float64 of k's shape."""
    t = _noise_parameter(epsilon, sensitivity)
    k = np.asarray(k)
    if not np.issubdtype(k.dtype, np.integer):
        raise ValueError("k must be an integer array")
    return math.log(math.tanh(t / 2.0)) - t * np.abs(k).astype(np.float64)


def geometric_pmf(k, epsilon: float, sensitivity: int = 1) -> np.ndarray:
    """P(Z = k) = (1 - a)/(1 + a) a^|k|, a = exp(-eps/Delta); float64 of k's shape."""
    return np.exp(geometric_log_pmf(k, epsilon, sensitivity))


def geometric_variance(epsilon: float, sensitivity: int = 1) -> float:
    """Var Z = 2a/(1 - a)^2 with a = exp(-eps/Delta)."""
    t = _noise_parameter(epsilon, sensitivity)
    a = math.exp(-t)
    return 2.0 * a / math.expm1(-t) ** 2


def geometric_dp_event(epsilon: float, sensitivity: int = 1) -> dp_event.DiscreteLaplaceDpEvent:
    """The ``dp_accounting`` event of one release: DiscreteLaplace(eps/Delta, sensitivity=Delta).

    ``PLDAccountant`` (ADD_OR_REMOVE_ONE or REPLACE_SPECIAL) composes it; its pure epsilon is
    ``geometric_epsilon(event)``.
    """
    t = _noise_parameter(epsilon, sensitivity)
    return dp_event.DiscreteLaplaceDpEvent(noise_parameter=t, sensitivity=int(sensitivity))


def geometric_epsilon(event: dp_event.DiscreteLaplaceDpEvent) -> float:
    """Pure epsilon (delta = 0) of a DiscreteLaplaceDpEvent: noise_parameter * sensitivity."""
    if not isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        raise TypeError(f"expected DiscreteLaplaceDpEvent, got {type(event).__name__}")
    if event.noise_parameter <= 0:
        return math.inf
    return float(event.noise_parameter) * int(event.sensitivity)


def geometric_mechanism(
    values, rng: np.random.Generator, epsilon: float, sensitivity: int
) -> np.ndarray:
    """values + i.i.d. two-sided Geometric noise; int64 of values' shape. (eps, 0)-DP if the
    L1 sensitivity of ``values`` (integer array) is at most ``sensitivity``."""
    values = np.asarray(values)
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError("the Geometric mechanism releases integer-valued queries")
    return values.astype(np.int64) + geometric_noise(rng, epsilon, sensitivity, size=values.shape)
