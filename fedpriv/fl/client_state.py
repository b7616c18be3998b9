"""Client state that stays on the client (``fedpriv.fl.client.ClientHooks.state_init``).

In a deployment each client keeps its own state on its device (SCAFFOLD's control variate
``c_i``, Karimireddy et al. 2020, ICML, Alg. 1); in this simulation the round loop keeps it for
every population member in a ``ClientStateStore``: a pytree of ``[N, ...]`` NumPy arrays in
population order, every client starting from ``state_init(initial params)``. Before a round the
sampled clients' states are gathered by cohort slot (``gather``: ``[K, ...]``, empty slots get
the initial state); after it, the states their ``final`` hooks returned are written back
(``scatter``). Nothing else reads the store: the server's state, the sum, the noise and the
metrics never see it, so it releases nothing (only each client's clipped release leaves the
client). It is checkpointed with the run (``fedpriv.fl.run_records``), so a resumed run
continues bit for bit. Memory: N copies of one client's state.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

__all__ = ["ClientStateStore"]


class ClientStateStore:
    """Each population member's client state (module docstring).

    Args:
      initial: one client's initial state (a pytree of arrays: ``state_init(params)``).
      num_clients: N, the population size (``len(client_ids)``).
    """

    def __init__(self, initial, num_clients: int):
        initial = jax.device_get(initial)
        self.initial = jax.tree_util.tree_map(np.asarray, initial)
        self.table = jax.tree_util.tree_map(
            lambda x: np.broadcast_to(x, (int(num_clients),) + x.shape).copy(), self.initial)

    def gather(self, indices: Sequence[int], capacity: int):
        """The states of population members ``indices`` (in cohort order) as ``[capacity, ...]``
        arrays; slots past the cohort hold the initial state."""
        idx = np.asarray(indices, np.int64)

        def pick(t, x0):
            out = np.broadcast_to(x0, (int(capacity),) + x0.shape).copy()
            out[:len(idx)] = t[idx]
            return out
        return jax.tree_util.tree_map(pick, self.table, self.initial)

    def scatter(self, indices: Sequence[int], states) -> None:
        """Write back the states of ``indices`` from the cohort's ``[capacity, ...]`` arrays."""
        idx = np.asarray(indices, np.int64)
        states = jax.device_get(states)

        def put(t, s):
            t[idx] = np.asarray(s)[:len(idx)]
        jax.tree_util.tree_map(put, self.table, states)
