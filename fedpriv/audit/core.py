"""The audit's population, engine runs (correct and deliberately broken) and statistics
(see :mod:`fedpriv.audit`)."""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.audit.epsilon import AuditError, bootstrap_interval, estimate_epsilon, null_epsilon
from fedpriv.dp import accounting
from fedpriv.dp.keys import tagged_key
from fedpriv.fl import algorithms, samplers as samplers_lib
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

# Resource limits of one audit run, checked before anything is allocated (the presets use
# T <= 100, d = 1e4, <= 10K clients). The statistics take the thin SVD of the T x d update
# matrix (~d T^2 flops: 2,000 rounds at d = 1e4 is ~4e10) and hold T x d and (clients +
# canaries + held out) x d float32 arrays: at most MAX_AUDIT_ELEMENTS entries each (1 GB).
MAX_AUDIT_ROUNDS = 2000
MAX_AUDIT_DIM = 10**6
MAX_AUDIT_CLIENTS = 10**6       # each of clients, canaries, held-out directions
MAX_AUDIT_ELEMENTS = 250_000_000
MAX_AUDIT_SEED = 2**32 - 1      # NumPy seeds and JAX keys
MAX_AUDIT_NOISE = 1e6           # fedpriv.dp.accounting.MAX_NOISE_MULTIPLIER
MAX_AUDIT_NORM = 1e6            # clip / canary norm: x 1e6 (the no-clip variant) stays in float32


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
        if not (math.isfinite(self.noise_multiplier) and 0 < self.noise_multiplier <= MAX_AUDIT_NOISE):
            raise AuditError(f"noise multiplier must be a finite number in (0, {MAX_AUDIT_NOISE:g}], "
                             f"got {self.noise_multiplier}")
        for name, flag, lo, hi in (("rounds", "rounds", 1, MAX_AUDIT_ROUNDS),
                                   ("dim", "dim", 16, MAX_AUDIT_DIM),
                                   ("num_real", "clients", 1, MAX_AUDIT_CLIENTS),
                                   ("num_canaries", "canaries", 100, MAX_AUDIT_CLIENTS),
                                   ("num_heldout", "heldout", 200, MAX_AUDIT_CLIENTS),
                                   ("seed", "seed", 0, MAX_AUDIT_SEED)):
            v = getattr(self, name)
            label = name if name == flag else f"{name} (--{flag})"
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or int(v) != v or v < lo:
                raise AuditError(f"{label} must be an integer >= {lo}, got {v}")
            if v > hi:
                raise AuditError(f"{label} = {v:,} exceeds its limit {hi:,}")
        for what, n in (("rounds x dim", self.rounds * self.dim),
                        ("(clients + canaries + held out) x dim",
                         (self.num_real + self.num_canaries + self.num_heldout) * self.dim)):
            if n > MAX_AUDIT_ELEMENTS:
                raise AuditError(f"{what} = {n:,} exceeds the limit of {MAX_AUDIT_ELEMENTS:,} float32 "
                                 "entries (1 GB) per array: lower --rounds/--dim/--clients")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise AuditError(f"clip norm must be a finite number > 0, got {self.clip_norm}")
        if not (math.isfinite(self.canary_norm) and self.canary_norm > 1):
            raise AuditError(f"canary norm must be > 1 (in units of C) so canaries are clipped, "
                             f"got {self.canary_norm}")
        for label, v in (("clip norm", self.clip_norm), ("canary norm", self.canary_norm)):
            if v > MAX_AUDIT_NORM:
                raise AuditError(f"{label} = {v:g} exceeds its limit {MAX_AUDIT_NORM:g}")
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



# ----------------------------------------------------------------------------- audit
def accountant_epsilon(claimed: algorithms.DPConfig, sampler, rounds: int, delta: float):
    event = algorithms.privacy_event(claimed, sampler, rounds)
    return accounting.compute_epsilon(event, delta, algorithms.neighboring_for(sampler))


def audit_verdict(brk: str, above: bool, significant: bool, eps_null: float, eps_acc: float) -> str:
    """The verdict of one row. The audit cannot tell apart anything below its resolution (the
    null estimate between two sets of held-out directions): when that is not below the
    accountant's epsilon, neither "consistent" nor "detected" is supported -- inconclusive
    (BUILD.md), whether the estimate is above or below the accountant's epsilon."""
    if eps_null >= eps_acc:
        return (f"inconclusive (the audit's resolution, null estimate {eps_null:.2f}, "
                f"is not below the accountant's epsilon {eps_acc:.2f})")
    if not above:
        return "consistent (below accountant)" if brk == "none" else "not detected"
    if not significant:
        return "above accountant, not significant (bootstrap 5% bound below it)"
    return ("VIOLATION (unexpected: correct mechanism)" if brk == "none"
            else "DETECTED (above accountant)")


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
    verdict = audit_verdict(brk, above, significant, eps_null, eps_acc)
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


