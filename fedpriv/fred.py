"""FreD: a differentially private Fréchet distance between a public and a federated dataset.

Hou, Zhan, Shrivastava, Wang, Livshits, Fanti, Lazar (2023), "Privately customizing
prefinetuning to better match user data in federated learning" (``papers/fred_hou2023.md``).

Eq. 2 (Dowson & Landau 1982), the Fréchet distance of two Gaussians::

    d = ||mu1 - mu2||^2 + Tr(C1 + C2 - 2 (C1 C2)^{1/2})

computed on the host in float64.  ``Tr((C1 C2)^{1/2})`` is the sum of the square roots of the
eigenvalues of the symmetric PSD matrix ``C1^{1/2} C2 C1^{1/2}`` (similar to ``C1 C2``), from
two symmetric eigendecompositions with tiny negative eigenvalues clipped to 0: no general
``sqrtm`` and no complex parts.

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
* **User level** (DESIGN.md's default unit): a user's whole contribution is bounded.  User
  ``u`` keeps at most ``max_samples_per_user`` sentences (first ones, if set), clips each and
  contributes the *average* ``v_u = (1/k_u) sum_j clip_c(e_uj)`` (norm <= c) to the mean sum
  and ``A_u = (1/k_u) sum_j b_uj b_uj^T`` (PSD, ``||A_u||_F <= Tr A_u <= c_cov^2``) to the
  covariance sum; ``n`` is then the number of users.  Replace-one: ``||A - A'||_F^2 =
  ||A||^2 + ||A'||^2 - 2<A, A'> <= 2 c_cov^4`` since ``<A, A'> >= 0`` for PSD matrices.
  The estimated distribution is the user-weighted mixture (pick a user uniformly, then one of
  their sentences), not the sentence-weighted one of the sample-level release.

The count ``n``: under replace-one it is the same on neighbouring datasets, so dividing by it
is exact post-processing.  Under add/remove the exact ``n`` is data-dependent; like the paper
("n_2 known") we treat it as **public** by default (``PrivateStats.count_public = True``), or
the caller passes ``n_public`` -- a data-independent denominator (e.g. a population size known
in advance) -- and the server divides by that instead (a fixed-denominator estimator, as in
DP-FedAvg; McMahan et al. 2018).  Shapes and counts (metadata) are checked before the ledger
is charged; the *values* (NaN/inf) are checked after, so a bad release still costs its budget.

Noise calibration: ``tau = sigma(eps, delta) * sensitivity`` with ``sigma`` from the analytic
Gaussian mechanism (Balle & Wang 2018; ``dp_accounting.get_sigma_gaussian``, which is the noise
for L2 sensitivity 1), exact for every ``eps > 0``.  The classic
``sqrt(2 ln(1.25/delta)) / eps`` of Prop. 3.1 is exposed for comparison and only allowed for
``eps < 1``.  Each release is (eps, delta)-DP; both together are (2 eps, 2 delta)-DP by basic
composition (Prop. 3.1), and an RDP / PLD accountant composing the two
``GaussianDpEvent(noise_multiplier = tau / sensitivity)`` events gives a tighter epsilon at
``2 delta``; ``PrivateStats`` reports all three.

JAX runs the per-client math (clip, centre, per-client sums, noise shares): written for one
client, ``jax.vmap``-ped over a padded set of clients (masked samples, masked padding
clients) and ``lax.scan``-ned over groups of clients to bound memory.  Large clients are split
into several fixed-size chunks that share one noise share.  NumPy float64 does the rest.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Iterable, Mapping, Sequence

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
from dp_accounting import pld, rdp

from fedpriv.dp.keys import tagged_key

UNITS = ("sample", "user")
RELATIONS = ("add_remove", "replace_one")
CALIBRATIONS = ("analytic", "classic")


# ============================================================================================
# Fréchet distance (Eq. 2), host-side float64
# ============================================================================================


def _sym(a: np.ndarray) -> np.ndarray:
    return 0.5 * (a + a.T)


def _as_mean_cov(mu, cov, name: str) -> tuple[np.ndarray, np.ndarray]:
    mu = np.asarray(mu, np.float64)
    cov = np.asarray(cov, np.float64)
    if mu.ndim != 1 or cov.shape != (mu.shape[0], mu.shape[0]):
        raise ValueError(f"{name}: need mean [d] and covariance [d, d], got {mu.shape}, {cov.shape}")
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(cov))):
        raise ValueError(f"{name}: mean/covariance contain NaN or inf")
    return mu, _sym(cov)


def psd_sqrt(cov: np.ndarray) -> np.ndarray:
    """Symmetric PSD square root ``[d, d] -> [d, d]`` (eigh, negative eigenvalues -> 0)."""
    w, v = np.linalg.eigh(_sym(np.asarray(cov, np.float64)))
    return (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T


def trace_sqrt_product(cov1: np.ndarray, cov2: np.ndarray) -> float:
    """``Tr((C1 C2)^{1/2})`` = sum sqrt(eig(C1^{1/2} C2 C1^{1/2})), ``[d, d] x2 -> float``."""
    s1 = psd_sqrt(cov1)
    w = np.linalg.eigvalsh(_sym(s1 @ _sym(np.asarray(cov2, np.float64)) @ s1))
    return float(np.sum(np.sqrt(np.clip(w, 0.0, None))))


def frechet_distance(mu1, cov1, mu2, cov2) -> float:
    """Eq. 2: ``||mu1 - mu2||^2 + Tr(C1 + C2 - 2 (C1 C2)^{1/2})`` in float64.

    Args:
      mu1, mu2: means, ``[d]``.
      cov1, cov2: PSD covariances, ``[d, d]`` (symmetrised; negative eigenvalues from rounding
        are clipped to 0 inside the square roots).

    Returns:
      The (squared-metric) Fréchet distance, a float >= 0 (a result below 0 can only come from
      rounding and is returned as 0).  Exact on closed forms up to the inputs' own rounding:
      at a zero eigenvalue ``x -> sqrt(x)`` is not Lipschitz, so a float64 rounding of 1e-16 in
      a singular covariance shows as ~1e-8 in the trace term.
    """
    mu1, cov1 = _as_mean_cov(mu1, cov1, "first Gaussian")
    mu2, cov2 = _as_mean_cov(mu2, cov2, "second Gaussian")
    if mu1.shape != mu2.shape:
        raise ValueError(f"dimension mismatch: {mu1.shape[0]} vs {mu2.shape[0]}")
    diff = mu1 - mu2
    d = float(diff @ diff + np.trace(cov1) + np.trace(cov2) - 2.0 * trace_sqrt_product(cov1, cov2))
    return max(d, 0.0)


def project_psd(mat: np.ndarray) -> np.ndarray:
    """Frobenius-nearest PSD matrix to the symmetric part of ``mat``: ``[d, d] -> [d, d]``.

    ``V diag(max(w, 0)) V^T`` for ``sym(mat) = V diag(w) V^T`` (Higham 1988).
    """
    w, v = np.linalg.eigh(_sym(np.asarray(mat, np.float64)))
    return _sym((v * np.clip(w, 0.0, None)) @ v.T)


def check_embeddings(emb, name: str = "embeddings", min_rows: int = 0) -> np.ndarray:
    """Validate a ``[n, d]`` float array (finite values, at least ``min_rows`` rows)."""
    arr = np.asarray(emb)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array [n, d], got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    if arr.shape[0] < min_rows:
        raise ValueError(
            f"{name}: need at least {min_rows} samples for a covariance, got {arr.shape[0]}"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contain NaN or inf")
    return arr


@dataclasses.dataclass(frozen=True)
class GaussianStats:
    """Mean ``[d]`` and covariance ``[d, d]`` (float64) of a (public) embedding set."""

    mean: np.ndarray
    cov: np.ndarray
    n: int

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])


def gaussian_stats(emb) -> GaussianStats:
    """``[n, d] -> GaussianStats``: mean and the 1/n covariance (the private estimator's
    normalisation), in float64.  Needs ``n >= 2`` and finite values."""
    x = check_embeddings(emb, "embeddings", min_rows=2).astype(np.float64)
    mu = x.mean(axis=0)
    xc = x - mu
    return GaussianStats(mu, _sym(xc.T @ xc / x.shape[0]), int(x.shape[0]))


def pca_basis(public_embeddings, k: int) -> np.ndarray:
    """Top-``k`` principal directions of *public* embeddings: ``[n, d] -> float64[d, k]``.

    Not part of the paper: an optional, privacy-free way to shrink the released covariance.
    The noise on the ``d x d`` covariance grows like ``sqrt(d)`` in spectral norm and its
    PSD projection adds roughly ``d * 2 R / (3 pi)`` to the trace (``R = 2 tau_2 sqrt(d) / n``),
    which swamps the signal when ``n`` is small (e.g. user level).  Composing the embedder
    with ``x -> x @ basis`` (basis from public data only) makes FreD a distance between the
    projected distributions, released with the same privacy cost in ``k`` dimensions.
    """
    x = check_embeddings(public_embeddings, "public embeddings", min_rows=2).astype(np.float64)
    if not 1 <= k <= x.shape[1]:
        raise ValueError(f"k must be in [1, {x.shape[1]}], got {k}")
    xc = x - x.mean(axis=0)
    w, v = np.linalg.eigh(xc.T @ xc)
    return np.ascontiguousarray(v[:, np.argsort(w)[::-1][:k]])


def fred_nonprivate(public_emb, private_emb) -> float:
    """Non-private Fréchet distance between two embedding sets ``[n1, d]``, ``[n2, d]``."""
    a = gaussian_stats(public_emb)
    b = gaussian_stats(private_emb)
    if a.dim != b.dim:
        raise ValueError(f"dimension mismatch between public ({a.dim}) and private ({b.dim})")
    return frechet_distance(a.mean, a.cov, b.mean, b.cov)


# ============================================================================================
# Noise calibration and sensitivities
# ============================================================================================


def _check_eps_delta(epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, (int, float, np.floating)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float, np.floating)) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def analytic_gaussian_sigma(epsilon: float, delta: float) -> float:
    """Noise std for L2 sensitivity 1 giving exactly (eps, delta)-DP (Balle & Wang 2018)."""
    _check_eps_delta(epsilon, delta)
    return float(dpa.get_sigma_gaussian(float(epsilon), float(delta)))


def classic_gaussian_sigma(epsilon: float, delta: float) -> float:
    """Prop. 3.1's ``sqrt(2 ln(1.25/delta)) / eps`` (Dwork & Roth Thm. A.1; only for eps < 1)."""
    _check_eps_delta(epsilon, delta)
    if epsilon >= 1:
        raise ValueError(
            f"the classic Gaussian calibration holds only for epsilon < 1 (got {epsilon}); "
            "use calibration='analytic'"
        )
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def gaussian_sigma(epsilon: float, delta: float, calibration: str = "analytic") -> float:
    if calibration == "analytic":
        return analytic_gaussian_sigma(epsilon, delta)
    if calibration == "classic":
        return classic_gaussian_sigma(epsilon, delta)
    raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")


def sensitivities(clip: float, cov_clip: float, unit: str, relation: str) -> tuple[float, float]:
    """L2 sensitivities ``(mean_sum, cov_sum_upper_triangle)`` (table in the module doc).

    ``unit`` does not change them: a sample (sample level) and a user's average (user level)
    are both bounded by ``c`` (and ``c_cov^2`` for the second moment).
    """
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    if relation == "add_remove":
        return float(clip), float(cov_clip) ** 2
    if relation == "replace_one":
        return 2.0 * float(clip), math.sqrt(2.0) * float(cov_clip) ** 2
    raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")


def composed_epsilons(events: Sequence[dpa.DpEvent], delta: float) -> dict[str, float]:
    """Epsilon at ``delta`` of the composition of ``GaussianDpEvent``s: RDP and PLD.

    The events' noise multipliers are relative to the sensitivity under the release's own
    neighbouring relation, so the add/remove accountants (a Gaussian of sensitivity 1) apply.
    PLD is skipped (NaN) for noise multipliers below 0.3 (its discretisation would need tens
    of GiB).  Results are cached on ``(noise multipliers, delta)``.
    """
    for e in events:
        if not isinstance(e, dpa.GaussianDpEvent):
            raise TypeError(f"expected GaussianDpEvent, got {type(e).__name__}")
    return dict(_composed_epsilons(tuple(float(e.noise_multiplier) for e in events), float(delta)))


@functools.lru_cache(maxsize=256)
def _composed_epsilons(sigmas: tuple[float, ...], delta: float) -> tuple[tuple[str, float], ...]:
    acc = rdp.RdpAccountant()
    for z in sigmas:
        acc.compose(dpa.GaussianDpEvent(z))
    out = {"rdp": float(acc.get_epsilon(delta)), "pld": float("nan")}
    if min(sigmas) >= _PLD_MIN_NOISE_MULTIPLIER:
        pacc = pld.PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
        for z in sigmas:
            pacc.compose(dpa.GaussianDpEvent(z))
        out["pld"] = float(pacc.get_epsilon(delta))
    return tuple(out.items())


# Below this the PLD discretisation needs ~1e10 buckets (tens of GiB); RDP is reported alone.
_PLD_MIN_NOISE_MULTIPLIER = 0.3


# ============================================================================================
# Per-client math in JAX (one client, unbatched), then vmap + scan over padded clients
# ============================================================================================


def clip_rows(x: jax.Array, clip) -> jax.Array:
    """Clip each row of ``[S, d]`` to L2 norm ``clip`` (Def. 2.4: ``v / max(1, ||v|| / c)``)."""
    norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x * jnp.minimum(1.0, clip / jnp.maximum(norm, 1e-30))


def upper_indices(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Row/column indices of the upper triangle with diagonal, ``P = d (d + 1) / 2`` entries."""
    return np.triu_indices(d)


def from_upper(vec: np.ndarray, d: int) -> np.ndarray:
    """``[P] -> [d, d]`` symmetric matrix mirrored from its upper triangle (float64)."""
    iu = upper_indices(d)
    m = np.zeros((d, d), np.float64)
    m[iu] = np.asarray(vec, np.float64)
    return m + np.triu(m, 1).T


def client_mean_contribution(emb: jax.Array, mask: jax.Array, weight, clip) -> jax.Array:
    """One client's contribution to the mean sum: ``weight * sum_j mask_j clip_c(e_j)``.

    Args:
      emb: ``[S, d]`` embeddings (padded rows arbitrary), mask: ``[S]`` 0/1, weight: scalar
        (1 at sample level, ``1/k_u`` at user level), clip: scalar ``c``.
    Returns:
      ``[d]``.
    """
    x = clip_rows(emb, clip) * mask[:, None]
    return weight * jnp.sum(x, axis=0)


def client_cov_contribution(
    emb: jax.Array, mask: jax.Array, weight, center: jax.Array, clip, cov_clip
) -> jax.Array:
    """One client's contribution to the covariance sum, upper triangle only.

    ``b_j = clip_{c_cov}(clip_c(e_j) - center)``; returns ``weight * upper(sum_j mask_j b_j
    b_j^T)`` as ``[P]``, ``P = d (d + 1) / 2``.  ``emb: [S, d]``, ``mask: [S]``, ``center: [d]``.
    """
    d = emb.shape[-1]
    b = clip_rows(clip_rows(emb, clip) - center[None, :], cov_clip) * mask[:, None]
    iu = upper_indices(d)
    return weight * (b.T @ b)[iu]


def _noise_share(key, client_id, share, size: int, total_std, num_clients) -> jax.Array:
    """Client ``client_id``'s share ``N(0, total_std^2 / m)`` per coordinate (0 if ``share=0``)."""
    k = jax.random.fold_in(key, client_id)
    std = total_std / jnp.sqrt(jnp.asarray(num_clients, jnp.float32))
    return share * std * jax.random.normal(k, (size,), jnp.float32)


def _scan_sum(per_chunk: Callable, xs: tuple, group: int, size: int) -> jax.Array:
    """Sum of ``vmap(per_chunk)`` over the leading (chunk) axis, ``group`` chunks at a time."""
    num = xs[0].shape[0]
    grouped = tuple(x.reshape((num // group, group) + x.shape[1:]) for x in xs)

    def body(acc, g):
        return acc + jnp.sum(jax.vmap(per_chunk)(*g), axis=0), None

    total, _ = jax.lax.scan(body, jnp.zeros((size,), jnp.float32), grouped)
    return total


@jax.jit
def secure_sum_mean(emb, mask, weight, client_id, share, clip, noise_std, num_clients, key):
    """Noisy securely aggregated mean sum (step 1 of Algorithm 1), jitted.

    Args:
      emb: ``[C, S, d]`` padded chunks of client embeddings; mask ``[C, S]``; weight ``[C]``;
      client_id ``[C]`` int32 (chunks of one client share it); share ``[C]`` 1.0 on exactly one
      chunk per real client, 0 elsewhere; clip ``c``; noise_std ``tau_1`` of the *aggregate*
      (0 gives the pre-noise sum); num_clients ``m``; key: PRNG key.
      ``C`` must be a multiple of the group size ``_GROUP``.
    Returns:
      ``[d]`` float32: ``sum_u contribution_u + sum_u share_u``, shares ``N(0, tau_1^2/m)``.
    """
    d = emb.shape[-1]

    def per_chunk(e, m, w, cid, s):
        return client_mean_contribution(e, m, w, clip) + _noise_share(
            key, cid, s, d, noise_std, num_clients
        )

    return _scan_sum(per_chunk, (emb, mask, weight, client_id, share), _GROUP, d)


@jax.jit
def secure_sum_cov(
    emb, mask, weight, client_id, share, center, clip, cov_clip, noise_std, num_clients, key
):
    """Noisy securely aggregated covariance sum, upper triangle ``[P]`` (step 2), jitted.

    Same arguments as :func:`secure_sum_mean` plus ``center [d]`` (the released DP mean) and
    ``cov_clip``; one noise draw per upper-triangle entry.
    """
    d = emb.shape[-1]
    size = d * (d + 1) // 2

    def per_chunk(e, m, w, cid, s):
        return client_cov_contribution(e, m, w, center, clip, cov_clip) + _noise_share(
            key, cid, s, size, noise_std, num_clients
        )

    return _scan_sum(per_chunk, (emb, mask, weight, client_id, share), _GROUP, size)


# Chunks are processed ``_GROUP`` at a time (vmap), groups sequentially (scan).
_GROUP = 8


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


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
    s = min(_next_pow2(max(largest, 8)), _next_pow2(chunk_size))
    pieces = []  # (client index, array slice, weight, first?)
    for i, a in enumerate(arrays):
        w = 1.0 if unit == "sample" else 1.0 / a.shape[0]
        for j, start in enumerate(range(0, a.shape[0], s)):
            pieces.append((i, a[start : start + s], w, j == 0))
    c = _GROUP * _next_pow2(-(-len(pieces) // _GROUP))
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
      n: count (samples at sample level, users at user level); n_divisor: the denominator the
        server used; count_public: True if the exact ``n`` was used as public information.
      epsilon, delta: per release (each of the two releases is (epsilon, delta)-DP).
      unit: "sample" or "user"; relation: "add_remove" or "replace_one".
      clip, cov_clip: clip norms; calibration: "analytic" or "classic".
      noise_multiplier: ``sigma`` = noise std / L2 sensitivity (same for both releases);
      mean_noise_std, cov_noise_std: std of the noise on the aggregated sums (``tau_1, tau_2``);
      mean_sensitivity, cov_sensitivity: L2 sensitivities of the sums.
      events: the two ``GaussianDpEvent``s (mean, covariance) charged to the ledger.
      epsilon_basic, delta_total: (2 eps, 2 delta) basic composition (Prop. 3.1).
      epsilon_rdp, epsilon_pld: epsilon at ``delta_total`` from the RDP / PLD accountants.
      num_clients: participating clients m; samples_used: embeddings read.
    """

    mean: np.ndarray
    cov: np.ndarray
    cov_raw: np.ndarray
    n: int
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
            f"({self.calibration}); n={self.n} ({'public' if self.count_public else 'fixed divisor'})"
        )


def fred_noise_keys(key, name: str = "fred") -> tuple[jax.Array, jax.Array]:
    """The keys of FreD's two releases: ``tagged_key(key, "fred", name, "mean-noise")`` and
    ``(..., "cov-noise")`` — keys carry their purpose (DESIGN.md), so the mean's and the
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
      n_public: a data-independent denominator to use instead of the exact count.
      ledger: optional privacy ledger with ``spend(name, event, populations)``; charged with
        ``ComposedDpEvent([mean_event, cov_event])`` before any embedding value is read.
      name, populations: the ledger entry's name and populations.
      chunk_size: largest chunk of one client processed at once (memory knob).

    Returns:
      :class:`PrivateStats` (mean ``[d]``, cov ``[d, d]``, privacy figures, unit).
    """
    # ---- parameters (no data) ----
    _check_eps_delta(epsilon, delta)
    if not (isinstance(clip, (int, float, np.floating)) and math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
    cov_clip = clip if cov_clip is None else cov_clip
    if not (isinstance(cov_clip, (int, float, np.floating)) and math.isfinite(cov_clip) and cov_clip > 0):
        raise ValueError(f"cov_clip must be a finite number > 0, got {cov_clip!r}")
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
    if n_public is not None and not (math.isfinite(n_public) and n_public > 0):
        raise ValueError(f"n_public must be > 0, got {n_public!r}")
    sigma = gaussian_sigma(epsilon, delta, calibration)
    mean_sens, cov_sens = sensitivities(clip, cov_clip, unit, relation)
    tau1, tau2 = sigma * mean_sens, sigma * cov_sens
    events = (dpa.GaussianDpEvent(sigma), dpa.GaussianDpEvent(sigma))

    # ---- metadata: shapes and counts (no values) ----
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

    # ---- charge the ledger before any private value is read (fail closed) ----
    if ledger is not None:
        ledger.spend(name, dpa.ComposedDpEvent(list(events)), populations=tuple(populations))

    # ---- clients: values ----
    for i, a in enumerate(arrays):
        check_embeddings(a, f"client {i} embeddings")
    packed = pack_clients(arrays, unit, max_samples_per_user, chunk_size)
    divisor = float(n_public) if n_public is not None else float(packed.count)
    k_mean, k_cov = fred_noise_keys(key, name)
    args = (
        jnp.asarray(packed.emb),
        jnp.asarray(packed.mask),
        jnp.asarray(packed.weight),
        jnp.asarray(packed.client_id),
        jnp.asarray(packed.share),
    )
    m = packed.num_clients
    noisy_sum = secure_sum_mean(*args, clip, tau1, m, k_mean)
    pmean = np.asarray(noisy_sum, np.float64) / divisor  # server
    noisy_cov = secure_sum_cov(
        *args, jnp.asarray(pmean, jnp.float32), clip, cov_clip, tau2, m, k_cov
    )
    cov_raw = from_upper(np.asarray(noisy_cov, np.float64), packed.dim) / divisor
    pcov = project_psd(cov_raw)

    eps_acc = composed_epsilons(events, 2 * delta)
    return PrivateStats(
        mean=pmean,
        cov=pcov,
        cov_raw=cov_raw,
        n=packed.count,
        n_divisor=divisor,
        count_public=n_public is None,
        epsilon=float(epsilon),
        delta=float(delta),
        unit=unit,
        relation=relation,
        clip=float(clip),
        cov_clip=float(cov_clip),
        calibration=calibration,
        noise_multiplier=sigma,
        mean_noise_std=tau1,
        cov_noise_std=tau2,
        mean_sensitivity=mean_sens,
        cov_sensitivity=cov_sens,
        events=events,
        epsilon_basic=2.0 * float(epsilon),
        delta_total=2.0 * float(delta),
        epsilon_rdp=eps_acc["rdp"],
        epsilon_pld=eps_acc["pld"],
        num_clients=m,
        samples_used=packed.samples_used,
        max_samples_per_user=max_samples_per_user,
    )


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
