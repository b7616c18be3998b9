"""Distributed discrete Gaussian (DDG) under a simulated secure aggregation.

Kairouz, Liu & Steinke 2021, "The distributed discrete Gaussian mechanism for federated
learning with secure aggregation" (ICML), Alg. 1, in JAX: ``encode`` (one client) and ``decode``
(the server) are what the FL engine runs for ``mechanism="ddg"`` (``fedpriv.fl.algorithms``);
``ddg_round`` simulates one round with them on a matrix of updates:

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
In a ledger: ``ddg_event`` (a ``DistributedDiscreteGaussianDpEvent``, replace-one neighbours of
a fixed-size cohort, the worst survivor count a released round can have), accounted by
``fedpriv.dp.accounting`` with the other events' RDP at the same integer orders.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import attr
import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc

from fedpriv.dp.clipping import check_sensitivity_clip
from fedpriv.dp.noise import check_int

RDP_ORDERS = tuple(float(a) for a in (*range(2, 129), 256, 512))  # integer orders, as the paper


# ----------------------------------------------------------------------------- primitives
def discrete_gaussian(key, sigma: float, shape) -> jax.Array:
    """Samples of ``N_Z(0, sigma^2)`` (``P(k) ~ exp(-k^2 / 2 sigma^2)``), int32 ``shape``.

    Canonne, Kamath & Steinke 2020, Alg. 3: a discrete Laplace of scale ``t = floor(sigma) + 1``
    (the difference of two geometrics ``floor(t E)``, ``E ~ Exp(1)``: ``P(floor(t E) >= k) =
    exp(-k / t)``) accepted with probability ``exp(-(|y| - sigma^2 / t)^2 / 2 sigma^2)``
    (about 0.67-0.76). Vectorised: i.i.d. proposals in pools of ``1.4 n``; the accepted ones,
    in order, fill the ``n`` outputs (``lax.while_loop`` until all are filled) — exact, since
    the proposals are i.i.d. Float32 arithmetic: exact for the integers used (``|y| < 2^24``)."""
    sigma = float(sigma)
    if sigma < 0:
        raise ValueError(f"discrete Gaussian sigma must be >= 0, got {sigma}")
    shape = tuple(np.atleast_1d(shape)) if not isinstance(shape, tuple) else shape
    n = int(np.prod(shape))
    if sigma == 0:
        return jnp.zeros(shape, jnp.int32)
    t = math.floor(sigma) + 1
    pool = max(64, int(1.4 * n))

    def body(c):
        i, out, filled = c
        k1, k2, k3 = jax.random.split(jax.random.fold_in(key, i), 3)
        y = (jnp.floor(t * jax.random.exponential(k1, (pool,)))
             - jnp.floor(t * jax.random.exponential(k2, (pool,))))
        ok = jax.random.uniform(k3, (pool,)) < jnp.exp(
            -jnp.square(jnp.abs(y) - sigma ** 2 / t) / (2 * sigma ** 2))
        pos = filled + jnp.cumsum(ok) - 1  # the accepted proposals fill the next free slots
        out = out.at[jnp.where(ok, pos, n)].set(y, mode="drop")
        return i + 1, out, jnp.minimum(filled + jnp.sum(ok), n)

    _, out, _ = jax.lax.while_loop(lambda c: c[2] < n, body,
                                   (jnp.int32(0), jnp.zeros((n,), jnp.float32), jnp.int32(0)))
    return out.astype(jnp.int32).reshape(shape)


def fwht(x: jax.Array) -> jax.Array:
    """Normalised fast Walsh-Hadamard transform over the last axis (orthogonal, self-inverse);
    its length must be a power of 2."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"Hadamard length must be a power of 2, got {n}")
    lead, h = x.shape[:-1], 1
    while h < n:
        x = x.reshape(lead + (n // (2 * h), 2, h))
        x = jnp.stack([x[..., 0, :] + x[..., 1, :], x[..., 0, :] - x[..., 1, :]], -2)
        h *= 2
    return x.reshape(lead + (n,)) / math.sqrt(n)


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
        check_int("dim", self.dim)
        check_int("num_clients", self.num_clients)
        check_int("bits", self.bits, 2)
        check_sensitivity_clip(self.clip, "clip")  # the L2 bound the DDG sensitivity is stated from
        if not (self.clip > 0 and self.noise_multiplier >= 0):
            raise ValueError(f"need clip > 0 and noise_multiplier >= 0, got {self.clip}, "
                             f"{self.noise_multiplier}")
        if not 2 <= self.bits <= 31:
            raise ValueError(f"bits must be in [2, 31], got {self.bits}")
        if not 0 <= self.beta < 1:  # (Kairouz et al. 2021, Eq. (5): beta in [0, 1))
            raise ValueError(f"beta must be in [0, 1), got {self.beta}")
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
        if self.beta == 0:  # no conditioning: only the deterministic bound (log(1/0) is inf)
            return a + math.sqrt(D)
        b2 = a * a + D / 4 + math.sqrt(2 * math.log(1 / self.beta)) * (a + math.sqrt(D) / 2)
        return min(math.sqrt(b2), a + math.sqrt(D))

    @property
    def l2_sensitivity(self) -> float:
        """What the accounting uses: ``Delta_2 (1 + norm_error(D))``, the most a vector that
        passed the float32 norm check can have."""
        return self.l2_bound * (1 + norm_error(self.padded_dim))

    @property
    def l1_bound(self) -> float:
        """``Delta_1`` of an integer vector of L2 norm ``<= l2_sensitivity``:
        ``min(sqrt(D) Delta_2, Delta_2^2)``."""
        return min(math.sqrt(self.padded_dim) * self.l2_sensitivity, self.l2_sensitivity ** 2)


# ----------------------------------------------------------------------------- accounting
def prop14_rdp(orders, sigma: float, l2: float, l1: float, dim: int, shares: int) -> np.ndarray:
    """Kairouz et al. 2021, Prop. 14: RDP ``[len(orders)]`` of the sum of ``shares`` discrete
    Gaussians ``N_Z(0, sigma^2)`` (``dim`` coordinates) shifted by an integer vector of L2 norm
    ``<= l2`` and L1 norm ``<= l1`` (the change of the integer sum between neighbours)."""
    n = int(shares)
    if n < 1:
        raise ValueError(f"shares must be >= 1, got {shares}")
    if sigma == 0:
        return np.full(len(orders), np.inf)
    tau = 10 * sum(math.exp(-2 * math.pi ** 2 * sigma ** 2 * k / (k + 1)) for k in range(1, n))
    s2, s1 = l2 / (math.sqrt(n) * sigma), l1 / (math.sqrt(n) * sigma)
    a = np.asarray(orders, np.float64)
    return np.minimum.reduce([a / 2 * s2 ** 2 + tau * dim,
                              a / 2 * (s2 ** 2 + 2 * s1 * tau + tau ** 2 * dim),
                              a / 2 * (s2 + math.sqrt(dim) * tau) ** 2])


def ddg_rdp(cfg: DDGConfig, survivors: int, rounds: int = 1, orders=RDP_ORDERS) -> np.ndarray:
    """RDP ``[len(orders)]`` of ``rounds`` DDG rounds summed over ``survivors`` clients, one
    client's data zeroed out (its share stays: sensitivity ``Delta_2``, ``survivors`` shares in
    both neighbours), Kairouz et al. 2021 Prop. 14."""
    n = int(survivors)
    if not 1 <= n <= cfg.num_clients:
        raise ValueError(f"survivors must be in [1, {cfg.num_clients}], got {survivors}")
    return prop14_rdp(orders, cfg.local_sigma, cfg.l2_sensitivity, cfg.l1_bound, cfg.padded_dim,
                      n) * int(rounds)


def ddg_epsilon(cfg: DDGConfig, survivors: int, delta: float, rounds: int = 1) -> float:
    """(eps, delta)-DP of ``rounds`` rounds with ``survivors`` surviving clients per round."""
    eps, _ = rdp_acc.compute_epsilon(RDP_ORDERS, ddg_rdp(cfg, survivors, rounds), delta)
    return float(eps)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DistributedDiscreteGaussianDpEvent(dpa.DpEvent):
    """One release of a secure sum of discrete Gaussian shares (Kairouz et al. 2021): ``shares``
    clients (any number in ``[min_shares, max_shares]``) each add ``N_Z(0, local_sigma^2)`` to
    ``dimension`` integer coordinates; between neighbours under ``neighboring`` the integer sum
    moves by at most ``l2_sensitivity`` / ``l1_sensitivity`` with the same number of shares.
    Accounted by ``fedpriv.dp.accounting`` (RDP only: the max of Prop. 14 over the share counts);
    ``dp_accounting``'s own accountants do not know it and refuse it."""
    local_sigma: float
    l2_sensitivity: float
    l1_sensitivity: float
    dimension: int
    min_shares: int
    max_shares: int
    neighboring: str


def event_rdp(event: DistributedDiscreteGaussianDpEvent, orders=RDP_ORDERS) -> np.ndarray:
    """RDP of one ``DistributedDiscreteGaussianDpEvent``: Prop. 14, worst share count (tau grows
    with the count, the shift's weight falls)."""
    return np.max([prop14_rdp(orders, event.local_sigma, event.l2_sensitivity,
                              event.l1_sensitivity, event.dimension, n)
                   for n in range(int(event.min_shares), int(event.max_shares) + 1)], axis=0)


def ddg_event(cfg: DDGConfig, min_survivors: int, neighboring: str = "replace_one"):
    """The event of one round of ``cfg`` whose sum is released only with ``>= min_survivors``
    shares (the server aborts a round with fewer). ``replace_one``: a fixed-size cohort, one
    client's update replaced by another's (every round has the same number of shares in both
    neighbours; the integer sum moves by ``<= 2 Delta_2``, ``2 Delta_1``). Add/remove is refused:
    removing a client also removes its share, which is not a shift of the noise."""
    if neighboring != "replace_one":
        raise ValueError("DDG accounting needs fixed-size cohorts (replace-one neighbouring): "
                         "removing a client also removes its noise share")
    if not 1 <= int(min_survivors) <= cfg.num_clients:
        raise ValueError(f"min_survivors must be in [1, {cfg.num_clients}], got {min_survivors}")
    return DistributedDiscreteGaussianDpEvent(
        float(cfg.local_sigma), 2 * float(cfg.l2_sensitivity), 2 * float(cfg.l1_bound),
        int(cfg.padded_dim), int(min_survivors), int(cfg.num_clients), neighboring)


# ----------------------------------------------------------------------------- one client, the server
def rotate_scale(cfg: DDGConfig, vec: jax.Array, signs: jax.Array) -> jax.Array:
    """``[d] -> [D]``: zero-pad, ``H diag(signs) x / sqrt(D)``, divide by ``gamma``."""
    x = jnp.zeros((cfg.padded_dim,), jnp.float32).at[:cfg.dim].set(vec.astype(jnp.float32))
    return fwht(x * signs) / cfg.gamma


_U = 2.0 ** -24  # float32 unit roundoff
_BLOCK = 128


def sum_of_squares(x: jax.Array) -> jax.Array:
    """``sum x^2`` over ``x`` ``[D]`` in float32, in nested blocks of <= 128 terms, so that its
    relative error is at most ``norm_error(D)`` whatever order XLA adds a block in."""
    s = jnp.square(x.astype(jnp.float32))
    while s.shape[0] > 1:
        b = min(_BLOCK, s.shape[0])
        s = jnp.pad(s, (0, -s.shape[0] % b)).reshape(-1, b).sum(axis=1)
    return s[0]


def norm_error(dim: int) -> float:
    """Rigorous bound on the relative error of ``sqrt(sum_of_squares)`` of a ``[dim]`` vector of
    integers (< 2^24): one rounding per square, ``m - 1`` per block sum of ``m`` non-negative
    terms (Higham 2002, §4.2), one for the square root."""
    n, err = int(dim), 1
    while n > 1:
        b = min(_BLOCK, n)
        err += b - 1
        n = -(-n // b)
    return (err + 1) * _U


def conditional_round(key, y: jax.Array, bound: float, max_tries: int = 100):
    """Stochastic rounding of ``y`` ``[D]`` redrawn until its L2 norm, computed in float32, is
    ``<= bound`` (the true norm is then ``<= bound (1 + norm_error(D))``: what the accounting
    uses, ``DDGConfig.l2_sensitivity``). Returns ``(int32[D], ok)``; after ``max_tries``
    failures, zeros and ``ok = False``."""
    base = jnp.floor(y)
    frac = y - base

    def draw(i):
        out = base + (jax.random.uniform(jax.random.fold_in(key, i), y.shape) < frac)
        return out, jnp.sqrt(sum_of_squares(out)) <= bound

    def body(c):
        i, out, ok = c
        new, new_ok = draw(i)
        return i + 1, new, new_ok

    out, ok = draw(0)
    _, out, ok = jax.lax.while_loop(lambda c: (~c[2]) & (c[0] < max_tries), body,
                                   (jnp.int32(1), out, ok))
    return jnp.where(ok, out, 0.0).astype(jnp.int32), ok


def encode(cfg: DDGConfig, vec: jax.Array, key, signs: jax.Array):
    """One client: ``vec`` ``[d]`` (already clipped to ``cfg.clip``) -> ``(raw int32[D], ok)``,
    ``raw`` = conditionally rounded scaled rotation + its discrete Gaussian share; the client
    sends ``message(cfg, raw)``."""
    k_round, k_share = jax.random.split(key)
    ints, ok = conditional_round(k_round, rotate_scale(cfg, vec, signs), cfg.l2_bound)
    return ints + discrete_gaussian(k_share, cfg.local_sigma, (cfg.padded_dim,)), ok


def message(cfg: DDGConfig, raw: jax.Array) -> jax.Array:
    """``raw mod 2^bits`` as uint32 (a sum of messages in uint32 wraps mod 2^32, a multiple of
    ``2^bits``: reduce it with ``message`` again)."""
    return raw.astype(jnp.uint32) & jnp.uint32(cfg.modulus - 1)


def centred(cfg: DDGConfig, modular_sum: jax.Array) -> jax.Array:
    """``[D]`` sum mod ``2^bits`` mapped to ``[-M/2, M/2)`` (int32)."""
    s = message(cfg, modular_sum).astype(jnp.int32)
    half = cfg.modulus // 2  # s - M as s - M/2 - M/2: M = 2^31 itself does not fit in int32
    return jnp.where(s >= half, s - half - half, s)


def decode(cfg: DDGConfig, modular_sum: jax.Array, signs: jax.Array) -> jax.Array:
    """Server: ``[D]`` sum of messages (uint32) -> ``[d]`` noisy sum of the clipped updates."""
    y = centred(cfg, modular_sum).astype(jnp.float32) * cfg.gamma
    return (signs * fwht(y))[:cfg.dim]


def round_signs(cfg: DDGConfig, key) -> jax.Array:
    """The round's shared public randomness: ``[D]`` Rademacher signs."""
    return jax.random.rademacher(key, (cfg.padded_dim,), jnp.float32)


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


@functools.partial(jax.jit, static_argnums=0)
def _simulate(cfg, xs, alive, k_signs, k_clients):
    signs = round_signs(cfg, k_signs)
    keys = jax.random.split(k_clients, xs.shape[0])
    raw, ok = jax.vmap(lambda v, k: encode(cfg, v, k, signs))(xs, keys)
    msgs = jnp.where(alive[:, None], message(cfg, raw), jnp.uint32(0))
    modular_sum = jnp.sum(msgs, axis=0, dtype=jnp.uint32)  # what secure aggregation returns
    y = jax.vmap(lambda v: rotate_scale(cfg, v, signs))(xs)
    return raw, ok, modular_sum, decode(cfg, modular_sum, signs), y - jnp.floor(y)


def ddg_round(cfg: DDGConfig, updates: np.ndarray, seed: int, round_idx: int = 0,
              survivors: np.ndarray | None = None) -> DDGRound:
    """Simulate one DDG round on ``updates`` ``[n, d]`` with the engine's own ``encode`` /
    ``decode``; ``survivors`` (bool ``[n]``) defaults to dropping each client independently
    with ``cfg.dropout_rate``."""
    x = np.asarray(updates, np.float64)
    n = cfg.num_clients
    if x.shape != (n, cfg.dim):
        raise ValueError(f"updates must be [{n}, {cfg.dim}], got {list(x.shape)}")
    key = jax.random.fold_in(jax.random.key(int(seed)), int(round_idx))
    k_drop, k_signs, k_clients = jax.random.split(key, 3)
    if survivors is None:
        survivors = np.asarray(jax.random.uniform(k_drop, (n,))) >= cfg.dropout_rate
    survivors = np.asarray(survivors, bool)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x * np.minimum(1.0, cfg.clip / np.maximum(norms, 1e-30))
    raw, ok, modular_sum, decoded, frac = _simulate(cfg, jnp.asarray(x, jnp.float32),
                                                    jnp.asarray(survivors), k_signs, k_clients)
    if not bool(jnp.all(ok)):
        raise RuntimeError(f"conditional rounding failed (bound {cfg.l2_bound:.4g})")
    frac = np.asarray(frac, np.float64)
    return DDGRound(np.asarray(decoded, np.float64), x[survivors].sum(0), survivors,
                    np.asarray(centred(cfg, modular_sum), np.int64),
                    np.asarray(raw, np.int64)[survivors].sum(0),
                    float((frac * (1 - frac))[survivors].sum()))
