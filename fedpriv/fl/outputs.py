"""Which per-round output of the round loop the ledger covers, and which is marked non-private
(docs/design.md §3, "Every output is covered or marked").

The keys of :data:`DP_COVERED_METRICS` are functions of the DP releases (the noised
adaptive-clipping count and the clip norm it sets); :data:`PUBLIC_METRICS` are what the server
observes whatever the data; every other training metric is an exact statistic of the sampled
private clients and is written as ``nonprivate/<name>`` (``nonprivate_key``). ``scalarize`` turns
a round's metric sums into the logged row, with the ratios of :data:`DERIVED_METRICS`.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["NONPRIVATE", "DP_COVERED_METRICS", "PUBLIC_METRICS", "OUTPUTS", "nonprivate_key",
           "DERIVED_METRICS", "scalarize"]

# Every per-round output of the loop is either covered by the ledger or marked non-private
# (docs/design.md §3): the keys below are functions of the DP releases (the noised adaptive-clipping
# count and the clip norm it sets); every other training metric is an exact statistic of the
# sampled private clients (clipped fraction, pre-clip norms, cohort size, non-finite updates,
# loss/accuracy sums, engine step counts) and is written as ``nonprivate/<name>``. ``round`` is
# public. Evaluation rows (``eval_*``, from the caller's ``eval_fn``) are exact statistics of
# whatever the caller evaluates on (held-out private users in the experiments): not covered,
# and listed as such in each run record (``OUTPUTS``); ``epsilon_spent`` is the ledger's.
NONPRIVATE = "nonprivate/"
DP_COVERED_METRICS = ("clip_norm", "unclipped_estimate")
# what the server observes whatever the data (DDG: which clients' messages arrived)
PUBLIC_METRICS = ("ddg_survivors", "ddg_released")
OUTPUTS = {
    "covered_by_ledger": ["model parameters / checkpoints", *DP_COVERED_METRICS],
    "public": ["round", "epsilon_spent", *PUBLIC_METRICS],
    "not_covered": [NONPRIVATE + "* (exact statistics of the sampled private clients)",
                    "eval_* (exact evaluation on held-out users)"],
}


def nonprivate_key(name: str) -> str:
    """The published name of a training metric: unchanged if DP-covered, else ``nonprivate/``."""
    keep = name in DP_COVERED_METRICS or name in PUBLIC_METRICS or name.startswith(NONPRIVATE)
    return name if keep else NONPRIVATE + name


# Ratios the loop derives from a round's summed metrics: name -> (numerator, denominators in
# order of preference). The default fits the LM tasks (``models.lm.make_lm_task``); a task
# whose loss returns other sums passes its own ``derived_metrics`` to ``train``.
DERIVED_METRICS = {"train_loss": ("loss_sum", ("num_tokens",)),
                   "train_accuracy": ("num_correct", ("num_acc_tokens", "num_tokens"))}


def scalarize(metrics, derived: Mapping = DERIVED_METRICS) -> dict:
    out = {}
    for k, v in metrics.items():
        v = np.asarray(v)
        out[k] = float(v) if v.size == 1 else v.tolist()
    for name, (num, denoms) in derived.items():
        denom = next((out[d] for d in denoms if d in out), None)
        if num in out and denom:
            out[name] = out[num] / denom
    return {nonprivate_key(k): v for k, v in out.items()}
