"""The latency model of Koga et al. 2023 (Prop. 3.1, Eq. 1, App. B).

Of N devices a fraction p is available and sampled with probability q; the round waits for the
remaining k = C - Npq of the m = N - Np unavailable devices, each becoming available (and sampled)
after an Exp(lambda) time. This module gives the exact expectation E[U_k] of that wait, its lower
and upper bounds (Eq. 1 and the intermediate bound of App. B), and a Monte Carlo simulator of
exponential availability clocks (`experiments.latency_figure` draws Figure 1 from them).
"""
from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple

import numpy as np

from fedpriv.util import check_positive

__all__ = ["latency_counts", "expected_kth_arrival", "expected_latency", "latency_lower_bound",
           "latency_upper_bound", "latency_upper_bound_tight", "LatencyEstimate",
           "simulate_kth_arrival", "simulate_latency", "compare_latency"]


def _check_count(v: Any, name: str) -> int:
    if isinstance(v, bool):
        raise TypeError(f"{name} must be an integer count, got {v!r}")
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an integer count, got {v!r} "
                        f"({type(v).__name__})") from None
    if v <= 0:
        raise ValueError(f"{name} must be a positive integer, got {v}")
    return v


def _check_latency_args(N, C, p, q, lam=None) -> tuple[int, int, float, float]:
    N = _check_count(N, "population size N")
    C = _check_count(C, "cohort size C")
    if C > N:
        raise ValueError(f"cohort size C={C} exceeds the population size N={N}")
    p, q = float(p), float(q)
    if not (0.0 <= p <= 1.0):
        raise ValueError(f"availability ratio p must be in [0, 1], got {p!r}")
    if not (0.0 < q <= 1.0):
        raise ValueError(f"sampling probability q must be in (0, 1], got {q!r}")
    if lam is not None:
        _check_lam(lam)
    return N, C, p, q


def _check_lam(lam) -> float:
    return check_positive(lam, "availability rate lambda")


def latency_counts(N: int, C: int, p: float, q: float) -> tuple[int, int]:
    """(m, k) of Prop. 3.1: m = N - Np unavailable devices, k = C - Npq devices still needed.

    Device counts are integers: m = N - round(N p) and k = C - round(N p q) (round half to even;
    identical to the paper when Np and Npq are integers). k <= 0 means a full cohort is already
    available.
    """
    N, C, p, q = _check_latency_args(N, C, p, q)
    return N - round(N * p), C - round(N * p * q)


_ASYMPTOTIC_FROM = 64


def _harmonic_diff(m: int, b: int) -> float:
    """H_m - H_b = sum_{x=b+1}^{m} 1/x for integers m >= b >= 0, without cancellation.

    Short ranges: compensated direct sum. Long ranges with b >= 64: the asymptotic series of
    psi(x+1) = ln x + 1/(2x) - 1/(12x^2) + 1/(120x^4) - 1/(252x^6) + ..., differenced term by term
    in closed form (ln(m/b) = log1p(k/b); 1/m^j - 1/b^j from k = m - b), error < 1e-17 relative.
    """
    if m - b <= 4096:
        return math.fsum(1.0 / x for x in range(b + 1, m + 1))
    if b < _ASYMPTOTIC_FROM:
        return (math.fsum(1.0 / x for x in range(b + 1, _ASYMPTOTIC_FROM + 1))
                + _harmonic_diff(m, _ASYMPTOTIC_FROM))
    k = m - b
    # 1/m^j - 1/b^j written with k = m - b, so no two nearly equal numbers are subtracted:
    d1 = -k / (m * b)  # 1/m - 1/b
    inv_m, inv_b = 1.0 / m, 1.0 / b
    d2 = d1 * (inv_m + inv_b)  # 1/m^2 - 1/b^2
    d4 = d2 * (inv_m**2 + inv_b**2)  # 1/m^4 - 1/b^4
    d6 = d2 * (inv_m**4 + inv_m**2 * inv_b**2 + inv_b**4)  # 1/m^6 - 1/b^6
    return math.log1p(k / b) + d1 / 2 - d2 / 12 + d4 / 120 - d6 / 252


def expected_kth_arrival(m: int, k: int, lam: float) -> float:
    """E[U_k] = (1/lambda) sum_{x=m-k+1}^{m} 1/x: mean time of the k-th of m i.i.d. Exp(lambda)
    arrivals (App. B). 0 for k <= 0; inf for k > m (the cohort can never fill)."""
    lam = _check_lam(lam)
    m, k = operator.index(m), operator.index(k)
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if k <= 0:
        return 0.0
    if k > m:
        return math.inf
    return _harmonic_diff(m, m - k) / lam


def expected_latency(N: int, C: int, p: float, q: float, lam: float) -> float:
    """Exact E[U_k] of Prop. 3.1 for population N, cohort C, availability p, sampling q, rate
    lambda (m, k from `latency_counts`). 0 if k <= 0, inf if k > m."""
    _check_latency_args(N, C, p, q, lam)
    m, k = latency_counts(N, C, p, q)
    return expected_kth_arrival(m, k, lam)


def latency_lower_bound(N: int, C: int, p: float, q: float, lam: float) -> float:
    """Eq. 1 lower bound (1/lambda)(C - Npq)/(N(1 - p) + 1) = k / (lambda (m + 1)), with the
    integer (m, k) of `latency_counts`; 0 when k <= 0. Holds for every valid argument."""
    _check_latency_args(N, C, p, q, lam)
    m, k = latency_counts(N, C, p, q)
    return max(k, 0) / (float(lam) * (m + 1))


def latency_upper_bound(N: int, C: int, lam: float) -> float:
    """Eq. 1 upper bound C / (lambda (N - C)) (inf for C = N).

    Valid when the server oversamples, q >= C/N (the last step of App. B), and k <= m; otherwise
    use `latency_upper_bound_tight`.
    """
    N, C, _, _ = _check_latency_args(N, C, 0.0, 1.0, lam)
    return math.inf if C == N else C / (float(lam) * (N - C))


def latency_upper_bound_tight(N: int, C: int, p: float, q: float, lam: float) -> float:
    """The intermediate bound of App. B, k / (lambda (m - k)) (= ln(m/(m-k)) <= m/(m-k) - 1),
    valid without the q >= C/N assumption; 0 if k <= 0, inf if k >= m."""
    _check_latency_args(N, C, p, q, lam)
    m, k = latency_counts(N, C, p, q)
    if k <= 0:
        return 0.0
    return math.inf if k >= m else k / (float(lam) * (m - k))


class LatencyEstimate(NamedTuple):
    """Monte Carlo estimate of E[U_k]: sample mean, its standard error, number of trials."""

    mean: float
    stderr: float
    trials: int


def simulate_kth_arrival(m: int, k: int, lam: float, rng: np.random.Generator, trials: int,
                         *, method: str = "clocks", max_chunk_elements: int = 4_000_000
                         ) -> LatencyEstimate:
    """Monte Carlo of the time until k of m unavailable devices become available.

    method="clocks": each trial draws m i.i.d. Exp(lambda) availability times (float64[trials, m]
      in chunks of <= ``max_chunk_elements``) and takes the k-th smallest (np.partition): the
      literal model, independent of the memorylessness argument of App. B.
    method="order_statistic": the k-th smallest of m Exp(lambda) is -ln(V)/lambda with
      V ~ Beta(m - k + 1, k) (V = 1 - U_(k), U_(k) the k-th uniform order statistic); O(trials)
      work, for populations too large for clocks.
    k <= 0 gives (0, 0, trials); k > m gives (inf, 0, trials) (never filled).
    """
    lam = _check_lam(lam)
    trials = _check_count(trials, "trials")
    m, k = operator.index(m), operator.index(k)
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if method not in ("clocks", "order_statistic"):
        raise ValueError(f"method must be 'clocks' or 'order_statistic', got {method!r}")
    if k <= 0:
        return LatencyEstimate(0.0, 0.0, trials)
    if k > m:
        return LatencyEstimate(math.inf, 0.0, trials)
    if method == "clocks":
        if m > 20_000_000:
            raise ValueError(f"m = {m:,} clocks per trial is too large for method='clocks'; "
                             "use method='order_statistic'")
        chunk = max(1, min(trials, max_chunk_elements // m))
        samples = []
        done = 0
        while done < trials:
            b = min(chunk, trials - done)
            t = rng.exponential(1.0 / lam, size=(b, m))
            samples.append(np.partition(t, k - 1, axis=1)[:, k - 1])
            done += b
        u = np.concatenate(samples)
    else:
        u = -np.log(rng.beta(m - k + 1, k, size=trials)) / lam
    se = float(u.std(ddof=1) / math.sqrt(trials)) if trials > 1 else math.nan
    return LatencyEstimate(float(u.mean()), se, trials)


def simulate_latency(N: int, C: int, p: float, q: float, lam: float, rng: np.random.Generator,
                     trials: int = 2000, *, method: str = "clocks") -> LatencyEstimate:
    """Monte Carlo estimate of Prop. 3.1's E[U_k] (see `simulate_kth_arrival`, `latency_counts`)."""
    _check_latency_args(N, C, p, q, lam)
    m, k = latency_counts(N, C, p, q)
    return simulate_kth_arrival(m, k, lam, rng, trials, method=method)


def compare_latency(cases, rng: np.random.Generator, trials: int) -> list[dict]:
    """Monte Carlo vs exact vs bounds, one row per case ``(N, C, p, q, lambda, method)``: m, k,
    the Eq. 1 lower bound, exact E[U_k], the App. B bound k/(lambda(m-k)), the Eq. 1 upper bound,
    the Monte Carlo mean, its standard error and ``z = (MC - exact) / s.e.``."""
    rows = []
    for N, C, p, q, lam, method in cases:
        m, k = latency_counts(N, C, p, q)
        est = simulate_latency(N, C, p, q, lam, rng, trials, method=method)
        exact = expected_latency(N, C, p, q, lam)
        rows.append({
            "N": N, "C": C, "p": p, "q": q, "lambda": lam, "m": m, "k": k,
            "lower": latency_lower_bound(N, C, p, q, lam), "exact": exact,
            "upper_tight": latency_upper_bound_tight(N, C, p, q, lam),
            "upper": latency_upper_bound(N, C, lam),
            "mc_mean": est.mean, "mc_stderr": est.stderr, "trials": est.trials,
            "z": (est.mean - exact) / est.stderr if est.stderr > 0 else 0.0,
            "method": method,
        })
    return rows
