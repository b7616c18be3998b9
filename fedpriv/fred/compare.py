"""Private vs non-private FreD over seeds (Hou et al. 2023, Table 1 analogue).

For each embedding space (the full space and, optionally, a ``k``-dim PCA basis of the pooled
public candidates -- not in the paper, no privacy cost) and each unit of privacy: the
non-private FreD (Eq. 2 on exact statistics of the private users: NOT covered by any epsilon)
and the private FreD of one release per seed, reused for every candidate.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
import numpy as np

from fedpriv.fred.distance import fred_nonprivate, gaussian_stats, pca_basis
from fedpriv.fred.private import PrivateStats, private_stats, rank_candidates


def embedding_spaces(candidates: Mapping[str, np.ndarray], pca_dims: int | None, dim: int):
    """``[(label, basis | None)]``: the full ``dim``-d space, plus the public PCA-``k`` basis
    ``[dim, k]`` of the pooled candidates if ``pca_dims``."""
    spaces = [(f"{dim}-d", None)]
    if pca_dims:
        basis = pca_basis(np.concatenate(list(candidates.values())), pca_dims)
        spaces.append((f"public PCA-{pca_dims}", basis))
    return spaces


def table_rows(clients: Sequence[np.ndarray], candidates: Mapping[str, np.ndarray], *,
               epsilon: float, delta: float, clip: float, seeds: int,
               pca_dims: int | None = None, units: Sequence[str] = ("sample", "user"),
               n_public: Mapping[str, float] | None = None
               ) -> tuple[list[dict], dict[str, PrivateStats]]:
    """Rows of the FreD table and the last release per unit.

    Args:
      clients: one ``[n_u, d]`` embedding array per private user.
      candidates: name -> ``[n_c, d]`` public embeddings.
      epsilon, delta: per release; clip: ``c``; seeds: releases ``jax.random.key(0..seeds-1)``.
      n_public: unit -> declared denominator (samples / users) of that unit's releases. The
        releases are add/remove, where the exact count is private (``fedpriv.fred.private``
        module doc), so every unit in ``units`` needs one; the rows' ``n`` is it.
    Returns:
      ``(rows, {unit: PrivateStats})``; one row per (space, unit, candidate) with the private
      FreD's mean/std/min/max over seeds, the privacy figures, and ``nonprivate/`` columns.
    """
    missing = [u for u in units if n_public is None or u not in n_public]
    if missing:
        raise ValueError(f"table_rows: no declared count n_public for unit(s) {missing}; under "
                         "add/remove the exact count is private and cannot be the denominator")
    pooled = np.concatenate(clients)
    rows, releases = [], {}
    for space, basis in embedding_spaces(candidates, pca_dims, pooled.shape[1]):
        proj = (lambda x: x) if basis is None else (lambda x, b=basis: (x @ b).astype(np.float32))
        cand_s = {name: proj(e) for name, e in candidates.items()}
        clients_s = [proj(c) for c in clients]
        pooled_s = proj(pooled)
        nonpriv = {name: fred_nonprivate(e, pooled_s) for name, e in cand_s.items()}
        stats = {name: gaussian_stats(e) for name, e in cand_s.items()}  # reused across seeds
        order_np = sorted(nonpriv, key=nonpriv.get)
        for unit in units:
            scores = {name: [] for name in candidates}
            same_order = same_top = 0
            for seed in range(seeds):
                rel = private_stats(clients_s, clip, epsilon, delta, unit, jax.random.key(seed),
                                    n_public=n_public[unit])
                ranked = rank_candidates(stats, rel)
                same_order += [n for n, _ in ranked] == order_np
                same_top += ranked[0][0] == order_np[0]
                for name, sc in ranked:
                    scores[name].append(sc)
                releases[unit] = rel
            rel = releases[unit]
            for name in candidates:
                sc = np.array(scores[name])
                rows.append({
                    "space": space, "candidate": name, "unit": unit, "n": rel.n,
                    "fred_private_mean": sc.mean(),
                    "fred_private_std": sc.std(ddof=1) if len(sc) > 1 else 0.0,
                    "fred_private_min": sc.min(), "fred_private_max": sc.max(),
                    "eps_per_release": epsilon, "delta_per_release": delta,
                    "eps_basic": rel.epsilon_basic, "delta_total": rel.delta_total,
                    "eps_rdp": rel.epsilon_rdp, "eps_pld": rel.epsilon_pld,
                    "noise_multiplier": rel.noise_multiplier,
                    # exact statistics of the private users: not covered by the release's epsilon
                    "nonprivate/fred": nonpriv[name],
                    "nonprivate/same_ranking": f"{same_order}/{seeds}",
                    "nonprivate/same_closest": f"{same_top}/{seeds}",
                })
    return rows, releases
