"""The contract every fedpriv privatizer inherits (issue 25 item 6; as jax_privacy parametrizes
one contract over all its privatizers).

A privatizer is an ``optax.GradientTransformation`` whose ``update(x_t, state)`` releases
``x_t + w_t`` (``x_t`` a pytree, e.g. a round's sum of clipped updates) with its PRNG key in
``state`` (docs/design.md, principle 2). Each case below states the mechanism's prescribed
per-coordinate covariance ``Sigma [n, n]`` of the noise ``w_1..w_n`` it releases at zero input,
computed in this file from the mechanism's definition (not from fedpriv's helpers), and the
contract checks, for every case:

* **noise scale**: each step's empirical variance over ``D`` i.i.d. coordinates is within
  ``5 sqrt(2 / D)`` (5 standard deviations of a chi-square mean) of ``Sigma[t, t]``, and the
  standardised last step passes a seeded Kolmogorov-Smirnov test against N(0, 1) (p > 1e-4);
* **fresh noise per step**: no two steps release the same noise, and every step pair's sample
  correlation is within ``5 / sqrt(D)`` of the prescribed one (0 for Gaussian and DDG, the
  tree's and ``C^{-1} C^{-T}``'s for tree, banded and BLT);
* **independent leaves** (issue 54): the noise of two same-shaped parameter leaves, and of a
  leaf and the same-shaped prefix of a larger leaf, is uncorrelated at every pair of steps
  (each within ``5 / sqrt(d / 4)``; a leaf keyed like another gives 1);
* **state and keys**: the state is a pytree that ``jax.lax.scan`` carries (type-stable) under
  ``jit`` with the same result as stepping the jitted ``update``; ``update`` is pure and the
  state advances; the same key gives the same noise, a different key different, uncorrelated
  noise (the key is an argument of the jitted stream: it lives in the state, not the trace);
* **prefix sums at zero noise**: with noise std 0 the released prefix sums equal the true ones
  (exactly; DDG up to its granularity: stochastic rounding moves each coordinate by at most
  ``gamma sqrt(D)`` per round).

``test_broken_privatizers_fail_the_contract`` shows the contract catches broken privatizers
(noise reused across steps, wrong scale, key ignored, a bias, one key for every leaf), and
``test_every_fedpriv_privatizer_is_under_contract`` that no privatizer of ``fedpriv.dp``
escapes it.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import inspect
import pkgutil
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree
from scipy import stats

import fedpriv.dp
from fedpriv.dp import ddg, matrix as M, noise
from tests import oracles

N, D, STD = 8, 16384, 1.3          # steps, i.i.d. coordinates per step, noise std
EPS32 = float(np.finfo(np.float32).eps)


# ----------------------------------------------------------------------------- covariances
def tree_increment_covariance(n: int, restart_every: int) -> np.ndarray:
    """``[n, n]`` covariance (node std 1) of DP-FTRL's released increments ``n(t) - n(t-1)``
    (Kairouz et al. 2021, Alg. 1): ``n(t)`` sums the i.i.d. nodes of the dyadic decomposition of
    ``t`` (node (h, i) covers leaves ``(i 2^h, (i+1) 2^h]``), one fresh tree every
    ``restart_every`` steps (the increment at a restart is the new tree's ``n(1)``)."""
    def prefix(tree, t):
        return collections.Counter({(tree, h, (t >> h) - 1): 1 for h in range(t.bit_length())
                                    if (t >> h) & 1})

    rows = []
    for s in range(n):
        tree, t = divmod(s, restart_every)
        inc = prefix(tree, t + 1)
        inc.subtract(prefix(tree, t))
        rows.append(inc)
    nodes = sorted({k for r in rows for k in r})
    m = np.array([[r.get(k, 0) for k in nodes] for r in rows], np.float64)
    return m @ m.T


def mf_covariance(strategy, n: int) -> np.ndarray:
    """``C^{-1} C^{-T}`` (noise std 1): the increments are ``C^{-1} Z`` (Denisov et al. 2022)."""
    cinv = np.linalg.inv(strategy.matrix(n))
    return cinv @ cinv.T


# ----------------------------------------------------------------------------- DDG as a privatizer
DDG_CLIENTS, DDG_BITS, DDG_CLIP = 3, 20, 1.0


def _ddg_cfg(dim: int, std: float) -> ddg.DDGConfig:
    return ddg.DDGConfig(dim, DDG_CLIENTS, DDG_CLIP, std / DDG_CLIP, DDG_BITS)


def ddg_test_privatizer(std: float, key) -> optax.GradientTransformation:
    """The distributed discrete Gaussian (``fedpriv.dp.ddg.encode``/``decode``, Kairouz et al.
    2021) behind the privatizer interface, *in this test*: the round's sum ``x`` is carried by
    client 0 of ``DDG_CLIENTS`` (the others contribute 0), every client adds its discrete
    Gaussian share (``z c / gamma / sqrt(n)``), the server decodes the modular sum. The state
    is ``(key, step)``; the round key is ``fold_in(key, step)`` (signs, client keys). The
    engine's DDG path (``fl.algorithms``) is not an optax transformation; this checks the
    noise of its ``encode``/``decode``."""
    def init_fn(params):
        del params
        return key, jnp.zeros((), jnp.int32)

    def update_fn(updates, state, params=None):
        del params
        k, step = state
        flat, unravel = ravel_pytree(updates)
        cfg = _ddg_cfg(flat.size, std)
        k_signs, k_clients = jax.random.split(jax.random.fold_in(k, step))
        signs = ddg.round_signs(cfg, k_signs)
        contrib = jnp.zeros((DDG_CLIENTS, flat.size), jnp.float32).at[0].set(flat)
        raw, _ = jax.vmap(lambda v, kk: ddg.encode(cfg, v, kk, signs))(
            contrib, jax.random.split(k_clients, DDG_CLIENTS))
        total = jnp.sum(ddg.message(cfg, raw), axis=0, dtype=jnp.uint32)
        return unravel(ddg.decode(cfg, total, signs).astype(flat.dtype)), (k, step + 1)

    return optax.GradientTransformation(init_fn, update_fn)


def _ddg_zero_noise_atol(dim: int, xs: np.ndarray) -> float:
    """Per-round bound of DDG at z = 0: the rounding error ``e`` (``|e_i| < 1``) rotated back
    and scaled, ``|gamma (H^T e)_i| <= gamma ||e|| <= gamma sqrt(D)``, plus float32 rounding."""
    cfg = _ddg_cfg(dim, 0.0)
    return cfg.gamma * np.sqrt(cfg.padded_dim) + 16 * EPS32 * float(np.abs(xs).max())


# ----------------------------------------------------------------------------- the cases
@dataclasses.dataclass(frozen=True)
class Case:
    """A privatizer under contract.

    Attributes:
      name: test id.
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


BANDED, BLT, TREE_R = M.banded_strategy(3), M.blt_strategy(16, 3), 4


def _banded_opt():
    pytest.importorskip("jax_privacy")
    from fedpriv.dp import optimized_banded  # noqa: F401 (registers "banded_opt")
    from fedpriv.dp.mechanisms import MatrixDPConfig
    return MatrixDPConfig(1.0, 1.0, mechanism="banded_opt", bands=3, min_separation=3, mf_rounds=N)


def _ma1_privatizer(std, key):
    """A stream defined outside the library on the engine (``noise.streaming_privatizer``): MA(1)
    noise ``w_t = Z_t + Z_{t-1} / 2`` (one buffer holding ``Z_{t-1}``), ``C^{-1}`` bidiagonal."""
    def noise_fn(key, step, like, prev):
        z = noise.noise_like(noise.release_key(key, step), like, std)
        return jax.tree_util.tree_map(lambda a, b: a + 0.5 * b, z, prev), z
    return noise.streaming_privatizer(noise_fn, key, lambda p: jax.tree_util.tree_map(jnp.zeros_like, p))


def _ma1_covariance(n):
    cinv = np.eye(n) + 0.5 * np.eye(n, k=-1)
    return cinv @ cinv.T


CASES = [
    Case("gaussian", lambda std, key: noise.gaussian_privatizer(std, key), np.eye,
         ("noise.gaussian_privatizer",)),
    Case("tree", lambda std, key: noise.tree_privatizer(std, key, TREE_R),
         lambda n: tree_increment_covariance(n, TREE_R), ("noise.tree_privatizer",)),
    Case("banded", lambda std, key: M.banded_privatizer(std, key, BANDED),
         lambda n: mf_covariance(BANDED, n), ("matrix.banded_privatizer", "matrix.privatizer")),
    Case("blt", lambda std, key: M.blt_privatizer(std, key, BLT),
         lambda n: mf_covariance(BLT, n), ("matrix.blt_privatizer", "matrix.privatizer")),
    Case("streaming_ma1", _ma1_privatizer, _ma1_covariance, ("noise.streaming_privatizer",)),
    Case("ddg", ddg_test_privatizer, np.eye, (), _ddg_zero_noise_atol, dim=2048),
    # a mechanism object's own privatizer (fedpriv/dp/optimized_banded.py): the optimised
    # 3-banded C for N rounds (jax_privacy, the "mf" extra)
    Case("banded_opt", lambda std, key: _banded_opt().privatizer(std, key),
         lambda n: mf_covariance(_banded_opt().strategy, n), ()),
]


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


@functools.lru_cache(maxsize=None)
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


@functools.lru_cache(maxsize=None)
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
    assert np.all(np.abs(ratio - 1) < _tols(w)[0]), f"{case.name}: variance / stated {ratio}"
    p = stats.kstest(w[-1] / np.sqrt(var[-1]), "norm").pvalue
    assert p > 1e-4, f"{case.name}: KS p = {p}"


def check_fresh_noise(case: Case):
    w = stream(case, 0)
    assert len({r.tobytes() for r in w}) == N, f"{case.name}: two steps released the same noise"
    emp, want = np.corrcoef(w), _corr(case.covariance(N))
    err = np.abs(emp - want)
    assert err.max() < _tols(w)[1], (f"{case.name}: step correlations off by {err.max():.3g} "
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
        assert np.abs(cross).max() < tol, (
            f"{case.name}: the noise of leaves {x} and {y} is correlated: {cross[worst]:.3g} "
            f"between steps {worst} (tolerance {tol:.3g})")


def check_keys(case: Case):
    a, b = stream(case, 0), stream(case, 1)
    again = _flat(_stream_fn(case, STD, N, case.dim)(jax.random.key(0)))
    np.testing.assert_array_equal(again, a, f"{case.name}: same key, other noise")
    corr = np.array([np.corrcoef(a[t], b[t])[0, 1] for t in range(N)])
    assert np.all(np.abs(corr) < _tols(a)[1]) and not np.array_equal(a, b), (
        f"{case.name}: different keys give correlated noise {corr}")


def check_state_and_jit(case: Case):
    tx = case.make(STD, jax.random.key(0))   # built outside the stream's trace
    x = _zeros(case.dim)
    s0 = tx.init(x)
    leaves, treedef = jax.tree_util.tree_flatten(s0)
    assert leaves and all(isinstance(v, jax.Array) for v in leaves), f"{case.name}: state leaves"
    update = jax.jit(tx.update)
    o1, s1 = update(x, s0)
    o1b, _ = update(x, s0)
    assert all(np.array_equal(u, v) for u, v in zip(jax.tree_util.tree_leaves(o1),
                                                    jax.tree_util.tree_leaves(o1b))), \
        f"{case.name}: update is not a pure function of (updates, state)"
    assert jax.tree_util.tree_structure(s1) == treedef, f"{case.name}: state structure changed"
    assert any(not np.array_equal(_raw(u), _raw(v))
               for u, v in zip(leaves, jax.tree_util.tree_leaves(s1))), f"{case.name}: state did not advance"
    # stepping the jitted update gives the scan's stream (a type-stable carry, same key)
    stepped, s = [], s0
    for _ in range(N):
        o, s = update(x, s)
        stepped.append(o)
    stepped = _flat(jax.tree_util.tree_map(lambda *v: jnp.stack(v), *stepped))
    scanned = stream(case, 0)
    np.testing.assert_allclose(stepped, scanned, rtol=0,
                               atol=64 * EPS32 * max(1.0, np.abs(scanned).max()),
                               err_msg=f"{case.name}: stepped updates != scanned stream")


def check_zero_noise_prefix_sums(case: Case):
    rng = np.random.default_rng(4)
    xs = (0.1 * rng.normal(size=(N, 8))).astype(np.float32)  # norm < DDG's clip
    tx = case.make(0.0, jax.random.key(5))
    like = {"a": jnp.zeros((5,), jnp.float32), "b": jnp.zeros((3,), jnp.float32)}
    state, out = tx.init(like), []
    update = jax.jit(tx.update)
    for x in xs:
        o, state = update({"a": jnp.asarray(x[:5]), "b": jnp.asarray(x[5:])}, state)
        out.append(np.concatenate([np.asarray(o["a"]), np.asarray(o["b"])]))
    got, want = np.cumsum(np.stack(out), 0), np.cumsum(xs, 0)
    atol = case.zero_noise_atol(8, xs) * np.arange(1, N + 1)[:, None]
    assert np.all(np.abs(got - want) <= atol), f"{case.name}: prefix sums off by {np.abs(got - want).max()}"


CHECKS = {"noise_scale": check_noise_scale, "fresh_noise": check_fresh_noise,
          "keys": check_keys, "state_and_jit": check_state_and_jit,
          "leaf_independence": check_leaf_independence,
          "zero_noise_prefix_sums": check_zero_noise_prefix_sums}


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_privatizer_contract(case, check):
    CHECKS[check](case)


def test_prescribed_covariances_match_the_mechanisms_own_formulas():
    """The contract's covariances (built here from the definitions) are fedpriv's documented ones:
    the tree's prefix variance is popcount(t) per tree (``matrix.tree_prefix_variance``) and the
    MF covariance ``matrix.noise_covariance``."""
    cov = tree_increment_covariance(3 * TREE_R, TREE_R)
    prefix_var = np.array([np.tril(np.ones((t + 1, t + 1)))[-1] @ cov[:t + 1, :t + 1]
                           @ np.tril(np.ones((t + 1, t + 1)))[-1] for t in range(3 * TREE_R)])
    per_tree = np.array([bin(t % TREE_R + 1).count("1") for t in range(3 * TREE_R)])
    np.testing.assert_array_equal(prefix_var - np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]),
                                  per_tree)
    for s in (BANDED, BLT):
        np.testing.assert_allclose(mf_covariance(s, N), oracles.noise_covariance(s, N), rtol=1e-12)


# ----------------------------------------------------------------------------- broken privatizers
def _reuses_noise(std, key):
    """Never advances its state: every step releases the same noise."""
    tx = noise.gaussian_privatizer(std, key)
    return optax.GradientTransformation(tx.init, lambda u, s, p=None: (tx.update(u, s)[0], s))


def _reuses_z_in_banded(std, key):
    """Banded MF whose Z_t is drawn from the initial key every step (correlated, not C^{-1} Z)."""
    tx = M.banded_privatizer(std, key, BANDED)

    def update(u, s, p=None):
        out, s2 = tx.update(u, s.replace(step=jnp.zeros_like(s.step)))
        return out, s2.replace(step=s.step + 1)
    return optax.GradientTransformation(tx.init, update)


def _wrong_scale(std, key):
    """Noise 5% larger than stated."""
    return noise.gaussian_privatizer(1.05 * std, key)


def _ignores_key(std, key):
    """Always keyed by key(0), whatever it is given."""
    return noise.gaussian_privatizer(std, jax.random.key(0))


def _biased(std, key):
    """Adds a constant 1e-3 to every release (a leak into the prefix sums)."""
    return optax.chain(noise.gaussian_privatizer(std, key),
                       optax.GradientTransformation(lambda p: optax.EmptyState(),
                                                    lambda u, s, p=None: (
                                                        jax.tree_util.tree_map(lambda v: v + 1e-3, u), s)))


def _one_key_for_every_leaf(std, key):
    """Gaussian noise drawn with the round's key for every leaf (no per-leaf ``split``): leaves
    of one shape get the same noise, a larger leaf the same noise in its prefix."""
    def noise_fn(key, step, like, buffers):
        k = noise.release_key(key, step)
        return jax.tree_util.tree_map(lambda x: std * jax.random.normal(k, x.shape, jnp.float32),
                                      like), buffers
    return noise.streaming_privatizer(noise_fn, key)


def _leaf_index_folded_into_the_step(std, key):
    """Leaf ``i`` drawn from ``release_key(key, step + i)``: leaf ``b`` at step t repeats leaf
    ``a``'s noise of step t + 1 (no two leaves share a step's noise: a lagged reuse)."""
    def noise_fn(key, step, like, buffers):
        leaves, treedef = jax.tree_util.tree_flatten(like)
        return treedef.unflatten([std * jax.random.normal(noise.release_key(key, step + i),
                                                          x.shape, jnp.float32)
                                  for i, x in enumerate(leaves)]), buffers
    return noise.streaming_privatizer(noise_fn, key)


BROKEN = [  # (broken privatizer, the check it fails, what that check says)
    (Case("one_key_for_every_leaf", _one_key_for_every_leaf, np.eye), "leaf_independence",
     "leaves a and b is correlated"),
    (Case("leaf_index_in_step", _leaf_index_folded_into_the_step, np.eye), "leaf_independence",
     "leaves a and b is correlated"),
    (Case("reuses_noise", _reuses_noise, np.eye), "fresh_noise", "released the same noise"),
    (Case("reuses_noise", _reuses_noise, np.eye), "state_and_jit", "state did not advance"),
    (Case("banded_reuses_z", _reuses_z_in_banded, lambda n: mf_covariance(BANDED, n)),
     "fresh_noise", "step correlations off"),
    (Case("wrong_scale", _wrong_scale, np.eye), "noise_scale", "variance / stated"),
    (Case("ignores_key", _ignores_key, np.eye), "keys", "different keys give correlated noise"),
    (Case("biased", _biased, np.eye), "zero_noise_prefix_sums", "prefix sums off"),
]


@pytest.mark.parametrize("case,check,says", BROKEN, ids=[f"{c.name}-{k}" for c, k, _ in BROKEN])
def test_broken_privatizers_fail_the_contract(case, check, says):
    with pytest.raises(AssertionError, match=says):
        CHECKS[check](case)


def _uncovered_privatizers() -> list:
    """Public ``*privatizer`` factories defined in a ``fedpriv.dp`` module and in no case."""
    found = set()
    for info in pkgutil.iter_modules(fedpriv.dp.__path__):
        mod = importlib.import_module(f"fedpriv.dp.{info.name}")
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if name.endswith("privatizer") and not name.startswith("_") and fn.__module__ == mod.__name__:
                found.add(f"{info.name}.{name}")
    assert found, "no privatizer found in fedpriv.dp"
    return sorted(found - {c for case in CASES for c in case.covers})


def test_every_fedpriv_privatizer_is_under_contract(monkeypatch):
    """Every public ``*privatizer`` factory of ``fedpriv.dp`` is covered by a case above: a new
    privatizer inherits the contract by adding its ``Case`` (and one that does not is named)."""
    assert _uncovered_privatizers() == []

    def laplace_privatizer(std, key):  # a privatizer someone adds without a Case
        return noise.gaussian_privatizer(std, key)
    laplace_privatizer.__module__ = "fedpriv.dp.noise"
    monkeypatch.setattr(noise, "laplace_privatizer", laplace_privatizer, raising=False)
    assert _uncovered_privatizers() == ["noise.laplace_privatizer"]
