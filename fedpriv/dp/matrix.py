"""Matrix-factorization DP-FTRL: banded and BLT (buffered-linear-Toeplitz) correlated noise.

The server wants the prefix sums ``A x`` of the per-round sums ``x_1..x_n`` (``A`` = lower
triangular all-ones, ``[n, n]``). A factorization ``A = B C`` releases ``C x + Z`` (``Z`` i.i.d.
``N(0, sigma^2)`` per coordinate, ``[n, d]``) and post-processes it into ``A x + B Z``; the
noise the model sees per round is the *increment* ``x_t + (C^{-1} Z)_t`` (so that SGD on the
increments gives exactly FTRL on the noisy prefix sums, as for the tree in ``noise.py``).
Privacy is that of one Gaussian mechanism on ``C x``: multiplier ``sigma / sens(C)`` with
``sens(C) = max_{u in participation patterns} ||C u||_2`` (Denisov et al. 2022; Choquette-Choo
et al. 2023, "Multi-epoch matrix factorization mechanisms for private machine learning"). The tree is the special case
``C`` = binary-tree matrix (``tree_matrix``), sens = sqrt(depth) in one epoch.

Strategies (both Toeplitz, lower triangular, ``c_0 > 0``):

* **banded** (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization", NeurIPS):
  ``C[i, j] = c_{i-j}`` for ``0 <= i - j < bands``. Here ``c`` is the banded square root of
  ``A`` (Kalinin & Lampert 2024, "Banded square root matrix factorization", BSR: the
  coefficients ``r_k = binom(2k, k) / 4^k`` of ``A^{1/2}`` truncated to ``bands``), not the
  optimised bands of Choquette-Choo et al. With ``min_separation >= bands`` the columns of
  the participations of one user have disjoint supports, so ``sens^2`` is *exactly* the sum of
  their squared column norms, maximised by participating at ``0, b, 2b, ...`` (column norms are
  non-increasing): O(n). Streaming: ``w_t = (sigma Z_t - sum_{k=1}^{bands-1} c_k w_{t-k}) / c_0``
  with ``bands - 1`` buffers of the model's size.
* **BLT** (McMahan, Dvijotham et al. 2024, "Don't use tree aggregation, use BLTs"):
  ``c_0 = 1``, ``c_k = sum_i theta_i omega_i^{k-1}`` (k >= 1) with ``buffers`` terms. Here
  ``(theta, omega)`` are fitted (non-negative least squares on a log-spaced grid of decays) to
  ``A^{1/2}``'s coefficients for the planned ``rounds`` — a BLT approximation of the
  square-root factorization — or optimised for a participation pattern by ``optimize_blt``
  (gradient descent on the parameters, as McMahan et al. do; a surrogate objective, see
  there). Streaming:
  ``w_t = sigma Z_t - sum_i theta_i s_i``; ``s_i <- omega_i s_i + w_t`` (``buffers`` buffers).
  Sensitivity under b-min-separation: the upper bound of Choquette-Choo et al. 2023 (Alg. 4,
  on the Gram ``C^T C`` of the run's ``rounds``), exact for a b-banded ``C``.

Privatizers (``banded_privatizer`` / ``blt_privatizer``) are ``optax.GradientTransformation``s
like ``noise.tree_privatizer``: ``Z_t`` is regenerated from ``fold_in(key, t)``; the state
``MatrixNoiseState(key, step, buffers)`` is a pytree (buffers ``[bands-1 or buffers, *leaf]``)
that checkpoints and resumes exactly.
"""
from __future__ import annotations

import dataclasses
import functools

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from fedpriv.dp.noise import _gaussian_like, check_int
from fedpriv.errors import FedprivError

MAX_DENSE_ROUNDS = 4096  # dense Gram sensitivity (BLT): O(rounds^2) memory


class MinSeparationError(FedprivError, ValueError):
    """The participation pattern does not give the min-separation a strategy's accounting needs."""


# ----------------------------------------------------------------------------- coefficients
def sqrt_toeplitz_coeffs(n: int) -> np.ndarray:
    """``r_k = binom(2k, k) / 4^k``, k < n: the Toeplitz coefficients of ``A^{1/2}`` (``[n]``)."""
    r = np.ones(int(n))
    for k in range(1, int(n)):
        r[k] = r[k - 1] * (2 * k - 1) / (2 * k)
    return r


def toeplitz_matrix(coeffs, n: int) -> np.ndarray:
    """Lower-triangular Toeplitz ``[n, n]`` with ``C[i, j] = coeffs[i - j]`` (0 past the end)."""
    c = np.zeros(n)
    m = min(n, len(coeffs))
    c[:m] = np.asarray(coeffs, np.float64)[:m]
    idx = np.subtract.outer(np.arange(n), np.arange(n))
    return np.where(idx >= 0, c[np.clip(idx, 0, n - 1)], 0.0)


def prefix_matrix(n: int) -> np.ndarray:
    """The workload ``A``: lower-triangular ones ``[n, n]`` (prefix sums)."""
    return np.tril(np.ones((n, n)))


def tree_matrix(n: int) -> np.ndarray:
    """DP-FTRL's tree as a factorization: one row per node (level h, index j) covering leaves
    ``[j 2^h, (j+1) 2^h)`` of ``n`` leaves, ``[nodes, n]`` (Kairouz et al. 2021, App. D)."""
    rows = []
    h = 0
    while (1 << h) <= n:
        for j in range(n >> h):
            r = np.zeros(n)
            r[j << h:(j + 1) << h] = 1.0
            rows.append(r)
        h += 1
    return np.array(rows)


# ----------------------------------------------------------------------------- sensitivity
def _check_sep(min_separation, rounds):
    if isinstance(min_separation, bool) or int(min_separation) != min_separation or min_separation < 1:
        raise ValueError(f"min_separation must be an integer >= 1, got {min_separation!r}")
    if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")


def max_participations(rounds: int, min_separation: int, cap: int | None = None) -> int:
    """Most participations of one user in ``rounds`` rounds, ``min_separation`` apart."""
    _check_sep(min_separation, rounds)
    k = -(-int(rounds) // int(min_separation))
    return k if cap is None else min(k, check_int("max_part", cap))


def _best_pattern_sum(x: np.ndarray, sep: int, k: int) -> np.ndarray:
    """``max_{pi} sum_{j in pi} x[..., j]`` over index sets ``pi`` with gaps >= ``sep`` and
    ``|pi| <= k`` (per row of ``x``, ``[..., n] -> [...]``): Choquette-Choo et al. 2023, Alg. 3
    (VecSens) — ``F[i, k] = max(x_i + F[i + sep, k - 1], F[i + 1, k])``."""
    x = np.maximum(np.asarray(x, np.float64), 0.0)
    n = x.shape[-1]
    pad = np.zeros(x.shape[:-1] + (sep,))
    if k >= -(-n // sep):  # the count constraint never binds: one pass, no k dimension
        f = np.zeros(x.shape[:-1] + (n + sep,))
        for i in range(n - 1, -1, -1):
            f[..., i] = np.maximum(x[..., i] + f[..., i + sep], f[..., i + 1])
        return f[..., 0]
    prev = np.zeros(x.shape[:-1] + (n + sep,))
    for _ in range(k):
        cur = np.zeros_like(prev)
        shifted = np.concatenate([x + prev[..., sep:n + sep], pad], axis=-1)
        for i in range(n - 1, -1, -1):
            cur[..., i] = np.maximum(shifted[..., i], cur[..., i + 1])
        prev = cur
    return prev[..., 0]


def gram_sensitivity(C: np.ndarray, min_separation: int = 1, max_part: int | None = None) -> float:
    """Upper bound on ``max_u ||C u||`` over b-min-separated 0/1 patterns ``u`` with at most
    ``max_part`` ones (Choquette-Choo et al. 2023, Alg. 4): ``sqrt(max_pi sum_{i in pi}
    max_pi' sum_{j in pi'} |G_ij|)``, ``G = C^T C`` (``C``: ``[m, n]``). Exact when ``C`` is
    ``min_separation``-banded (then ``G`` is diagonal on patterns)."""
    C = np.asarray(C, np.float64)
    n = C.shape[1]
    _check_sep(min_separation, n)
    k = max_participations(n, min_separation, max_part)
    g = np.abs(C.T @ C)
    row = _best_pattern_sum(g, int(min_separation), k)
    return float(np.sqrt(_best_pattern_sum(row, int(min_separation), k)))


def gaussian_mf_event(noise_multiplier: float, sensitivity: float) -> dpa.DpEvent:
    """The event of ``C x + N(0, sigma^2)``: one Gaussian, multiplier ``sigma / sens(C)`` (with
    ``noise_multiplier`` = sigma / clip on unit-clip sums)."""
    if not sensitivity > 0:
        raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
    return dpa.GaussianDpEvent(float(noise_multiplier) / float(sensitivity))


# ----------------------------------------------------------------------------- strategies
@dataclasses.dataclass(frozen=True)
class BandedStrategy:
    """Banded lower-triangular Toeplitz ``C`` (``coeffs``: ``c_0..c_{bands-1}``, ``c_0 > 0``)."""
    coeffs: tuple

    def __post_init__(self):
        if len(self.coeffs) < 1 or not self.coeffs[0] > 0:
            raise ValueError(f"a banded strategy needs c_0 > 0, got {self.coeffs[:1]}")

    @property
    def bands(self) -> int:
        return len(self.coeffs)

    @property
    def min_separation(self) -> int:
        """The smallest min-separation its exact sensitivity holds for (= bands)."""
        return self.bands

    def matrix(self, n: int) -> np.ndarray:
        return toeplitz_matrix(self.coeffs, n)

    def sensitivity(self, rounds: int, min_separation: int, max_part: int | None = None) -> float:
        """Exact ``max ||C u||`` over patterns ``min_separation`` apart (>= bands), in ``rounds``."""
        _check_sep(min_separation, rounds)
        if min_separation < self.bands:
            raise MinSeparationError(f"a {self.bands}-banded strategy needs participations >= "
                                     f"{self.bands} rounds apart, got min-separation {min_separation}")
        c2 = np.asarray(self.coeffs, np.float64) ** 2
        cum = np.cumsum(c2)
        k = max_participations(rounds, min_separation, max_part)
        cols = np.arange(k) * int(min_separation)          # 0, b, 2b, ...: largest column norms
        return float(np.sqrt(sum(cum[min(self.bands, rounds - j) - 1] for j in cols)))


@dataclasses.dataclass(frozen=True)
class BLTStrategy:
    """BLT ``C``: ``c_0 = 1``, ``c_k = sum_i theta_i omega_i^(k-1)`` (``theta, omega``: ``[d]``)."""
    theta: tuple
    omega: tuple

    def __post_init__(self):
        if len(self.theta) != len(self.omega) or not self.theta:
            raise ValueError("theta and omega must be non-empty and of equal length")
        if not all(0 <= w < 1 for w in self.omega):
            raise ValueError(f"BLT decays omega must be in [0, 1), got {self.omega}")

    @property
    def buffers(self) -> int:
        return len(self.theta)

    min_separation = 1  # the Gram bound holds for any min-separation

    def coeffs(self, n: int) -> np.ndarray:
        k = np.arange(1, n)[:, None]
        c = np.ones(n)
        c[1:] = (np.asarray(self.theta)[None] * np.asarray(self.omega)[None] ** (k - 1)).sum(-1)
        return c

    def matrix(self, n: int) -> np.ndarray:
        return toeplitz_matrix(self.coeffs(n), n)

    def sensitivity(self, rounds: int, min_separation: int, max_part: int | None = None) -> float:
        """Alg. 4 upper bound on the Gram of the first ``rounds`` rounds (dense; <= 4096)."""
        _check_sep(min_separation, rounds)
        if rounds > MAX_DENSE_ROUNDS:
            raise ValueError(f"BLT sensitivity is computed densely for <= {MAX_DENSE_ROUNDS} "
                             f"rounds, got {rounds}")
        return gram_sensitivity(self.matrix(int(rounds)), min_separation, max_part)


def banded_strategy(bands: int) -> BandedStrategy:
    """The banded square root (BSR): ``A^{1/2}``'s coefficients truncated to ``bands`` bands."""
    if isinstance(bands, bool) or int(bands) != bands or bands < 1:
        raise ValueError(f"bands must be an integer >= 1, got {bands!r}")
    return BandedStrategy(tuple(float(c) for c in sqrt_toeplitz_coeffs(int(bands))))


def blt_strategy(rounds: int, buffers: int = 4) -> BLTStrategy:
    """A ``buffers``-buffer BLT fitted to ``A^{1/2}`` over ``rounds`` rounds: decays
    ``omega_i = 1 - 1 / tau_i`` with time constants log-spaced in ``[1, rounds]``, weights
    ``theta >= 0`` by non-negative least squares on ``r_1..r_{rounds-1}``."""
    from scipy.optimize import nnls
    if isinstance(buffers, bool) or int(buffers) != buffers or buffers < 1:
        raise ValueError(f"buffers must be an integer >= 1, got {buffers!r}")
    rounds = max(int(rounds), 2)
    tau = np.geomspace(1.0, float(rounds), int(buffers) + 1)[1:]
    omega = 1.0 - 1.0 / tau
    r = sqrt_toeplitz_coeffs(rounds)[1:]
    k = np.arange(1, rounds)[:, None]
    basis = omega[None] ** (k - 1)
    theta, _ = nnls(basis / r[:, None], np.ones(rounds - 1))  # relative error: all lags count
    return BLTStrategy(tuple(float(t) for t in theta), tuple(float(w) for w in omega))


def noise_covariance(strategy, n: int, noise_std: float = 1.0) -> np.ndarray:
    """Covariance ``sigma^2 C^{-1} C^{-T}`` ``[n, n]`` of the per-round noise (per coordinate)."""
    cinv = np.linalg.inv(strategy.matrix(n))
    return noise_std ** 2 * cinv @ cinv.T


def prefix_noise_variance(strategy, n: int, noise_std: float = 1.0) -> np.ndarray:
    """Variance ``[n]`` per coordinate of the noise on the released prefix sums (``A C^{-1}``)."""
    b = prefix_matrix(n) @ np.linalg.inv(strategy.matrix(n))
    return noise_std ** 2 * (b ** 2).sum(1)


# ----------------------------------------------------------------------------- privatizers
@struct.dataclass
class MatrixNoiseState:
    key: jax.Array      # typed PRNG key; Z_t = N(0, std^2) from fold_in(key, t)
    step: jax.Array     # int32: rounds released so far
    buffers: object     # pytree like the updates, each leaf [num_buffers, *leaf.shape]


def _normal_like(key, tree, std):
    """float32 ``N(0, std^2)`` noise like ``tree``: the tree mechanism's ``_gaussian_like``
    (one key per leaf from ``split``), at float32 whatever the leaves' dtype."""
    f32 = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.float32), tree)
    return _gaussian_like(key, f32, std)


def _privatizer(noise_std, key, num_buffers, step_fn):
    noise_std = float(noise_std)
    if not noise_std >= 0:
        raise ValueError(f"noise std must be >= 0, got {noise_std}")

    def init_fn(params):
        if key is None:
            raise ValueError("this privatizer was built without a key: pass one to init a state")
        bufs = jax.tree_util.tree_map(
            lambda p: jnp.zeros((num_buffers,) + jnp.shape(p), jnp.float32), params)
        return MatrixNoiseState(key, jnp.zeros((), jnp.int32), bufs)

    def update_fn(updates, state, params=None):
        del params
        z = _normal_like(jax.random.fold_in(state.key, state.step), updates, noise_std)
        out = jax.tree_util.tree_map(step_fn, z, state.buffers)
        treedef = jax.tree_util.tree_structure(updates)
        w = treedef.unflatten([o[0] for o in treedef.flatten_up_to(out)])
        bufs = treedef.unflatten([o[1] for o in treedef.flatten_up_to(out)])
        noised = jax.tree_util.tree_map(lambda x, n: x + n.astype(x.dtype), updates, w)
        return noised, MatrixNoiseState(state.key, state.step + 1, bufs)

    return optax.GradientTransformation(init_fn, update_fn)


def banded_privatizer(noise_std: float, key, strategy: BandedStrategy | int) -> optax.GradientTransformation:
    """Banded MF noise as an optax transformation: ``update(x_t)`` returns ``x_t + w_t``,
    ``w = C^{-1} (noise_std Z)`` row t, with ``bands - 1`` buffers (``strategy``: a
    ``BandedStrategy`` or a number of bands, BSR). ``key=None``: update-only (engine)."""
    s = banded_strategy(strategy) if isinstance(strategy, int) else strategy
    c = jnp.asarray(s.coeffs, jnp.float32)
    nb = s.bands - 1

    def step(z, buf):  # buf[k-1] = w_{t-k}
        corr = jnp.tensordot(c[1:], buf, axes=1) if nb else 0.0
        w = (z - corr) / c[0]
        return w, (jnp.concatenate([w[None], buf[:-1]], 0) if nb else buf)

    return _privatizer(noise_std, key, nb, step)


def blt_privatizer(noise_std: float, key, strategy: BLTStrategy) -> optax.GradientTransformation:
    """BLT MF noise as an optax transformation: ``w_t = noise_std Z_t - sum_i theta_i s_i``,
    ``s_i <- omega_i s_i + w_t`` (``= C^{-1}(noise_std Z)`` row t; ``buffers`` buffers)."""
    th = jnp.asarray(strategy.theta, jnp.float32)
    om = jnp.asarray(strategy.omega, jnp.float32)

    def step(z, buf):
        w = z - jnp.tensordot(th, buf, axes=1)
        om_b = om.reshape((-1,) + (1,) * z.ndim)
        return w, om_b * buf + w[None]

    return _privatizer(noise_std, key, strategy.buffers, step)


def privatizer(strategy, noise_std: float, key=None) -> optax.GradientTransformation:
    """The privatizer of ``strategy`` (banded or BLT)."""
    if isinstance(strategy, BandedStrategy):
        return banded_privatizer(noise_std, key, strategy)
    if isinstance(strategy, BLTStrategy):
        return blt_privatizer(noise_std, key, strategy)
    raise TypeError(f"not a matrix strategy: {type(strategy).__name__}")


@functools.lru_cache(maxsize=64)
def strategy_for(mechanism: str, bands: int = 0, buffers: int = 0, rounds: int = 0,
                 blt_params: tuple | None = None):
    """The strategy a ``DPConfig`` names: ``"banded"`` (``bands``) or ``"blt"``: the given
    ``blt_params = (theta, omega)`` (e.g. from ``optimize_blt``), else ``buffers`` fitted for
    ``rounds`` (deterministic NNLS). Cached: the engine and the accounting share one object."""
    if mechanism == "banded":
        return banded_strategy(bands)
    if mechanism == "blt":
        if blt_params is not None:
            theta, omega = blt_params
            return BLTStrategy(tuple(map(float, theta)), tuple(map(float, omega)))
        if rounds < 1:
            raise ValueError(f"a BLT strategy needs the planned rounds (mf_rounds >= 1), got {rounds}")
        return blt_strategy(rounds, buffers)
    raise ValueError(f"no matrix strategy for mechanism {mechanism!r}")


def optimize_blt(rounds: int, buffers: int = 4, min_separation: int | None = None,
                 steps: int = 300, learning_rate: float = 0.05) -> BLTStrategy:
    """A BLT for ``rounds`` rounds and users every ``min_separation`` rounds (None: once),
    optimised in the spirit of McMahan et al. 2024 (§4: gradient descent on the parameters):
    from ``blt_strategy``, Adam on ``log sens^2 + log mean_t Var(prefix sum t)`` (the mean
    prefix-sum variance at fixed epsilon), ``theta = softplus``, ``omega = sigmoid``. The
    surrogate sensitivity is the pattern ``0, b, 2b, ...`` (FFT of the comb with ``c``); the
    accounting always uses ``BLTStrategy.sensitivity`` (Alg. 4 bound). Deterministic on a
    given machine; pass the result as ``DPConfig.blt_params`` so resumes check it."""
    n = int(rounds)
    b = n if min_separation is None else int(min_separation)
    _check_sep(b, n)
    init = blt_strategy(n, buffers)
    th0 = np.maximum(np.asarray(init.theta), 1e-3)
    om0 = np.clip(np.asarray(init.omega), 1e-3, 1 - 1e-4)
    p0 = (jnp.asarray(np.log(np.expm1(th0)), jnp.float32),
          jnp.asarray(np.log(om0 / (1 - om0)), jnp.float32))
    comb = np.zeros(n)
    comb[::b] = 1.0
    f_comb = jnp.fft.rfft(jnp.asarray(comb, jnp.float32), 2 * n)
    weights = jnp.asarray(n - np.arange(n), jnp.float32)
    e0 = jnp.zeros(n, jnp.float32).at[0].set(1.0)

    def loss(p):
        th, om = jax.nn.softplus(p[0]), jax.nn.sigmoid(p[1])
        k = jnp.arange(1, n, dtype=jnp.float32)[:, None]
        c = jnp.concatenate([jnp.ones(1), (th * om ** (k - 1)).sum(-1)])
        v = jnp.fft.irfft(jnp.fft.rfft(c, 2 * n) * f_comb, 2 * n)[:n]

        def step(buf, z):  # the privatizer's recurrence on an impulse: C^{-1} e_0
            w = z - th @ buf
            return om * buf + w, w

        _, cinv = jax.lax.scan(step, jnp.zeros_like(th), e0)
        q = jnp.cumsum(cinv)  # A C^{-1} is Toeplitz with coefficients q
        return jnp.log((v ** 2).sum()) + jnp.log((weights * q ** 2).sum() / n)

    opt = optax.adam(learning_rate)
    grad = jax.jit(jax.value_and_grad(loss))
    p, state = p0, opt.init(p0)
    best = (float(loss(p0)), p0)
    for _ in range(int(steps)):
        val, g = grad(p)
        if float(val) < best[0]:
            best = (float(val), p)
        upd, state = opt.update(g, state)
        p = optax.apply_updates(p, upd)
    p = best[1]
    theta = np.asarray(jax.nn.softplus(p[0]), np.float64)
    omega = np.minimum(np.asarray(jax.nn.sigmoid(p[1]), np.float64), 1 - 1e-7)
    return BLTStrategy(tuple(float(t) for t in theta), tuple(float(w) for w in omega))


def matrix_event(strategy, noise_multiplier: float, rounds: int, min_separation: int,
                 max_part: int | None = None) -> dpa.DpEvent:
    """The event of ``rounds`` rounds of ``strategy`` whose users participate at most
    ``max_part`` times, ``min_separation`` apart: ``GaussianDpEvent(z / sens)``."""
    _check_sep(min_separation, rounds)
    sens = strategy.sensitivity(int(rounds), int(min_separation), max_part)
    return gaussian_mf_event(noise_multiplier, sens)



# ----------------------------------------------------------------------------- comparison
def tree_prefix_variance(rounds: int, restart_every: int) -> np.ndarray:
    """Per-coordinate variance ``[rounds]`` (node std 1) of DP-FTRL's prefix sums over the whole
    run: trees of ``restart_every`` leaves, the completed ones adding ``popcount(R)`` nodes."""
    check_int("rounds", rounds)
    check_int("restart_every", restart_every)
    t = np.arange(1, int(rounds) + 1)
    done, pos = np.divmod(t, int(restart_every))
    pop = np.vectorize(lambda v: bin(int(v)).count("1"))
    return done * bin(int(restart_every)).count("1") + pop(pos)


def variance_ratio_to_tree(strategy, rounds: int, min_separation: int) -> dict:
    """Prefix-sum noise variance of ``strategy`` over the tree's at *equal epsilon* (both are
    one Gaussian: tree multiplier ``z / sqrt(epochs * depth)``, MF ``z / sens``; so the noise
    std is ``const * sens`` for each and variances scale with ``sens^2``), for ``rounds``
    rounds with users every ``min_separation`` rounds (the tree restarts every epoch of that
    many rounds). Returns ``{"max": ..., "mean": ..., "final": ...}`` (MF / tree)."""
    from fedpriv.dp.noise import num_tree_levels
    epochs = max_participations(rounds, min_separation)
    tree_sens2 = epochs * num_tree_levels(min_separation)
    tree = tree_prefix_variance(rounds, min_separation) * tree_sens2
    mf = prefix_noise_variance(strategy, rounds) * strategy.sensitivity(rounds, min_separation) ** 2
    return {"max": float(mf.max() / tree.max()), "mean": float(mf.mean() / tree.mean()),
            "final": float(mf[-1] / tree[-1])}
