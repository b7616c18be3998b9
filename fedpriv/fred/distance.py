"""Fréchet distance of two Gaussians (Hou et al. 2023, Eq. 2) and its host-side numerics.

Eq. 2 (Dowson & Landau 1982), the Fréchet distance of two Gaussians::

    d = ||mu1 - mu2||^2 + Tr(C1 + C2 - 2 (C1 C2)^{1/2})

computed on the host in float64.  ``Tr((C1 C2)^{1/2})`` is the sum of the square roots of the
eigenvalues of the symmetric PSD matrix ``C1^{1/2} C2 C1^{1/2}`` (similar to ``C1 C2``), from
two symmetric eigendecompositions with tiny negative eigenvalues clipped to 0: no general
``sqrtm`` and no complex parts.  Also: the PSD projection of a noisy covariance, the
(non-private) Gaussian statistics of a public embedding set and a public PCA basis.
"""

from __future__ import annotations

import dataclasses

import numpy as np


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
