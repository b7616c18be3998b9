"""The noise engine of every central DP mechanism: one streaming privatizer, one key rule.

Every mechanism that noises the cohort sum on the server (``fedpriv.dp.mechanisms``) is one
``streaming_privatizer``: an ``optax.GradientTransformation`` whose state ``NoiseState(key,
step, buffers)`` holds the run's noise key, the number of releases made and the stream's memory,
and whose ``update(x_t, state)`` returns ``x_t + w_t`` with ``w_t`` row t of ``C^{-1} Z`` for the
mechanism's factor ``C`` (the increment of the noisy prefix sums ``A x + B Z``; Denisov et al.
2022, the streaming view of jax_privacy's ``StreamingMatrix`` privatizers):

    privatizer = tree_privatizer(noise_std, key, restart_every)   # or gaussian_/banded_/blt_
    state = privatizer.init(params)
    noised_increment, state = privatizer.update(sum_tree, state)

so it composes with any optax chain (``optax.chain(tree_privatizer(z * C, key, R),
optax.scale(1 / m), optax.sgd(lr))``) and the federated engine (``fedpriv.fl.algorithms``)
uses these very objects on its normalised sums. The special cases:

* **Gaussian** (DP-FedAvg, McMahan et al. 2018): ``C = I``, ``w_t = std Z_t``: fresh noise every
  round, ``std = z * C`` (noise multiplier z, clip norm C; docs/design.md §3).
* **Tree** (DP-FTRL, Kairouz et al. 2021, "Practical and private (deep) learning without
  sampling or shuffling", Alg. 1 and App. D): ``C`` = the binary-tree matrix; the released
  prefix sum ``S_t = sum_{s<=t} x_s + n(t)`` carries the i.i.d. ``N(0, std^2)`` noises of the
  tree nodes in the dyadic decomposition of ``t``, and the privatizer returns the increment
  ``x_t + n(t) - n(t-1)`` (SGD with learning rate eta on it is exactly FTRL:
  ``theta_t = theta_0 + eta * S_t``). Node (level h, index j) covers leaves
  ``[j 2^h + 1, (j+1) 2^h]``; its noise is regenerated from its key, so the stream needs no
  buffers: O(1) memory, jit-able, exactly resumable. With ``restart_every=R`` the tree restarts
  every R releases with a fresh key (one tree per epoch; accounting composes one tree per
  epoch). Each leaf lies in at most ``ceil(log2(R + 1))`` nodes, the depth used by
  ``dp_accounting.SingleEpochTreeAggregationDpEvent``. ``R = 1`` is the Gaussian mechanism.
* **Banded / BLT matrix factorization** (``fedpriv.dp.matrix``): ``w_t`` from ``Z_t`` and a
  few buffers of past ``w`` (the Toeplitz recurrences), kept in ``NoiseState.buffers``.

**The key rule** (one for every mechanism; docs/design.md §3): the Gaussian draw with stream
index ``i`` under key ``k`` is ``noise_like(release_key(k, i), like, std)``:
``release_key(k, i) = fold_in(k, i)`` and one ``split`` key per parameter leaf. The stream index
of a Gaussian or MF release is its round ``t``; a tree's nodes nest it: the tree of epoch ``e``
is ``release_key(key, e)`` and its node (h, j) ``release_key(tree_key, h * 2^24 + j)``. The
distributed discrete Gaussian's round keys are ``release_key(key, t)`` too (split by purpose,
``mechanisms.DDGMechanism.codec``).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

# Node ids are folded into the key as ``level * _LEVEL_STRIDE + index``.
_LEVEL_STRIDE = 1 << 24


@struct.dataclass
class NoiseState:
    key: jax.Array          # typed PRNG key of the run's noise (fixed for the run)
    step: jax.Array         # int32: releases made so far (the next is release ``step``)
    buffers: Any = ()       # the stream's memory (MF: each leaf [num_buffers, *leaf]); () if none


# (update, state) -> noise shaped like the update, new buffers; see ``streaming_privatizer``
NoiseFn = Callable[[jax.Array, jax.Array, Any, Any], tuple]


def check_int(name: str, value, lo: int = 1) -> int:
    """``value`` as an ``int`` if it is an integer ``>= lo`` (Python or NumPy int, or an
    integral float such as ``4.0``); ``2.7``, ``True``, NaN and strings are refused
    (``ValueError`` naming ``name``): an int-valued privacy parameter is never truncated, so
    the noise and the accounting cannot read it differently."""
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer,
                                                                         np.floating))
    if not ok or not math.isfinite(value) or int(value) != value or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def check_std(noise_std) -> float:
    """``noise_std`` as a float if it is finite and >= 0 (else ``ValueError``)."""
    std = float(noise_std)
    if not (std >= 0 and math.isfinite(std)):
        raise ValueError(f"noise std must be a finite number >= 0, got {std}")
    return std


def release_key(key, index):
    """The key of stream index ``index`` (a round, a tree, a node) under ``key``: the one key
    rule of every noise draw in fedpriv.dp (``fold_in``)."""
    return jax.random.fold_in(key, index)


def noise_like(key, tree, std):
    """i.i.d. ``N(0, std^2)`` noise shaped like ``tree``: one ``split`` key per leaf, drawn in
    float32 and cast to the leaf's dtype."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    noise = [std * jax.random.normal(k, x.shape, jnp.float32).astype(x.dtype)
             for k, x in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, noise)


def check_key(key, name: str = "key"):
    """``key`` if it is a JAX PRNG key (typed, ``jax.random.key(seed)``, or a legacy raw
    ``uint32[2]`` ``jax.random.PRNGKey(seed)``) or None; else ``ValueError`` naming it (an int
    seed where a key is expected would otherwise fail deep inside JAX)."""
    if key is None:
        return key
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) and shape == ():
        return key
    if dtype == jnp.uint32 and shape == (2,):
        return key
    got = (f"an array of dtype {dtype} and shape {tuple(shape)}" if dtype is not None and shape is not None
           else f"{type(key).__name__} {key!r}")
    raise ValueError(f"{name} must be a JAX PRNG key (e.g. jax.random.key({key if type(key) is int else 0})), "
                     f"got {got}")


def streaming_privatizer(noise_fn: NoiseFn | None, key,
                         init_buffers: Callable[[Any], Any] | None = None) -> optax.GradientTransformation:
    """The noise engine: ``update(x_t, NoiseState(key, t, buffers))`` returns ``x_t + w_t``
    (``w_t`` cast to each leaf's dtype) and ``NoiseState(key, t + 1, buffers')``, where
    ``w_t, buffers' = noise_fn(key, t, x_t, buffers)`` (``noise_fn=None``: no noise; the state
    still counts the releases and holds the key).

    Args:
      noise_fn: ``(key, step, like, buffers) -> (noise like ``like``, new buffers)``; draws its
        Gaussians by the key rule (``release_key``, ``noise_like``).
      key: typed PRNG key ``init`` puts in the state; ``None`` builds an update-only
        transformation (the engine's jitted round: the key lives in ``ServerState``).
      init_buffers: ``params -> buffers`` (a pytree); ``None``: no buffers (``()``).
    """
    check_key(key)

    def init_fn(params):
        if key is None:
            raise ValueError("this privatizer was built without a key: pass one to init a state")
        buffers = init_buffers(params) if init_buffers is not None else ()
        return NoiseState(key, jnp.zeros((), jnp.int32), buffers)

    def update_fn(updates, state, params=None):
        del params
        if noise_fn is None:
            return updates, NoiseState(state.key, state.step + 1, state.buffers)
        w, buffers = noise_fn(state.key, state.step, updates, state.buffers)
        noised = jax.tree_util.tree_map(lambda x, n: x + n.astype(x.dtype), updates, w)
        return noised, NoiseState(state.key, state.step + 1, buffers)

    return optax.GradientTransformation(init_fn, update_fn)


def node_noise(key, level, index, like, std):
    """Noise of tree node (``level``, ``index``): i.i.d. ``N(0, std^2)`` per coordinate."""
    return noise_like(release_key(key, level * _LEVEL_STRIDE + index), like, std)


def tree_increment_noise(key, t, like, std, num_levels: int):
    """``n(t) - n(t-1)`` for ``t >= 1`` without materialising both prefix noises.

    With ``h0`` the lowest set bit of ``t``: ``n(t) - n(t-1) = node(h0, (t >> h0) - 1)
    - sum_{h < h0} node(h, ((t - 1) >> h) - 1)`` (the nodes above ``h0`` are shared).
    Only those ``h0 + 1`` nodes are generated (``lax.cond``), ~2 per step on average. The
    levels are a ``lax.fori_loop`` (one compiled body: compile time no longer grows with the
    levels; the noise is bit-identical to the unrolled loop, tests/dp/test_clipping_noise.py).
    """
    h0 = jax.lax.population_count((t & -t) - 1)

    def level(h, total):
        coef = jnp.where(h == h0, 1.0, jnp.where(h < h0, -1.0, 0.0))
        idx = jnp.where(h == h0, (t >> h) - 1, ((t - 1) >> h) - 1)

        def add(total):
            z = node_noise(key, h, jnp.maximum(idx, 0), like, std)
            return jax.tree_util.tree_map(lambda a, b: a + coef.astype(b.dtype) * b, total, z)

        return jax.lax.cond(coef != 0, add, lambda total: total, total)

    return jax.lax.fori_loop(0, num_levels, level, jax.tree_util.tree_map(jnp.zeros_like, like))


def num_tree_levels(leaves: int) -> int:
    """Levels of a binary tree over ``leaves`` leaves = ceil(log2(leaves + 1))."""
    return max(1, int(leaves).bit_length())


def tree_privatizer(noise_std: float, key, restart_every: int) -> optax.GradientTransformation:
    """DP-FTRL tree-aggregation noise as an ``optax.GradientTransformation``.

    ``update(updates, state)`` treats ``updates`` (a pytree, e.g. the sum of clipped client
    deltas of one round, sensitivity C) as the next leaf of the tree and returns
    ``updates + n(t) - n(t-1)``: the increment of the noisy prefix sums (Kairouz et al. 2021,
    Alg. 1), ``n`` built from i.i.d. ``N(0, noise_std^2)`` node noises (``noise_std = z * C``).
    Release ``s`` (0-based) is leaf ``s mod R + 1`` of tree ``s // R`` (key
    ``release_key(key, s // R)``): the tree restarts with a fresh key every ``restart_every``
    updates (one tree per epoch).

    Args:
      noise_std: per-node noise std per coordinate (a Python float >= 0).
      key: typed PRNG key the state is initialised with (``init``); ``None``: update-only.
      restart_every: leaves per tree; 1 is the Gaussian mechanism (``gaussian_privatizer``).
    """
    std = check_std(noise_std)
    R = check_int("restart_every", restart_every)
    levels = num_tree_levels(R)

    def noise_fn(key, step, like, buffers):
        tree_key = release_key(key, step // R)  # a fresh key for every tree
        if R == 1:
            return noise_like(tree_key, like, std), buffers
        return tree_increment_noise(tree_key, step % R + 1, like, std, levels), buffers

    return streaming_privatizer(noise_fn if std > 0 else None, key)


def gaussian_privatizer(noise_std: float, key) -> optax.GradientTransformation:
    """The Gaussian mechanism as an ``optax.GradientTransformation``: ``updates + N(0,
    noise_std^2 I)``, fresh noise every update (DP-FedAvg, McMahan et al. 2018; ``noise_std =
    z * C``); release ``t`` draws ``noise_like(release_key(key, t))``. The ``restart_every=1``
    case of :func:`tree_privatizer`."""
    return tree_privatizer(noise_std, key, 1)
