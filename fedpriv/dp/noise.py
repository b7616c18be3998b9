"""Noise mechanisms on aggregated sums: Gaussian and DP-FTRL tree aggregation.

One mechanism (PRNG key in the state) covers both, and is used as an optax transformation:

    privatizer = tree_privatizer(noise_std, key, restart_every)   # or gaussian_privatizer
    state = privatizer.init(params)
    noised_increment, state = privatizer.update(sum_tree, state)

so it composes with any optax chain (``optax.chain(tree_privatizer(z * C, key, R),
optax.scale(1 / m), optax.sgd(lr))``) and the federated engine (``fedpriv.fl.algorithms``)
uses these very objects on its normalised sums.

* **Gaussian** (DP-FedAvg, McMahan et al. 2018): ``sum + N(0, std^2 I)`` with fresh noise
  every round, ``std = z * C`` (noise multiplier z, clip norm C; docs/design.md §3).
* **Tree** (DP-FTRL, Kairouz et al. 2021, "Practical and private (deep) learning without
  sampling or shuffling", Alg. 1 and App. D): the server releases noisy *prefix sums*
  ``S_t = sum_{s<=t} x_s + n(t)`` where ``n(t)`` is the sum of the i.i.d. ``N(0, std^2)``
  noises of the binary-tree nodes in the dyadic decomposition of ``t``. The mechanism
  returns the increment ``S_t - S_{t-1} = x_t + n(t) - n(t-1)``, so any server optimizer
  consumes it like a noisy sum (SGD with learning rate eta gives exactly FTRL:
  ``theta_t = theta_0 + eta * S_t``). Node (level h, index j) covers leaves
  ``[j 2^h + 1, (j+1) 2^h]``; its noise is regenerated from ``fold_in(key, node)``, so the
  state is just ``(key, step, tree)``: jit-able, O(1) memory, exactly resumable.
  With ``restart_every=R`` the tree restarts after R steps with a fresh key (one tree per
  epoch for clients that participate again; accounting composes one tree per epoch).
  Each leaf lies in at most ``ceil(log2(R + 1))`` nodes, the depth used by
  ``dp_accounting.SingleEpochTreeAggregationDpEvent``.
  Gaussian noise is the identity case of the tree: ``restart_every=1``.

Also: per-client noise *shares* for distributed DP under secure aggregation
(``distributed_noise_share``): m clients each add ``N(0, std^2/m)`` so that the securely
aggregated sum carries exactly ``N(0, std^2)``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

# Node ids are folded into the key as ``level * _LEVEL_STRIDE + index``.
_LEVEL_STRIDE = 1 << 24


@struct.dataclass
class NoiseState:
    key: jax.Array          # typed PRNG key of the current tree
    step: jax.Array         # int32: number of leaves already released in the current tree
    tree: jax.Array         # int32: index of the current tree (epoch) since init


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


def _gaussian_like(key, tree, std):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    noise = [std * jax.random.normal(k, x.shape, jnp.float32).astype(x.dtype)
             for k, x in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(treedef, noise)


def node_noise(key, level, index, like, std):
    """Noise of tree node (``level``, ``index``): i.i.d. ``N(0, std^2)`` per coordinate."""
    return _gaussian_like(jax.random.fold_in(key, level * _LEVEL_STRIDE + index), like, std)


def tree_prefix_noise(key, t, like, std, num_levels: int):
    """Total noise ``n(t)`` on the prefix sum of the first ``t`` leaves (``t >= 0``).

    ``n(t) = sum over set bits h of t of node_noise(level=h, index=(t >> h) - 1)``;
    ``n(0) = 0``. ``num_levels`` (static) bounds the levels examined.
    """
    total = jax.tree_util.tree_map(jnp.zeros_like, like)
    for h in range(num_levels):
        bit = (t >> h) & 1
        z = node_noise(key, h, jnp.maximum((t >> h) - 1, 0), like, std)
        total = jax.tree_util.tree_map(lambda a, b: a + jnp.where(bit == 1, b, 0), total, z)
    return total


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


@dataclasses.dataclass(frozen=True)
class NoiseMechanism:
    """Gaussian (``restart_every=1``) or tree-aggregation noise on a sum.

    Attributes:
      std: noise std per coordinate of a sum (per tree node for the tree) = z * C.
      restart_every: leaves per tree; 1 = plain Gaussian mechanism.
    """
    std: float
    restart_every: int = 1

    def __post_init__(self):
        if not (self.std >= 0 and math.isfinite(self.std)):
            raise ValueError(f"noise std must be a finite number >= 0, got {self.std}")
        check_int("restart_every", self.restart_every)

    @property
    def num_levels(self) -> int:
        return num_tree_levels(self.restart_every)

    def init(self, key) -> NoiseState:
        return NoiseState(key=key, step=jnp.zeros((), jnp.int32), tree=jnp.zeros((), jnp.int32))

    def add_noise(self, sum_tree, state: NoiseState):
        """Returns ``(sum_tree + n(t) - n(t-1), new_state)`` for the next leaf t."""
        restart = state.step >= self.restart_every
        tree_idx = jnp.where(restart, state.tree + 1, state.tree)
        step = jnp.where(restart, 0, state.step)
        key = jax.random.fold_in(state.key, tree_idx)  # a fresh key for every tree
        if self.std == 0:
            return sum_tree, NoiseState(state.key, step + 1, tree_idx)
        if self.restart_every == 1:
            inc = _gaussian_like(key, sum_tree, self.std)
        else:
            inc = tree_increment_noise(key, step + 1, sum_tree, self.std, self.num_levels)
        noised = jax.tree_util.tree_map(jnp.add, sum_tree, inc)
        return noised, NoiseState(state.key, step + 1, tree_idx)


def tree_privatizer(noise_std: float, key, restart_every: int) -> optax.GradientTransformation:
    """DP-FTRL tree-aggregation noise as an ``optax.GradientTransformation``.

    ``update(updates, state)`` treats ``updates`` (a pytree, e.g. the sum of clipped client
    deltas of one round, sensitivity C) as the next leaf of the tree and returns
    ``updates + n(t) - n(t-1)``: the increment of the noisy prefix sums (Kairouz et al. 2021,
    Alg. 1), ``n`` built from i.i.d. ``N(0, noise_std^2)`` node noises (``noise_std = z * C``).
    The tree restarts with a fresh key every ``restart_every`` updates (one tree per epoch).

    Args:
      noise_std: per-node noise std per coordinate (a Python float >= 0).
      key: typed PRNG key the state is initialised with (``init``). ``None`` builds a
        transformation that can only ``update`` an existing state (what the engine's jitted
        round uses: the key lives in the state).
      restart_every: leaves per tree; 1 is the Gaussian mechanism (``gaussian_privatizer``).

    The state is a ``NoiseState`` (key, step, tree index): O(1) memory, exactly resumable.
    """
    mech = NoiseMechanism(float(noise_std), check_int("restart_every", restart_every))

    def init_fn(params):
        del params
        if key is None:
            raise ValueError("this privatizer was built without a key: pass one to init a state")
        return mech.init(key)

    def update_fn(updates, state, params=None):
        del params
        return mech.add_noise(updates, state)

    return optax.GradientTransformation(init_fn, update_fn)


def gaussian_privatizer(noise_std: float, key) -> optax.GradientTransformation:
    """The Gaussian mechanism as an ``optax.GradientTransformation``: ``updates + N(0,
    noise_std^2 I)``, fresh noise every update (DP-FedAvg, McMahan et al. 2018; ``noise_std =
    z * C``). The ``restart_every=1`` case of :func:`tree_privatizer`."""
    return tree_privatizer(noise_std, key, 1)


def gaussian_mechanism(noise_multiplier: float, clip_norm: float) -> NoiseMechanism:
    """Plain Gaussian mechanism on a sum with L2 sensitivity ``clip_norm``."""
    return NoiseMechanism(std=float(noise_multiplier) * float(clip_norm), restart_every=1)


def tree_mechanism(noise_multiplier: float, clip_norm: float, restart_every: int) -> NoiseMechanism:
    """DP-FTRL tree aggregation with per-node std ``z * C``, restarting every ``restart_every``."""
    return NoiseMechanism(std=float(noise_multiplier) * float(clip_norm),
                          restart_every=check_int("restart_every", restart_every))


def distributed_noise_share(key, like: Any, std: float, num_clients):
    """One client's share of distributed Gaussian noise under secure aggregation.

    Each of ``num_clients`` clients adds ``N(0, std^2 / num_clients)`` per coordinate; the
    securely aggregated sum of the shares is ``N(0, std^2)``, the noise the proof needs.
    """
    return _gaussian_like(key, like, std / jnp.sqrt(jnp.asarray(num_clients, jnp.float32)))
