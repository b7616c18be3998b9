"""Self-checks a researcher runs on their own DP mechanism (as jax_privacy keeps its test
utilities beside its modules): the privatizer contract, and the noise a mechanism adds against
the event it charges. ``tests/dp/test_privatizer_contract.py`` runs the same checks on every
built-in privatizer; docs/extending.md, "A mechanism", shows them on a new one.

**The privatizer contract.** A privatizer is an ``optax.GradientTransformation`` whose
``update(x_t, state)`` releases ``x_t + w_t`` (``x_t`` a pytree, e.g. a round's sum of clipped
updates divided by C) with its PRNG key in ``state`` (docs/design.md §1, principle 2). A
:class:`Case` states the prescribed per-coordinate covariance ``Sigma [n, n]`` of the noise
``w_1..w_n`` released at zero input (from the mechanism's definition, for noise std 1), and
:data:`CHECKS` checks, on ``D`` i.i.d. coordinates:

* ``noise_scale``: each step's empirical variance is within ``5 sqrt(2 / D)`` (5 standard
  deviations of a chi-square mean) of ``Sigma[t, t]``, and the standardised last step passes a
  seeded Kolmogorov-Smirnov test against N(0, 1) (p > 1e-4);
* ``fresh_noise``: no two steps release the same noise, and every step pair's sample correlation
  is within ``5 / sqrt(D)`` of the prescribed one;
* ``leaf_independence`` (issue 54): the noise of two same-shaped parameter leaves, and of a leaf
  and the same-shaped prefix of a larger leaf, is uncorrelated at every pair of steps (each within
  ``5 / sqrt(d / 4)``; a leaf keyed like another gives 1);
* ``keys``: the same key gives the same noise, a different key different, uncorrelated noise;
* ``state_and_jit``: the state is a pytree of arrays that ``lax.scan`` carries under ``jit``
  with the result of stepping the jitted ``update``; ``update`` is pure and the state advances;
* ``zero_noise_prefix_sums``: at noise std 0 the released prefix sums equal the true ones.

A failed check raises :class:`ContractViolation` (an ``AssertionError``) naming what is wrong.

**Noise = charged event** (:func:`check_noise_matches_event`): the privatizer of a mechanism
(``fedpriv.dp.mechanisms.DPConfig`` subclass) at multiplier z is run for ``n`` rounds; from the
measured covariance ``Sigma`` of its released noise, a user who takes part in one round t of the
first k (contributing a vector of norm <= 1 to the normalised sum) is distinguished by a
Gaussian mechanism of multiplier ``1 / sqrt((Sigma_k^{-1})_tt)`` (``Sigma_k`` the first k rounds'
block) -- the privacy the noise actually gives. For k = 1 and k = n, the event the mechanism
charges for k rounds (``privacy_event`` under :class:`OneParticipation`: each user in at most one
of ``n`` rounds, no amplification) must cost at least the epsilon (RDP, add/remove) of that
Gaussian at the worst round, with a 5-standard-deviation margin in the mechanism's favour. An
event that claims more noise than is added -- a subclass adding ``z / 2`` while inheriting the
event of ``z`` -- fails. Sound in one direction: a mechanism whose noise is what its event
accounts passes (its event's epsilon bounds the true one from above). Not for noise the clients
add under secure aggregation (DDG: the server's privatizer adds none).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import stats

from fedpriv.dp import accounting

__all__ = ["ContractViolation", "Case", "CHECKS", "check_privatizer", "stream",
           "check_noise_scale", "check_fresh_noise", "check_leaf_independence", "check_keys", "check_state_and_jit",
           "check_zero_noise_prefix_sums", "mechanism_case", "check_mechanism",
           "OneParticipation", "measured_multiplier", "measured_covariance", "check_noise_matches_event",
           "N", "D", "STD"]

N, D, STD = 8, 16384, 1.3          # steps, i.i.d. coordinates per step, noise std
EPS32 = float(np.finfo(np.float32).eps)


class ContractViolation(AssertionError):
    """A privatizer or mechanism breaks the contract (the message says how)."""


def _require(ok, message: str) -> None:
    if not ok:
        raise ContractViolation(message)


@dataclasses.dataclass(frozen=True)
class Case:
    """A privatizer under contract.

    Attributes:
      name: shown in every failure.
      make: ``(std, key) -> GradientTransformation``.
      covariance: ``n -> [n, n]`` prescribed covariance of the released noise per coordinate
        at zero input, for noise std 1 (scaled by ``STD^2``).
      covers: the ``fedpriv.dp`` factories this case exercises (module.function).
      zero_noise_atol: ``(dim, xs) -> float`` per-round tolerance at std 0 (0: exact).
      dim: i.i.d. coordinates per step in the statistical checks.
    """
    name: str
    make: Callable
    covariance: Callable
    covers: tuple = ()
    zero_noise_atol: Callable = lambda dim, xs: 0.0
    dim: int = D


# ----------------------------------------------------------------------------- helpers
def _zeros(d: int):
    """A zero update pytree with ``d`` coordinates (``d % 4 == 0``) in four leaves, flattened in
    this order: two of one shape (``a``, ``b``: ``[d / 4]``), a larger one (``c``:
    ``[d / 2 - 6]``, whose prefix ``[:d / 4]`` has ``a``'s shape) and a 2-D one (``e``: ``[2, 3]``)."""
    q = d // 4
    return {"a": jnp.zeros((q,), jnp.float32), "b": jnp.zeros((q,), jnp.float32),
            "c": jnp.zeros((d - 2 * q - 6,), jnp.float32), "e": jnp.zeros((2, 3), jnp.float32)}


def _flat(tree) -> np.ndarray:
    """Leaves ``[n, ...]`` of a stacked pytree as one ``[n, d]`` float64 array."""
    return np.concatenate([np.asarray(v, np.float64).reshape(v.shape[0], -1)
                           for v in jax.tree_util.tree_leaves(tree)], axis=1)


@functools.lru_cache(maxsize=64)
def _stream_fn(case, std: float, n: int, d: int):
    """jit of ``key -> [n, ...]`` pytree of noise released on ``n`` zero inputs (``_zeros(d)``):
    the privatizer is built from the (traced) key and scanned with its state as the carry."""
    def run(key):
        tx = case.make(std, key)
        x = _zeros(d)

        def body(s, _):
            out, s = tx.update(x, s)
            return s, out
        return jax.lax.scan(body, tx.init(x), None, length=n)[1]
    return jax.jit(run)


def stream(case: Case, seed: int, std: float = STD, n: int = N) -> np.ndarray:
    """``[n, case.dim]`` noise the privatizer keyed by ``key(seed)`` releases at zero input."""
    return _stream(case, seed, std, n)


@functools.lru_cache(maxsize=64)
def _stream(case, seed, std, n):
    return _flat(_stream_fn(case, std, n, case.dim)(jax.random.key(seed)))


def _tols(w):
    """(chi-square, correlation) tolerances for ``w`` ``[n, d]``: 5 sd of the mean of ``d``
    squared standard normals, 5 sd of a sample correlation (``(1 - rho^2) / sqrt(d)``)."""
    d = w.shape[1]
    return 5 * np.sqrt(2 / d), 5 / np.sqrt(d)


def _raw(v):
    """An array's values (a typed PRNG key's key data)."""
    return np.asarray(jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v)


def _corr(cov):
    s = np.sqrt(np.diag(cov))
    return cov / np.outer(s, s)


# ----------------------------------------------------------------------------- the contract
def check_noise_scale(case: Case):
    w, var = stream(case, 0), STD ** 2 * np.diag(case.covariance(N))
    ratio = (w ** 2).mean(1) / var
    _require(np.all(np.abs(ratio - 1) < _tols(w)[0]), f"{case.name}: variance / stated {ratio}")
    p = stats.kstest(w[-1] / np.sqrt(var[-1]), "norm").pvalue
    _require(p > 1e-4, f"{case.name}: KS p = {p}")


def check_fresh_noise(case: Case):
    w = stream(case, 0)
    _require(len({r.tobytes() for r in w}) == N, f"{case.name}: two steps released the same noise")
    emp, want = np.corrcoef(w), _corr(case.covariance(N))
    err = np.abs(emp - want)
    _require(err.max() < _tols(w)[1], f"{case.name}: step correlations off by {err.max():.3g} "
                                      f"at {np.unravel_index(err.argmax(), err.shape)}")


def check_leaf_independence(case: Case):
    """The noise of different parameter leaves is independent: between two same-shaped leaves
    (``a``, ``b``) and between a leaf and the same-shaped prefix of a larger one (``a``/``b`` and
    ``c[:d/4]``), every correlation of step ``t`` of one with step ``s`` of the other (``N x N``
    of them: a lagged reuse counts too) is within ``5 / sqrt(d / 4)`` of 0. A leaf drawn from
    another leaf's key gives a correlation of 1 (JAX's counter-based threefry: the same key
    draws the same numbers for a leaf and the prefix of a larger one). False-alarm rate: 5 sd
    of a sample correlation, two-sided 5.7e-7 per entry, 3 N^2 = 192 entries per case (< 1.1e-4
    per case by the union bound; the key is fixed, so the outcome is too)."""
    w, q = stream(case, 0), case.dim // 4
    leaves = {"a": w[:, :q], "b": w[:, q:2 * q], "c[:d/4]": w[:, 2 * q:3 * q]}
    tol = 5 / np.sqrt(q)
    for x, y in (("a", "b"), ("a", "c[:d/4]"), ("b", "c[:d/4]")):
        cross = np.corrcoef(leaves[x], leaves[y])[:N, N:]  # [N, N]: step t of x vs step s of y
        worst = np.unravel_index(np.abs(cross).argmax(), cross.shape)
        _require(np.abs(cross).max() < tol,
                 f"{case.name}: the noise of leaves {x} and {y} is correlated: {cross[worst]:.3g} "
                 f"between steps {worst} (tolerance {tol:.3g})")


def check_keys(case: Case):
    a, b = stream(case, 0), stream(case, 1)
    again = _flat(_stream_fn(case, STD, N, case.dim)(jax.random.key(0)))
    _require(np.array_equal(again, a), f"{case.name}: same key, other noise")
    corr = np.array([np.corrcoef(a[t], b[t])[0, 1] for t in range(N)])
    _require(np.all(np.abs(corr) < _tols(a)[1]) and not np.array_equal(a, b),
             f"{case.name}: different keys give correlated noise {corr}")


def check_state_and_jit(case: Case):
    tx = case.make(STD, jax.random.key(0))   # built outside the stream's trace
    x = _zeros(case.dim)
    s0 = tx.init(x)
    leaves, treedef = jax.tree_util.tree_flatten(s0)
    _require(leaves and all(isinstance(v, jax.Array) for v in leaves), f"{case.name}: state leaves")
    update = jax.jit(tx.update)
    o1, s1 = update(x, s0)
    o1b, _ = update(x, s0)
    _require(all(np.array_equal(u, v) for u, v in zip(jax.tree_util.tree_leaves(o1),
                                                      jax.tree_util.tree_leaves(o1b))),
             f"{case.name}: update is not a pure function of (updates, state)")
    _require(jax.tree_util.tree_structure(s1) == treedef, f"{case.name}: state structure changed")
    _require(any(not np.array_equal(_raw(u), _raw(v))
                 for u, v in zip(leaves, jax.tree_util.tree_leaves(s1))),
             f"{case.name}: state did not advance")
    # stepping the jitted update gives the scan's stream (a type-stable carry, same key)
    stepped, s = [], s0
    for _ in range(N):
        o, s = update(x, s)
        stepped.append(o)
    stepped = _flat(jax.tree_util.tree_map(lambda *v: jnp.stack(v), *stepped))
    scanned = stream(case, 0)
    err = np.abs(stepped - scanned).max()
    _require(err <= 64 * EPS32 * max(1.0, np.abs(scanned).max()),
             f"{case.name}: stepped updates != scanned stream (by {err:.3g})")


def check_zero_noise_prefix_sums(case: Case):
    rng = np.random.default_rng(4)
    xs = (0.1 * rng.normal(size=(N, 8))).astype(np.float32)
    tx = case.make(0.0, jax.random.key(5))
    like = {"a": jnp.zeros((5,), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}
    state, out = tx.init(like), []
    update = jax.jit(tx.update)
    for x in xs:
        o, state = update({"a": jnp.asarray(x[:5]), "b": jnp.asarray(x[5:])}, state)
        out.append(np.concatenate([np.asarray(o["a"]), np.asarray(o["b"])]))
    got, want = np.cumsum(np.stack(out), 0), np.cumsum(xs, 0)
    atol = case.zero_noise_atol(8, xs) * np.arange(1, N + 1)[:, None]
    _require(np.all(np.abs(got - want) <= atol),
             f"{case.name}: prefix sums off by {np.abs(got - want).max()}")


CHECKS = {"noise_scale": check_noise_scale, "fresh_noise": check_fresh_noise,
          "keys": check_keys, "state_and_jit": check_state_and_jit,
          "leaf_independence": check_leaf_independence,
          "zero_noise_prefix_sums": check_zero_noise_prefix_sums}


def check_privatizer(case: Case, checks=None) -> None:
    """Run the contract's ``checks`` (names of :data:`CHECKS`; default all) on ``case``."""
    for name in (sorted(CHECKS) if checks is None else checks):
        CHECKS[name](case)


# ----------------------------------------------------------------------------- mechanisms
def mechanism_case(mech, covariance: Callable | None = None) -> Case:
    """A mechanism object's privatizer as a :class:`Case` (``mech.privatizer(std, key)``; its
    noise std on the normalised sum is the multiplier). ``covariance``: its prescribed one
    (default the identity: fresh i.i.d. noise every round, e.g. a Gaussian mechanism)."""
    return Case(getattr(mech, "mechanism", type(mech).__name__),
                lambda std, key: mech.privatizer(std, key), covariance or np.eye)


def check_mechanism(mech, covariance: Callable | None = None, rounds: int = N) -> None:
    """The whole self-check of a mechanism: the privatizer contract (with its prescribed
    ``covariance``, default the identity) and :func:`check_noise_matches_event`."""
    check_privatizer(mechanism_case(mech, covariance))
    check_noise_matches_event(mech, rounds)


@dataclasses.dataclass(frozen=True)
class OneParticipation:
    """A stand-in sampler for the event check: ``rounds`` rounds, one client per round, each
    client in exactly one round (a single pass), add/remove neighbours, no amplification. It
    declares what the built-in samplers do (``amplified_event``, ``neighboring``, a
    min-separation for matrix mechanisms, ``rounds_per_epoch`` for trees)."""
    rounds: int
    neighboring: str = "add_remove"

    num_clients = property(lambda self: self.rounds)
    cohort_size = 1
    expected_cohort_size = 1.0
    max_cohort_size = 1
    variable_cohort = False
    min_separation = property(lambda self: self.rounds)
    rounds_per_epoch = property(lambda self: self.rounds)

    def max_participations(self, rounds: int) -> int:
        return -(-int(rounds) // self.rounds)

    def amplified_event(self, release, rounds: int):
        return accounting.periodic_event(release, rounds, self.rounds, self.max_participations(rounds))

    def sample(self, round_idx: int) -> np.ndarray:
        return np.asarray([int(round_idx) % self.rounds])


def measured_multiplier(privatizer: optax.GradientTransformation | Callable, rounds: int = N,
                        dim: int = D, seed: int = 0) -> np.ndarray:
    """``[rounds]``: for each round t, ``1 / sqrt((Sigma^{-1})_tt)`` with ``Sigma`` the measured
    covariance of the noise ``privatizer`` releases over ``rounds`` rounds at zero input (``dim``
    i.i.d. coordinates): the Gaussian multiplier that distinguishes a unit contribution in
    round t alone. ``privatizer``: ``key -> GradientTransformation``."""
    sigma = measured_covariance(privatizer, rounds, dim, seed)
    return 1.0 / np.sqrt(np.diag(np.linalg.inv(sigma)))


def measured_covariance(privatizer, rounds: int = N, dim: int = D, seed: int = 0) -> np.ndarray:
    """``[rounds, rounds]``: the per-coordinate covariance of the noise ``privatizer`` (``key ->
    GradientTransformation``) releases over ``rounds`` rounds at zero input (``dim`` i.i.d.
    coordinates)."""
    case = Case("measured", lambda std, key: privatizer(key), np.eye, dim=dim)
    w = _flat(_stream_fn(case, 0.0, int(rounds), int(dim))(jax.random.key(seed)))
    return w @ w.T / w.shape[1]


def check_noise_matches_event(mech, rounds: int = N, noise_multiplier: float = 1.0,
                              delta: float = 1e-5, dim: int = D) -> dict:
    """The mechanism's charged event costs at least what its measured noise gives (module
    docstring), for the first round alone and for all ``rounds`` (one participation, at the worst
    round); returns ``{"charged_epsilon", "noise_epsilon", "measured_multiplier"}`` of the
    ``rounds``-round check. ``mech``: a ``DPConfig`` (subclass) instance; its privatizer runs at
    ``noise_multiplier``. A tree restarting every R rounds is checked with ``rounds = R``."""
    sampler = OneParticipation(int(rounds))
    mech = dataclasses.replace(mech, noise_multiplier=float(noise_multiplier), noise_cohort_size=None,
                               adaptive=None)
    sigma = measured_covariance(lambda key: mech.privatizer(float(noise_multiplier), key), rounds, dim)
    margin = 1 + 5 * math.sqrt(2.0 / (dim - rounds))  # 5 sd of the estimate: favours the mechanism
    out = {}
    for k in sorted({1, int(rounds)}):
        charged = accounting.compute_epsilon(mech.privacy_event(sampler, k), delta, "add_remove",
                                             accountant="rdp")[0]
        # the first k rounds' noise alone (a user in one of them)
        worst = float((1.0 / np.sqrt(np.diag(np.linalg.inv(sigma[:k, :k])))).min())
        noise_eps = accounting.compute_epsilon(dpa.GaussianDpEvent(worst * margin), delta,
                                               "add_remove", accountant="rdp")[0]
        _require(charged >= noise_eps * (1 - 1e-9),
                 f"{mech.mechanism}: the event charged for {k} round(s) gives epsilon {charged:.4g} "
                 f"but the noise added gives {noise_eps:.4g} (measured multiplier {worst:.4g} at "
                 f"z = {noise_multiplier:g}, one participation): the event claims more noise than "
                 "is added")
        out = {"charged_epsilon": charged, "noise_epsilon": noise_eps, "measured_multiplier": worst}
    return out
