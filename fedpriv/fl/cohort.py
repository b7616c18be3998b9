"""Cohort arrays for the client updates (docs/design.md §1.3): packed lanes and padded cohorts.

**Packed lanes** (``pack_cohort``, what the round loop uses). Clients differ in size by orders
of magnitude (log-normal), so padding every client to the largest one wastes most of the work.
A cohort is instead laid out as ``W`` *lanes*; each lane is a flat sequence of its clients'
*real* local steps, one client after the other. The engine runs each lane with a
dynamic-length loop (``fedpriv.fl.aggregate.packed_sum``): a client's last step clips its
delta and adds it to the lane's running sum, then the lane restarts from the server model
for its next client. Lanes are ``vmap``-ped (accelerators: ``W`` clients train at once; the
vmapped loop runs as long as the longest lane) or a single lane runs alone (CPU: exactly the
real steps, nothing padded). Clients are assigned to lanes longest-first to the least-loaded
lane (LPT), so lanes end within one client of each other. Arrays:

* ``data``: dict of ``[W, D, B, ...]`` (D = padded steps per lane, a power of two, so jit
  compiles one shape per bucket) plus ``data['mask']: float32[W, D, B]``;
* per lane step ``t``: ``src[W, D]`` (which data step), ``slot[W, D]`` (the client's position in
  the sampled cohort: its PRNG key and output slot), ``step[W, D]`` (its local step index),
  ``start[W, D]`` / ``last[W, D]`` (the client's first / final step in the lane),
  ``num_examples[W, D]`` (the client's example count);
* ``length: int32[W]`` (real steps per lane) and ``client_mask: float32[K]`` (K = padded cohort
  capacity, 1 = real client).

Executed steps are ``sum(length)`` with one lane and ``W * max(length)`` with W vmapped lanes;
``PackedCohort.real_steps``/``executed_steps`` report both. Compiled shapes: one per (D, K)
bucket, i.e. at most ``log2(max steps per lane) + 1`` values of D times the capacities of K.

Optionally (``first_steps=True``) every client's first step is taken out of the lanes and
batched over the cohort with the shared server weights (``FirstSteps``).

**Padded cohorts** (``build_cohort``, kept for simple uses and tests; the algorithms' ``apply``
turns one into one lane per client with ``pack_padded``).

A federated dataset maps client id -> dict of NumPy arrays sharing a leading example axis
(for LMs ``{'tokens': int32[n, L+1]}``). ``build_cohort`` packs a list of clients into

* ``batches``: dict of arrays ``[K, S, B, ...]`` (K = cohort capacity, S = local steps,
  B = batch size) plus ``batches['mask']: float32[K, S, B]`` (1 = real example),
* ``client_mask: float32[K]`` (1 = real client), ``num_examples: int32[K]``.

S is the number of batches of the largest client rounded up to a power of two (capped at
``max_steps``) and K is a fixed capacity, so jit compiles one shape per (K, S) bucket instead
of one per round. Padded examples are masked in the loss, padded steps are no-ops, padded
clients are masked after clipping.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
from flax import struct

from fedpriv.util import next_pow2  # noqa: F401 (re-exported)


@dataclasses.dataclass
class Cohort:
    batches: dict[str, np.ndarray]
    client_mask: np.ndarray
    num_examples: np.ndarray
    client_ids: list

    @property
    def capacity(self) -> int:
        return int(self.client_mask.shape[0])


def round_up(n: int, multiple: int) -> int:
    return -(-int(n) // int(multiple)) * int(multiple)


def build_cohort(dataset: Mapping[Any, Mapping[str, np.ndarray]], client_ids: Sequence,
                 batch_size: int, capacity: int, max_steps: int | None = None,
                 rng: np.random.Generator | None = None) -> Cohort:
    """Pack ``client_ids`` of ``dataset`` into padded ``[capacity, S, batch_size, ...]`` arrays.

    Args:
      dataset: client id -> dict of arrays with a shared leading example axis.
      client_ids: the sampled clients (at most ``capacity``).
      batch_size: local batch size B.
      capacity: number of client slots K (>= len(client_ids)); pad with masked clients.
      max_steps: cap on local steps S; a client's examples beyond S*B are dropped.
      rng: if given, each client's examples are shuffled before batching.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(client_ids) > capacity:
        raise ValueError(f"cohort of {len(client_ids)} clients exceeds capacity {capacity}")
    examples = [_client_examples(dataset, cid, rng)[0] for cid in client_ids]
    if not examples:
        raise ValueError("empty cohort: no clients were sampled")
    max_n = max(len(next(iter(e.values()))) for e in examples)
    steps = next_pow2(-(-max_n // batch_size))
    if max_steps is not None:
        steps = min(steps, int(max_steps))
    per_client = steps * batch_size
    template = examples[0]
    batches = {k: np.zeros((capacity, per_client) + v.shape[1:], v.dtype) for k, v in template.items()}
    mask = np.zeros((capacity, per_client), np.float32)
    num = np.zeros((capacity,), np.int32)
    for i, ex in enumerate(examples):
        n = min(len(next(iter(ex.values()))), per_client)
        for k, v in ex.items():
            if k not in batches or v.shape[1:] != batches[k].shape[2:]:
                raise ValueError(f"client {client_ids[i]!r}: field {k!r} has shape {v.shape[1:]}, "
                                 f"expected {batches[k].shape[2:] if k in batches else 'absent'}")
            batches[k][i, :n] = v[:n]
        mask[i, :n] = 1.0
        num[i] = n
    out = {k: v.reshape((capacity, steps, batch_size) + v.shape[2:]) for k, v in batches.items()}
    out["mask"] = mask.reshape(capacity, steps, batch_size)
    cmask = np.zeros((capacity,), np.float32)
    cmask[:len(examples)] = 1.0
    return Cohort(out, cmask, num, list(client_ids))


# ----------------------------------------------------------------------------- packed lanes
@struct.dataclass
class Lanes:
    """Device arrays of packed lanes; every field has the lane axis W first.

    ``start[W, D]`` marks a client's first step in the lane (the lane loads that client's
    starting point: the server model, or its batched first step, see ``FirstSteps``).
    """
    data: dict
    src: Any
    slot: Any
    step: Any
    start: Any
    last: Any
    num_examples: Any
    length: Any


@struct.dataclass
class FirstSteps:
    """Every client's first local step, batched over the cohort's K slots.

    All clients of a round start from the same server model, so their first steps can run as
    ONE batch with shared weights (large matmuls) instead of K small ones. ``data``:
    ``[K, B, ...]`` (+ ``mask``); ``single[K]``: 1 for real clients whose only step this is
    (they never enter a lane); ``num_examples[K]``.
    """
    data: dict
    single: Any
    num_examples: Any


@dataclasses.dataclass
class PackedCohort:
    """A cohort packed into lanes (host side): ``lanes`` (and ``first``) go to the engine with
    ``client_mask``."""
    lanes: Lanes
    client_mask: np.ndarray
    client_ids: list
    real_steps: int
    lane_loads: list          # steps of every lane (also those another process holds)
    first: FirstSteps | None = None

    @property
    def num_lanes(self) -> int:
        return len(self.lane_loads)

    @property
    def capacity(self) -> int:
        return int(self.client_mask.shape[0])

    @property
    def executed_steps(self) -> int:
        """Local steps the engine executes: the batched first steps (one per real client)
        plus the sum of lane lengths for one lane, else ``W * max(length)`` (vmapped lanes run
        in lockstep)."""
        loads = self.lane_loads
        lanes = int(sum(loads)) if len(loads) == 1 else len(loads) * max(loads, default=0)
        return lanes + (len(self.client_ids) if self.first is not None else 0)


def _client_examples(dataset, cid, rng):
    ex = dataset[cid]
    if "mask" in ex:
        raise ValueError("'mask' is reserved for the engine's example mask")
    n = len(next(iter(ex.values())))
    if n == 0:
        raise ValueError(f"client {cid!r} has no examples; drop empty clients before training")
    if any(len(v) != n for v in ex.values()):
        raise ValueError(f"client {cid!r}: fields have different numbers of examples "
                         f"{ {k: len(v) for k, v in ex.items()} }")
    if rng is not None:
        perm = rng.permutation(n)
        ex = {k: v[perm] for k, v in ex.items()}
    return ex, n


def assign_lanes(steps: Sequence[int], lanes: int) -> list[list[int]]:
    """Longest-processing-time assignment of clients (by local steps) to ``lanes`` lanes.

    Returns, per lane, the indices of its clients in ascending order (so one lane keeps the
    cohort's order). Lane loads differ by at most the largest client. Clients with 0 steps
    are left out.
    """
    loads = [0] * lanes
    members: list[list[int]] = [[] for _ in range(lanes)]
    for i in sorted(range(len(steps)), key=lambda i: (-steps[i], i)):
        if steps[i] == 0:
            continue
        lane = min(range(lanes), key=lambda w: (loads[w], w))
        loads[lane] += steps[i]
        members[lane].append(i)
    return [sorted(m) for m in members]


def pack_cohort(dataset: Mapping[Any, Mapping[str, np.ndarray]], client_ids: Sequence,
                batch_size: int, *, lanes: int = 1, capacity: int | None = None,
                max_steps: int | None = None, local_epochs: int = 1,
                rng: np.random.Generator | None = None, example_template: Mapping | None = None,
                lane_subset: Sequence[int] | None = None, first_steps: bool = False) -> PackedCohort:
    """Pack ``client_ids`` of ``dataset`` into ``lanes`` lanes of real local steps.

    Args:
      dataset: client id -> dict of arrays with a shared leading example axis.
      client_ids: the sampled clients, in cohort order (position = PRNG slot); may be empty
        (a round that releases only noise).
      batch_size: local batch size B; a client with n examples takes ``ceil(n / B)`` steps per
        local epoch (at most ``max_steps``; examples beyond ``max_steps * B`` are dropped).
      lanes: W, clients trained concurrently (vmapped); 1 = one sequential lane.
      capacity: K, length of the per-client outputs (>= len(client_ids); default the cohort).
      local_epochs: passes over each client's batches (its steps are repeated).
      rng: if given, each client's examples are shuffled before batching (in cohort order,
        exactly as ``build_cohort`` does, so both layouts give the same batches).
      example_template: ``{field: array}`` with one example's shape/dtype, needed when the
        cohort is empty.
      lane_subset: materialise only these lanes' data (multi-process: each process builds its
        own lanes; all processes compute the same assignment).
      first_steps: batch every client's first step over the cohort (``FirstSteps``); the lanes
        then hold the remaining steps only.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    if local_epochs < 1:
        raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
    k = len(client_ids)
    capacity = k if capacity is None else int(capacity)
    if k > capacity:
        raise ValueError(f"cohort of {k} clients exceeds capacity {capacity}")
    examples, steps, sizes = [], [], []
    for cid in client_ids:
        ex, n = _client_examples(dataset, cid, rng)
        s = -(-n // batch_size)
        if max_steps is not None:
            s = min(s, int(max_steps))
        examples.append(ex)
        steps.append(s)
        sizes.append(min(n, s * batch_size))
    template = examples[0] if examples else example_template
    if template is None:
        raise ValueError("an empty cohort needs example_template (one example's fields)")
    skip = 1 if first_steps else 0                       # steps run outside the lanes
    members = assign_lanes([s * local_epochs - skip for s in steps], lanes)
    loads = [sum(steps[i] * local_epochs - skip for i in m) for m in members]
    rows = [sum(steps[i] for i in m) for m in members]    # data rows a lane holds
    depth = next_pow2(max(max(rows, default=0), max(loads, default=0), 1))
    shown = list(range(lanes)) if lane_subset is None else list(lane_subset)
    W = len(shown)

    def zeros(lead):
        return {f: np.zeros(lead + (batch_size,) + np.shape(v)[1:], np.asarray(v).dtype)
                for f, v in template.items()}

    def batches(i):
        """Client i's examples as ``[s_i, B, ...]`` arrays plus the mask ``[s_i, B]``."""
        ex, s, n = examples[i], steps[i], sizes[i]
        out = {}
        for f, v in ex.items():
            if f not in template or np.shape(v)[1:] != np.shape(template[f])[1:]:
                raise ValueError(f"client {client_ids[i]!r}: field {f!r} has shape {np.shape(v)[1:]}, "
                                 f"expected {np.shape(template[f])[1:] if f in template else 'absent'}")
            flat = np.zeros((s * batch_size,) + np.shape(v)[1:], np.asarray(template[f]).dtype)
            flat[:n] = v[:n]
            out[f] = flat.reshape((s, batch_size) + flat.shape[1:])
        m = np.zeros(s * batch_size, np.float32)
        m[:n] = 1.0
        out["mask"] = m.reshape(s, batch_size)
        return out

    data = zeros((W, depth))
    data["mask"] = np.zeros((W, depth, batch_size), np.float32)
    src, slot, step = (np.zeros((W, depth), np.int32) for _ in range(3))
    start, last = np.zeros((W, depth), bool), np.zeros((W, depth), bool)
    nex = np.zeros((W, depth), np.float32)
    for row, lane in enumerate(shown):
        d = t = 0
        for i in members[lane]:
            s, b = steps[i], batches(i)
            for f, v in b.items():
                data[f][row, d:d + s] = v
            order = np.arange(skip, s * local_epochs)       # the client's steps in the lane
            n_t = len(order)
            src[row, t:t + n_t] = d + order % s
            step[row, t:t + n_t] = order
            slot[row, t:t + n_t] = i
            nex[row, t:t + n_t] = sizes[i]
            start[row, t] = last[row, t + n_t - 1] = True
            t += n_t
            d += s
    first = None
    if first_steps:
        fdata = zeros((capacity,))
        fdata["mask"] = np.zeros((capacity, batch_size), np.float32)
        single = np.zeros((capacity,), np.float32)
        fnex = np.zeros((capacity,), np.float32)
        for i in range(k):
            for f, v in batches(i).items():
                fdata[f][i] = v[0]
            single[i] = float(steps[i] * local_epochs == 1)
            fnex[i] = sizes[i]
        first = FirstSteps(fdata, single, fnex)
    length = np.asarray([loads[w] for w in shown], np.int32)
    cmask = np.zeros((capacity,), np.float32)
    cmask[:k] = 1.0
    return PackedCohort(Lanes(data, src, slot, step, start, last, nex, length), cmask, list(client_ids),
                        int(sum(steps)) * local_epochs, list(loads), first)


def pack_padded(batches: Mapping[str, np.ndarray], client_mask, local_epochs: int = 1) -> Lanes:
    """The lanes of a padded ``[K, S, B, ...]`` cohort (``build_cohort``): one client per lane.

    Works on traced arrays (used inside ``jit`` by the algorithms' padded ``apply``); the
    padded clients' lanes have length 0.
    """
    import jax.numpy as jnp

    mask = batches["mask"]
    K, S = mask.shape[0], mask.shape[1]
    real = jnp.sum(jnp.asarray(client_mask)[:, None] * (jnp.sum(mask, axis=2) > 0), axis=1)
    real = real.astype(jnp.int32)                                   # [K] real steps
    t = jnp.arange(S * local_epochs, dtype=jnp.int32)[None, :]
    safe = jnp.maximum(real, 1)[:, None]
    src = jnp.where(t < real[:, None] * local_epochs, t % safe, 0)
    step = t + jnp.zeros((K, 1), jnp.int32)
    start = step == 0
    last = t == real[:, None] * local_epochs - 1
    slot = jnp.broadcast_to(jnp.arange(K, dtype=jnp.int32)[:, None], (K, S * local_epochs))
    nex = jnp.broadcast_to(jnp.sum(mask, axis=(1, 2))[:, None], (K, S * local_epochs))
    return Lanes(dict(batches), src, slot, step, start, last, nex, real * local_epochs)
