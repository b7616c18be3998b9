"""Padded, bucketed cohort arrays for the vmapped client update (DESIGN.md principle 3).

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


@dataclasses.dataclass
class Cohort:
    batches: dict[str, np.ndarray]
    client_mask: np.ndarray
    num_examples: np.ndarray
    client_ids: list

    @property
    def capacity(self) -> int:
        return int(self.client_mask.shape[0])


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


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
    examples = []
    for cid in client_ids:
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
        examples.append(ex)
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
