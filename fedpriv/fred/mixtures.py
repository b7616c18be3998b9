"""Prefinetuning mixtures (Hou et al. 2023 §4.2, Table 2 and Figure 2) at small scale.

The paper's prefinetuning candidates are mixtures: ``Y%`` sentences from the private
distribution (StackOverflow-train1, users disjoint from the FL users of StackOverflow-train2)
and ``100 - Y%`` Wikitext, at a fixed total size. FreD (non-private and private) is computed
for every ``Y``; each mixture is then prefinetuned on and DP FL-finetuned, test perplexity
before and after (Table 2). Here: private-distribution text = messages of held-out chitchat
senders (:data:`fedpriv.fred.embed.HELD_OUT`), public = Wikipedia sentences, private users =
the training split of the other chitchat senders (as in :mod:`fedpriv.fred.pipeline`).

Mixtures are *nested*: each pool is shuffled once and a mixture at ``Y`` is the first
``k = round(Y * total / 100)`` sentences of the private-distribution pool plus the first
``total - k`` of the public pool. So the 99% and 100% sets share 99% of their sentences, and
the pools are embedded once: a mixture's embeddings are the same prefixes of the pools'
embeddings (FreD for every ``Y`` is post-processing of one release per trial).

Stages (``fedpriv.fl.stages.run_stages``, resumable; ``workdir/<i>-<name>``): ``FreD`` (embed
the pools and users once, non-private FreD per Y, one Algorithm-1 release per trial reused for
every Y; trial 0's release is charged to the pipeline ledger, the other trials are replicates
of the experiment, each of which would cost the same), then one stage per (Y, seed):
prefinetune on the mixture, test perplexity, DP-FTRL FL-finetune under a copy of the ledger
after FreD (z calibrated to what FreD left of the budget), test perplexity.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from fedpriv import report
from fedpriv.fred.distance import gaussian_stats, pca_basis
from fedpriv.fred.embed import HELD_OUT, embed_all
from fedpriv.fred.private import fred, private_stats

__verdict_code__ = ("monotone_verdict", "separation_verdict")  # read-time code (experiments.results.verdict_code)
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
              n_public: float | None = None, ledger=None, name: str = RELEASE) -> dict:
    """Non-private FreD and private FreD (``trials`` releases) of every mixture.

    ``priv_emb``: user -> ``[n_u, d]``; ``pools``: ``{HELD_OUT: [n, d], PUBLIC: [n, d]}``.
    Release ``t`` uses ``fold_in(key(seed), t)``; only release 0 is charged to ``ledger`` (the
    others are replicates of the experiment). Every release is reused for every ``Y``.
    ``n_public``: the declared denominator (required under an add/remove relation, where the
    exact user count is private: ``fedpriv.fred.private`` module doc); each release's ``n``.
    Returns JSON-able ``{"y", "nonprivate", "nonprivate_full", "private": [trial][y], ...}``.
    """
    basis = _basis(pools, pca_dims)
    proj = (lambda e: np.asarray(e, np.float64) @ basis) if basis is not None else np.asarray
    mixes = {y: mixture(pools[HELD_OUT], pools[PUBLIC], y, total) for y in y_percents}
    stats = {y: gaussian_stats(proj(m)) for y, m in mixes.items()}
    out = {"y": list(y_percents),
           **nonprivate_fred_vs_y(priv_emb, pools, y_percents, total, pca_dims, basis),
           "private": [], "releases": []}
    users = [proj(priv_emb[u]) for u in priv_emb]
    for t in range(trials):
        rel = private_stats(users, clip, epsilon, delta, unit=unit,
                            key=jax.random.fold_in(jax.random.key(seed), t),
                            ledger=ledger if t == 0 else None, name=name, n_public=n_public)
        out["private"].append([fred(stats[y], rel) for y in y_percents])
        out["releases"].append({"trial": t, "charged": t == 0, "epsilon_basic": rel.epsilon_basic,
                                "delta_total": rel.delta_total, "epsilon_rdp": rel.epsilon_rdp,
                                "epsilon_pld": rel.epsilon_pld, "n": rel.n,
                                "noise_multiplier": rel.noise_multiplier})
    return out


def trials_epsilon(epsilon: float, delta: float, trials: int, at_delta: float) -> float:
    """Epsilon at ``at_delta`` of ``trials`` FreD releases (mean + covariance, each Gaussian at
    ``(epsilon, delta)``) of the same users together: what the spread over trials would cost if
    every trial were charged (only trial 0 is; the others are replicates of the experiment)."""
    from fedpriv.dp import accounting, moments
    release = moments.release_event(moments.moment_events(moments.gaussian_sigma(epsilon, delta)))
    return accounting.compute_epsilon([release] * trials, at_delta)[0]


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


# ============================================================================================
# Figure 2
# ============================================================================================

def plot_fred_vs_y(fr: dict, path: str, pair: tuple[float, float] = (99, 100),
                   title: str = "") -> str:
    """Figure 2: left, FreD vs Y (non-private; private mean ± std over trials); right, private
    FreD of the ``pair`` Ys per trial with min-max bars."""
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
    for key, label, style in (("nonprivate_full", "non-private (full embedding)", "o-"),
                              ("nonprivate", "non-private (PCA basis)", "^-"),
                              ("nonprivate_user", "non-private (PCA, user-weighted)", "v:")):
        if key in fr:
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


# ============================================================================================
# The experiment's stages
# ============================================================================================

def build_data(cfg, progress: bool = True):
    """``(train, val, test, pools, fred_private)``: the private users' splits, the two pools
    (``{HELD_OUT: [str], PUBLIC: [str]}``, ``num_sentences`` each, shuffled) and each training
    user's FreD sentences. Same draws as :func:`fedpriv.fred.pipeline.build_data` (the Simpsons
    candidate is dropped)."""
    from fedpriv.fred.pipeline import build_data as pipeline_data
    tr, va, te, candidates, fred_private = pipeline_data(cfg, progress)
    pools = shuffled_pools({HELD_OUT: candidates[HELD_OUT], PUBLIC: candidates[PUBLIC]}, cfg.seed)
    for name, texts in pools.items():
        if len(texts) < cfg.num_sentences:
            raise ValueError(f"pool {name!r} has {len(texts)} sentences < num_sentences "
                             f"{cfg.num_sentences}")
    return tr, va, te, pools, fred_private


def stage_name(y: float, seed: int) -> str:
    return f"Y={y:g}% seed={seed}"


def _fred_stage(cfg, pools, fred_private, progress) -> Callable:
    from fedpriv.fred.pipeline import fred_declared_users
    from fedpriv.models import bert

    def run(ctx) -> dict:
        t0 = time.time()
        embedder = bert.load_embedder(max_length=cfg.embed_max_length)
        priv_emb, pool_emb, throughput = embed_all(embedder, fred_private, pools, cfg.embed_batch,
                                                   os.path.join(ctx.workdir, "embeddings.npz"),
                                                   progress=progress)
        fr = fred_vs_y(priv_emb, pool_emb, cfg.y_percents, cfg.num_sentences,
                       trials=cfg.fred_trials, clip=cfg.fred_clip, epsilon=cfg.fred_epsilon,
                       delta=cfg.fred_delta, unit="user", seed=cfg.seed, pca_dims=cfg.pca_dims,
                       n_public=fred_declared_users(cfg), ledger=ctx.ledger, name=RELEASE)
        return {**fr, "embedder_sentences_per_s": throughput,
                "embedded_sentences": int(sum(len(v) for v in priv_emb.values())
                                          + sum(len(v) for v in pool_emb.values())),
                # the declared count (the exact one is private under the add/remove ledger)
                "private_users": fred_declared_users(cfg), "ledger_after_fred": ctx.ledger.to_dict(),
                "wall_s": time.time() - t0}
    return run


def _finetune_stage(cfg, y: float, seed: int, lm_data: Callable, pools, progress) -> Callable:
    from fedpriv.data import encode_examples
    from fedpriv.dp.ledger import PrivacyLedger
    from fedpriv.models.metrics import evaluate
    from fedpriv.public.pretrain import adam_with_clipping, train_central
    from fedpriv.recipes import lm as lm_recipe

    def run(ctx) -> dict:
        t0 = time.time()
        lm = dataclasses.replace(cfg.lm, seed=seed)
        prepared, task, test_tokens = lm_data()
        texts = mixture(pools[HELD_OUT], pools[PUBLIC], y, cfg.num_sentences)
        data = {"tokens": encode_examples(prepared.tokenizer.encode(texts), lm.seq_len)}
        params = task.init(jax.random.key(seed))
        params, _ = train_central(task.loss_fn, params, data, steps=cfg.prefinetune_steps,
                                  batch_size=cfg.prefinetune_batch, seed=seed,
                                  optimizer=adam_with_clipping(cfg.prefinetune_lr),
                                  workdir=os.path.join(ctx.workdir, "prefinetune"),
                                  progress=progress, desc=f"prefinetune Y={y:g}%",
                                  log=ctx.log if progress else None)
        before = evaluate(task, params, test_tokens, lm.eval_batch_size)
        # counterfactual: every (Y, seed) run starts from the ledger after FreD (trial 0)
        led = PrivacyLedger.from_dict(ctx.results["FreD"]["ledger_after_fred"])
        s = lm_recipe.run_lm_fl(lm, os.path.join(ctx.workdir, "fl"), prepared=prepared,
                                init_params=params, ledger=led, progress=progress,
                                log=ctx.log if progress else (lambda _: None),
                                stage=f"DP-FTRL FL-finetune (Y={y:g}%)")
        return {"y": y, "seed": seed, "prefinetune_examples": int(len(data["tokens"])),
                "test_ppl_before_fl": before["perplexity"],
                "test_ppl_after_fl": float(math.exp(s["test_loss"])),
                "test_acc_before_fl": before["accuracy"], "test_acc_after_fl": s["test_accuracy"],
                "fl_noise_multiplier": s["noise_multiplier"], "fl_epsilon_alone": s["epsilon"],
                "pipeline_epsilon": led.spent(), "ledger": led.report(), "wall_s": time.time() - t0}
    return run


def run_mixtures(cfg, workdir: str, progress: bool = True) -> dict:
    """Run (or resume) the mixture experiment of ``cfg`` (``configs/fred_mixtures.py``).

    Returns ``{"fred": FreD stage result, "runs": [(Y, seed) results], "ledger", "resumed"}``.
    """
    from fedpriv.data import load_public_pool, train_sentencepiece
    from fedpriv.dp.ledger import PrivacyLedger
    from fedpriv.fl.stages import Stage, run_stages, stage_dir
    from fedpriv.recipes import lm as lm_recipe

    lm = cfg.lm
    os.makedirs(workdir, exist_ok=True)
    tr, va, te, pools, fred_private = build_data(cfg, progress)
    cache = {}

    def lm_data():
        """(prepared data, task, test tokens), built once on first use."""
        if not cache:
            tok = train_sentencepiece(load_public_pool(progress=progress).texts,
                                      vocab_size=lm.vocab_size)
            kw = dict(seq_len=lm.seq_len, max_examples_per_client=lm.max_examples_per_client,
                      batch_size=lm.batch_size, seed=cfg.seed)
            datasets = [t.to_dataset(tok, **kw) for t in (tr, va, te)]
            stats = {"corpus": "chitchat (private half)", "vocab_size": tok.vocab_size,
                     "train_clients": len(datasets[0]), "test_clients": len(datasets[2])}
            cache["v"] = (lm_recipe.Prepared(*datasets, tok, stats),
                          lm_recipe.build_task(lm, tok.vocab_size),
                          datasets[2].concat_examples()["tokens"][: lm.max_eval_examples])
        return cache["v"]

    stages = [Stage("FreD", _fred_stage(cfg, pools, fred_private, progress))]
    stages += [Stage(stage_name(y, s), _finetune_stage(cfg, y, s, lm_data, pools, progress))
               for s in cfg.seeds for y in cfg.fl_y_percents]  # seed-major: each seed a full table
    ledger = PrivacyLedger(cfg.total_epsilon, lm.delta, unit="user")
    out = run_stages(stages, workdir, ledger, fingerprint=dataclasses.asdict(cfg),
                     log=print if progress else (lambda _: None))
    fr = out.results["FreD"]
    if "nonprivate_user" not in fr:  # a FreD stage recorded before this column existed
        priv_emb, pool_emb, _ = embed_all(None, {}, {}, cfg.embed_batch,
                                          os.path.join(stage_dir(workdir, 0, "FreD"), "embeddings.npz"))
        fr = {**fr, **nonprivate_fred_vs_y(priv_emb, pool_emb, cfg.y_percents, cfg.num_sentences,
                                           cfg.pca_dims)}
    return {"fred": fr, "runs": [out.results[s.name] for s in stages[1:]],
            "ledger": out.ledger, "resumed": out.resumed}
