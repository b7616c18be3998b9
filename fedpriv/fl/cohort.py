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

**Length-aware batches** (``batching``; the time axis of the ``trim_fields``, e.g. LM
``tokens[B, T]`` right-padded with PAD = 0). ``"padded"``: every step runs all T positions.
``"trimmed"``: the same batches, each step cut to the smallest of at most ``num_buckets``
widths holding its longest row (``fedpriv.models.bucketing.width_buckets``); a pure speed-up
(same per-example losses and gradients up to float summation order). ``"sorted"``: each
client's kept examples (the first ``min(n, max_steps * B)`` after the shuffle, as padded) are
sorted by length into batches, then the *order* of its batches is shuffled (``rng``), and each
batch is trimmed. Sorting changes the local SGD trajectory, not what is released: a batch
now holds sentences of similar length, so with the per-batch token-mean loss a short
sentence's tokens weigh more in their step than in a random batch (and the steps' gradients
are less alike); the client's examples, step count, example count, clipping and the clipped
sum are as before. Trimming needs one sequential lane (``lanes=1``, the CPU default): the
engine selects the step's width with ``lax.switch``, which ``vmap`` would turn into running
every width, so vmapped lanes keep the full width (``sorted`` then only reorders). Compiled
shapes: the lane program holds one local-step body per width (``num_buckets``, default 4).

``"packed"``: the padded path's batches (same shuffle, same examples per step, same steps),
each step's real examples packed end to end into rows of L = T - 1 positions
(``fedpriv.models.bucketing.pack_sentences``: inputs, targets, segment ids and positions
inside the sentence; the models reset the LSTM state at each sentence start and restrict
attention to the sentence). The LM loss is a mean over the batch's real target tokens, so each
step's loss and gradient equal the padded step's up to float summation order: the local SGD
trajectory, clipping and the clipped sum are unchanged. A step of B examples needs at most B
rows; it runs on the smallest of the ``count_buckets(B, num_buckets)`` row counts (default 8
counts, e.g. 2, 4, ..., 16 for B = 16) holding its rows: at most ``num_buckets`` compiled step
bodies (row counts) per lane program, one sequential lane only (vmapped lanes run all B rows).

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
import heapq
from typing import Any, Mapping, Sequence

import numpy as np
from flax import struct

from fedpriv import registry
from fedpriv.models.bucketing import (
    NUM_ROW_BUCKETS,
    NUM_WIDTH_BUCKETS,
    PACKED_FIELDS,
    bucket_index,
    count_buckets,
    pack_sentences,
    row_lengths,
    width_buckets,
)
from fedpriv.util import next_pow2  # re-exported

BATCHINGS = registry.BATCHINGS  # ("padded", "trimmed", "sorted", "packed")


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
    Length-aware batches: ``bucket[W, D]`` (per data row, like ``data``) indexes the static
    ``widths``; the step runs on the ``trim_fields`` cut to ``widths[bucket]`` on the batch's
    axis ``trim_axis`` (1: time, ``"trimmed"``/``"sorted"``; 0: rows, ``"packed"``).
    ``bucket=None``: every step runs the full width.
    """
    data: dict
    src: Any
    slot: Any
    step: Any
    start: Any
    last: Any
    num_examples: Any
    length: Any
    bucket: Any = None
    widths: tuple = struct.field(pytree_node=False, default=())
    trim_fields: tuple = struct.field(pytree_node=False, default=())
    trim_axis: int = struct.field(pytree_node=False, default=1)


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
    # target positions (T - 1 per row of a step) the steps run / real (non-PAD) targets, over the
    # trim fields (0 when there are none): ``1 - real/executed`` is the share of padded positions
    executed_positions: int = 0
    real_positions: int = 0

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
    heap = [(0, w) for w in range(lanes)]      # (load, lane): the least-loaded, lowest lane first
    members: list[list[int]] = [[] for _ in range(lanes)]
    for i in sorted(range(len(steps)), key=lambda i: (-steps[i], i)):
        if steps[i] == 0:
            continue
        load, lane = heap[0]
        heapq.heapreplace(heap, (load + steps[i], lane))
        members[lane].append(i)
    return [sorted(m) for m in members]


def _check_pack_args(batching: str, batch_size: int, lanes: int, local_epochs: int) -> None:
    if batching not in BATCHINGS:
        raise ValueError(f"batching must be one of {BATCHINGS}, got {batching!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    if local_epochs < 1:
        raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")


def _load_clients(dataset, client_ids, batch_size, max_steps, rng):
    """Each client's (shuffled) examples, its local steps ``ceil(n / B)`` (at most
    ``max_steps``) and the examples it uses (``min(n, steps * B)``)."""
    examples, steps, sizes = [], [], []
    for cid in client_ids:
        ex, n = _client_examples(dataset, cid, rng)
        s = -(-n // batch_size)
        if max_steps is not None:
            s = min(s, int(max_steps))
        examples.append(ex)
        steps.append(s)
        sizes.append(min(n, s * batch_size))
    return examples, steps, sizes


def _time_fields(template, trim_fields) -> tuple[tuple, int]:
    """The fields with a time axis ``[n, T]`` present in ``template``, and their width T."""
    fields = tuple(f for f in trim_fields if f in template)
    for f in fields:
        if np.ndim(template[f]) != 2:
            raise ValueError(f"trim field {f!r} must be [n, T] per client, got shape {np.shape(template[f])}")
    full = int(np.shape(template[fields[0]])[1]) if fields else 0
    if len({np.shape(template[f])[1] for f in fields}) > 1:
        raise ValueError(f"trim fields {fields} have different widths")
    return fields, full


def _sort_by_length(examples, steps, sizes, fields, pad_id, rng):
    """``batching="sorted"``: each client's used examples ordered by length (in place), and
    its batch order (drawn after every client's shuffle, so those match the padded path)."""
    k = len(examples)
    for i in range(k):
        n, ex = sizes[i], examples[i]
        lens = np.max([row_lengths(ex[f][:n], pad_id) for f in fields], axis=0)
        rows = np.concatenate([np.argsort(lens, kind="stable"), np.arange(n, len(ex[fields[0]]))])
        examples[i] = {f: v[rows] for f, v in ex.items()}
    return [rng.permutation(steps[i]) for i in range(k)] if rng is not None else [None] * k


def _zeros(template, lead, batch_size):
    return {f: np.zeros(lead + (batch_size,) + np.shape(v)[1:], np.asarray(v).dtype)
            for f, v in template.items()}


def _client_batches(cid, ex, s, n, template, batch_size, order):
    """A client's examples as ``[s, B, ...]`` arrays plus the mask ``[s, B]`` (``order``: its
    batch order, or None)."""
    out = {}
    for f, v in ex.items():
        if f not in template or np.shape(v)[1:] != np.shape(template[f])[1:]:
            raise ValueError(f"client {cid!r}: field {f!r} has shape {np.shape(v)[1:]}, "
                             f"expected {np.shape(template[f])[1:] if f in template else 'absent'}")
        flat = np.zeros((s * batch_size,) + np.shape(v)[1:], np.asarray(template[f]).dtype)
        flat[:n] = v[:n]
        out[f] = flat.reshape((s, batch_size) + flat.shape[1:])
    m = np.zeros(s * batch_size, np.float32)
    m[:n] = 1.0
    out["mask"] = m.reshape(s, batch_size)
    if order is not None:
        out = {f: v[order] for f, v in out.items()}
    return out


def _packed_template(template, field):
    """One example's fields in packed form (``pack_sentences``): ``[1, L]`` each."""
    width = np.shape(template[field])[1] - 1
    out = {f: np.zeros((1, width), np.int32) for f in PACKED_FIELDS}
    for f, v in template.items():
        if f != field:
            if np.ndim(v) != 1:
                raise ValueError(f"batching='packed' takes per-example scalar fields beside {field!r}, "
                                 f"{f!r} has shape {np.shape(v)[1:]}")
            out[f] = np.zeros((1, width), np.asarray(v).dtype)
    return out


def _pack_steps(b, field, pad_id):
    """A client's padded batches ``b`` (``[s, B, ...]``) with each step's examples packed into
    rows (``pack_sentences``); ``rows[s]`` holds each step's rows in use."""
    steps = [pack_sentences(b[field][j], b["mask"][j], pad_id,
                            {f: v[j] for f, v in b.items() if f not in (field, "mask")})
             for j in range(len(b["mask"]))]
    packed = {f: np.stack([p[f] for p, _ in steps]) for f in steps[0][0]}
    packed["rows"] = np.asarray([r for _, r in steps])
    return packed


def _step_positions(b, fields, batch_size, pad_id, trim, widths):
    """Per step of a client's batches ``b``: (bucket index, real target positions)."""
    if not fields:
        z = np.zeros(len(b["mask"]), np.int64)
        return z, z
    if "segments" in b:  # packed rows
        real = (b["segments"] > 0).sum(axis=(1, 2))
        if not trim:
            return np.full(len(real), -1, np.int64), real
        return np.asarray([bucket_index(int(r), widths) for r in b["rows"]]), real
    s = len(b["mask"])
    lens = np.max([row_lengths(b[f].reshape(s * batch_size, -1), pad_id) for f in fields], axis=0)
    lens = lens.reshape(s, batch_size)
    real = np.maximum(lens - 1, 0).sum(axis=1)
    if not trim:
        return np.full(s, -1, np.int64), real
    return np.asarray([bucket_index(max(int(x), 2), widths) for x in lens.max(axis=1)]), real


def pack_cohort(dataset: Mapping[Any, Mapping[str, np.ndarray]], client_ids: Sequence,
                batch_size: int, *, lanes: int = 1, capacity: int | None = None,
                max_steps: int | None = None, local_epochs: int = 1,
                rng: np.random.Generator | None = None, example_template: Mapping | None = None,
                lane_subset: Sequence[int] | None = None, first_steps: bool = False,
                batching: str = "padded", trim_fields: Sequence[str] = ("tokens",),
                num_buckets: int | None = None, pad_id: int = 0) -> PackedCohort:
    """Pack ``client_ids`` of ``dataset`` into ``lanes`` lanes of real local steps.

    Args:
      dataset: client id -> dict of arrays with a shared leading example axis.
      client_ids: the sampled clients, in cohort order (position = PRNG slot); may be empty.
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
      batching: ``"padded"``, ``"trimmed"``, ``"sorted"`` or ``"packed"`` (module docstring,
        "Length-aware batches"); ``trim_fields``: the fields with a time axis (per example
        ``[T]``, padded with ``pad_id`` on the right; ``"packed"`` takes one), absent fields are
        ignored; ``num_buckets``: at most this many widths or row counts (compiled step bodies;
        default 4 widths, 8 row counts).
    """
    _check_pack_args(batching, batch_size, lanes, local_epochs)
    k = len(client_ids)
    capacity = k if capacity is None else int(capacity)
    if k > capacity:
        raise ValueError(f"cohort of {k} clients exceeds capacity {capacity}")
    examples, steps, sizes = _load_clients(dataset, client_ids, batch_size, max_steps, rng)
    template = examples[0] if examples else example_template
    if template is None:
        raise ValueError("an empty cohort needs example_template (one example's fields)")
    fields, full = _time_fields(template, trim_fields)
    packing = batching == "packed" and bool(fields)
    if packing and len(fields) > 1:
        raise ValueError(f"batching='packed' packs one time field, got {fields}")
    trim = batching != "padded" and bool(fields) and lanes == 1
    if packing:
        widths = count_buckets(batch_size, num_buckets or NUM_ROW_BUCKETS) if trim else ()
    else:
        widths = width_buckets(full, num_buckets or NUM_WIDTH_BUCKETS) if trim else ()
    order_of = (_sort_by_length(examples, steps, sizes, fields, pad_id, rng)
                if batching == "sorted" and fields else [None] * k)
    skip = 1 if first_steps else 0                       # steps run outside the lanes
    members = assign_lanes([s * local_epochs - skip for s in steps], lanes)
    loads = [sum(steps[i] * local_epochs - skip for i in m) for m in members]
    rows = [sum(steps[i] for i in m) for m in members]    # data rows a lane holds
    depth = next_pow2(max(max(rows, default=0), max(loads, default=0), 1))
    shown = list(range(lanes)) if lane_subset is None else list(lane_subset)
    batches = lambda i: _client_batches(client_ids[i], examples[i], steps[i], sizes[i],
                                        template, batch_size, order_of[i])
    step_template = template                              # one step's example fields
    if packing:
        padded_batches, step_template = batches, _packed_template(template, fields[0])
        batches = lambda i: _pack_steps(padded_batches(i), fields[0], pad_id)
    positions = lambda b: _step_positions(b, fields, batch_size, pad_id, trim, widths)
    length = np.asarray([loads[w] for w in shown], np.int32)
    lanes_out, executed_pos, real_pos = _fill_lanes(
        shown, members, steps, sizes, batches, positions, step_template, batch_size, depth,
        local_epochs, skip, fields, full, trim, widths, length, packing)
    first = None
    if first_steps:
        first, fpos, freal = _first_steps_batch(k, capacity, steps, sizes, batches, positions,
                                                step_template, batch_size, local_epochs, fields, full)
        executed_pos, real_pos = executed_pos + fpos, real_pos + freal
    if len(shown) > 1 and fields:  # vmapped lanes run in lockstep: W * max(length) full-width steps
        executed_pos = len(shown) * int(length.max(initial=0)) * batch_size * (full - 1) + (
            k * batch_size * (full - 1) if first_steps else 0)
    cmask = np.zeros((capacity,), np.float32)
    cmask[:k] = 1.0
    return PackedCohort(lanes_out, cmask, list(client_ids), int(sum(steps)) * local_epochs, list(loads),
                        first, int(executed_pos), int(real_pos))


def _fill_lanes(shown, members, steps, sizes, batches, positions, template, batch_size, depth,
                local_epochs, skip, fields, full, trim, widths, length, packing=False):
    """The lanes' arrays (`Lanes`) and the executed / real target positions of the steps they
    run (``packing``: ``widths`` are row counts of ``full - 1`` positions)."""
    W = len(shown)
    data = _zeros(template, (W, depth), batch_size)
    data["mask"] = np.zeros((W, depth, batch_size), np.float32)
    src, slot, step = (np.zeros((W, depth), np.int32) for _ in range(3))
    start, last = np.zeros((W, depth), bool), np.zeros((W, depth), bool)
    nex = np.zeros((W, depth), np.float32)
    bucket = np.full((W, depth), len(widths) - 1, np.int32) if trim else None
    if packing:  # target positions a step runs
        step_cost = (lambda j: widths[j] * (full - 1)) if trim else (lambda j: batch_size * (full - 1))
    else:
        step_cost = lambda j: batch_size * ((widths[j] if trim else full) - 1)
    executed_pos = real_pos = 0
    for row, lane in enumerate(shown):
        d = t = 0
        for i in members[lane]:
            s, b = steps[i], batches(i)
            for f, v in b.items():
                if f != "rows":  # packed: the steps' rows in use (bucket only)
                    data[f][row, d:d + s] = v
            bidx, real = positions(b)
            if trim:
                bucket[row, d:d + s] = bidx
            run = np.arange(skip, s * local_epochs) % s          # data steps the lane runs
            executed_pos += sum(step_cost(j) for j in bidx[run]) if fields else 0
            real_pos += int(real[run].sum())
            order = np.arange(skip, s * local_epochs)       # the client's steps in the lane
            n_t = len(order)
            src[row, t:t + n_t] = d + order % s
            step[row, t:t + n_t] = order
            slot[row, t:t + n_t] = i
            nex[row, t:t + n_t] = sizes[i]
            start[row, t] = last[row, t + n_t - 1] = True
            t += n_t
            d += s
    cut = (tuple(data) if packing else fields) if trim else ()   # packed steps: every field's rows
    lanes_out = Lanes(data, src, slot, step, start, last, nex, length, bucket, widths, cut,
                      0 if packing else 1)
    return lanes_out, executed_pos, real_pos


def _first_steps_batch(k, capacity, steps, sizes, batches, positions, template, batch_size,
                       local_epochs, fields, full):
    """Every client's first step as one batch (`FirstSteps`), with its executed / real target
    positions (first steps run at full width)."""
    fdata = _zeros(template, (capacity,), batch_size)
    fdata["mask"] = np.zeros((capacity, batch_size), np.float32)
    single = np.zeros((capacity,), np.float32)
    fnex = np.zeros((capacity,), np.float32)
    executed_pos = real_pos = 0
    for i in range(k):
        b = batches(i)
        for f, v in b.items():
            if f != "rows":
                fdata[f][i] = v[0]
        single[i] = float(steps[i] * local_epochs == 1)
        fnex[i] = sizes[i]
        executed_pos += batch_size * (full - 1) if fields else 0
        real_pos += int(positions(b)[1][0])
    return FirstSteps(fdata, single, fnex), executed_pos, real_pos


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
