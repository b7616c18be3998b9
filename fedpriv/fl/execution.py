"""Cohort execution: how a sampled cohort becomes packed lanes on the devices (docs/design.md §1.3).

``CohortExecutor`` is what the round loop calls every round: it packs the sampled clients into
lanes of real local steps (``fedpriv.fl.cohort.pack_cohort``), places them on the devices
(sharded over a ``clients`` mesh, across processes under ``jax.distributed``) and runs the
algorithm's jitted ``apply``. It also keeps the round's executed vs real local steps.

Backend-aware defaults (``lanes="auto"``):

* **CPU**: one lane per local device (1 on a plain CPU): a sequential loop over exactly the
  real steps. Vmapping clients on XLA:CPU is slower per client than running them one after
  the other (measured: 141 vs 89 ms per step for the 4M-parameter LSTM), so nothing is padded.
* **GPU/TPU**: vmapped lanes, ``W = 2^floor(log2(real steps / largest client's steps))`` per
  round (so lanes stay balanced: the longest lane is close to the average), or one client per
  lane (W = the cohort capacity K) where that executes fewer steps (clients of equal size;
  :func:`balanced_lanes`), at least one per device, at most ``max_lanes`` (memory: each lane
  holds a copy of the model, its optimizer state and a running sum). Lanes are a multiple of
  the device count. Measured on an H100 (benchmarks/results/gpu_h100.md).

Optionally (``first_steps=True``) the clients' FIRST local steps run as one batch with the
shared server weights (every client starts from the same model) and the lanes continue from
there; exact, but measured NOT faster on the 2-core CPU (16 first steps of the 4M-parameter
LSTM: 3.05 s batched vs 2.44 s as a sequential scan), so it is off by default; it is meant for
accelerators, where it is not measured yet.

Length-aware batches (``batching``, ``fedpriv.fl.cohort`` "Length-aware batches"): ``"padded"``
runs every step over all T positions of the ``trim_fields`` (LM ``tokens``); ``"trimmed"`` cuts
each step to the smallest of ``num_buckets`` widths holding its longest row (same numbers up to
float order); ``"sorted"`` also sorts each client's examples by length into batches (a
different local SGD trajectory, much less padding); ``"packed"`` keeps the padded batches and
packs each step's sentences end to end into fewer rows (the same numbers up to float order, the
least padding). Trimming and packing need one sequential lane (the CPU default); vmapped lanes
keep the full width (``"packed"`` is then refused: it would only add work). ``"auto"`` (the LM
configs' default) is ``"packed"`` on one sequential lane and ``"padded"`` on vmapped lanes: the
same numbers up to float order either way.

Compiled shapes are bounded: lanes W and lane depth D are powers of two and the cohort
capacity K is the sampler's fixed size (or a power of two for Poisson sampling), so a run
compiles at most ``log2(max lanes) x log2(max depth) x log2(max capacity)`` shapes.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fedpriv.fl.cohort import BATCHINGS, PackedCohort, assign_lanes, pack_cohort, round_up
from fedpriv.util import next_pow2, prev_pow2


def default_lanes(backend: str | None = None) -> str | int:
    """``1`` lane per device on CPU; ``"balanced"`` (chosen per round) on accelerators."""
    backend = backend or jax.default_backend()
    return jax.local_device_count() if backend == "cpu" else "balanced"


def lpt_depth(steps: Sequence[int], lanes: int) -> int:
    """The longest lane's load under ``cohort.assign_lanes`` (longest-first to ``lanes`` lanes)."""
    return max((sum(steps[i] for i in m) for m in assign_lanes(steps, lanes)), default=0)


def balanced_lanes(steps: Sequence[int], multiple: int = 1, max_lanes: int = 256,
                   capacity: int | None = None) -> int:
    """Lane count W for one round: of ``2^floor(log2(real / largest))`` (balanced LPT lanes,
    the longest close to the average) and ``capacity`` (one client per lane: the cohort's K,
    already a compiled dimension), the one executing fewer steps ``W x next_pow2(depth)``
    (ties: fewer lanes). Clients of equal size (e.g. 100 x 256 examples) thus run 100 lanes of
    16 steps (executed/real 1.00) instead of 64 lanes of 32 (1.28). At most one lane count
    beyond the powers of two is compiled."""
    if not len(steps):
        return multiple
    ratio = max(1, sum(steps) // max(max(steps), 1))
    w = max(multiple, round_up(min(prev_pow2(ratio), max_lanes), multiple))
    if capacity is None:
        return w
    k = round_up(int(capacity), multiple)
    if k == w or k > max_lanes or k < len(steps):
        return w
    cost_w = w * next_pow2(max(lpt_depth(steps, w), 1))
    cost_k = k * next_pow2(max(max(steps), 1))
    return k if cost_k < cost_w else w


def _put(tree, mesh: Mesh | None, spec):
    """Place host arrays on ``mesh`` with ``spec``: each process passes the rows it holds
    (``jax.make_array_from_process_local_data``), so this works across processes."""
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, spec)
    return jax.tree_util.tree_map(lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), tree)


def replicate(tree, mesh: Mesh | None):
    """Replicate a pytree (e.g. the server state; PRNG keys included) on every device of
    ``mesh``, across processes too."""
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, P())

    def put(x):
        if hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = put(jax.random.key_data(x))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
    return jax.tree_util.tree_map(put, tree)


class CohortExecutor:
    """Packs, places and runs one round's cohort (see the module docstring).

    Args:
      algorithm: a ``FederatedAlgorithm`` (its ``apply`` and ``local_epochs``).
      dataset: client id -> dict of example arrays.
      batch_size, max_steps: local batching (``pack_cohort``).
      capacity: K, the padded cohort capacity (the sampler's ``max_cohort_size``).
      variable_cohort: cohort sizes vary (Poisson): K is the next power of two of the cohort
        (capped at ``capacity``) so the number of compiled shapes stays small.
      lanes: ``"auto"`` (backend default), ``"balanced"`` or a fixed int.
      mesh: a ``clients`` mesh to shard lanes over (``fedpriv.fl.aggregate.client_mesh``).
      max_lanes: cap for balanced lanes (memory).
      batching: ``"padded"``, ``"trimmed"``, ``"sorted"`` or ``"packed"`` (module docstring);
        ``trim_fields``: the example fields with a time axis.
    """

    def __init__(self, algorithm, dataset: Mapping, *, batch_size: int, capacity: int,
                 max_steps: int | None = None, variable_cohort: bool = False,
                 lanes: str | int = "auto", mesh: Mesh | None = None, max_lanes: int = 256,
                 first_steps: bool = False, first_steps_budget: float = 2 * 2**30,
                 batching: str = "padded", trim_fields: Sequence[str] = ("tokens",)):
        self.algorithm, self.dataset = algorithm, dataset
        self.batch_size, self.max_steps = int(batch_size), max_steps
        self.capacity, self.variable = int(capacity), bool(variable_cohort)
        self.mesh = mesh
        self.devices = 1 if mesh is None else int(mesh.devices.size)
        if isinstance(lanes, str) and lanes.isdigit():
            lanes = int(lanes)
        self.lanes = default_lanes() if lanes == "auto" else lanes
        if not (self.lanes == "balanced" or (isinstance(self.lanes, int) and self.lanes >= 1)):
            raise ValueError(f"lanes must be 'auto', 'balanced' or an int >= 1, got {lanes!r}")
        self.max_lanes = int(max_lanes)
        if batching == "auto":  # the LM configs' default: packed where it runs (one lane)
            batching = "packed" if self.lanes == 1 else "padded"
        if batching not in BATCHINGS:
            raise ValueError(f"batching must be one of {BATCHINGS}, got {batching!r}")
        if batching in ("trimmed", "packed") and self.lanes != 1:
            raise ValueError(f"batching={batching!r} needs one sequential lane (lanes=1, the CPU "
                             f"default), got lanes={self.lanes!r}: vmapped lanes run every step at full width")
        self.batching, self.trim_fields = batching, tuple(trim_fields)
        self.executed_positions = 0
        self.real_positions = 0
        self.first_steps = bool(first_steps)
        self.first_steps_budget = float(first_steps_budget)
        self.real_steps = 0
        self.executed_steps = 0
        self._template = None
        self.param_bytes = 0

    def _num_lanes(self, ids, capacity: int | None = None) -> int:
        if self.lanes != "balanced":
            return round_up(int(self.lanes), self.devices)
        bs, cap = self.batch_size, self.max_steps
        steps = []
        for cid in ids:
            n = len(next(iter(self.dataset[cid].values())))
            steps.append(min(-(-n // bs), cap) if cap is not None else -(-n // bs))
        return balanced_lanes([s * self.algorithm.local_epochs for s in steps], self.devices, self.max_lanes,
                              capacity)

    def pack(self, ids: Sequence, rng: np.random.Generator | None = None) -> PackedCohort:
        """Pack the cohort ``ids`` (may be empty: the round then releases only noise)."""
        if self._template is None:
            first = self.dataset[next(iter(self.dataset))]
            self._template = {k: np.asarray(v[:1]) for k, v in first.items()}
        cap = min(next_pow2(max(len(ids), 1)), self.capacity) if self.variable else self.capacity
        cap = max(cap, len(ids))
        lanes = self._num_lanes(ids, cap)
        subset = None
        if self.mesh is not None and jax.process_count() > 1:
            per = lanes // jax.process_count()
            subset = range(jax.process_index() * per, (jax.process_index() + 1) * per)
        return pack_cohort(self.dataset, ids, self.batch_size, lanes=lanes, capacity=cap,
                           max_steps=self.max_steps, local_epochs=self.algorithm.local_epochs,
                           rng=rng, example_template=self._template, lane_subset=subset,
                           first_steps=self._batch_first_steps(cap), batching=self.batching,
                           trim_fields=self.trim_fields)

    def _batch_first_steps(self, capacity: int) -> bool:
        """Batch the clients' first steps (if asked) unless sharded over a mesh (each device
        would repeat them) or the K model copies they produce exceed the budget."""
        if not self.first_steps or self.mesh is not None or not self.param_bytes:
            return False
        if getattr(self.algorithm, "stateful_clients", False):
            return False  # each client starts from its own state
        return capacity * self.param_bytes <= self.first_steps_budget

    def set_params_size(self, params) -> None:
        """Tell the executor the model size (bytes) for the first-steps memory budget."""
        self.param_bytes = sum(int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize
                               for x in jax.tree_util.tree_leaves(params))

    def run(self, state, packed: PackedCohort, key, client_states=None):
        """One round: ``(state, metrics)`` (``(state, metrics, client_states)`` with the cohort's
        client states by slot, for hooks that keep client state); counts real and executed
        local steps."""
        lanes = _put(packed.lanes, self.mesh, P("clients"))
        cmask = _put(packed.client_mask, self.mesh, P())
        self.real_steps += packed.real_steps
        self.executed_steps += packed.executed_steps
        self.executed_positions += packed.executed_positions
        self.real_positions += packed.real_positions
        first = None if packed.first is None else _put(packed.first, self.mesh, P())
        if client_states is not None:
            return self.algorithm.apply(state, lanes, cmask, key, first, client_states)
        state, metrics = self.algorithm.apply(state, lanes, cmask, key, first)
        return state, metrics

    @property
    def executed_over_real(self) -> float:
        return self.executed_steps / self.real_steps if self.real_steps else math.nan
