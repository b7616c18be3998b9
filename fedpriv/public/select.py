"""Distribution matching: choose the public sequences closest to the private distribution.

Wang et al. 2023, §5.1 and Algorithm 1 (lines 4–11), with the estimator of §5.2 / App. D.
For every public sequence x the average token log-probability is computed under

* the private on-device LM after T' rounds of DP-FTRL, ``logp_priv = log p_priv(x)`` — a DP
  checkpoint, so using it is post-processing (no privacy cost), and
* the public teacher LLM, ``logp_pub = log p_pub(x)`` (`fedpriv.models.llama.sequence_logprob`),

and the public pool is ranked by the combined score

    score_β(x) = (1 − β) · logp_pub(x) + β · logp_priv(x),        β ∈ [0, 1],

keeping the top q fraction (|D'| = ⌈q·|D|⌉). β is the weight on the *private* model, as in App.
D.3's ``f̂_β = (1−β) ℓ_pub + β ℓ̂_priv``:

* β = 0.5 is the paper's ĥ = ½ℓ_pub + ½ℓ̂_priv (Theorem 5.1), the same ranking as Algorithm 1's
  ``log p_priv + log p_pub`` (line 10);
* β = 1 ranks by logp_priv alone: the "w/o p_pub" ablation of Table 3;
* β = 0 ranks by the public LLM alone.

Beware: App. D.2 (Eq. 9) writes the same family with β on the *public* term,
``f̂_β = β ℓ_pub + (1−β) ℓ̂_priv``, so its β is our 1−β. Its Eq. 15,
ε(f̂) = w_pub² d²_pub,priv + w_priv² σ²_priv, holds in either notation with w the weights.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

import numpy as np


def matching_scores(logp_priv: Sequence[float], logp_pub: Sequence[float],
                    beta: float = 0.5) -> np.ndarray:
    """Distribution-matching score ``(1 − β)·logp_pub + β·logp_priv``: float64[N].

    Args:
      logp_priv: float[N] average token log-probs under the private (DP) on-device LM.
      logp_pub: float[N] average token log-probs under the public LLM.
      beta: weight on the private model, in [0, 1] (0.5 = paper's ĥ; 1 = "w/o p_pub").
    """
    if not 0.0 <= beta <= 1.0 or math.isnan(beta):
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    priv = np.asarray(logp_priv, np.float64)
    pub = np.asarray(logp_pub, np.float64)
    if priv.ndim != 1 or priv.shape != pub.shape:
        raise ValueError(f"logp_priv and logp_pub must be 1-D of equal length, got shapes "
                         f"{priv.shape} and {pub.shape}")
    # Exact end points (so an infinite log-prob of the unused model cannot leak in as 0·inf).
    if beta == 0.0:
        return pub.copy()
    if beta == 1.0:
        return priv.copy()
    return (1.0 - beta) * pub + beta * priv


def num_selected(n: int, q: float) -> int:
    """|D'| = ⌈q·n⌉ (at least 1 for n >= 1), for q ∈ (0, 1]."""
    if not (isinstance(q, (int, float, np.floating)) and 0.0 < q <= 1.0):
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    return min(n, max(1, math.ceil(q * n - 1e-9))) if n else 0


def select_top_fraction(scores: Sequence[float], q: float) -> np.ndarray:
    """Indices of the top-q fraction of `scores`, best first: int64[⌈q·N⌉].

    Ties are broken deterministically by smaller index. -inf scores are allowed (ranked last);
    NaN scores raise ValueError, as does q ∉ (0, 1].
    """
    s = np.asarray(scores, np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D, got shape {s.shape}")
    m = num_selected(len(s), q)
    bad = np.isnan(s)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} NaN score(s), e.g. at index {int(np.argmax(bad))}")
    if np.isposinf(s).any():
        raise ValueError("+inf score: an average log-probability cannot be +inf")
    order = np.lexsort((np.arange(len(s)), -s))  # score descending, then index ascending
    return order[:m].astype(np.int64)


def distribution_matching_select(logp_priv: Sequence[float], logp_pub: Sequence[float], q: float,
                                 beta: float = 0.5) -> np.ndarray:
    """Algorithm 1 lines 10–11: indices of the top-q public sequences by ``score_β``."""
    return select_top_fraction(matching_scores(logp_priv, logp_pub, beta), q)


def source_shares(sources: Sequence[Any], selected: Sequence[int]) -> dict[Any, dict[str, float]]:
    """Share of each `source` label in the selection vs in the pool.

    Args:
      sources: N labels (e.g. "wikipedia", "lee", "chitchat-like") of the public pool.
      selected: indices into the pool (e.g. from `select_top_fraction`).

    Returns:
      {label: {'pool_count', 'pool_share', 'selected_count', 'selected_share', 'lift'}} with
      lift = selected_share / pool_share, labels sorted by decreasing selected share.
    """
    labels = list(sources)
    sel = np.asarray(selected, np.int64).reshape(-1)
    if len(sel) and (sel.min() < 0 or sel.max() >= len(labels)):
        raise ValueError("selected indices out of range of the pool")
    if len(np.unique(sel)) != len(sel):
        raise ValueError("selected indices contain duplicates")
    pool = Counter(labels)
    chosen = Counter(labels[i] for i in sel)
    n, m = len(labels), len(sel)
    out = {}
    for label, count in pool.items():
        pool_share = count / n
        sel_share = chosen.get(label, 0) / m if m else float("nan")
        out[label] = {"pool_count": count, "pool_share": pool_share,
                      "selected_count": chosen.get(label, 0), "selected_share": sel_share,
                      "lift": sel_share / pool_share}
    return dict(sorted(out.items(), key=lambda kv: (-kv[1]["selected_count"], str(kv[0]))))


