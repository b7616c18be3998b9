"""FreD's private side (Hou et al. 2023, Algorithm 1): a DP release of the users' embedding
mean and covariance, and FreD = Eq. 2 between a public candidate and that release.

Hou, Zhan, Shrivastava, Wang, Livshits, Fanti, Lazar (2023), "Privately customizing
prefinetuning to better match user data in federated learning" (``papers/fred_hou2023.md``).
The Gaussian releases, their calibration, sensitivities and events are
:mod:`fedpriv.dp.moments`; this module packs the clients' embeddings, chooses the unit of
privacy and the denominator, charges the ledger and scores candidates.

Algorithm 1 (the private side), as a federated computation under secure aggregation:

1. every client embeds its sentences, clips each embedding to norm ``c`` and computes its
   contribution to the *sum*; each of the ``m`` participating clients adds a noise share
   ``N(0, tau_1^2 / m)`` per coordinate, so the securely aggregated sum carries exactly
   ``N(0, tau_1^2)`` -- the noise the Gaussian-mechanism proof needs.  (Algorithm 1 read
   literally adds ``N(0, tau_1^2)`` to every *sample* and then averages, which leaves only
   ``tau_1 / sqrt(n)`` on the mean: under-noised by ``sqrt(n)``.  We do not do that.)
   The server divides by the count: ``pmean = (sum + noise) / n``.
2. the server sends ``pmean``; clients centre their clipped embeddings on it, clip again to
   ``c_cov`` (default ``c``) and contribute ``sum b b^T``; the upper triangle (with the
   diagonal) is released the same way -- one noise draw per upper-triangle entry, shares
   summing to ``N(0, tau_2^2)`` -- mirrored to a symmetric matrix, divided by ``n`` and
   projected onto the PSD cone (eigenvalues clipped at 0, the Frobenius-nearest PSD matrix).
3. FreD = Eq. 2 between the public ``(m_1, C_1)`` and ``(pmean, pcov)``.  The release is made
   once and reused for any number of candidate public datasets (§4.2): scoring is
   post-processing and costs no privacy (``fred`` / ``rank_candidates`` never touch a ledger).

Sensitivities (L2, of the released *sums*; ``||upper(M)||_2 <= ||M||_F`` for symmetric M):

============  ==============  ===================  ============================================
unit          relation        mean sum             covariance sum (upper triangle)
============  ==============  ===================  ============================================
sample        add_remove      c                    c_cov^2   (||b b^T||_F = ||b||^2)
sample        replace_one     2c                   sqrt(2) c_cov^2
user          add_remove      c                    c_cov^2
user          replace_one     2c                   sqrt(2) c_cov^2
============  ==============  ===================  ============================================

* **Sample level** (the paper, Def. 2.1): one sentence of one client is added or removed.
  The paper's Prop. 3.1 uses ``2c/n_2`` for the *mean*, which is the replace-one sensitivity
  of the mean with ``n_2`` fixed, and ``c^2/n_2`` for the covariance (add/remove, via a
  spectral-norm argument).  Here both releases use the same relation: add/remove gives
  ``(c, c^2)``, replace-one ``(2c, sqrt(2) c^2)`` -- replacing ``b`` by ``b'`` moves
  ``b b^T`` by ``||b b^T - b' b'^T||_F^2 = ||b||^4 + ||b'||^4 - 2 (b.b')^2 <= 2 c^4``.
* **User level** (docs/design.md §3): a user's whole contribution is bounded.  User
  ``u`` keeps at most ``max_samples_per_user`` sentences (first ones, if set), clips each and
  contributes the *average* ``v_u = (1/k_u) sum_j clip_c(e_uj)`` (norm <= c) to the mean sum
  and ``A_u = (1/k_u) sum_j b_uj b_uj^T`` (PSD, ``||A_u||_F <= Tr A_u <= c_cov^2``) to the
  covariance sum; ``n`` is then the number of users.  Replace-one: ``||A - A'||_F^2 =
  ||A||^2 + ||A'||^2 - 2<A, A'> <= 2 c_cov^4`` since ``<A, A'> >= 0`` for PSD matrices.
  The estimated distribution is the user-weighted mixture (pick a user uniformly, then one of
  their sentences), not the sentence-weighted one of the sample-level release.

The count ``n`` (the mean's and covariance's normalisation) -- fail closed:

* **replace-one**: neighbouring datasets have the same ``n``, so the exact count is public and
  dividing by it is post-processing of the two DP sums (the paper's Prop. 3.1: "n_2 known",
  mean sensitivity ``2c/n_2``).  ``PrivateStats.count_public = True``.
* **add/remove**: neighbouring datasets differ in ``n`` by one, so the exact count is private.
  Dividing the noisy sum by it would not be post-processing: ``(S + N(0, tau^2)) / n`` has a
  variance that differs between neighbours, which the Gaussian mechanism's proof (and the
  ledger's two events) does not cover -- and the release would disclose ``n``.  Marking ``n``
  "non-private" would not help, since the released mean itself is a function of it.  The
  caller must therefore declare ``n_public``: a data-independent denominator (the population
  size the experiment declares, e.g. from the config and the corpus' published size), and the
  server divides by that -- the fixed-denominator estimator of DP-FedAvg (McMahan et al.
  2018).  It costs no privacy (the ledger charges exactly the two Gaussian releases); if the
  real count differs from the declared one the estimate is scaled by ``n / n_public`` (biased,
  never less private).  Without ``n_public`` an add/remove release is refused.  The exact count
  is then not part of the release: ``PrivateStats.n`` is the declared denominator.

(A noisy count -- a third Gaussian release charged with the other two -- would also be
accepted by a reviewer; it was not chosen because it changes the release's event and so every
stored FreD run's epsilon, while every FreD experiment here has a declared population.)
Shapes and counts (metadata) are checked before the ledger is charged; the *values* (NaN/inf)
are checked after, so a bad release still costs its budget.

Noise calibration (:mod:`fedpriv.dp.moments`): ``tau = sigma(eps, delta) * sensitivity`` with
``sigma`` from the analytic Gaussian mechanism (Balle & Wang 2018), exact for every ``eps > 0``;
the classic ``sqrt(2 ln(1.25/delta)) / eps`` of Prop. 3.1 only for ``eps < 1``.  Each release is
(eps, delta)-DP; both together are (2 eps, 2 delta)-DP by basic composition (Prop. 3.1), and
the RDP / PLD accountants of :mod:`fedpriv.dp.accounting` composing the two
``GaussianDpEvent(noise_multiplier = tau / sensitivity)`` events give a tighter epsilon at
``2 delta``; ``PrivateStats`` reports all three.

The per-client math (clip, centre, per-client sums, noise shares) is
``moments.secure_sum_mean`` / ``secure_sum_cov``, vmapped over a padded set of client chunks
(:func:`pack_clients`: masked samples, masked padding chunks, ``C`` and ``S`` powers of two).
Large clients are split into several fixed-size chunks that share one noise share.  NumPy
float64 does the rest.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.dp import moments
from fedpriv.dp.keys import tagged_key
from fedpriv.fred.distance import GaussianStats, check_embeddings, frechet_distance, gaussian_stats, project_psd
from fedpriv.util import check_positive, next_pow2

UNITS = ("sample", "user")
RELATIONS = moments.RELATIONS
CALIBRATIONS = moments.CALIBRATIONS


def sensitivities(clip: float, cov_clip: float, unit: str, relation: str) -> tuple[float, float]:
    """L2 sensitivities ``(mean_sum, cov_sum_upper_triangle)`` (table in the module doc).

    ``unit`` does not change them: a sample (sample level) and a user's average (user level)
    are both bounded by ``c`` (and ``c_cov^2`` for the second moment).
    """
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    return moments.moment_sensitivities(clip, cov_clip, relation)


@dataclasses.dataclass(frozen=True)
class PackedClients:
    """Clients padded into fixed-size chunks for the vmapped per-client math.

    emb ``[C, S, d]`` float32, mask ``[C, S]``, weight ``[C]``, client_id ``[C]``,
    share ``[C]`` (one 1.0 per real client); ``C`` and ``S`` are bucketed (powers of two) so
    jit compiles few shapes.  ``num_clients`` = m (non-empty clients), ``count`` = n (samples
    used at sample level, users at user level).
    """

    emb: np.ndarray
    mask: np.ndarray
    weight: np.ndarray
    client_id: np.ndarray
    share: np.ndarray
    num_clients: int
    count: int
    samples_used: int

    @property
    def dim(self) -> int:
        return int(self.emb.shape[-1])


def _client_shapes(client_embeddings) -> tuple[list, int]:
    """Metadata only: each client's array, and the common dimension (no values read)."""
    if isinstance(client_embeddings, np.ndarray) or not isinstance(client_embeddings, Sequence):
        raise TypeError("client_embeddings must be a list with one [n_i, d] array per client")
    arrays, dims = [], set()
    for i, e in enumerate(client_embeddings):
        a = e if hasattr(e, "shape") else np.asarray(e)
        if len(a.shape) != 2:
            raise ValueError(f"client {i}: embeddings must be [n_i, d], got shape {a.shape}")
        arrays.append(a)
        if a.shape[0] > 0:
            dims.add(int(a.shape[1]))
    if len(dims) > 1:
        raise ValueError(f"clients have different embedding dimensions: {sorted(dims)}")
    if not dims:
        raise ValueError("no client has any embedding")
    return arrays, dims.pop()


def pack_clients(
    client_embeddings: Sequence[np.ndarray],
    unit: str,
    max_samples_per_user: int | None = None,
    chunk_size: int = 256,
) -> PackedClients:
    """Pad a list of per-client ``[n_i, d]`` arrays into chunks (see :class:`PackedClients`).

    Empty clients are skipped.  At user level a client keeps its first
    ``max_samples_per_user`` rows (all if None) and every chunk of it gets weight ``1/k_u``.
    """
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    if max_samples_per_user is not None and max_samples_per_user < 1:
        raise ValueError(f"max_samples_per_user must be >= 1, got {max_samples_per_user}")
    arrays, d = _client_shapes(client_embeddings)
    if unit == "user" and max_samples_per_user is not None:
        arrays = [a[:max_samples_per_user] for a in arrays]
    arrays = [a for a in arrays if a.shape[0] > 0]
    largest = max(a.shape[0] for a in arrays)
    s = min(next_pow2(max(largest, 8)), next_pow2(chunk_size))
    pieces = []  # (client index, array slice, weight, first?)
    for i, a in enumerate(arrays):
        w = 1.0 if unit == "sample" else 1.0 / a.shape[0]
        for j, start in enumerate(range(0, a.shape[0], s)):
            pieces.append((i, a[start : start + s], w, j == 0))
    c = moments.GROUP * next_pow2(-(-len(pieces) // moments.GROUP))
    emb = np.zeros((c, s, d), np.float32)
    mask = np.zeros((c, s), np.float32)
    weight = np.zeros((c,), np.float32)
    cid = np.zeros((c,), np.int32)
    share = np.zeros((c,), np.float32)
    for r, (i, a, w, first) in enumerate(pieces):
        emb[r, : a.shape[0]] = np.asarray(a, np.float32)
        mask[r, : a.shape[0]] = 1.0
        weight[r] = w
        cid[r] = i
        share[r] = 1.0 if first else 0.0
    used = int(sum(a.shape[0] for a in arrays))
    return PackedClients(
        emb=emb,
        mask=mask,
        weight=weight,
        client_id=cid,
        share=share,
        num_clients=len(arrays),
        count=used if unit == "sample" else len(arrays),
        samples_used=used,
    )


# ============================================================================================
# The release (Algorithm 1) and its reuse
# ============================================================================================


@dataclasses.dataclass(frozen=True)
class PrivateStats:
    """The DP release of Algorithm 1: private mean ``[d]`` and PSD covariance ``[d, d]``.

    Released once, reused for any number of candidates (:func:`fred`, :func:`rank_candidates`).

    Attributes:
      mean, cov: float64 ``pmean_2`` and PSD-projected ``pcov_2``; cov_raw: before projection.
      n: the denominator of the release: the exact count (samples at sample level, users at
        user level) under replace-one, where it is public; the declared ``n_public`` under
        add/remove, where the exact count is private and not released (module doc);
        n_divisor: the same as a float; count_public: True iff ``n`` is the exact count.
      epsilon, delta: per release (each of the two releases is (epsilon, delta)-DP).
      unit: "sample" or "user"; relation: "add_remove" or "replace_one".
      clip, cov_clip: clip norms; calibration: "analytic" or "classic".
      noise_multiplier: ``sigma`` = noise std / L2 sensitivity (same for both releases);
      mean_noise_std, cov_noise_std: std of the noise on the aggregated sums (``tau_1, tau_2``);
      mean_sensitivity, cov_sensitivity: L2 sensitivities of the sums.
      events: the two ``GaussianDpEvent``s (mean, covariance) charged to the ledger.
      epsilon_basic, delta_total: (2 eps, 2 delta) basic composition (Prop. 3.1).
      epsilon_rdp, epsilon_pld: epsilon at ``delta_total`` from the RDP / PLD accountants.
      num_clients: participating clients m; samples_used: embeddings read. Both are exact
        counts of private data (``nonprivate``, for the caller's diagnostics): no output of
        the FreD experiments writes them.
    """

    mean: np.ndarray
    cov: np.ndarray
    cov_raw: np.ndarray
    n: float
    n_divisor: float
    count_public: bool
    epsilon: float
    delta: float
    unit: str
    relation: str
    clip: float
    cov_clip: float
    calibration: str
    noise_multiplier: float
    mean_noise_std: float
    cov_noise_std: float
    mean_sensitivity: float
    cov_sensitivity: float
    events: tuple
    epsilon_basic: float
    delta_total: float
    epsilon_rdp: float
    epsilon_pld: float
    num_clients: int
    samples_used: int
    max_samples_per_user: int | None = None

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def privacy_summary(self) -> str:
        return (
            f"{self.unit}-level ({self.relation}) DP: each release ({self.epsilon:g}, "
            f"{self.delta:g}); both: basic ({self.epsilon_basic:g}, {self.delta_total:g}), "
            f"RDP eps={self.epsilon_rdp:.4g}, PLD eps={self.epsilon_pld:.4g} at "
            f"delta={self.delta_total:g}; noise multiplier {self.noise_multiplier:.4g} "
            f"({self.calibration}); n={self.n:g} "
            f"({'exact, public under replace-one' if self.count_public else 'declared'})"
        )


def fred_noise_keys(key, name: str = "fred") -> tuple[jax.Array, jax.Array]:
    """The keys of FreD's two releases: ``tagged_key(key, "fred", name, "mean-noise")`` and
    ``(..., "cov-noise")`` — keys carry their purpose (docs/design.md §3), so the mean's and the
    covariance's shares, and any other release from the same root key (FL training, unigrams),
    never draw the same noise. Client ``i``'s share key is ``fold_in(k, i)``."""
    return (tagged_key(key, "fred", name, "mean-noise"), tagged_key(key, "fred", name, "cov-noise"))


def private_stats(
    client_embeddings: Sequence[np.ndarray],
    clip: float,
    epsilon: float,
    delta: float,
    unit: str = "sample",
    key: jax.Array | None = None,
    *,
    relation: str | None = None,
    cov_clip: float | None = None,
    calibration: str = "analytic",
    max_samples_per_user: int | None = None,
    n_public: float | None = None,
    ledger=None,
    name: str = "fred",
    populations: Iterable[str] = ("users",),
    chunk_size: int = 256,
) -> PrivateStats:
    """Algorithm 1's private side: DP mean and covariance of federated embeddings.

    Args:
      client_embeddings: one ``[n_i, d]`` array per client (the clients' ``f(X_2)``).
      clip: ``c`` > 0, per-embedding clip norm for the mean (and first clip before centring).
      epsilon, delta: (eps, delta) of *each* of the two releases (eps > 0, 0 < delta < 1).
      unit: "sample" (the paper) or "user" (each user's contribution bounded; see module doc).
      key: PRNG key (``jax.random.key``) for the noise shares; required. The two releases use
        ``fred_noise_keys(key, name)`` (purpose-tagged), never ``key`` itself.
      relation: "add_remove" or "replace_one"; default: the ledger's ``neighboring`` if a
        ledger is given, else "add_remove".  Must match the ledger's.
      cov_clip: clip norm of the centred embeddings (default ``clip``).
      calibration: "analytic" (default) or "classic" (Prop. 3.1, eps < 1 only).
      max_samples_per_user: user level only: keep each user's first k embeddings.
      n_public: a declared, data-independent denominator (> 0). Required when the relation
        is "add_remove" (the exact count is private there; see the module doc), optional under
        "replace_one" (default: the exact count, public there).
      ledger: optional privacy ledger with ``spend(name, event, populations)``; charged with
        ``ComposedDpEvent([mean_event, cov_event])`` before any embedding value is read.
      name, populations: the ledger entry's name and populations.
      chunk_size: largest chunk of one client processed at once (memory knob).

    Returns:
      :class:`PrivateStats` (mean ``[d]``, cov ``[d, d]``, privacy figures, unit).
    """
    # ---- parameters (no data) ----
    relation, cov_clip = _check_release(clip, epsilon, delta, unit, key, relation, cov_clip,
                                        max_samples_per_user, n_public, ledger)
    sigma = moments.gaussian_sigma(epsilon, delta, calibration)
    mean_sens, cov_sens = sensitivities(clip, cov_clip, unit, relation)
    tau1, tau2 = sigma * mean_sens, sigma * cov_sens
    events = moments.moment_events(sigma)

    arrays = _counted(client_embeddings, unit, max_samples_per_user)  # shapes and counts only
    # ---- charge the ledger before any private value is read (fail closed) ----
    if ledger is not None:
        ledger.spend(name, moments.release_event(events), populations=tuple(populations))

    # ---- clients: values ----
    for i, a in enumerate(arrays):
        check_embeddings(a, f"client {i} embeddings")
    packed = pack_clients(arrays, unit, max_samples_per_user, chunk_size)
    divisor = float(n_public) if n_public is not None else float(packed.count)
    pmean, cov_raw, pcov = _released_moments(packed, clip, cov_clip, tau1, tau2, divisor,
                                             fred_noise_keys(key, name))

    # (at a total delta >= 1 every mechanism is DP with epsilon 0: no accountant figure, NaN)
    eps_acc = (moments.composed_epsilons(events, 2 * delta) if 2 * delta < 1
               else {"rdp": float("nan"), "pld": float("nan")})
    return PrivateStats(
        mean=pmean, cov=pcov, cov_raw=cov_raw,
        n=(packed.count if n_public is None
           else int(n_public) if float(n_public).is_integer() else float(n_public)),
        n_divisor=divisor, count_public=n_public is None, epsilon=float(epsilon), delta=float(delta),
        unit=unit, relation=relation, clip=float(clip), cov_clip=float(cov_clip),
        calibration=calibration, noise_multiplier=sigma, mean_noise_std=tau1, cov_noise_std=tau2,
        mean_sensitivity=mean_sens, cov_sensitivity=cov_sens, events=events,
        epsilon_basic=2.0 * float(epsilon), delta_total=2.0 * float(delta),
        epsilon_rdp=eps_acc["rdp"], epsilon_pld=eps_acc["pld"], num_clients=packed.num_clients,
        samples_used=packed.samples_used, max_samples_per_user=max_samples_per_user,
    )


def _check_release(clip, epsilon, delta, unit, key, relation, cov_clip, max_samples_per_user,
                   n_public, ledger) -> tuple[str, float]:
    """``private_stats``' parameter checks (no data): ``(relation, cov_clip)`` resolved, or a
    one-line ``ValueError``."""
    moments.check_epsilon_delta(epsilon, delta)
    check_positive(clip, "clip")
    cov_clip = clip if cov_clip is None else cov_clip
    check_positive(cov_clip, "cov_clip")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    if max_samples_per_user is not None and unit != "user":
        raise ValueError("max_samples_per_user applies to unit='user' only")
    if key is None:
        raise ValueError("private_stats needs an explicit PRNG key (jax.random.key(seed))")
    ledger_relation = getattr(ledger, "neighboring", None) if ledger is not None else None
    if relation is None:
        relation = ledger_relation or "add_remove"
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if ledger_relation is not None and ledger_relation != relation:
        raise ValueError(
            f"release relation {relation!r} differs from the ledger's {ledger_relation!r}: the "
            "noise multiplier would be relative to the wrong sensitivity"
        )
    ledger_unit = getattr(ledger, "unit", None) if ledger is not None else None
    if ledger_unit == "user" and unit == "sample":
        raise ValueError(
            "a sample-level release cannot be charged to a user-level ledger (a user with k "
            "sentences would only get k*epsilon); use unit='user' or a sample-level ledger"
        )
    if n_public is not None and (isinstance(n_public, bool)
                                 or not isinstance(n_public, (int, float, np.integer, np.floating))
                                 or not (math.isfinite(n_public) and n_public > 0)):
        raise ValueError(f"n_public must be a finite number > 0, got {n_public!r}")
    if relation == "add_remove" and n_public is None:
        raise ValueError(
            "private_stats: under add_remove the exact count is private (it differs between "
            "neighbouring datasets), so the release cannot divide by it: pass n_public (a "
            "declared, data-independent denominator) or use relation='replace_one'")
    return relation, cov_clip


def _counted(client_embeddings, unit: str, max_samples_per_user) -> list:
    """The clients' arrays, refused unless they hold at least 2 samples / users (shapes and
    counts only: no values are read)."""
    arrays, _ = _client_shapes(client_embeddings)
    kept = [
        min(a.shape[0], max_samples_per_user) if max_samples_per_user else a.shape[0]
        for a in arrays
    ]
    count = sum(kept) if unit == "sample" else sum(1 for k in kept if k > 0)
    if count < 2:
        raise ValueError(
            f"need at least 2 {'samples' if unit == 'sample' else 'users'} for a covariance, "
            f"got {count}"
        )

    return arrays


def _released_moments(packed, clip, cov_clip, tau1, tau2, divisor, keys):
    """The two releases (``moments.secure_sum_mean`` / ``secure_sum_cov``, noise shares keyed
    by ``keys``) post-processed by the server: ``(mean [d], raw covariance [d, d], its PSD
    projection)``, each divided by ``divisor``."""
    k_mean, k_cov = keys
    args = (
        jnp.asarray(packed.emb),
        jnp.asarray(packed.mask),
        jnp.asarray(packed.weight),
        jnp.asarray(packed.client_id),
        jnp.asarray(packed.share),
    )
    m = packed.num_clients
    noisy_sum = moments.secure_sum_mean(*args, clip, tau1, m, k_mean)
    pmean = np.asarray(noisy_sum, np.float64) / divisor  # server
    noisy_cov = moments.secure_sum_cov(
        *args, jnp.asarray(pmean, jnp.float32), clip, cov_clip, tau2, m, k_cov
    )
    cov_raw = moments.from_upper(np.asarray(noisy_cov, np.float64), packed.dim) / divisor
    return pmean, cov_raw, project_psd(cov_raw)


def _public_stats(public) -> GaussianStats:
    if isinstance(public, GaussianStats):
        return public
    return gaussian_stats(check_embeddings(public, "public embeddings", min_rows=2))


def fred(public_embeddings, release: PrivateStats) -> float:
    """FreD (Algorithm 1, last line): Eq. 2 between public stats and the DP release.

    Args:
      public_embeddings: ``[n_1, d]`` public embeddings, or their :class:`GaussianStats`.
      release: a :class:`PrivateStats`; reusing it costs no privacy (post-processing).
    Returns:
      float >= 0.
    """
    pub = _public_stats(public_embeddings)
    if pub.dim != release.dim:
        raise ValueError(
            f"dimension mismatch between public ({pub.dim}) and private ({release.dim}) embeddings"
        )
    return frechet_distance(pub.mean, pub.cov, release.mean, release.cov)


def rank_candidates(
    candidates: Mapping[str, np.ndarray | GaussianStats], release: PrivateStats
) -> list[tuple[str, float]]:
    """Score every candidate public dataset against one release; closest (smallest) first.

    ``candidates``: name -> ``[n_c, d]`` embeddings (or :class:`GaussianStats`).
    """
    scores = [(name, fred(emb, release)) for name, emb in candidates.items()]
    return sorted(scores, key=lambda t: t[1])
