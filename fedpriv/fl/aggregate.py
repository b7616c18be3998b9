"""Cohort aggregation: per-client updates + clipping, summed over a cohort.

``packed_sum`` (the engine's path) runs a ``fedpriv.fl.cohort.PackedCohort``: each lane is a
dynamic-length loop over its clients' real local steps; at a client's last step its delta is
clipped, weighted and added to the lane's running sum, and the lane restarts from the server
model. One lane runs alone (CPU: only real steps execute); several lanes are ``vmap``-ped
(accelerators), optionally in chunks of ``lane_chunk`` lanes (bounded memory), and their sums
are added. The released query is the sum over real clients of ``w_i clip(delta_i)``: L2
sensitivity C per client (each contribution has norm <= w_i C with w_i <= 1), plus summed
metrics and clipping statistics. When the lanes are sharded over devices
(``fedpriv.fl.execution``), XLA partitions the vmap and turns the sum into an all-reduce: the
same code on 1 CPU, several GPUs or a TPU slice. (The padded, per-client ``vmap`` of the same
query is the tests' oracle: ``tests/oracles.py``.)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from fedpriv.dp.clipping import WEIGHTINGS, clip_update
from fedpriv.fl.client import ClientHooks, ServerView, step_hooks
from fedpriv.fl.cohort import FirstSteps, Lanes


def client_weight(num_examples, weighting: str, weight_cap: float):
    """w_i in [0, 1]: 1 (uniform) or min(n_i, cap) / cap (example-count weighting)."""
    if weighting == "uniform":
        return jnp.ones_like(num_examples, dtype=jnp.float32)
    if weighting == "num_examples":
        return jnp.minimum(num_examples.astype(jnp.float32), weight_cap) / weight_cap
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def _finish_client(delta, nex, clip_norm, weighting, weight_cap, real=1.0, slot=None, encode=None):
    """Clip one client's ``delta`` (its ``final`` hook's output) and weight it: ``(w * clipped,
    stats, norm)``. Not a hook: whatever the client hooks compute, this clipping bounds the
    client's contribution to the sum by ``w clip_norm``.

    ``encode``: ``(contrib, slot, real) -> (message, stats)`` turns the weighted clipped delta
    into what the client sends (e.g. ``fedpriv.fl.algorithms``' DDG secure-aggregation
    message); the lane then sums messages, and ``stats`` join the client's."""
    tmap = jax.tree_util.tree_map
    clipped, norm, finite = clip_update(delta, clip_norm)
    w = client_weight(nex, weighting, weight_cap) * finite.astype(jnp.float32) * real
    contrib = tmap(lambda x: (w * x).astype(jnp.float32), clipped)
    stats = {"weight_sum": w, "norm_sum": jnp.where(finite, norm, 0.0) * real,
             "num_clipped": (finite & (norm > clip_norm)).astype(jnp.float32) * real,
             "num_nonfinite": (~finite).astype(jnp.float32) * real,
             "num_clients": jnp.asarray(real, jnp.float32)}
    if encode is not None:
        contrib, extra = encode(contrib, slot, jnp.asarray(real, jnp.float32))
        stats.update(extra)
    return contrib, stats, norm


def _sum0(tree):
    """Sum over the leading axis, keeping each leaf's dtype (uint32 messages wrap mod 2^32)."""
    return jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0, dtype=a.dtype), tree)


def _trimmed_step(step_fn, width: int, fields, axis: int = 1):
    """``step_fn(server, carry, batch, key)`` on the batch's ``fields`` cut to their first
    ``width`` entries on ``axis``: time (1: ``[B, T] -> [B, width]``; exact when the cut columns
    are PAD in every row: causal models, PAD targets carry no loss, ``fedpriv.models.bucketing``)
    or rows (0, packed steps: ``[R, ...] -> [width, ...]``; exact when the cut rows are empty)."""
    def step(server, c, batch, key):
        if axis == 0:
            batch = {k: (v[:width] if k in fields else v) for k, v in batch.items()}
        else:
            batch = {k: (v[:, :width] if k in fields else v) for k, v in batch.items()}
        return step_fn(server, c, batch, key)
    return step


def _lane_sum(hooks: ClientHooks, starting_point, server: ServerView, lane: Lanes, rng, clip_norm,
              weighting, weight_cap, capacity, aux_template, carry0, encode=None, states=None):
    """One lane (arrays without the lane axis): ``(sum, aux, stats, norms[capacity])``, plus
    ``((states, written[capacity]),)`` for stateful hooks (``states``: the cohort's client states
    by slot, ``[capacity, ...]``; each client finishing here writes its new state at its slot).

    ``starting_point``: None (every client starts from ``carry0 = hooks.init(server)``: the lane
    resets at each client's last step, inside the ``cond`` that finishes it) or ``slot ->
    carry`` (batched first steps, or a client's own state: selected at its first lane step).
    """
    tmap = jax.tree_util.tree_map
    stateful = states is not None
    delta0 = jax.eval_shape(lambda: _release(hooks, server, carry0)[0])
    acc0, stats0, _ = jax.eval_shape(lambda: _finish_client(
        tmap(lambda d: jnp.zeros(d.shape, d.dtype), delta0), jnp.zeros((), jnp.int32), clip_norm,
        weighting, weight_cap, 1.0, jnp.zeros((), jnp.int32), encode))
    acc0, stats0 = tmap(lambda s: jnp.zeros(s.shape, s.dtype), (acc0, stats0))
    aux0 = tmap(lambda a: jnp.zeros(a.shape, a.dtype), aux_template)
    norms0 = jnp.zeros((capacity,), jnp.float32)
    cs0 = (states, jnp.zeros((capacity,), bool)) if stateful else ()

    def body(t, loop_carry):
        c, acc, aux, stats, norms, cs = loop_carry
        slot = lane.slot[t]
        if starting_point is not None:
            c = tmap(lambda a, b: jnp.where(lane.start[t], a, b), starting_point(slot), c)
        batch = {k: v[lane.src[t]] for k, v in lane.data.items()}
        key = jax.random.fold_in(jax.random.fold_in(rng, slot), lane.step[t])
        if lane.bucket is None or len(lane.widths) < 2:
            c, step_aux = hooks.step(server, c, batch, key)
        else:  # length-aware batches: the step's width, one compiled body per width
            c, step_aux = jax.lax.switch(lane.bucket[lane.src[t]], [
                _trimmed_step(hooks.step, w, lane.trim_fields, lane.trim_axis) for w in lane.widths],
                server, c, batch, key)
        aux = tmap(jnp.add, aux, step_aux)

        def finish(fc):
            c, acc, stats, norms, cs = fc
            release, new_state = _release(hooks, server, c)
            contrib, st, norm = _finish_client(release, lane.num_examples[t],
                                               clip_norm, weighting, weight_cap, 1.0, slot, encode)
            if stateful:  # the client's own state, kept at its slot (never summed)
                table, written = cs
                cs = (tmap(lambda a, v: a.at[slot].set(v), table, new_state), written.at[slot].set(True))
            if starting_point is None:
                c = carry0
            return (c, tmap(jnp.add, acc, contrib), tmap(jnp.add, stats, st),
                    norms.at[slot].set(norm), cs)

        c, acc, stats, norms, cs = jax.lax.cond(lane.last[t], finish, lambda fc: fc,
                                                (c, acc, stats, norms, cs))
        return c, acc, aux, stats, norms, cs

    _, acc, aux, stats, norms, cs = jax.lax.fori_loop(0, lane.length, body,
                                                      (carry0, acc0, aux0, stats0, norms0, cs0))
    return (acc, aux, stats, norms) + ((cs,) if stateful else ())


def _release(hooks: ClientHooks, server: ServerView, carry):
    """``(release, new client state or None)`` of a client's ``final`` hook."""
    out = hooks.final(server, carry)
    return out if hooks.stateful else (out, None)


def _merge_states(states, written):
    """One ``[K, ...]`` table from lanes' ``[W, K, ...]`` tables: each slot from the lane that
    wrote it (at most one lane runs a given client), else from ``states[0]``."""
    any_written = jnp.any(written, axis=0)
    merged = jax.tree_util.tree_map(
        lambda a: jnp.sum(jnp.where(written.reshape(written.shape + (1,) * (a.ndim - 2)), a, 0),
                          axis=0).astype(a.dtype), states)
    return jax.tree_util.tree_map(
        lambda m, a: jnp.where(any_written.reshape(any_written.shape + (1,) * (a.ndim - 2)), m, a[0]),
        merged, states), any_written


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _as_hooks(local_step, opt_init, params):
    """``packed_sum``'s arguments as ``(ClientHooks, ServerView)``."""
    if not isinstance(local_step, ClientHooks):
        local_step = step_hooks(local_step, opt_init)
    if not isinstance(params, ServerView):
        params = ServerView(params, None, jnp.zeros((), jnp.int32))
    return local_step, params


def _first_steps_sum(hooks, server, carry0, first, rng, first_chunk, clip_norm, weighting,
                     weight_cap, encode):
    """Every client's first step as one batch over the K slots (shared server weights), in
    chunks of ``first_chunk``; returns ``(starting_point, extra)``: ``slot -> carry`` after the
    first step, and the summed contributions of the clients finished by it."""
    tmap = jax.tree_util.tree_map
    K = first.single.shape[0]
    c = _divisor_at_most(K, first_chunk)

    def first_step(k, batch):
        key = jax.random.fold_in(jax.random.fold_in(rng, k), 0)
        return hooks.step(server, carry0, batch, key)  # shared weights: one big batch

    chunked = tmap(lambda a: a.reshape((K // c, c) + a.shape[1:]), (jnp.arange(K), first.data))
    c1, aux1 = jax.lax.map(lambda xs: jax.vmap(first_step)(*xs), chunked)
    c1, aux1 = tmap(lambda a: a.reshape((K,) + a.shape[2:]), (c1, aux1))

    def starting_point(slot):
        return tmap(lambda a: a[slot], c1)

    # clients whose only step was the first one are finished here, vmapped over the slots
    contrib, st, norm = jax.vmap(lambda ci, n, r, k: _finish_client(
        hooks.final(server, ci), n, clip_norm, weighting, weight_cap, r, k, encode))(
            c1, first.num_examples, first.single, jnp.arange(K))
    real = (jnp.sum(first.data["mask"], axis=1) > 0).astype(jnp.float32)  # [K] real slots
    aux1 = tmap(lambda a: a * real.reshape((K,) + (1,) * (a.ndim - 1)).astype(a.dtype), aux1)
    extra = (_sum0(contrib), _sum0(aux1), _sum0(st), jnp.where(first.single > 0, norm, 0.0))
    return starting_point, extra


def _run_lanes(run, lanes: Lanes, lane0, W: int, lane_chunk, states, capacity: int):
    """``run`` on every lane (one, vmapped, or vmapped in chunks of ``lane_chunk`` under a
    ``lax.scan``), their sums added and -- for stateful hooks -- their client states merged by slot."""
    tmap = jax.tree_util.tree_map

    def combine(parts):  # lanes' results [W, ...]: sums added, client states merged by slot
        out = _sum0(parts[:4])
        return out if states is None else out + (_merge_states(*parts[4]),)

    if W == 1:
        return run(lane0)
    if lane_chunk is None or lane_chunk >= W:
        return combine(jax.vmap(run)(lanes))
    if W % lane_chunk:
        raise ValueError(f"{W} lanes are not a multiple of lane_chunk {lane_chunk}")
    chunked = tmap(lambda a: a.reshape((W // lane_chunk, lane_chunk) + a.shape[1:]), lanes)

    def body(carry, chunk):
        part = combine(jax.vmap(run)(chunk))
        out = tmap(jnp.add, carry[:4], part[:4])
        if states is not None:
            (ca, wa), (pa, wp) = carry[4], part[4]
            out = out + ((tmap(lambda a, b: jnp.where(
                wp.reshape(wp.shape + (1,) * (a.ndim - 1)), b, a), ca, pa), wa | wp),)
        return out, None

    zero = tmap(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(run, lane0))
    if states is not None:
        zero = zero[:4] + ((states, jnp.zeros((capacity,), bool)),)
    return jax.lax.scan(body, zero, chunked)[0]


def packed_sum(local_step, opt_init, params, lanes: Lanes, capacity: int, rng, clip_norm,
               weighting: str = "uniform", weight_cap: float = 256.0, lane_chunk: int | None = None,
               first: FirstSteps | None = None, first_chunk: int = 16, encode=None,
               client_states=None):
    """Sum of clipped, weighted client updates over a packed cohort (see module docstring).

    Args:
      local_step: ``ClientHooks`` (``fedpriv.fl.client``), or a plain ``(params, opt_state,
        batch[B, ...], rng) -> (params, opt_state, aux)`` (``client.make_local_step``) whose
        clients start from ``opt_init(params)`` (``opt_init`` is unused with hooks).
      params: server parameters, or the round's ``ServerView`` (what the hooks see).
      lanes: ``Lanes`` with a leading lane axis W on every array.
      capacity: K, the number of cohort slots (length of the returned ``norms``).
      rng: PRNG key of the round; the client in cohort slot k, local step j uses
        ``fold_in(fold_in(rng, k), j)`` — as the padded path does.
      clip_norm: scalar C (``inf`` = no clipping): every ``final`` delta is clipped to it.
      lane_chunk: vmap at most this many lanes at once (``lax.scan`` over chunks).
      first: every client's first step, batched over the K slots with the shared server
        weights (``cohort.FirstSteps``), in chunks of ``first_chunk`` clients; the lanes then
        start each client from its first step's result. ``None``: lanes run every step.
      encode: ``(contrib, slot, real) -> (message, stats)`` (``_finish_client``): sum what the
        clients send instead of their clipped deltas (DDG under secure aggregation).
      client_states: for hooks that keep client state (``ClientHooks.stateful``): the cohort's
        states by slot, a pytree of ``[K, ...]`` arrays (slot k = the k-th sampled client).

    Returns:
      ``(sum_tree, stats)``: ``sum_tree = sum_k w_k clip(release_k)`` over real clients
      (float32); ``stats`` has ``aux`` (summed metrics), ``weight_sum``, ``norm_sum``,
      ``num_clipped``, ``num_nonfinite``, ``num_clients`` and ``norms: float32[K]`` (pre-clip
      norms by slot). Stateful hooks: ``(sum_tree, stats, client_states)``, the cohort's new
      states by slot (unchanged at empty slots).
    """
    tmap = jax.tree_util.tree_map
    hooks, server = _as_hooks(local_step, opt_init, params)
    W = lanes.length.shape[0]
    states = None
    if hooks.stateful:
        if client_states is None:
            raise ValueError("these client hooks keep client state (state_init): pass client_states")
        if first is not None:
            raise ValueError("client hooks that keep client state cannot batch the first steps "
                             "(each client starts from its own state)")
        states = client_states
        carry0 = hooks.init(server, tmap(lambda a: a[0], states))
    else:
        carry0 = hooks.init(server)
    lane0 = tmap(lambda a: a[0], lanes)
    batch0 = {k: v[0] for k, v in lane0.data.items()}
    aux_template = jax.eval_shape(lambda: hooks.step(server, carry0, batch0, rng)[1])
    extra = starting_point = None
    if first is not None:
        starting_point, extra = _first_steps_sum(hooks, server, carry0, first, rng, first_chunk,
                                                 clip_norm, weighting, weight_cap, encode)
    elif states is not None:  # each client starts from its own state
        def starting_point(slot):
            return hooks.init(server, tmap(lambda a: a[slot], states))

    def run(lane):
        return _lane_sum(hooks, starting_point, server, lane, rng, clip_norm, weighting, weight_cap,
                         capacity, aux_template, carry0, encode, states)

    total = _run_lanes(run, lanes, lane0, W, lane_chunk, states, capacity)
    if extra is not None:
        total = tmap(jnp.add, total, extra)
    acc, aux, stats, norms = total[:4]
    if states is None:
        return acc, dict(stats, norms=norms, aux=aux)
    table, written = total[4]
    new = tmap(lambda t, a: jnp.where(written.reshape(written.shape + (1,) * (a.ndim - 1)), t, a),
               table, states)
    return acc, dict(stats, norms=norms, aux=aux), new


def client_mesh(devices=None) -> Mesh:
    """A 1-D mesh named ``clients`` over ``devices`` (default: all)."""
    devices = np.asarray(jax.devices() if devices is None else devices)
    return Mesh(devices, ("clients",))
