"""Prefinetuning mixtures (Hou et al. 2023 §4.2, Table 2 and Figure 2) at small scale.

The paper's prefinetuning candidates are mixtures: ``Y%`` sentences from the private
distribution (StackOverflow-train1, users disjoint from the FL users of StackOverflow-train2)
and ``100 - Y%`` Wikitext, at a fixed total size. FreD (non-private and private) is computed
for every ``Y``; each mixture is then prefinetuned on and DP FL-finetuned, test perplexity
before and after (Table 2). Here: private-distribution text = messages of held-out chitchat
senders (:data:`fedpriv.fred.embed.HELD_OUT`), public = Wikipedia sentences, private users =
the training split of the other chitchat senders (as in :mod:`fedpriv.recipes.fred_pipeline`).

Mixtures are *nested*: each pool is shuffled once and a mixture at ``Y`` is the first
``k = round(Y * total / 100)`` sentences of the private-distribution pool plus the first
``total - k`` of the public pool. So the 99% and 100% sets share 99% of their sentences, and
the pools are embedded once: a mixture's embeddings are the same prefixes of the pools'
embeddings (FreD for every ``Y`` is post-processing of one release per trial).

Figure 2 as in the paper: sample-level FreD (one sentence of one user; the paper's Def. 2.1) at
``(0.6, 2e-6)`` per release in the full 384-d embedding, five trials, mixtures as large as the
packaged pools allow (19,782 sentences: 99 % and 100 % differ by 198). A user-level release
(every user's contribution bounded) and a public PCA basis remain options of :func:`fred_vs_y`.

This module holds the mixtures, FreD vs Y and the verdicts (functions of arrays); the experiment's
stages (``run_mixtures``) are a recipe, :mod:`fedpriv.recipes.fred_mixtures`: ``FreD`` (embed
the pools and users once, non-private FreD per Y, one Algorithm-1 release per trial reused for
every Y; trial 0's release is charged -- to its own sample-level ledger at sample level, to the
pipeline's user-level ledger at user level -- the other trials are replicates of the experiment,
each of which would cost the same), then one stage per (Y, seed): prefinetune on the mixture,
test perplexity, DP-FTRL FL-finetune under a user-level ledger, test perplexity.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np

from fedpriv import report
from fedpriv.fred.distance import gaussian_stats, pca_basis
from fedpriv.fred.embed import HELD_OUT
from fedpriv.fred.private import fred, private_stats

# read-time code (experiments.results.verdict_code)
__verdict_code__ = ("monotone_verdict", "separation_verdict", "AGREEMENT_CLAIM")
PUBLIC = "wikipedia"
RELEASE = "FreD release (mean + covariance)"


# ============================================================================================
# The mixtures (pure: lists or arrays)
# ============================================================================================

def mixture_counts(y_percent: float, total: int) -> tuple[int, int]:
    """``(k, total - k)``: sentences from the private-distribution pool and the public pool of
    the mixture at ``y_percent`` (``k = round(y * total / 100)``)."""
    if not (isinstance(total, (int, np.integer)) and total >= 1):
        raise ValueError(f"total must be an int >= 1, got {total!r}")
    if not (math.isfinite(y_percent) and 0 <= y_percent <= 100):
        raise ValueError(f"Y% must be in [0, 100], got {y_percent!r}")
    k = int(round(y_percent * total / 100.0))
    return k, int(total) - k


def mixture(private_like, public, y_percent: float, total: int):
    """The nested mixture at ``y_percent``: ``private_like[:k] + public[:total - k]``.

    ``private_like`` / ``public``: pools (lists of sentences, or ``[n, d]`` arrays of their
    embeddings, in the same shuffled order); returns a list or an array accordingly. Mixtures
    at different ``Y`` share prefixes (99% and 100% share ``0.99 * total`` sentences).
    """
    k, rest = mixture_counts(y_percent, total)
    if len(private_like) < k or len(public) < rest:
        raise ValueError(f"Y={y_percent}% of {total} needs {k} private-distribution and {rest} "
                         f"public sentences; the pools hold {len(private_like)} and {len(public)}")
    if isinstance(private_like, np.ndarray) or isinstance(public, np.ndarray):
        return np.concatenate([np.asarray(private_like)[:k], np.asarray(public)[:rest]])
    return list(private_like[:k]) + list(public[:rest])


def shuffled_pools(pools: Mapping[str, Sequence[str]], seed: int) -> dict[str, list[str]]:
    """Each pool in a seeded random order (so prefixes are random subsets)."""
    rng = np.random.default_rng([seed, 12])
    return {name: [texts[i] for i in rng.permutation(len(texts))] for name, texts in pools.items()}


# ============================================================================================
# FreD vs Y (Figure 2)
# ============================================================================================

def user_weighted_stats(priv_emb: Mapping[str, np.ndarray]):
    """The noise-free value of what a user-level release estimates: mean = average of the users'
    means, covariance = average of the users' second moments about that mean (every user weighs
    the same, whatever their number of sentences; no clipping)."""
    from fedpriv.fred.distance import GaussianStats
    users = [np.asarray(e, np.float64) for e in priv_emb.values() if len(e)]
    mu = np.mean([u.mean(0) for u in users], axis=0)
    cov = np.mean([(u - mu).T @ (u - mu) / len(u) for u in users], axis=0)
    return GaussianStats(mu, 0.5 * (cov + cov.T), len(users))


def frechet_to_many(publics: Sequence, target) -> list[float]:
    """Eq. 2 from each public :class:`GaussianStats` in ``publics`` to one ``target``: the
    target's PSD square root is computed once, ``Tr((C1 C2)^{1/2}) = sum sqrt eig(C2^{1/2} C1
    C2^{1/2})`` (same eigenvalues as ``C1 C2``), so each public set costs one ``eigvalsh``."""
    from fedpriv.fred.distance import psd_sqrt
    s2 = psd_sqrt(target.cov)
    out = []
    for p in publics:
        w = np.linalg.eigvalsh(s2 @ p.cov @ s2)
        diff = p.mean - target.mean
        d = diff @ diff + np.trace(p.cov) + np.trace(target.cov) - 2 * np.sum(np.sqrt(np.clip(w, 0, None)))
        out.append(max(float(d), 0.0))
    return out


def _basis(pools: Mapping[str, np.ndarray], pca_dims: int | None):
    """The public PCA basis of the two pools (None: no projection)."""
    return (pca_basis(np.concatenate([pools[HELD_OUT], pools[PUBLIC]]), pca_dims)
            if pca_dims else None)


def nonprivate_fred_vs_y(priv_emb: Mapping[str, np.ndarray], pools: Mapping[str, np.ndarray],
                         y_percents: Sequence[float], total: int, pca_dims: int | None,
                         basis: np.ndarray | None = None) -> dict:
    """Noise-free FreD of every mixture: ``nonprivate`` (sentence-pooled users, in the PCA basis
    of the release), ``nonprivate_full`` (sentence-pooled, full embedding: the paper's
    non-private FreD) and ``nonprivate_user`` (user-weighted, PCA basis: exactly the private
    release's estimand). ``basis``: the PCA basis if already computed."""
    basis = _basis(pools, pca_dims) if basis is None and pca_dims else basis
    proj = (lambda e: np.asarray(e, np.float64) @ basis) if basis is not None else np.asarray
    mixes = {y: mixture(pools[HELD_OUT], pools[PUBLIC], y, total) for y in y_percents}
    all_priv = np.concatenate(list(priv_emb.values()))
    pub = [gaussian_stats(proj(mixes[y])) for y in y_percents]
    return {"nonprivate": frechet_to_many(pub, gaussian_stats(proj(all_priv))),
            "nonprivate_full": frechet_to_many([gaussian_stats(mixes[y]) for y in y_percents],
                                               gaussian_stats(all_priv)),
            "nonprivate_user": frechet_to_many(
                pub, user_weighted_stats({u: proj(e) for u, e in priv_emb.items()}))}


def fred_vs_y(priv_emb: Mapping[str, np.ndarray], pools: Mapping[str, np.ndarray],
              y_percents: Sequence[float], total: int, *, trials: int, clip: float,
              epsilon: float, delta: float, unit: str, seed: int, pca_dims: int | None,
              n_public: float | None = None, ledger=None, name: str = RELEASE,
              relation: str | None = None) -> dict:
    """Non-private FreD and private FreD (``trials`` releases) of every mixture.

    ``priv_emb``: user -> ``[n_u, d]``; ``pools``: ``{HELD_OUT: [n, d], PUBLIC: [n, d]}``.
    Release ``t`` uses ``fold_in(key(seed), t)``; only release 0 is charged to ``ledger`` (the
    others are replicates of the experiment). Every release is reused for every ``Y``.
    ``unit`` / ``relation``: the releases' unit of privacy and neighbouring relation (default:
    the ledger's, else add/remove; every trial uses the same, charged or not); a sample-level
    release on a user-level ledger is refused (``fedpriv.fred.private``).
    ``n_public``: the declared denominator (required under add/remove, where the exact count is
    private: ``fedpriv.fred.private`` module doc; None under replace-one: the exact count).
    Returns JSON-able ``{"y", "nonprivate", "nonprivate_full", "nonprivate_user", "private":
    [trial][y], "releases": [trial]}``.
    """
    basis = _basis(pools, pca_dims)
    proj = (lambda e: np.asarray(e, np.float64) @ basis) if basis is not None else np.asarray
    mixes = {y: mixture(pools[HELD_OUT], pools[PUBLIC], y, total) for y in y_percents}
    stats = {y: gaussian_stats(proj(m)) for y, m in mixes.items()}
    out = {"y": list(y_percents),
           **nonprivate_fred_vs_y(priv_emb, pools, y_percents, total, pca_dims, basis),
           "private": [], "releases": []}
    users = [proj(priv_emb[u]) for u in priv_emb]
    relation = relation or getattr(ledger, "neighboring", None) or "add_remove"
    for t in range(trials):
        rel = private_stats(users, clip, epsilon, delta, unit=unit, relation=relation,
                            key=jax.random.fold_in(jax.random.key(seed), t),
                            ledger=ledger if t == 0 else None, name=name, n_public=n_public)
        out["private"].append([fred(stats[y], rel) for y in y_percents])
        out["releases"].append({"trial": t, "charged": t == 0, "epsilon_basic": rel.epsilon_basic,
                                "delta_total": rel.delta_total, "epsilon_rdp": rel.epsilon_rdp,
                                "epsilon_pld": rel.epsilon_pld, "n": rel.n, "unit": rel.unit,
                                "relation": rel.relation, "dim": rel.dim,
                                "noise_multiplier": rel.noise_multiplier})
    return out


def trials_epsilon(epsilon: float, delta: float, trials: int, at_delta: float,
                   neighboring: str = "add_remove") -> float:
    """Epsilon at ``at_delta`` of ``trials`` FreD releases (mean + covariance, each Gaussian at
    ``(epsilon, delta)``) of the same users together, under ``neighboring``: what the spread over
    trials would cost if every trial were charged (only trial 0 is; the others are replicates of
    the experiment)."""
    from fedpriv.dp import accounting, moments
    release = moments.release_event(moments.moment_events(moments.gaussian_sigma(epsilon, delta)))
    return accounting.compute_epsilon([release] * trials, at_delta, neighboring)[0]


# ============================================================================================
# Verdicts
# ============================================================================================

def monotone_verdict(claim: str, ys: Sequence[float], values: Sequence, *, decreasing: bool = True,
                     exact: bool = False, digits: int = 4, source: str = "paper", fragile_abs: float = 0.1):
    """Verdict on "the values are monotone in Y" (:mod:`fedpriv.verdicts`).

    ``exact``: ``values[i]`` is one deterministic number per Y (e.g. non-private FreD of fixed
    data): reproduced iff strictly monotone (:func:`fedpriv.verdicts.check`). Otherwise
    ``values[i]`` holds per-trial/seed values (``{trial or seed: value}`` pairs them across Ys)
    and every consecutive pair is compared by its 90 % interval (:func:`fedpriv.verdicts.monotone`;
    no trivial baseline: FreD has none and the perplexity claims' unigram baseline is not
    computed here). ``source``: "paper" or "project" (our own diagnostic); ``fragile_abs``: the
    absolute fragility tolerance in the values' units (FreD: 0, the relative rule only).
    """
    from fedpriv import verdicts as V
    if exact:
        flat = []
        for v in values:
            f = [float(x) for x in (v.values() if isinstance(v, dict) else v)]
            if len(f) != 1 or not math.isfinite(f[0]):
                raise ValueError(f"monotone_verdict({claim!r}): exact needs one finite value per Y")
            flat.append(f[0])
        gaps = [(a - b) if decreasing else (b - a) for a, b in zip(flat, flat[1:])]
        return V.check(claim, all(g > 0 for g in gaps),
                       ", ".join(f"Y={y:g}: {v:.{digits}g}" for y, v in zip(ys, flat)),
                       basis="one deterministic value per Y (no sampling noise)", source=source)
    return V.monotone(claim, list(ys), list(values), increasing=not decreasing, higher_is_better=False,
                      trivial=None, label="Y", digits=digits, source=source, fragile_abs=fragile_abs)


def separation_verdict(claim: str, closer: Sequence[float], farther: Sequence[float],
                       names: tuple[str, str], digits: int = 5):
    """Verdict on "every ``closer`` value is below every ``farther`` value" (max < min), a
    statement about every observed trial (:func:`fedpriv.verdicts.check`)."""
    from fedpriv import verdicts as V
    ok = max(closer) < min(farther)
    return V.check(claim, ok,
                   f"{names[0]} in [{min(closer):.{digits}g}, {max(closer):.{digits}g}], "
                   f"{names[1]} in [{min(farther):.{digits}g}, {max(farther):.{digits}g}] "
                   f"over {len(closer)} trials; margin {min(farther) - max(closer):+.{digits}g}",
                   basis=f"every one of the {len(closer)} observed trials")


#: (ours) Figure 2's resolution check, judged at read time by ``experiments.rejudge`` with
#: :func:`fedpriv.verdicts.orders_agree` on the stored per-trial private FreD and the noise-free
#: FreD of the release's estimand
AGREEMENT_CLAIM = ("(ours) private FreD orders every consecutive pair of Ys as the noise-free FreD of what the "
                   "release estimates does, in every trial (the release's resolution, whatever the data's own "
                   "direction)")


# ============================================================================================
# Figure 2
# ============================================================================================

CURVES = (("nonprivate_full", "non-private (full embedding)", "o-"),
          ("nonprivate", "non-private (PCA basis)", "^-"),
          ("nonprivate_user", "non-private (release space, user-weighted)", "v:"))


def plot_fred_vs_y(fr: dict, path: str, pair: tuple[float, float] = (99, 100),
                   title: str = "", curves: Sequence[str] = tuple(k for k, _, _ in CURVES)) -> str:
    """Figure 2: left, FreD vs Y (non-private ``curves``, keys of ``fr`` among :data:`CURVES`;
    private mean ± std over trials); right, private FreD of the ``pair`` Ys per trial with
    min-max bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ys = np.asarray(fr["y"], float)
    priv = np.asarray(fr["private"], float)  # [trials, Y]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.errorbar(ys, priv.mean(0), yerr=priv.std(0, ddof=1) if len(priv) > 1 else None, fmt="s--",
               color="C3", capsize=3, label=f"private FreD (mean ± std, {len(priv)} trials)")
    a.set_xlabel("Y (% of prefinetuning data from the private distribution)")
    a.set_ylabel("private FreD to the private users", color="C3")
    a.grid(alpha=0.3)
    a2 = a.twinx()  # the private values carry the PSD projection's bias: own axis
    for key, label, style in CURVES:
        if key in fr and key in curves:
            a2.plot(ys, fr[key], style, label=label)
    a2.set_ylabel("non-private FreD")
    h1, l1 = a.get_legend_handles_labels()
    h2, l2 = a2.get_legend_handles_labels()
    a.legend(h1 + h2, l1 + l2, fontsize=7)
    idx = [list(fr["y"]).index(p) for p in pair if p in fr["y"]]
    for t in range(len(priv)):  # one line per trial: both Ys share that trial's release
        b.plot(range(len(idx)), priv[t, idx], "-o", color=f"C{t % 10}", alpha=0.6, ms=4,
               label=f"trial {t}")
    for j, i in enumerate(idx):
        v = priv[:, i]
        x = j + (0.15 if j else -0.15)
        b.errorbar([x], [v.mean()], yerr=[[v.mean() - v.min()], [v.max() - v.mean()]], fmt="s",
                   color="k", capsize=6)
    b.legend(fontsize=7)
    b.set_xticks(range(len(idx)), [f"{fr['y'][i]:g}%" for i in idx])
    b.set_xlim(-0.6, len(idx) - 0.4)
    b.set_ylabel("private FreD (trials; bars: min-max)")
    b.grid(alpha=0.3)
    return report.save_figure(fig, path, title)
