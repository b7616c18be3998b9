"""Client votes of PrE-Text / Private Evolution: nearest-synthetic-sample histograms, bounded.

Private Evolution (Lin et al., ICLR 2024, Alg. 1-2 "DP_NN_HISTOGRAM"; Xie et al., ICML 2024)
lets every private sample vote for its nearest synthetic sample in an embedding space; PrE-Text
(Hou et al., ICML 2024, Alg. 1) moves the vote onto the clients of a cross-device federation:
each sampled client computes the histogram of its own messages' votes over the server's ``N``
synthetic samples and bounds it, and the server only sees the noisy sum over the cohort
(:mod:`fedpriv.synth.release`).

One client ``u`` with messages ``e_1..e_n`` (``[n, d]``) and synthetic samples ``s_1..s_N``
(``[N, d]``):

* each message votes for its ``k`` nearest synthetic samples (squared L2 distance in the
  embedding space; ties broken towards the smaller index, as ``lax.top_k``), one vote each:
  ``h_u[j] = #{i : j in kNN(e_i)}``, a histogram ``[N]`` of non-negative counts;
* the histogram is **normalised to unit L2 norm**: ``v_u = h_u / ||h_u||_2`` (``0`` for a
  client with no messages).  A user's whole contribution is then one vector of norm ``<= 1``
  whatever its number of messages: the unit of privacy is the **user**.

Sensitivity of the cohort SUM ``S = sum_u v_u`` (L2):

* add/remove one user: ``||S - S'||_2 = ||v_u||_2 <= 1``;
* replace one user by another: ``||v_u - v_u'||_2^2 = ||v_u||^2 + ||v_u'||^2 - 2 <v_u, v_u'>
  <= 2`` because both vectors are non-negative (``<v_u, v_u'> >= 0``), so ``sqrt(2)``
  (below the generic ``2`` of two arbitrary norm-1 vectors that the replace-one accounting of
  fixed-size samplers assumes: that accounting is conservative here).

:data:`SENSITIVITY` (= 1, add/remove) is what the noise multiplier is relative to.  The
normalisation is not clipping (``h / max(1, ||h||)``): with integer counts the two coincide
except for the empty client, so nothing is lost by normalising, and a user's vote always has the
same total weight.

Everything is pure JAX (``jit``-able): :func:`client_votes` for one client (unbatched),
:func:`cohort_votes` ``vmap``-ped over a cohort padded to ``[m, S, d]`` with a mask (the
reference), and :func:`chunked_votes`, what the release runs: since raw counts add up, a client's
messages are split into fixed-size chunks (:func:`pack_messages`), the chunks' histograms are
summed per client (``segment_sum``) and only then normalised -- so a user with 25K messages costs
its chunks, not a cohort padded to 25K rows, and jit sees few shapes (powers of two).
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.util import next_pow2

__all__ = ["SENSITIVITY", "REPLACE_ONE_SENSITIVITY", "sq_distances", "nearest", "vote_histogram",
           "normalise", "client_votes", "cohort_votes", "pad_cohort", "pack_messages",
           "chunked_votes", "vote_sum"]

SENSITIVITY = 1.0  # L2, of the cohort sum, add/remove one user (module docstring)
REPLACE_ONE_SENSITIVITY = float(np.sqrt(2.0))  # replace one user (non-negative unit vectors)


def sq_distances(emb: jax.Array, synth: jax.Array) -> jax.Array:
    """Squared L2 distances ``[n, N]`` between messages ``emb [n, d]`` and ``synth [N, d]``."""
    e2 = jnp.sum(emb * emb, axis=-1)[:, None]
    s2 = jnp.sum(synth * synth, axis=-1)[None, :]
    return jnp.maximum(e2 + s2 - 2.0 * emb @ synth.T, 0.0)


def nearest(emb: jax.Array, synth: jax.Array, k: int = 1) -> jax.Array:
    """Indices ``[n, k]`` (int32) of each message's ``k`` nearest synthetic samples."""
    if not 1 <= k <= synth.shape[0]:
        raise ValueError(f"k must be in [1, N={synth.shape[0]}], got {k}")
    _, idx = jax.lax.top_k(-sq_distances(emb, synth), k)
    return idx


def vote_histogram(emb: jax.Array, mask: jax.Array, synth: jax.Array, k: int = 1) -> jax.Array:
    """One client's raw vote counts ``[N]`` (float32): every real message (``mask [n]`` = 1)
    gives one vote to each of its ``k`` nearest synthetic samples; padded rows vote nothing."""
    idx = nearest(emb, synth, k)  # [n, k]
    w = jnp.broadcast_to(mask.astype(jnp.float32)[:, None], idx.shape)
    return jnp.zeros((synth.shape[0],), jnp.float32).at[idx.reshape(-1)].add(w.reshape(-1))


def normalise(h: jax.Array) -> jax.Array:
    """``h / ||h||_2`` (``0`` for ``h = 0``): a vector of L2 norm exactly 1 (or 0)."""
    norm = jnp.linalg.norm(h)
    return jnp.where(norm > 0, h / jnp.maximum(norm, 1e-30), 0.0)


def client_votes(emb: jax.Array, mask: jax.Array, synth: jax.Array, k: int = 1) -> jax.Array:
    """One client's bounded vote vector ``[N]``: ``normalise(vote_histogram(...))``, norm <= 1.

    Args:
      emb: ``[n, d]`` the client's message embeddings (padded rows arbitrary);
      mask: ``[n]`` 1 for real messages, 0 for padding;
      synth: ``[N, d]`` the server's synthetic-sample embeddings (public);
      k: votes per message (its ``k`` nearest synthetic samples), static.
    Returns:
      ``[N]`` float32, non-negative, L2 norm 1 (0 if the client has no message).
    """
    return normalise(vote_histogram(emb, mask, synth, k))


def cohort_votes(emb: jax.Array, mask: jax.Array, synth: jax.Array, k: int = 1) -> jax.Array:
    """Every client's vote vector: ``emb [m, S, d]``, ``mask [m, S]`` -> ``[m, N]``."""
    return jax.vmap(client_votes, in_axes=(0, 0, None, None))(emb, mask, synth, k)


cohort_votes_jit = jax.jit(cohort_votes, static_argnums=3)


def pad_cohort(client_embeddings: Sequence, dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Pad ``m`` per-client ``[n_i, d]`` arrays into ``emb [m, S, d]`` float32 and ``mask
    [m, S]`` (``S`` a power of two >= 8, so jit compiles few shapes). Empty clients stay (all-0
    mask: they vote nothing but still hold a noise share)."""
    arrays = [np.asarray(a, np.float32) for a in client_embeddings]
    for i, a in enumerate(arrays):
        if a.ndim != 2 or (a.shape[0] and dim is not None and a.shape[1] != dim):
            raise ValueError(f"client {i}: embeddings must be [n_i, {dim or 'd'}], got {a.shape}")
    dims = {a.shape[1] for a in arrays if a.shape[0]}
    if dim is None:
        if len(dims) != 1:
            raise ValueError(f"clients need one common embedding dimension, got {sorted(dims)}")
        dim = dims.pop()
    s = next_pow2(max([8] + [a.shape[0] for a in arrays]))
    emb = np.zeros((len(arrays), s, dim), np.float32)
    mask = np.zeros((len(arrays), s), np.float32)
    for i, a in enumerate(arrays):
        emb[i, : a.shape[0]] = a
        mask[i, : a.shape[0]] = 1.0
    return emb, mask


def pack_messages(client_embeddings: Sequence, dim: int, chunk_size: int = 256
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Split ``m`` clients' ``[n_i, d]`` messages into chunks for :func:`chunked_votes`.

    Returns ``emb [C, S, d]`` float32, ``mask [C, S]``, ``owner [C]`` int32 (the chunk's client,
    0 for padding chunks, whose mask is all 0) and ``M`` >= m (client slots, a power of two).
    ``S = min(next_pow2(max(8, largest n_i)), next_pow2(chunk_size))``; ``C`` a power of two.
    """
    arrays = [np.asarray(a, np.float32).reshape(-1, dim) if np.size(a) == 0
              else np.asarray(a, np.float32) for a in client_embeddings]
    for i, a in enumerate(arrays):
        if a.ndim != 2 or a.shape[1] != dim:
            raise ValueError(f"client {i}: embeddings must be [n_i, {dim}], got {a.shape}")
    largest = max([1] + [a.shape[0] for a in arrays])
    s = min(next_pow2(max(largest, 8)), next_pow2(chunk_size))
    pieces = [(i, a[j : j + s]) for i, a in enumerate(arrays) for j in range(0, a.shape[0], s)]
    c = next_pow2(max(1, len(pieces)))
    emb = np.zeros((c, s, dim), np.float32)
    mask = np.zeros((c, s), np.float32)
    owner = np.zeros((c,), np.int32)
    for r, (i, a) in enumerate(pieces):
        emb[r, : a.shape[0]], mask[r, : a.shape[0]], owner[r] = a, 1.0, i
    return emb, mask, owner, next_pow2(max(1, len(arrays)))


@functools.partial(jax.jit, static_argnums=(4, 5))
def chunked_votes(emb, mask, owner, synth, k: int, num_slots: int) -> jax.Array:
    """Every client's vote vector from chunks: ``emb [C, S, d]``, ``mask [C, S]``, ``owner
    [C]``, ``synth [N, d]`` -> ``[num_slots, N]``: per chunk :func:`vote_histogram`, summed
    per owner, then :func:`normalise` (equal to :func:`cohort_votes` on the unsplit clients;
    slots without a message are 0)."""
    h = jax.vmap(vote_histogram, in_axes=(0, 0, None, None))(emb, mask, synth, k)
    per_client = jax.ops.segment_sum(h, owner, num_segments=num_slots)
    return jax.vmap(normalise)(per_client)


def vote_sum(client_embeddings: Sequence, synth, k: int = 1) -> np.ndarray:
    """The pre-noise cohort sum ``sum_u client_votes(e_u)`` ``[N]`` (float64; no privacy: for
    tests and non-private references). ``client_embeddings``: ``m`` arrays ``[n_i, d]``."""
    synth = np.asarray(synth, np.float32)
    if not len(client_embeddings):
        return np.zeros((synth.shape[0],), np.float64)
    emb, mask = pad_cohort(client_embeddings, synth.shape[1])
    v = cohort_votes_jit(jnp.asarray(emb), jnp.asarray(mask), jnp.asarray(synth), k)
    return np.asarray(v, np.float64).sum(axis=0)
