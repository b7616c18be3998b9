"""Self-checks a researcher runs on their own algorithm's hooks (the hook contract), beside the
mechanism checks of ``fedpriv.dp.testing`` (which cannot hold these: ``fedpriv.dp`` never imports
``fedpriv.fl``). docs/extending.md, "An algorithm", shows them on a new algorithm.

**Client hooks** (``check_client_hooks``; ``fedpriv.fl.client.ClientHooks``), on the caller's
params and one client's batches ``[S, B, ...]``:

* ``init`` / ``step`` / ``final`` trace under ``jit``; the carry keeps its structure, shapes and
  dtypes across steps (the engine carries it through ``lax.fori_loop``); ``aux`` is a dict of
  scalar sums; the hooks are pure (the same inputs give the same outputs, bit for bit);
* ``final``'s release is a pytree of floats (the engine clips it as one vector); for hooks that
  keep client state, ``final`` returns ``(release, client_state)`` with the structure, shapes
  and dtypes of ``state_init(params)``;
* through the engine (``fedpriv.fl.aggregate.packed_sum``): replacing one client's data moves the
  cohort's clipped sum by at most ``2 C`` and adding a client by at most ``C`` -- the sensitivity
  the mechanisms account, whatever the hooks compute.

**Server hooks** (``check_server_hooks``; ``ServerHooks``): ``init(params)`` and ``update(params,
state, release_avg, round)`` trace under ``jit``, are pure, and keep the params' and the state's
structure, shapes and dtypes. They see only the DP release and public server state
(post-processing) by their signature.

**Samplers** (``check_sampler``; ``fedpriv.fl.samplers.Sampler``): over ``rounds`` rounds the
schedule is a pure function of (seed, round) (sampled twice, the same), its indices are sorted,
unique and in the population, no cohort exceeds ``max_cohort_size``, and what the sampler
declares for its accounting holds on the schedule it draws: each client at most once per
``rounds_per_epoch`` (a period, for trees), consecutive participations at least
``min_separation`` rounds apart, at most ``max_participations(rounds)`` of them; the fixed-size
samplers draw exactly ``cohort_size``; the mean cohort is near ``expected_cohort_size``.

A failed check raises ``fedpriv.dp.testing.ContractViolation`` naming what is wrong.
"""
from __future__ import annotations

import math
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.dp.testing import ContractViolation
from fedpriv.fl.aggregate import packed_sum
from fedpriv.fl.client import ClientHooks, ServerHooks, ServerView
from fedpriv.fl.cohort import build_cohort, pack_cohort
from fedpriv.fl.samplers import check_sampler as _has_members

__all__ = ["check_client_hooks", "check_server_hooks", "check_sampler", "ContractViolation"]


def _require(ok, message: str) -> None:
    if not ok:
        raise ContractViolation(message)


def _signature(tree):
    """Structure, shapes and dtypes of a pytree (what a loop carry must keep)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, [(tuple(np.shape(x)), jnp.result_type(x)) for x in leaves]


def _same(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def _norm(tree) -> float:
    return float(np.sqrt(sum(float(jnp.sum(jnp.square(x.astype(jnp.float32))))
                             for x in jax.tree_util.tree_leaves(tree))))


def _run_client(hooks: ClientHooks, view: ServerView, batches: Mapping, client_state=None):
    """One client's hooks over its batches ``[S, B, ...]`` under jit: ``(final output, carries)``.
    Each call traces afresh (new wrappers): a hook whose trace reads mutable Python state gives
    another result the second time, as it would after a recompilation (e.g. a resume)."""
    init = jax.jit(lambda *a: hooks.init(*a))
    step = jax.jit(lambda *a: hooks.step(*a))
    final = jax.jit(lambda *a: hooks.final(*a))
    carry = init(view, client_state) if hooks.stateful else init(view)
    carries = [carry]
    n = len(next(iter(batches.values())))
    for j in range(n):
        batch = {k: v[j] for k, v in batches.items()}
        carry, aux = step(view, carry, batch, jax.random.key(j))
        _require(isinstance(aux, Mapping) and all(np.ndim(v) == 0 for v in aux.values()),
                 "step's aux must be a dict of scalar sums")
        carries.append(carry)
    return final(view, carry), carries


def check_client_hooks(hooks: ClientHooks, params, dataset: Mapping, *, server_state=None,
                       batch_size: int = 4, max_steps: int = 3, clip_norm: float = 1.0) -> None:
    """The client side of the hook contract (module docstring) on ``params`` and ``dataset``
    (client id -> dict of example arrays, at least 3 clients); ``server_state``: what the server
    hooks would broadcast (``ServerView.opt_state``, e.g. ``ServerHooks.init(params)``)."""
    ids = list(dataset)
    _require(len(ids) >= 3, "check_client_hooks needs a dataset of at least 3 clients")
    view = ServerView(params, server_state, jnp.asarray(0, jnp.int32))
    state0 = hooks.state_init(params) if hooks.stateful else None
    cohort = build_cohort(dataset, ids[:1], batch_size, 1, max_steps)
    batches = {k: v[0] for k, v in cohort.batches.items()}  # one client's [S, B, ...] batches
    out, carries = _run_client(hooks, view, batches, state0)
    sig = _signature(carries[0])
    _require(all(_signature(c) == sig for c in carries),
             "the carry changed structure, shape or dtype across steps (the engine's loop carry "
             "must be type-stable)")
    again, _ = _run_client(hooks, view, batches, state0)
    _require(_same(out, again), "the hooks are not pure: the same inputs gave another output")
    release = out
    if hooks.stateful:
        _require(isinstance(out, tuple) and len(out) == 2,
                 "a stateful client's final must return (release, client_state)")
        release, state = out
        _require(_signature(state) == _signature(state0),
                 "final's client state differs in structure, shape or dtype from state_init's")
    _require(all(jnp.issubdtype(jnp.result_type(x), jnp.floating) for x in jax.tree_util.tree_leaves(release))
             and jax.tree_util.tree_leaves(release), "final's release must be a non-empty pytree of floats")
    _check_sensitivity(hooks, view, dataset, ids, batch_size, max_steps, clip_norm, state0)


def _check_sensitivity(hooks, view, dataset, ids, batch_size, max_steps, clip_norm, state0):
    """Replace-one moves the clipped sum by <= 2 C, add-one by <= C (through the engine)."""
    k = len(ids)
    # the last client's data replaced (the others keep their slots, keys and batch order): the
    # first client's, reversed, floats scaled by 100
    other = dict(dataset)
    other[ids[-1]] = {key: (np.asarray(v)[::-1] * 100).astype(np.asarray(v).dtype)
                      if np.issubdtype(np.asarray(v).dtype, np.floating) else np.asarray(v)[::-1]
                      for key, v in dataset[ids[0]].items()}
    states = (None if state0 is None else
              jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (k,) + np.shape(x)), state0))

    def total(data, cohort):
        packed = pack_cohort(data, cohort, batch_size, lanes=1, capacity=k, max_steps=max_steps,
                             rng=np.random.default_rng(0))
        run = jax.jit(lambda lanes, cs: packed_sum(hooks, None, view, lanes, k, jax.random.key(1),
                                                   clip_norm, client_states=cs)[0])
        return run(packed.lanes, states)

    a, b, c = total(dataset, ids), total(other, ids), total(dataset, ids[:-1])
    diff = lambda x, y: _norm(jax.tree_util.tree_map(jnp.subtract, x, y))
    tol = 1 + 1e-4
    _require(diff(a, b) <= 2 * clip_norm * tol,
             f"replacing one client moved the clipped sum by {diff(a, b):.4g} > 2 C = {2 * clip_norm:g}")
    _require(diff(a, c) <= clip_norm * tol,
             f"removing one client moved the clipped sum by {diff(a, c):.4g} > C = {clip_norm:g}")


def check_server_hooks(server: ServerHooks, params, release_like=None) -> None:
    """The server side of the hook contract (module docstring). ``release_like``: a release
    average of the clients' release structure (default: params-shaped, a model delta)."""
    release = release_like if release_like is not None else jax.tree_util.tree_map(
        lambda x: 0.01 * jnp.ones_like(x), params)
    state = jax.jit(server.init)(params)
    update = jax.jit(server.update)
    p1, s1 = update(params, state, release, jnp.asarray(0, jnp.int32))
    p1b, s1b = update(params, state, release, jnp.asarray(0, jnp.int32))
    _require(_same((p1, s1), (p1b, s1b)), "the server update is not pure")
    _require(_signature(p1) == _signature(params),
             "the server update changed the params' structure, shape or dtype")
    _require(_signature(s1) == _signature(state),
             "the server update changed its state's structure, shape or dtype")
    p2, s2 = update(p1, s1, release, jnp.asarray(1, jnp.int32))
    _require(_signature(s2) == _signature(state), "the server state is not type-stable over rounds")


def check_sampler(sampler, rounds: int = 64) -> None:
    """The sampler contract (module docstring) over ``rounds`` rounds."""
    _has_members(sampler)
    n, cap = int(sampler.num_clients), int(sampler.max_cohort_size)
    schedule = [np.asarray(sampler.sample(r)) for r in range(rounds)]
    _require(all(np.array_equal(a, np.asarray(sampler.sample(r))) for r, a in enumerate(schedule)),
             "sample(round) is not a pure function of (seed, round)")
    for r, a in enumerate(schedule):
        _require(a.ndim == 1 and np.array_equal(a, np.unique(a)) and (a.size == 0 or 0 <= a.min() <= a.max() < n),
                 f"round {r}: the cohort is not sorted unique indices into the population of {n}")
        _require(a.size <= cap, f"round {r}: {a.size} clients > max_cohort_size {cap}")
    sizes = np.array([a.size for a in schedule])
    fixed = isinstance(getattr(sampler, "cohort_size", None), int) and not sampler.variable_cohort
    if fixed:
        _require(np.all(sizes == sampler.cohort_size), f"a fixed-size sampler drew cohorts of {set(sizes)}")
    want = float(sampler.expected_cohort_size)
    _require(abs(sizes.mean() - want) <= 5 * math.sqrt(want / rounds) + 1e-9,
             f"mean cohort {sizes.mean():.3g} vs expected_cohort_size {want:g}")
    _check_participation(sampler, schedule, rounds)


def _check_participation(sampler, schedule, rounds: int) -> None:
    where: dict[int, list[int]] = {}
    for r, a in enumerate(schedule):
        for c in a.tolist():
            where.setdefault(c, []).append(r)
    period = getattr(sampler, "rounds_per_epoch", None)
    sep = getattr(sampler, "min_separation", None)
    maxp = getattr(sampler, "max_participations", None)
    for c, rs in where.items():
        if isinstance(period, int):
            epochs = [r // period for r in rs]
            _require(len(epochs) == len(set(epochs)),
                     f"client {c} takes part twice in one period of {period} rounds (rounds {rs})")
        if isinstance(sep, int) and len(rs) > 1:
            gap = int(np.diff(rs).min())
            _require(gap >= sep, f"client {c} takes part {gap} rounds apart < min_separation {sep}")
        if callable(maxp):
            _require(len(rs) <= int(maxp(rounds)),
                     f"client {c} takes part {len(rs)} times > max_participations({rounds}) = {int(maxp(rounds))}")
