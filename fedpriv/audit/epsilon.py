"""Empirical epsilon from canary statistics: the epsilon of telling two fitted Gaussians
apart at the run's delta, its null (held-out vs held-out) value and a bootstrap interval
(Andrew et al., ICLR 2024; see :mod:`fedpriv.audit`)."""
from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr


class AuditError(ValueError):
    """A bad audit setting (the CLI prints it on one line and exits with status 2)."""

# ----------------------------------------------------------------------------- epsilon
def _region_logprob(lo_hi, mu, sigma):
    """log P(X in region) for X ~ N(mu, sigma^2); region = list of (lo, hi) intervals."""
    total = -np.inf
    for lo, hi in lo_hi:
        a, b = (lo - mu) / sigma, (hi - mu) / sigma
        if b <= a:
            continue
        if a > 0:   # upper tail: difference of survival functions, in logs
            la, lb = log_ndtr(-a), log_ndtr(-b)
        else:
            la, lb = log_ndtr(b), log_ndtr(a)
        term = la + np.log1p(-np.exp(min(lb - la, 0.0))) if lb > -np.inf else la
        total = np.logaddexp(total, term)
    return total


def _hockey_stick(eps, mu_p, s_p, mu_q, s_q):
    """``delta_{P||Q}(eps) = P(L > eps) - e^eps Q(L > eps)``, ``L = log p/q``, P, Q Gaussian."""
    # L(x) - eps = a x^2 + b x + c
    a = 0.5 / s_q ** 2 - 0.5 / s_p ** 2
    b = mu_p / s_p ** 2 - mu_q / s_q ** 2
    c = mu_q ** 2 / (2 * s_q ** 2) - mu_p ** 2 / (2 * s_p ** 2) + math.log(s_q / s_p) - eps
    inf = np.inf
    if abs(a) < 1e-12 * max(abs(b), 1e-300):
        if b == 0:
            region = [(-inf, inf)] if c > 0 else []
        else:
            x0 = -c / b
            region = [(x0, inf)] if b > 0 else [(-inf, x0)]
    else:
        disc = b * b - 4 * a * c
        if disc <= 0:
            region = [(-inf, inf)] if a > 0 else []
        else:
            q = -0.5 * (b + math.copysign(math.sqrt(disc), b))   # no cancellation
            r1, r2 = sorted((q / a, c / q))
            region = [(-inf, r1), (r2, inf)] if a > 0 else [(r1, r2)]
    if not region:
        return 0.0
    lp, lq = _region_logprob(region, mu_p, s_p), _region_logprob(region, mu_q, s_q)
    if lp == -np.inf:
        return 0.0
    return float(max(0.0, np.exp(lp) - np.exp(min(eps + lq, 700.0))))


def gaussian_pair_epsilon(mu0: float, sigma0: float, mu1: float, sigma1: float, delta: float,
                          eps_max: float = 500.0) -> float:
    """Smallest eps >= 0 such that ``N(mu0, sigma0^2)`` and ``N(mu1, sigma1^2)`` are
    (eps, delta)-indistinguishable in both directions (exact for unequal variances)."""
    if not (sigma0 > 0 and sigma1 > 0):
        raise AuditError("a fitted Gaussian has zero variance")

    def worst(eps):
        return max(_hockey_stick(eps, mu1, sigma1, mu0, sigma0), _hockey_stick(eps, mu0, sigma0, mu1, sigma1))

    if worst(0.0) <= delta:
        return 0.0
    if worst(eps_max) > delta:
        return eps_max
    return float(brentq(lambda e: worst(e) - delta, 0.0, eps_max, xtol=1e-5))


def estimate_epsilon(inserted: np.ndarray, heldout: np.ndarray, delta: float) -> dict:
    """The one-shot estimate: fit one Gaussian per sample, epsilon of the pair at ``delta``."""
    mu1, s1 = float(np.mean(inserted)), float(np.std(inserted, ddof=1))
    mu0, s0 = float(np.mean(heldout)), float(np.std(heldout, ddof=1))
    return {"epsilon": gaussian_pair_epsilon(mu0, s0, mu1, s1, delta),
            "mean_in": mu1, "std_in": s1, "mean_out": mu0, "std_out": s0}


def null_epsilon(stats: dict, delta: float, seed: int) -> float:
    """The audit's resolution: the same estimate (largest over the statistics) between two
    disjoint sets of *held-out* directions, the first as large as the inserted sample. Nothing
    separates them, so any epsilon it finds is finite-sample error of the Gaussian fits."""
    rng = np.random.default_rng([int(seed), 7_005])
    best = 0.0
    for ins, out in stats.values():
        perm = rng.permutation(len(out))
        n = min(len(ins), len(out) // 2)
        best = max(best, estimate_epsilon(out[perm[:n]], out[perm[n:]], delta)["epsilon"])
    return best


def bootstrap_interval(stats: dict, delta: float, seed: int, resamples: int = 200,
                       level: float = 0.90) -> tuple[float, float]:
    """``level`` percentile-bootstrap interval of the reported estimate (the largest over the
    statistics): canaries and held-out directions are resampled with replacement, so the
    interval reflects the finite-sample error of the Gaussian fits (and the max's selection)."""
    rng = np.random.default_rng([int(seed), 7_004])
    draws = []
    for _ in range(resamples):
        best = 0.0
        for ins, out in stats.values():
            i, o = ins[rng.integers(0, len(ins), len(ins))], out[rng.integers(0, len(out), len(out))]
            best = max(best, estimate_epsilon(i, o, delta)["epsilon"])
        draws.append(best)
    tail = 100 * (1 - level) / 2
    return float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))


