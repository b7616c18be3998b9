"""The privatizer contract on every fedpriv privatizer (issue 25 item 6; as jax_privacy
parametrizes one contract over all its privatizers). The contract itself ships with the library,
``fedpriv.dp.testing`` (issue 52: a researcher runs it on their own mechanism); this file states
each built-in privatizer's prescribed covariance from the mechanism's definition (not from
fedpriv's helpers), runs every check on it, shows the checks catch broken privatizers (noise
reused across steps, wrong scale, key ignored, a bias, one key for every leaf), that no privatizer of ``fedpriv.dp``
escapes the contract, and that every built-in mechanism's noise matches the event it charges
(``check_noise_matches_event``; its broken z/2 variant is caught in
``tests/fl/test_user_mechanism.py``).
"""
from __future__ import annotations

import collections
import importlib
import inspect
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import fedpriv.dp
from fedpriv.dp import ddg, matrix as M, noise
from fedpriv.dp.mechanisms import BandedMechanism, BLTMechanism, GaussianMechanism, TreeMechanism
from fedpriv.dp.testing import CHECKS, EPS32, Case, ContractViolation, N, check_noise_matches_event
from tests import oracles


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
        if info.name == "testing":  # the contract's own checks (check_privatizer), not privatizers
            continue
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


@pytest.mark.parametrize("mech", [
    GaussianMechanism(1.0, 1.0),
    TreeMechanism(1.0, 1.0, restart_every=N),
    BandedMechanism(1.0, 1.0, bands=3, min_separation=N, mf_rounds=N),
    BLTMechanism(1.0, 1.0, min_separation=N, blt_buffers=3, mf_rounds=N),
], ids=lambda m: m.mechanism)
def test_every_built_in_mechanism_s_noise_covers_its_charged_event(mech):
    """``fedpriv.dp.testing.check_noise_matches_event``: the event each built-in mechanism charges
    for N rounds (one participation) costs at least what its measured noise gives; for banded MF
    the two are the same number (its sensitivity is exact), a check with teeth."""
    out = check_noise_matches_event(mech, N)
    assert out["charged_epsilon"] >= out["noise_epsilon"] > 0
    if mech.mechanism == "banded":
        assert out["charged_epsilon"] < 1.15 * out["noise_epsilon"]


def test_contract_failures_are_contract_violations():
    with pytest.raises(ContractViolation, match="variance / stated"):
        CHECKS["noise_scale"](Case("wrong_scale", _wrong_scale, np.eye))
