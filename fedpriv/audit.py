"""Empirical privacy audit of the FL engine with canary clients (one-shot estimation).

Method: G. Andrew, P. Kairouz, S. Oh, A. Oprea, H. B. McMahan, V. M. Suriyakumar, "One-shot
Empirical Privacy Estimation for Federated Learning", ICLR 2024 (arXiv:2302.03098).

``python -m fedpriv audit`` runs the *real* engine (``fedpriv.fl.algorithms.dp_fedavg`` /
``dp_ftrl`` -> ``init`` / ``apply`` on cohorts from ``fedpriv.fl.cohort.build_cohort``, drawn by
the real samplers) on a population that contains ``k`` canary clients, and compares an
empirical epsilon with the accountant's epsilon of the same run (``privacy_event`` of the
claimed ``DPConfig`` and sampler).

Canaries. The model is a vector ``w in R^d`` with the linear loss ``-sum_b mask_b <x_b, w>``;
with one local SGD step of learning rate 1 a client's delta is exactly its vector ``x``.
Canary ``i`` holds ``x = a C u_i`` with ``u_i`` a uniformly random unit direction and
``a > 1`` (``canary_norm``), so after clipping its update is exactly ``C u_i``. Real clients
hold random vectors of norm in ``[0.25 C, 1.5 C]``. ``k'`` further random directions
``v_j`` are never inserted (held out). In high dimension (``d ~ 1e4``) all directions are
nearly orthogonal.

Statistics (one per threat model, each computed for the k inserted and the k' held-out
directions):

* ``final`` (the paper's final-model statistic): ``cos(theta_T - theta_0, u)``.
* ``iterates`` (all iterates released, participation unknown; our extension): with
  ``A in R^{T x d}`` the per-round model deltas, ``E = d * ||P_A u||^2``, d times the squared
  norm of the direction's projection on the span of the released updates (``= s^T Sigma^-1 s``
  with ``s = A u`` and ``Sigma = A A^T / d`` the across-round covariance estimated from all
  coordinates). It is invariant to any linear mixing of rounds, so it sees through
  correlated noise (tree aggregation, or noise repeated every round); for a held-out
  direction ``E ~ chi^2_T`` whatever the mechanism. The statistic is ``(E / T)^(1/3)``
  (Wilson-Hilferty), which is close to Gaussian as the fit assumes (the raw chi^2 is skewed
  and its inflated variance alone inflates the estimate).
* ``known`` (all iterates, the canary's rounds known; our extension, only for samplers
  whose accounting does not rely on secret participation, i.e. ``ShuffledPassSampler``):
  the generalised-least-squares score ``b^T Sigma^-1 s / sqrt(b^T Sigma^-1 b)`` with ``b``
  the canary's participation pattern (over the canaries that took part); a held-out
  direction gets the pattern of a participating real client (same sampler), so its score is
  ``~ N(0, 1)``.

Estimate. As in the paper, a Gaussian is fitted to each of the two samples and the
estimate is the epsilon, at the run's delta, of the mechanism that outputs one draw of
``N(mu_out, s_out^2)`` or ``N(mu_in, s_in^2)`` (both orders; unequal variances handled
exactly: ``delta(eps) = P(L > eps) - e^eps Q(L > eps)`` with the quadratic log-likelihood
ratio ``L``). The reported lower bound is the largest of the statistics' estimates. A 90%
percentile bootstrap over canaries and held-out directions gives its finite-sample spread; the
verdict calls a run above the accountant *significant* only when the interval's lower end is
above the accountant's epsilon (a point estimate alone above it is reported as not significant),
and *inconclusive* when the audit's resolution (the same estimate between two disjoint sets of
held-out directions) is not below the accountant's epsilon.

What the number is: an *estimate* of a lower bound on the epsilon of the run, valid under the
one-shot method's assumptions (the statistics are close to Gaussian; canaries are
representative worst-case clients; the bootstrap covers only the finite-sample error of the
fitted means and variances; taking the largest of 2-3 statistics adds a little selection bias).
It is not a proof of anything: an estimate below the accountant's epsilon does not prove the
implementation private, and an estimate above it is strong evidence of a bug, not a proof.

Deliberately broken variants (built here from engine components; the engine is not edited),
each run while the accountant is still given the *claimed* configuration:

* ``half-noise``: the engine adds noise ``z/2`` while the event claims ``z``;
* ``no-clip``: the engine clips at ``1e6 C`` (i.e. not at all) with the noise std of ``z C``;
* ``reused-key``: the noise state is reset to its initial value before every round, so the
  same noise (same key) is added every round;
* ``twice-per-epoch`` (DP-FTRL only): a ``ShuffledPassSampler`` subclass that gives every
  cohort of an epoch two consecutive rounds, so each sampled client is in two leaves of
  the same tree, while the event claims one participation per epoch.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy.special import log_ndtr
from scipy.optimize import brentq

from fedpriv.dp import accounting
from fedpriv.dp.keys import tagged_key
from fedpriv.fl import algorithms
from fedpriv.fl import samplers as samplers_lib
from fedpriv.fl.cohort import build_cohort

MECHANISMS = ("dp-fedavg", "dp-ftrl")
BREAKS = ("none", "half-noise", "no-clip", "reused-key", "twice-per-epoch")
BREAK_LABELS = {
    "none": "correct",
    "half-noise": "BROKEN: noise std z/2, event claims z",
    "no-clip": "BROKEN: clipping skipped, event claims C",
    "reused-key": "BROKEN: same noise key every round",
    "twice-per-epoch": "BROKEN: each client sampled twice per epoch",
}
_UNCLIPPED = 1e6  # clip norm (in units of C) of the no-clip variant: nothing is ever clipped


class AuditError(ValueError):
    """A bad audit setting (the CLI prints it on one line and exits with status 2)."""


# ----------------------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """One audit run.

    Attributes:
      mechanism: "dp-fedavg" (Gaussian noise, Poisson sampling) or "dp-ftrl" (tree noise,
        shuffled passes, the tree restarting every epoch).
      noise_multiplier: z claimed (and, unless broken, used).
      rounds: T.
      dim: model dimension d.
      num_real: real (non-canary) clients.
      num_canaries: k inserted canary clients (members of the population).
      num_heldout: k' held-out directions (never inserted).
      sampling_rate: Poisson q (dp-fedavg).
      cohort_size: m per round (dp-ftrl); rounds per epoch = (num_real + k) // m.
      clip_norm: C.
      canary_norm: a canary's raw update norm, in units of C (> 1: clipped to C).
      delta: the run's delta (accountant and estimate).
      seed: one seed for data, canaries, sampler and noise.
    """
    mechanism: str
    noise_multiplier: float
    rounds: int
    dim: int = 10000
    num_real: int = 1000
    num_canaries: int = 1000
    num_heldout: int = 2000
    sampling_rate: float | None = None
    cohort_size: int | None = None
    clip_norm: float = 1.0
    canary_norm: float = 4.0
    delta: float = 1e-5
    seed: int = 0

    def __post_init__(self):
        if self.mechanism not in MECHANISMS:
            raise AuditError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {self.mechanism!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise AuditError(f"noise multiplier must be a finite number > 0, got {self.noise_multiplier}")
        for name, flag, lo in (("rounds", "rounds", 1), ("dim", "dim", 16), ("num_real", "clients", 1),
                               ("num_canaries", "canaries", 100), ("num_heldout", "heldout", 200)):
            v = getattr(self, name)
            if int(v) != v or v < lo:
                label = name if name == flag else f"{name} (--{flag})"
                raise AuditError(f"{label} must be an integer >= {lo}, got {v}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise AuditError(f"clip norm must be a finite number > 0, got {self.clip_norm}")
        if not (math.isfinite(self.canary_norm) and self.canary_norm > 1):
            raise AuditError(f"canary norm must be > 1 (in units of C) so canaries are clipped, "
                             f"got {self.canary_norm}")
        if not (0 < self.delta < 1):
            raise AuditError(f"delta must be in (0, 1), got {self.delta}")
        if self.mechanism == "dp-fedavg":
            if self.sampling_rate is None or not 0 < self.sampling_rate <= 1:
                raise AuditError(f"dp-fedavg needs a sampling rate in (0, 1], got {self.sampling_rate}")
        else:
            n = self.num_real + self.num_canaries
            if self.cohort_size is None or int(self.cohort_size) != self.cohort_size \
                    or not 1 <= self.cohort_size <= n:
                raise AuditError(f"dp-ftrl needs a cohort size in [1, population={n}], "
                                 f"got {self.cohort_size}")

    @property
    def population(self) -> int:
        return self.num_real + self.num_canaries


# Settings at which every break is detected (see BUILD.md and tests/test_audit.py).
# DP-FedAvg: 2,000 clients (1,000 canaries), Poisson q = 0.05 (~100 per round), 100 rounds, z = 0.8.
# DP-FTRL: 4,096 clients (2,000 canaries, 4,000 held out), cohorts of 128, so one epoch = one
# tree of 32 rounds (more canaries than DP-FedAvg: its margin below the accountant is smaller).
PRESETS = {
    "dp-fedavg": dict(mechanism="dp-fedavg", noise_multiplier=0.8, rounds=100, sampling_rate=0.05),
    "dp-ftrl": dict(mechanism="dp-ftrl", noise_multiplier=2.0, rounds=32, cohort_size=128,
                    num_real=2096, num_canaries=2000, num_heldout=4000),
}
DEFAULT_BREAKS = {
    "dp-fedavg": ("none", "half-noise", "no-clip", "reused-key"),
    "dp-ftrl": ("none", "half-noise", "no-clip", "reused-key", "twice-per-epoch"),
}


# ----------------------------------------------------------------------------- population
_CHUNK = 256  # directions are generated in blocks of this many rows (one RNG stream per block)


def directions(seed: int, kind: int, start: int, stop: int, d: int) -> np.ndarray:
    """Unit directions ``start..stop-1`` of ``kind`` (0 real client, 1 canary, 2 held out):
    ``float32[stop - start, d]``; row i is the same whichever slice it is generated in."""
    out = []
    for block in range(start // _CHUNK, -(-stop // _CHUNK)):
        rng = np.random.default_rng([int(seed), 7_001, int(kind), block])
        v = rng.standard_normal((_CHUNK, d), dtype=np.float32)
        lo, hi = max(start - block * _CHUNK, 0), min(stop - block * _CHUNK, _CHUNK)
        out.append(v[lo:hi])
    v = np.concatenate(out) if out else np.zeros((0, d), np.float32)
    return v / np.sqrt(np.einsum("ij,ij->i", v, v, dtype=np.float64))[:, None].astype(np.float32)


class CanaryPopulation(Mapping):
    """Client id -> ``{'x': float32[1, d]}``: ids ``< num_real`` are real clients (random
    directions, norms uniform in ``[0.25 C, 1.5 C]``), the rest canaries
    (``x = canary_norm * C * u_i``)."""

    def __init__(self, s: AuditSettings):
        self.s = s
        norms = np.random.default_rng([s.seed, 7_002]).uniform(0.25, 1.5, s.num_real)
        self.real = directions(s.seed, 0, 0, s.num_real, s.dim) * (norms * s.clip_norm).astype(np.float32)[:, None]
        self.canary = directions(s.seed, 1, 0, s.num_canaries, s.dim) * np.float32(s.canary_norm * s.clip_norm)

    def __len__(self):
        return self.s.population

    def __iter__(self):
        return iter(range(self.s.population))

    def __getitem__(self, cid):
        s, cid = self.s, int(cid)
        if not 0 <= cid < s.population:
            raise KeyError(cid)
        x = self.real[cid] if cid < s.num_real else self.canary[cid - s.num_real]
        return {"x": x[None, :]}


def linear_loss(params, batch, rng):
    """``-sum_b mask_b <x_b, w>``: one SGD step of learning rate 1 gives delta = sum of x."""
    del rng
    score = jnp.sum(batch["x"] * params["w"][None, :], axis=-1) * batch["mask"]
    return -jnp.sum(score), {"num_examples": jnp.sum(batch["mask"])}


# ----------------------------------------------------------------------------- broken parts
@dataclasses.dataclass(frozen=True)
class TwicePerEpochSampler(samplers_lib.ShuffledPassSampler):
    """DELIBERATELY BROKEN (audit only): claims to be a shuffled pass (one participation per
    epoch) but rounds ``2j`` and ``2j+1`` of an epoch get the same cohort, so every sampled
    client is in two leaves of one tree (half of the population never participates)."""

    def sample(self, round_idx: int) -> np.ndarray:
        epoch, pos = divmod(round_idx, self.rounds_per_epoch)
        return super().sample(epoch * self.rounds_per_epoch + pos // 2)


def _sampler(s: AuditSettings, brk: str):
    if s.mechanism == "dp-fedavg":
        return samplers_lib.PoissonSampler(s.population, s.sampling_rate, seed=s.seed)
    cls = TwicePerEpochSampler if brk == "twice-per-epoch" else samplers_lib.ShuffledPassSampler
    return cls(s.population, int(s.cohort_size), seed=s.seed)


def _build(s: AuditSettings, brk: str, sampler):
    """(claimed DPConfig, engine algorithm, per-round state hook) for variant ``brk``."""
    z, c = s.noise_multiplier, s.clip_norm
    expected = sampler.expected_cohort_size
    build = dict(loss_fn=linear_loss, client_optimizer=optax.sgd(1.0),
                 server_opt=algorithms.server_optimizer("sgd", 1.0), expected_cohort_size=expected)
    if s.mechanism == "dp-ftrl":
        build["rounds_per_epoch"] = sampler.rounds_per_epoch
    make = algorithms.dp_ftrl if s.mechanism == "dp-ftrl" else algorithms.dp_fedavg
    claimed = make(**build, clip_norm=c, noise_multiplier=z, jit=False).dp
    if brk == "half-noise":        # BROKEN: half the noise
        algo = make(**build, clip_norm=c, noise_multiplier=z / 2)
    elif brk == "no-clip":         # BROKEN: clip at 1e6 C (never), noise std still z C
        algo = make(**build, clip_norm=c * _UNCLIPPED, noise_multiplier=z / _UNCLIPPED)
    else:
        algo = make(**build, clip_norm=c, noise_multiplier=z)
    hook = None
    if brk == "reused-key":        # BROKEN: the noise state (its key) is reset every round
        def hook(state, initial):
            return state.replace(noise_state=initial.noise_state)
    return claimed, algo, hook


# ----------------------------------------------------------------------------- engine run
def run_engine(s: AuditSettings, brk: str = "none"):
    """Run ``s.rounds`` rounds of the real engine (variant ``brk``).

    Returns ``(A, theta0, participation, claimed_dp, sampler)``: ``A: float32[T, d]`` the
    per-round model deltas, ``participation: int8[N, T]`` (client, round) counts.
    """
    if brk not in BREAKS:
        raise AuditError(f"unknown variant {brk!r}; choose from {', '.join(BREAKS)}")
    if brk == "twice-per-epoch" and s.mechanism != "dp-ftrl":
        raise AuditError("the twice-per-epoch variant breaks DP-FTRL's one-participation-per-epoch "
                         "rule; use it with --mechanism dp-ftrl")
    sampler = _sampler(s, brk)
    if brk == "twice-per-epoch" and sampler.rounds_per_epoch % 2:
        raise AuditError(f"twice-per-epoch needs an even number of rounds per epoch, "
                         f"got {sampler.rounds_per_epoch}")
    claimed, algo, hook = _build(s, brk, sampler)
    data = CanaryPopulation(s)
    key = tagged_key(s.seed, "audit", s.mechanism, "engine")
    k_init, k_rounds = jax.random.split(key)
    params = {"w": jnp.zeros((s.dim,), jnp.float32)}
    state = algo.init(params, k_init)
    initial = state
    capacity = int(sampler.max_cohort_size)
    A = np.zeros((s.rounds, s.dim), np.float32)
    part = np.zeros((s.population, s.rounds), np.int8)
    prev = np.asarray(state.params["w"])
    theta0 = prev.copy()
    for r in range(s.rounds):
        ids = sampler.sample(r)
        part[ids, r] += 1
        if hook is not None:
            state = hook(state, initial)
        if len(ids):  # build_cohort refuses an empty cohort (possible with Poisson sampling)
            cohort = build_cohort(data, list(ids), batch_size=1, capacity=capacity)
            batches, cmask = cohort.batches, cohort.client_mask
        else:
            batches = {"x": np.zeros((capacity, 1, 1, s.dim), np.float32),
                       "mask": np.zeros((capacity, 1, 1), np.float32)}
            cmask = np.zeros((capacity,), np.float32)
        state, _ = algo.apply(state, batches, cmask, jax.random.fold_in(k_rounds, r))
        cur = np.asarray(state.params["w"])
        A[r] = cur - prev
        prev = cur
    return A, theta0, part, claimed, sampler


# ----------------------------------------------------------------------------- statistics
def _direction_blocks(s: AuditSettings, kind: int, count: int):
    for start in range(0, count, _CHUNK):
        yield start, directions(s.seed, kind, start, min(count, start + _CHUNK), s.dim)


def canary_statistics(s: AuditSettings, A: np.ndarray, part: np.ndarray, known: bool) -> dict:
    """Per-direction statistics ``{name: (inserted[k], heldout[k'])}`` (module docstring).

    With the thin SVD ``A^T = U S V^T`` (rank r), ``p = U^T u`` and ``w = S^-1 V^T b``:
    ``iterates = (d ||p||^2 / r)^(1/3)`` and ``known = sqrt(d) <w, p> / ||w||``
    (pseudo-inverse GLS).
    """
    T, d = A.shape
    final = A.sum(axis=0, dtype=np.float64)
    final_n = max(np.linalg.norm(final), 1e-30)
    U_a, S_a, Vt_a = np.linalg.svd(A.T.astype(np.float64), full_matrices=False)
    keep = S_a > 1e-7 * max(S_a.max(initial=0.0), 1e-30)
    U_a, S_a, Vt_a = U_a[:, keep], S_a[keep], Vt_a[keep]
    out = {"final": ([], []), "iterates": ([], [])}
    if known:
        out["known"] = ([], [])
        active = np.flatnonzero(part[:s.num_real].sum(axis=1) > 0)
        if len(active) == 0:
            raise AuditError("no real client participated: no participation patterns to pair "
                             "with the held-out directions")
        real_pick = active[np.random.default_rng([s.seed, 7_003]).integers(0, len(active), s.num_heldout)]
    for slot, kind, count in ((0, 1, s.num_canaries), (1, 2, s.num_heldout)):
        for start, U in _direction_blocks(s, kind, count):
            U = U.astype(np.float64)
            out["final"][slot].append(U @ final / final_n)
            p = U @ U_a                                   # [n, r]
            # Wilson-Hilferty: the cube root of a chi^2-like energy is close to Gaussian
            out["iterates"][slot].append(np.cbrt(d * np.sum(p ** 2, axis=1) / len(S_a)))
            if known:
                rows = (np.arange(start, start + len(U)) + s.num_real if slot == 0
                        else real_pick[start:start + len(U)])
                w = (part[rows].astype(np.float64) @ Vt_a.T) / S_a      # [n, r]
                wn = np.linalg.norm(w, axis=1)
                g = np.sqrt(d) * np.sum(w * p, axis=1) / np.where(wn > 0, wn, 1.0)
                out["known"][slot].append(g[wn > 0])  # canaries that never took part: no pattern
    return {k: (np.concatenate(v[0]), np.concatenate(v[1])) for k, v in out.items()}


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


# ----------------------------------------------------------------------------- audit
def accountant_epsilon(claimed: algorithms.DPConfig, sampler, rounds: int, delta: float):
    event = algorithms.privacy_event(claimed, sampler, rounds)
    return accounting.compute_epsilon(event, delta, algorithms.neighboring_for(sampler))


def run_audit(s: AuditSettings, brk: str = "none") -> dict:
    """One row of the audit table: the accountant's and the empirical epsilon of variant ``brk``."""
    t0 = time.time()
    A, _, part, claimed, sampler = run_engine(s, brk)
    eps_acc, acc_name = accountant_epsilon(claimed, sampler, s.rounds, s.delta)
    known = isinstance(sampler, samplers_lib.ShuffledPassSampler)
    stats = canary_statistics(s, A, part, known)
    est = {name: estimate_epsilon(ins, out, s.delta) for name, (ins, out) in stats.items()}
    eps_emp = max(e["epsilon"] for e in est.values())
    ci_low, ci_high = bootstrap_interval(stats, s.delta, s.seed)
    eps_null = null_epsilon(stats, s.delta, s.seed)
    above, significant = eps_emp > eps_acc, ci_low > eps_acc and eps_null < eps_acc
    if not above:
        verdict = "consistent (below accountant)" if brk == "none" else "not detected"
    elif eps_null >= eps_acc:
        verdict = (f"inconclusive (the audit's resolution, null estimate {eps_null:.2f}, "
                   f"is not below the accountant's epsilon)")
    elif not significant:
        verdict = "above accountant, not significant (bootstrap 5% bound below it)"
    else:
        verdict = ("VIOLATION (unexpected: correct mechanism)" if brk == "none"
                   else "DETECTED (above accountant)")
    canary_part = part[s.num_real:].sum(axis=1)
    return {
        "mechanism": s.mechanism, "variant": brk, "label": BREAK_LABELS[brk],
        "accountant_epsilon": eps_acc, "accountant": acc_name,
        "empirical_epsilon": eps_emp,
        "empirical_by_statistic": {k: v["epsilon"] for k, v in est.items()},
        "empirical_interval_90": [ci_low, ci_high], "null_epsilon": eps_null,
        "fits": est, "verdict": verdict, "exceeds_accountant": above,
        "exceeds_significantly": significant,
        "delta": s.delta, "noise_multiplier_claimed": s.noise_multiplier, "rounds": s.rounds,
        "canary_participations_mean": float(canary_part.mean()),
        "seconds": round(time.time() - t0, 2),
        "settings": dataclasses.asdict(s),
    }


# ----------------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return ">=500" if x >= 500 else f"{x:.2f}"


def markdown_table(rows: list[dict]) -> str:
    lines = ["| mechanism | variant | accountant ε | empirical ε lower bound (estimate) | "
             "90% bootstrap | null ε | final / iterates / known | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        by = r["empirical_by_statistic"]
        parts = " / ".join(_fmt(by[k]) if k in by else "–" for k in ("final", "iterates", "known"))
        lo, hi = r["empirical_interval_90"]
        lines.append(f"| {r['mechanism']} | {r['label']} | {r['accountant_epsilon']:.2f} "
                     f"({r['accountant']}) | {_fmt(r['empirical_epsilon'])} | {_fmt(lo)}–{_fmt(hi)} "
                     f"| {_fmt(r['null_epsilon'])} | {parts} | {r['verdict']} |")
    return "\n".join(lines)


def report_markdown(rows: list[dict], command: str) -> str:
    s0 = rows[0]
    head = [
        "# Empirical privacy audit (one-shot estimation, Andrew et al., ICLR 2024)",
        "",
        f"Command: `{command}`",
        "",
        f"Unit of privacy: the user (client). delta = {s0['delta']:g}. The empirical epsilon is an "
        "*estimate* of a lower bound under the one-shot method's assumptions (Gaussian fits to the "
        "canary statistics), not a proof; the accountant's epsilon is the upper bound claimed for "
        "the run (its event is derived from the *claimed* configuration, also for the broken "
        "variants). Rows marked BROKEN are deliberately broken mechanisms built by the audit.",
        "",
        markdown_table(rows),
        "",
        "Statistics: final = cosine of the final model delta with the canary (the paper's final-model "
        "estimate); iterates = (d·||projection of the canary on the span of the per-round updates||² / T)^(1/3) "
        "(all iterates, participation unknown); known = GLS score with the canary's participation "
        "known (all iterates; shuffled-pass samplers only). The interval resamples canaries and "
        "held-out directions (finite-sample error only); a break counts as DETECTED when even its "
        "lower end exceeds the accountant's epsilon. null ε = the same estimate between two sets of "
        "held-out directions (the audit's resolution; nothing below it can be told apart from "
        "finite-sample error).",
        "",
        "Settings:",
        "",
    ]
    seen = set()
    for r in rows:
        st = r["settings"]
        key = json.dumps(st, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        head.append(f"- {r['mechanism']}: " + ", ".join(f"{k}={v}" for k, v in st.items() if v is not None))
    return "\n".join(head) + "\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        self.exit(2, f"error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m fedpriv audit",
                 description="Empirical privacy audit of the FL engine with canary clients "
                             "(one-shot estimation, Andrew et al. ICLR 2024).")
    ap.add_argument("--mechanism", default="all", help="dp-fedavg, dp-ftrl or all (default)")
    ap.add_argument("--variants", default="all",
                    help=f"comma list of {', '.join(BREAKS)}, or all (default; twice-per-epoch "
                         "only for dp-ftrl)")
    for flag, typ, what in (("--noise-multiplier", float, "z"), ("--rounds", int, "rounds T"),
                            ("--dim", int, "model dimension d"),
                            ("--clients", int, "real (non-canary) clients"),
                            ("--canaries", int, "inserted canary clients k"),
                            ("--heldout", int, "held-out canary directions k'"),
                            ("--sampling-rate", float, "Poisson q (dp-fedavg)"),
                            ("--cohort-size", int, "clients per round (dp-ftrl)"),
                            ("--clip-norm", float, "clip norm C"),
                            ("--canary-norm", float, "canary raw norm / C (> 1)"),
                            ("--delta", float, "delta"), ("--seed", int, "seed")):
        ap.add_argument(flag, type=typ, default=None, help=f"{what} (default: the preset)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--workdir", default=None, help="write audit.md and audit.json here")
    return ap


_FIELDS = {"noise_multiplier": "noise_multiplier", "rounds": "rounds", "dim": "dim",
           "clients": "num_real", "canaries": "num_canaries", "heldout": "num_heldout",
           "clip_norm": "clip_norm", "canary_norm": "canary_norm", "delta": "delta", "seed": "seed"}


def plan(argv=None) -> tuple[list[tuple[AuditSettings, str]], argparse.Namespace]:
    """Parse ``argv`` into the list of (settings, variant) to run; raises AuditError."""
    args = build_parser().parse_args(argv)
    mechs = list(MECHANISMS) if args.mechanism == "all" else [args.mechanism]
    if any(m not in MECHANISMS for m in mechs):
        raise AuditError(f"--mechanism must be dp-fedavg, dp-ftrl or all, got {args.mechanism!r}")
    if args.sampling_rate is not None and "dp-fedavg" not in mechs:
        raise AuditError("--sampling-rate applies to dp-fedavg (Poisson sampling) only")
    if args.cohort_size is not None and "dp-ftrl" not in mechs:
        raise AuditError("--cohort-size applies to dp-ftrl (shuffled passes) only")
    if args.variants == "all":
        wanted = list(BREAKS)
    else:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        bad = [v for v in wanted if v not in BREAKS]
        if bad or not wanted:
            raise AuditError(f"unknown variant {bad[0] if bad else args.variants!r}; "
                             f"choose from {', '.join(BREAKS)} or all")
        if "twice-per-epoch" in wanted and mechs == ["dp-fedavg"]:
            raise AuditError("twice-per-epoch breaks DP-FTRL's one participation per epoch; "
                             "use it with --mechanism dp-ftrl")
    runs = []
    for m in mechs:
        kw = dict(PRESETS[m])
        for arg, field in _FIELDS.items():
            v = getattr(args, arg)
            if v is not None:
                kw[field] = v
        if m == "dp-fedavg" and args.sampling_rate is not None:
            kw["sampling_rate"] = args.sampling_rate
        if m == "dp-ftrl" and args.cohort_size is not None:
            kw["cohort_size"] = args.cohort_size
        s = AuditSettings(**kw)
        for v in wanted:
            if v == "twice-per-epoch" and m != "dp-ftrl":
                continue
            runs.append((s, v))
    return runs, args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        runs, args = plan(argv)
        if args.workdir:
            os.makedirs(args.workdir, exist_ok=True)
        rows = [run_audit(s, v) for s, v in runs]
    except (AuditError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: cannot use --workdir {args.workdir!r}: {err.strerror}", file=sys.stderr)
        return 2
    command = " ".join(["python -m fedpriv audit", *argv])
    report = {"method": "one-shot empirical privacy estimation (Andrew et al., ICLR 2024)",
              "estimate": "lower-bound estimate under the method's assumptions, not a proof",
              "unit": "user", "command": command, "rows": rows}
    text_json = json.dumps(report, indent=1, allow_nan=False)
    md = report_markdown(rows, command)
    if args.workdir:
        try:
            os.makedirs(args.workdir, exist_ok=True)
            with open(os.path.join(args.workdir, "audit.json"), "w") as f:
                f.write(text_json + "\n")
            with open(os.path.join(args.workdir, "audit.md"), "w") as f:
                f.write(md)
        except OSError as err:
            print(f"error: cannot write to --workdir {args.workdir!r}: {err.strerror}", file=sys.stderr)
            return 2
    print(text_json if args.json else md, end="\n" if args.json else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
