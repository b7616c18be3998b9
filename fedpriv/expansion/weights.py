"""Unigram sequence densities and the relative importance weights of Koga et al. 2023 (Eq. 2, Eq. 3).

    p_hat_pi(x) = prod_i u_hat_pi(x_i),
    w(x) = p_hat_T(x) / (alpha p_hat_T(x) + (1 - alpha) p_hat_pi(x)),    (Eq. 3)

the weight of the instance-weighted objective E_{x ~ S u T}[w(x) L(x)] (Eq. 2), computed in log
space, with optional bounding. ``u_hat`` comes from the private release of
`fedpriv.expansion.unigrams` (the weights are post-processing of it); x are the same target
positions that release counts.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from fedpriv.expansion.data import SOURCE, TARGET, _like
from fedpriv.expansion.unigrams import DEFAULT_IGNORE_IDS, _counted_mask, _target_positions

__all__ = ["sequence_log_density", "relative_log_weights", "importance_weights", "bound_weights",
           "add_importance_weights", "check_alpha"]


def sequence_log_density(
    tokens: np.ndarray,
    u_hat: np.ndarray,
    *,
    ignore_ids: Sequence[int] = DEFAULT_IGNORE_IDS,
    targets_only: bool = True,
) -> np.ndarray:
    """log p_hat(x) = sum_i log u_hat(x_i) over counted tokens: float64[...] for int[..., L+1].

    x = the target positions ``tokens[..., 1:]`` minus PAD and BOS (``targets_only=False`` scores
    every position). ``u_hat`` must be strictly positive (e.g. from `normalise_counts`). A sequence
    with no counted token has log p_hat = 0 (p_hat = 1, so w = 1 for it in Eq. 3).
    """
    u_hat = np.asarray(u_hat, dtype=np.float64)
    if u_hat.ndim != 1 or np.any(~(u_hat > 0)):
        raise ValueError("u_hat must be a vector of strictly positive probabilities")
    x = _target_positions(tokens, targets_only)
    if x.size and (x.min() < 0 or x.max() >= u_hat.shape[0]):
        raise ValueError(f"token ids must lie in [0, {u_hat.shape[0]})")
    log_u = np.log(u_hat)
    mask = _counted_mask(x, ignore_ids)
    return np.where(mask, log_u[x], 0.0).sum(axis=-1)


def check_alpha(alpha: float) -> float:
    """``alpha`` (the fraction of devices with target data) as a float in (0, 1]."""
    alpha = float(alpha)
    if not (0.0 < alpha <= 1.0):
        raise ValueError(f"alpha (fraction of devices with target data) must be in (0, 1], "
                         f"got {alpha!r}")
    return alpha


def relative_log_weights(log_p_target: np.ndarray, log_p_own: np.ndarray,
                         alpha: float) -> np.ndarray:
    """log w of Eq. 3: log p_T - log(alpha p_T + (1 - alpha) p_pi); float64 of the broadcast shape.

    Evaluated as  log w = -logaddexp(log alpha, log(1 - alpha) + (log p_pi - log p_T)),
    which only involves the log-density *difference* d: exact for log-densities of -1000 or less
    (where p itself underflows), and monotone: w -> 1/alpha as d -> -inf, w -> 0 as d -> +inf,
    w = 1 at d = 0. So w in (0, 1/alpha] (exp of a log weight below about -745 in float64, or
    -103 in float32, rounds to 0: such an example is effectively dropped from the objective).
    """
    alpha = check_alpha(alpha)
    d = np.asarray(log_p_own, np.float64) - np.asarray(log_p_target, np.float64)
    if alpha == 1.0:
        return np.zeros_like(d)
    return -np.logaddexp(math.log(alpha), math.log1p(-alpha) + d)


def bound_weights(w: np.ndarray, alpha: float, *, mode: str = "none",
                  w_max: float | None = None) -> np.ndarray:
    """Optional bounding of Eq. 3 weights w in (0, 1/alpha]; same shape and dtype as ``w``.

    modes: "none" (w as is), "scale" (alpha * w in (0, 1]: a constant factor, so the same
    minimiser of Eq. 2, and no per-example gradient is ever larger than unweighted),
    "clip" (min(w, w_max), w_max > 0: biased, but bounds the largest up-weighting).

    Why the privacy analysis does not change: the weights only rescale per-example losses inside
    a client's local training, and DP-FedAvg/DP-FTRL clip each client's *model delta* to norm S
    afterwards, so one user's contribution to the aggregate is bounded by S whatever objective the
    client optimised (the sensitivity is a property of the clip, not of the loss). The weights are
    a function of the client's own examples and of u_hat, which is a DP release already charged to
    the ledger (post-processing), and of alpha, a public population count. Bounding them is for
    optimisation (w up to 1/alpha = 10 multiplies the effective local step, makes deltas hit the
    clip more often and so biases the clipped average), not for privacy.
    """
    alpha = check_alpha(alpha)
    w = np.asarray(w)
    if mode == "none":
        return w
    if mode == "scale":
        return (w * alpha).astype(w.dtype)
    if mode == "clip":
        if w_max is None or not (w_max > 0):
            raise ValueError("mode='clip' needs w_max > 0")
        return np.minimum(w, np.asarray(w_max, w.dtype))
    raise ValueError(f"mode must be 'none', 'scale' or 'clip', got {mode!r}")


def importance_weights(
    tokens: np.ndarray,
    domain: np.ndarray,
    u_source: np.ndarray,
    u_target: np.ndarray,
    alpha: float,
    *,
    mode: str = "none",
    w_max: float | None = None,
    ignore_ids: Sequence[int] = DEFAULT_IGNORE_IDS,
    targets_only: bool = True,
) -> np.ndarray:
    """Per-example weights of Eq. 3 for one client: float32[n] (the example dict's 'weight').

    Args:
      tokens: int[n, L+1]; domain: int[n] with SOURCE = 0 / TARGET = 1 (pi of each example).
      u_source, u_target: private unigram frequencies float[V] of S and T.
      alpha: fraction of devices with target-domain data (`DomainDataset.alpha`).
      mode, w_max: `bound_weights`.
    Target examples get w = 1 exactly (Eq. 3 with pi = T is 1/(alpha + 1 - alpha)); source
    examples w = 1/(alpha + (1 - alpha) p_hat_S(x)/p_hat_T(x)) from log-space densities.
    """
    domain = np.asarray(domain)
    tokens = np.asarray(tokens)
    if domain.shape != tokens.shape[:1]:
        raise ValueError(f"domain must be int[n] for tokens of shape {tokens.shape}")
    if np.any((domain != SOURCE) & (domain != TARGET)):
        raise ValueError("domain ids must be SOURCE (0) or TARGET (1)")
    kw = dict(ignore_ids=ignore_ids, targets_only=targets_only)
    log_pt = sequence_log_density(tokens, u_target, **kw)
    log_ps = sequence_log_density(tokens, u_source, **kw)
    log_w = relative_log_weights(log_pt, log_ps, alpha)
    w = np.where(domain == TARGET, 1.0, np.exp(log_w))
    return bound_weights(w.astype(np.float32), alpha, mode=mode, w_max=w_max)


def add_importance_weights(
    clients: Mapping[Hashable, Mapping[str, Any]],
    u_source: np.ndarray,
    u_target: np.ndarray,
    alpha: float,
    **kwargs,
) -> Mapping[Hashable, dict[str, Any]]:
    """Clients with 'weight': float32[n] added next to 'tokens' and 'domain' (inputs unchanged).

    ``clients``: client id -> {'tokens': int[n, L+1], 'domain': int[n], ...}; a
    `fedpriv.data.federated.FederatedDataset` gives a FederatedDataset back. ``kwargs`` go to
    `importance_weights` (mode, w_max, ...).
    """
    out = {}
    for cid, ex in clients.items():
        new = dict(ex)
        new["weight"] = importance_weights(ex["tokens"], ex["domain"], u_source, u_target, alpha,
                                           **kwargs)
        out[cid] = new
    return _like(clients, out)

