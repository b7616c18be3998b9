"""Distributed discrete Gaussian (DDG) under a simulated secure aggregation.

Kairouz, Liu & Steinke 2021, "The distributed discrete Gaussian mechanism for federated
learning with secure aggregation" (ICML), Alg. 1. Host-side NumPy simulation of one round:

client i (update ``x_i``, ``[d]``):
  1. clip to L2 norm ``c``; zero-pad to ``D = 2^ceil(log2 d)``;
  2. rotate: ``y = H diag(s) x / sqrt(D)`` (randomized Walsh-Hadamard, signs ``s`` shared
     public randomness of the round), and scale ``y / gamma`` (granularity ``gamma``);
  3. *conditional* stochastic rounding to integers, re-drawn until the integer vector's norm
     is at most ``Delta_2`` (``l2_bound``; ``beta`` = the paper's rounding bias parameter);
  4. add a discrete Gaussian share ``N_Z(0, sigma_int^2)`` per coordinate (Canonne, Kamath &
     Steinke 2020, Alg. 3: rejection from a discrete Laplace);
  5. send ``(.) mod 2^bits`` to secure aggregation.
server: sums the survivors' messages mod ``M = 2^bits``, maps to ``[-M/2, M/2)``, multiplies by
``gamma``, rotates back and drops the padding: the noisy sum of the survivors' clipped updates.

Scale: ``gamma`` is chosen so that the sum cannot wrap (``choose_gamma``): every rotated
coordinate of a clipped vector is ``<= c r``, ``r = sqrt(2 ln(2 D n / rotation_failure) / D)``
(sub-Gaussian tail of the randomized Hadamard transform, union over coordinates and clients),
rounding adds ``< 1`` per client, and the noise sum stays within ``k_stddevs`` of its std:
``n c r / gamma + n + k sigma_sum / gamma <= M / 2 - 1``. (Worst case: all clients aligned.)

Noise: ``noise_multiplier z`` is the target std of the *sum's* noise over ``c`` (as elsewhere
in fedpriv) for the planned ``floor(n (1 - dropout_rate))`` survivors: each client adds
``sigma_int^2 = (z c / gamma)^2 / n_planned``. Clients that drop send nothing — their shares are
missing — so the noise is that of the *survivors only*, and ``epsilon(survivors)`` accounts
with the actual survivor count.

Accounting (the paper's bound, not a conservative Gaussian stand-in): Kairouz et al. 2021,
Prop. 14 / Thm. 1, RDP of the sum of ``n`` discrete Gaussians of variance ``sigma^2`` with
integer sensitivities ``Delta_2`` and ``Delta_1 <= min(sqrt(D) Delta_2, Delta_2^2)``:
``eps(alpha) = min(alpha/2 s2^2 + tau D, alpha/2 (s2^2 + 2 s1 tau + tau^2 D),
alpha/2 (s2 + sqrt(D) tau)^2)``, ``s_p = Delta_p / (sqrt(n) sigma)``,
``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))``; composed over rounds and
converted to (eps, delta) with ``dp_accounting``'s RDP conversion. No sampling amplification.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc

RDP_ORDERS = tuple(float(a) for a in (*range(2, 129), 256, 512))  # integer orders, as the paper


# ----------------------------------------------------------------------------- primitives
def discrete_gaussian(rng: np.random.Generator, sigma: float, shape) -> np.ndarray:
    """Samples of ``N_Z(0, sigma^2)`` (``P(k) ~ exp(-k^2 / 2 sigma^2)``), int64, ``shape``."""
    if sigma < 0:
        raise ValueError(f"discrete Gaussian sigma must be >= 0, got {sigma}")
    out = np.zeros(shape, np.int64)
    if sigma == 0:
        return out
    t = math.floor(sigma) + 1
    p = -math.expm1(-1.0 / t)  # discrete Laplace(t) = difference of two Geometric(p)
    todo = np.ones(shape, bool)
    while todo.any():
        m = int(todo.sum())
        y = rng.geometric(p, m) - rng.geometric(p, m)
        accept = rng.random(m) < np.exp(-np.square(np.abs(y) - sigma ** 2 / t) / (2 * sigma ** 2))
        idx = np.flatnonzero(todo)[accept]
        out.flat[idx] = y[accept]
        todo.flat[idx] = False
    return out


def discrete_gaussian_variance(sigma: float) -> float:
    """Exact variance of ``N_Z(0, sigma^2)`` (slightly below ``sigma^2`` for small sigma)."""
    if sigma == 0:
        return 0.0
    k = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41, dtype=np.float64)
    w = np.exp(-k ** 2 / (2 * sigma ** 2))
    return float((k ** 2 * w).sum() / w.sum())


def _fwht(x):
    """Normalised, order-consistent fast Walsh-Hadamard transform (self-inverse)."""
    x = np.array(x, np.float64)
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"Hadamard length must be a power of 2, got {n}")
    h = 1
    while h < n:
        x = x.reshape(x.shape[:-1] + (n // (2 * h), 2, h))
        a, b = x[..., 0, :], x[..., 1, :]
        x = np.stack([a + b, a - b], -2).reshape(x.shape[:-3] + (n,))
        h *= 2
    return x / math.sqrt(n)


# ----------------------------------------------------------------------------- configuration
@dataclasses.dataclass(frozen=True)
class DDGConfig:
    """One DDG round.

    Attributes:
      dim: d, the update's length (padded to ``padded_dim`` = next power of 2).
      num_clients: n, clients asked to contribute.
      clip: c, L2 clip norm of an update.
      noise_multiplier: z: std of the sum's noise over c for the planned survivors.
      bits: modulus ``M = 2^bits`` of secure aggregation.
      dropout_rate: planned fraction of clients that drop (noise calibrated for the rest).
      beta: conditional-rounding parameter (paper: ``exp(-1/2)``).
      k_stddevs, rotation_failure: overflow margins of ``choose_gamma``.
    """
    dim: int
    num_clients: int
    clip: float
    noise_multiplier: float
    bits: int
    dropout_rate: float = 0.0
    beta: float = math.exp(-0.5)
    k_stddevs: float = 7.0
    rotation_failure: float = 1e-9

    def __post_init__(self):
        if self.dim < 1 or self.num_clients < 1:
            raise ValueError(f"dim and num_clients must be >= 1, got {self.dim}, {self.num_clients}")
        if not (self.clip > 0 and self.noise_multiplier >= 0):
            raise ValueError(f"need clip > 0 and noise_multiplier >= 0, got {self.clip}, "
                             f"{self.noise_multiplier}")
        if not 2 <= self.bits <= 62:
            raise ValueError(f"bits must be in [2, 62], got {self.bits}")
        if not 0 <= self.dropout_rate < 1:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")
        if self.modulus // 2 - 1 - self.num_clients <= 0:
            raise ValueError(f"{self.bits} bits cannot hold the sum of {self.num_clients} rounded "
                             f"integers: need 2^bits / 2 > num_clients + 1")

    @property
    def modulus(self) -> int:
        return 1 << int(self.bits)

    @property
    def padded_dim(self) -> int:
        return 1 << max(0, (int(self.dim) - 1).bit_length())

    @property
    def planned_survivors(self) -> int:
        return max(1, math.floor(self.num_clients * (1 - self.dropout_rate)))

    @property
    def sum_std(self) -> float:
        """Target std of the noise on the (real-valued) sum: ``z c``."""
        return self.noise_multiplier * self.clip

    @property
    def gamma(self) -> float:
        """Granularity: the smallest scale at which the sum cannot wrap (module docstring)."""
        D, n = self.padded_dim, self.num_clients
        r = min(1.0, math.sqrt(2 * math.log(2 * D * n / self.rotation_failure) / D))
        noise = self.k_stddevs * self.sum_std * math.sqrt(n / self.planned_survivors)
        return (n * self.clip * r + noise) / (self.modulus // 2 - 1 - n)

    @property
    def local_sigma(self) -> float:
        """Per-client discrete Gaussian parameter ``sigma_int`` (integer units)."""
        return self.sum_std / self.gamma / math.sqrt(self.planned_survivors)

    @property
    def l2_bound(self) -> float:
        """``Delta_2``: L2 norm bound of a conditionally rounded scaled update (Kairouz et al.
        2021, Eq. (5)): ``min(sqrt(a^2 + D/4 + sqrt(2 ln(1/beta)) (a + sqrt(D)/2)), a + sqrt(D))``,
        ``a = c / gamma``."""
        a, D = self.clip / self.gamma, self.padded_dim
        b2 = a * a + D / 4 + math.sqrt(2 * math.log(1 / self.beta)) * (a + math.sqrt(D) / 2)
        return min(math.sqrt(b2), a + math.sqrt(D)) if self.beta > 0 else a + math.sqrt(D)

    @property
    def l1_bound(self) -> float:
        """``Delta_1`` of an integer vector of L2 norm ``<= Delta_2``: ``min(sqrt(D) Delta_2,
        Delta_2^2)``."""
        return min(math.sqrt(self.padded_dim) * self.l2_bound, self.l2_bound ** 2)


# ----------------------------------------------------------------------------- accounting
def ddg_rdp(cfg: DDGConfig, survivors: int, rounds: int = 1, orders=RDP_ORDERS) -> np.ndarray:
    """RDP ``[len(orders)]`` of ``rounds`` DDG rounds summed over ``survivors`` clients (the
    noise of the survivors only; add/remove one survivor), Kairouz et al. 2021 Prop. 14."""
    n = int(survivors)
    if not 1 <= n <= cfg.num_clients:
        raise ValueError(f"survivors must be in [1, {cfg.num_clients}], got {survivors}")
    sigma = cfg.local_sigma
    if sigma == 0:
        return np.full(len(orders), np.inf)
    tau = 10 * sum(math.exp(-2 * math.pi ** 2 * sigma ** 2 * k / (k + 1)) for k in range(1, n))
    s2 = cfg.l2_bound / (math.sqrt(n) * sigma)
    s1 = cfg.l1_bound / (math.sqrt(n) * sigma)
    D = cfg.padded_dim
    a = np.asarray(orders, np.float64)
    eps = np.minimum.reduce([a / 2 * s2 ** 2 + tau * D,
                             a / 2 * (s2 ** 2 + 2 * s1 * tau + tau ** 2 * D),
                             a / 2 * (s2 + math.sqrt(D) * tau) ** 2])
    return eps * int(rounds)


def ddg_epsilon(cfg: DDGConfig, survivors: int, delta: float, rounds: int = 1) -> float:
    """(eps, delta)-DP of ``rounds`` rounds with ``survivors`` surviving clients per round."""
    eps, _ = rdp_acc.compute_epsilon(RDP_ORDERS, ddg_rdp(cfg, survivors, rounds), delta)
    return float(eps)


# ----------------------------------------------------------------------------- one round
@dataclasses.dataclass(frozen=True)
class DDGRound:
    """What a simulated round produced.

    Attributes:
      decoded: ``[d]`` the server's decoded noisy sum of the survivors' clipped updates.
      clipped_sum: ``[d]`` the exact sum of the survivors' clipped updates (for evaluation).
      survivors: ``[n]`` bool mask of the clients whose messages arrived.
      modular_sum, integer_sum: ``[D]`` centred sum mod ``2^bits`` and the same sum without
        the modulus (equal iff nothing wrapped).
      rounding_variance: sum over survivors and coordinates of ``p (1 - p)`` (integer units).
    """
    decoded: np.ndarray
    clipped_sum: np.ndarray
    survivors: np.ndarray
    modular_sum: np.ndarray
    integer_sum: np.ndarray
    rounding_variance: float

    @property
    def num_survivors(self) -> int:
        return int(self.survivors.sum())

    @property
    def overflowed(self) -> bool:
        return not np.array_equal(self.modular_sum, self.integer_sum)


def _conditional_round(rng, y, bound, max_tries=1000):
    """Stochastic rounding of each row of ``y`` ``[n, D]``, redrawn until its L2 norm <= bound."""
    base = np.floor(y)
    frac = y - base
    out = base + (rng.random(y.shape) < frac)
    for _ in range(max_tries):
        bad = np.linalg.norm(out, axis=1) > bound
        if not bad.any():
            return out.astype(np.int64), float((frac * (1 - frac)).sum())
        out[bad] = base[bad] + (rng.random(y[bad].shape) < frac[bad])
    raise RuntimeError(f"conditional rounding failed {max_tries} times (bound {bound:.4g})")


def ddg_round(cfg: DDGConfig, updates: np.ndarray, seed: int, round_idx: int = 0,
              survivors: np.ndarray | None = None) -> DDGRound:
    """Simulate one DDG round on ``updates`` ``[n, d]``; ``survivors`` (bool ``[n]``) defaults to
    dropping each client independently with ``cfg.dropout_rate``."""
    x = np.asarray(updates, np.float64)
    n, D = cfg.num_clients, cfg.padded_dim
    if x.shape != (n, cfg.dim):
        raise ValueError(f"updates must be [{n}, {cfg.dim}], got {list(x.shape)}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 7, int(round_idx)]))
    if survivors is None:
        survivors = rng.random(n) >= cfg.dropout_rate
    survivors = np.asarray(survivors, bool)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x * np.minimum(1.0, cfg.clip / np.maximum(norms, 1e-30))
    signs = rng.choice([-1.0, 1.0], D)             # the round's shared public randomness
    padded = np.zeros((n, D))
    padded[:, :cfg.dim] = x
    y = _fwht(padded * signs) / cfg.gamma
    ints, _ = _conditional_round(rng, y, cfg.l2_bound)
    frac = y - np.floor(y)
    shares = discrete_gaussian(rng, cfg.local_sigma, (n, D))
    M = cfg.modulus
    messages = np.mod(ints + shares, M)           # what each client sends to SecAgg
    alive = messages[survivors]
    modular = np.mod(alive.sum(0), M)
    modular = np.where(modular >= M // 2, modular - M, modular)
    integer = (ints + shares)[survivors].sum(0)
    decoded = signs * _fwht(modular * cfg.gamma)
    return DDGRound(decoded[:cfg.dim], x[survivors].sum(0), survivors, modular, integer,
                    float((frac * (1 - frac))[survivors].sum()))


def expected_error_variance(cfg: DDGConfig, result: DDGRound) -> float:
    """``E ||decoded - clipped_sum||^2`` over rounding and noise (rotation is orthogonal):
    ``gamma^2 (sum p (1 - p) + survivors * D * Var N_Z(0, sigma_int^2))`` (padding included;
    the decoded sum drops the padding, so compare over the full rotated space or d = D)."""
    noise = result.num_survivors * cfg.padded_dim * discrete_gaussian_variance(cfg.local_sigma)
    return cfg.gamma ** 2 * (result.rounding_variance + noise)
