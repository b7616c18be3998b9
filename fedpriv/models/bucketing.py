"""Length-bucketed batching of variable-length token sequences for a jitted function.

Teacher forcing over a corpus (`fedpriv.models.llama.token_logprobs`, the top-k corpus of
`fedpriv.public.distill`) sorts sequences by length and pads each batch to one of a few bucket
lengths, so `jit` compiles one program per bucket.

The on-device LMs' fixed-width rows (``tokens: int32[N, T]``, T = L+1, right-padded with PAD)
use `width_buckets` / `row_lengths` / `length_sorted_batches`: a batch is cut to the smallest
bucket width holding its longest row. Trailing all-PAD columns carry no target and, the models
being causal (LSTM; transformer with a causal mask and position tables indexed from 0), do not
change any output at real positions, so a trimmed batch gives the padded batch's per-example
losses and gradients up to float summation order (tests/models/test_length_buckets.py).

Packed rows (`pack_sentences`, the ``"packed"`` batching of `fedpriv.fl.cohort`): a batch's
sentences laid end to end in fewer rows of L = T - 1 positions, each with its segment index
and its position inside the sentence; the models reset the LSTM state / restrict attention at
sentence boundaries, so every sentence gives the padded batch's loss and gradient up to float
summation order. `count_buckets` bounds the row counts a step may take.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512)
NUM_WIDTH_BUCKETS = 4
NUM_ROW_BUCKETS = 8
PACKED_FIELDS = ("inputs", "targets", "segments", "positions")


def width_buckets(width: int, num_buckets: int = NUM_WIDTH_BUCKETS) -> tuple[int, ...]:
    """At most ``num_buckets`` widths ``ceil(width * k / num_buckets)`` (k = 1..num_buckets), each
    >= 2 (one input and one target), the last = ``width``: the bounded set of trimmed batch
    widths (one compiled program per width)."""
    if width < 2:
        raise ValueError(f"rows need >= 2 tokens (input and target), got width {width}")
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    return tuple(sorted({max(2, -(-width * k // num_buckets)) for k in range(1, num_buckets + 1)}))


def count_buckets(n: int, num_buckets: int = NUM_ROW_BUCKETS) -> tuple[int, ...]:
    """At most ``num_buckets`` counts ``ceil(n * k / num_buckets)`` (k = 1..num_buckets), each
    >= 1, the last = ``n``: the bounded set of row counts of a packed step (one compiled program
    per count; e.g. n = 16, 8 buckets: 2, 4, ..., 16)."""
    if n < 1 or num_buckets < 1:
        raise ValueError(f"need n >= 1 and num_buckets >= 1, got n={n}, num_buckets={num_buckets}")
    return tuple(sorted({max(1, -(-n * k // num_buckets)) for k in range(1, num_buckets + 1)}))


def pack_sentences(tokens: np.ndarray, mask: np.ndarray, pad_id: int = 0,
                   extra: dict | None = None) -> tuple[dict, int]:
    """One batch's real examples packed end to end into rows of ``L = T - 1`` target positions.

    Example b with ``l = row_lengths(tokens)[b]`` takes ``l - 1`` consecutive positions of one
    row: inputs ``tokens[b, :l-1]``, targets ``tokens[b, 1:l]``, segment j (its 1-based index
    within the row; 0 = empty position) and positions ``0 .. l-2`` inside the sentence. Rows are
    filled first-fit decreasing (longest first, each into the first row with room); examples
    with mask 0 are dropped.

    Args:
      tokens: ``int[B, T]`` right-padded with ``pad_id``.
      mask: ``float[B]``, 1 = real example.
      extra: ``{name: [B]}`` per-example scalars (e.g. ``weight``), copied to every position of
        their example (0 elsewhere).

    Returns:
      ``(packed, rows)``: ``packed`` has ``inputs``, ``targets``, ``segments``, ``positions``
      (``int32[B, L]``; at most B rows are ever needed), the ``extra`` fields ``[B, L]`` and
      ``mask: float32[B]`` = examples per row (its sum is the batch's example count; examples
      without targets count in row 0); ``rows`` (>= 1) = rows in use, all at the front.
    """
    tokens = np.asarray(tokens)
    B, T = tokens.shape
    L = T - 1
    extra = {k: np.asarray(v) for k, v in (extra or {}).items()}
    for k, v in extra.items():
        if v.shape != (B,):
            raise ValueError(f"packed rows take per-example scalars, field {k!r} has shape {v.shape[1:]}")
    out = {f: np.zeros((B, L), np.int32) for f in PACKED_FIELDS}
    out.update({k: np.zeros((B, L), v.dtype) for k, v in extra.items()})
    count = np.zeros(B, np.float32)
    real = np.flatnonzero(np.asarray(mask) > 0)
    slots = np.maximum(row_lengths(tokens[real], pad_id) - 1, 0)
    fill = []                                          # positions used per open row
    for j in np.argsort(-slots, kind="stable"):
        b, n = real[j], int(slots[j])
        r = next((r for r, used in enumerate(fill) if used + n <= L), None) if n else 0
        if r is None or r == len(fill):
            r = len(fill)
            fill.append(0)
        at = slice(fill[r], fill[r] + n)
        out["inputs"][r, at], out["targets"][r, at] = tokens[b, :n], tokens[b, 1:n + 1]
        out["segments"][r, at], out["positions"][r, at] = int(count[r]) + 1, np.arange(n)
        for k, v in extra.items():
            out[k][r, at] = v[b]
        count[r] += 1
        fill[r] += n
    out["mask"] = count
    return out, max(1, len(fill))


def row_lengths(tokens: np.ndarray, pad_id: int = 0) -> np.ndarray:
    """``int64[N]``: per row of ``tokens[N, T]``, 1 + the index of its last non-PAD token
    (0 for an all-PAD row); columns from there on are PAD in that row."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [N, T], got shape {tokens.shape}")
    real = tokens != pad_id
    last = tokens.shape[1] - np.argmax(real[:, ::-1], axis=1)
    return np.where(real.any(axis=1), last, 0).astype(np.int64)


def bucket_index(longest: int, widths: Sequence[int]) -> int:
    """Index of the smallest width in ``widths`` (ascending) that holds ``longest`` tokens."""
    for i, w in enumerate(widths):
        if longest <= w:
            return i
    raise ValueError(f"row of {longest} tokens exceeds the widest bucket {widths[-1]}")


def length_sorted_batches(lengths: np.ndarray, batch_size: int, widths: Sequence[int]):
    """Yield ``(rows int64[<=B], width)``: rows sorted by length (stable), cut into batches of
    ``batch_size``, each with the smallest bucket width holding its longest row."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        yield rows, int(widths[bucket_index(int(np.max(lengths[rows], initial=0)), widths)])


def bucket_length(n: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """Smallest bucket >= n; beyond the largest, the next multiple of the largest."""
    if n < 1:
        raise ValueError(f"sequence length must be >= 1, got {n}")
    for b in sorted(buckets):
        if n <= b:
            return int(b)
    top = max(buckets)
    return int(-(-n // top) * top)


def map_bucketed(fn: Callable[[np.ndarray, np.ndarray], Any], sequences: Sequence[Sequence[int]],
                 *, batch_size: int = 16, buckets: Sequence[int] = DEFAULT_BUCKETS,
                 pad_id: int = 0, trim: bool = True, progress: bool = True,
                 desc: str = "teacher") -> list:
    """Apply a batched function to variable-length sequences, length-bucketed.

    Sequences are sorted by length, cut into batches of `batch_size`, and each batch is padded
    (right) to `bucket_length(longest)` and to exactly `batch_size` rows, so `fn` sees at most
    one shape per bucket (one jit compilation each).

    Args:
      fn: (ids int32[B, Lb], mask float32[B, Lb]) -> pytree of arrays with leading axis B.
      sequences: N sequences of token ids (lengths >= 1).
      trim: cut leaves of rank >= 2 to each sequence's own length on axis 1.
      progress: show a tqdm bar counting real tokens (its rate is tokens/second).

    Returns:
      list of N per-sequence pytrees (numpy), in the input order.
    """
    from tqdm.auto import tqdm

    seqs = [np.asarray(s, np.int32).reshape(-1) for s in sequences]
    lengths = np.array([len(s) for s in seqs], np.int64)
    if len(seqs) and lengths.min() < 1:
        raise ValueError("empty sequence passed to the teacher")
    order = np.argsort(lengths, kind="stable")
    results: list = [None] * len(seqs)
    bar = tqdm(total=int(lengths.sum()), unit="tok", desc=desc, disable=not progress,
               leave=False)
    try:
        for start in range(0, len(seqs), batch_size):
            idx = order[start:start + batch_size]
            width = bucket_length(int(lengths[idx].max()), buckets)
            ids = np.full((batch_size, width), pad_id, np.int32)
            mask = np.zeros((batch_size, width), np.float32)
            for row, j in enumerate(idx):
                ids[row, :lengths[j]] = seqs[j]
                mask[row, :lengths[j]] = 1.0
            out = jax.tree.map(np.asarray, fn(ids, mask))
            for row, j in enumerate(idx):
                n = int(lengths[j])
                results[j] = jax.tree.map(
                    lambda a, row=row, n=n: a[row, :n] if (trim and a.ndim >= 2) else a[row], out)
            bar.update(int(lengths[idx].sum()))
    finally:
        bar.close()
    return results

