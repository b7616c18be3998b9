"""Recipe: Wang et al. 2023 Figure 3 -- perplexity of private vs public samples under a NON-PRIVATE
"oracle" on-device LM (trained centrally on the private training users, never released, in no
ledger) and under the public LLM (the teacher).
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from fedpriv import report, verdicts as V
from fedpriv.data import load_public_pool
from fedpriv.data.errors import ConfigError
from fedpriv.models import gguf
from fedpriv.public import distill, pretrain
from fedpriv.public.algorithm import private_logprob
from fedpriv.public.pool import build_public_pool
from fedpriv.public.vocab import RestrictedTeacherTokenizer, restriction_from_texts, unk_class_size
from fedpriv.recipes.public import _task, private_splits

# --------------------------------------------------------------------------------------------

NONPRIVATE_ORACLE = ("NON-PRIVATE: the oracle on-device LM is trained centrally, without DP "
                     "noise, on the private training users' text (Wang et al. §5.1, Figure 3); "
                     "neither it nor anything computed from it is covered by any privacy ledger "
                     "or released")


@dataclasses.dataclass
class Figure3Samples:
    """Per-sample values of Figure 3: ``rows`` (one dict per sample: set, source, text,
    nll/ppl under the oracle and the LLM, targets), the data statistics, the oracle's history;
    ``tokens`` (student ids of every sample, row order), ``task`` and ``params`` (the oracle) to
    recompute them. None of it is released (see `NONPRIVATE_ORACLE`)."""
    rows: list
    stats: dict
    oracle_history: list
    tokens: np.ndarray | None = None
    task: object = None
    params: object = None


def figure3_samples(cfg, workdir: str, *, teacher=None, progress: bool = True,
                    log=print, cache_dir: str | None = None) -> Figure3Samples:
    """N private messages of held-out (test-split) users and N public-pool sentences, scored by
    (a) a NON-PRIVATE oracle LM trained centrally on the training users (``cfg.oracle_steps``
    Adam steps, resumable in ``workdir/oracle``) and (b) the teacher (`build_public_pool`'s
    cached ``log p_pub``). Both score the same corpus-form sequences (teacher BOS + first L
    tokens + EOS if it fits) at the same positions; NLL = −mean token log-prob, PPL = exp(NLL).
    The oracle's NLL spreads p(UNK) over the teacher ids folded into UNK (`private_logprob`), so
    both are per-teacher-token perplexities. ``cache_dir``: the teacher's cache (default
    ``workdir/teacher_cache``; keyed by content, so seeds can share one)."""
    teacher = teacher or gguf.cached_teacher(cfg.teacher_path)
    pub = load_public_pool(progress=progress)
    rng = np.random.default_rng(cfg.sample_seed)
    vocab_idx = (np.arange(len(pub)) if cfg.vocab_texts is None or cfg.vocab_texts >= len(pub)
                 else np.sort(rng.choice(len(pub), cfg.vocab_texts, replace=False)))
    restriction = (distill.VocabRestriction.full(teacher) if cfg.vocab_kept is None else
                   restriction_from_texts(teacher, [pub.texts[i] for i in vocab_idx],
                                          cfg.vocab_kept))
    tok = RestrictedTeacherTokenizer(teacher, restriction)
    text, train, _, test = private_splits(cfg, tok, progress)
    held = [m for c in test.client_ids for m in text[c] if m.strip()]
    for what, have in (("messages of held-out users", len(held)), ("public-pool sentences", len(pub))):
        if cfg.num_samples > have:  # never fewer samples than asked, silently (as the FreD configs refuse)
            raise ConfigError(f"num_samples={cfg.num_samples:,} but there are {have:,} {what}: set num_samples "
                              f"<= {have:,} (the paper's 10,000 private samples need a larger held-out population)")
    n_priv = n_pub = cfg.num_samples
    priv_sel = np.sort(np.random.default_rng([cfg.sample_seed, 1]).choice(len(held), n_priv,
                                                                           replace=False))
    pub_sel = np.sort(np.random.default_rng([cfg.sample_seed, 2]).choice(len(pub), n_pub,
                                                                          replace=False))
    texts = [held[i] for i in priv_sel] + [pub.texts[i] for i in pub_sel]
    sets = ["private"] * n_priv + ["public"] * n_pub
    sources = ["private (held-out users)"] * n_priv + [pub.sources[i] for i in pub_sel]
    log(f"figure 3: {n_priv} private messages of {len(test)} held-out users, {n_pub} public "
        "sentences; teacher pass (cached)")
    scored = build_public_pool(teacher, texts, sources, restriction, seq_len=cfg.seq_len,
                               cache_dir=cache_dir or os.path.join(workdir, "teacher_cache"),
                               with_topk=False, batch_size=cfg.teacher_batch_size,
                               progress=progress)
    task = _task(cfg, tok.vocab_size)
    train_tokens = train.concat_examples()["tokens"]
    log(f"oracle (NON-PRIVATE): {cfg.oracle_steps} central steps on {len(train_tokens)} "
        f"sequences of {len(train)} training users")
    params, hist = pretrain.train_central(
        task.loss_fn, task.init(jax.random.key(cfg.seed)), {"tokens": train_tokens},
        steps=cfg.oracle_steps, batch_size=min(cfg.oracle_batch_size, len(train_tokens)),
        seed=cfg.seed, optimizer=pretrain.adam_with_clipping(cfg.oracle_lr, 1.0),
        workdir=os.path.join(workdir, "oracle"), progress=progress,
        desc="oracle (non-private)", log=log)
    lp_oracle = private_logprob(task, params, scored, cfg.score_batch_size,
                                unk_correction=cfg.unk_correction)
    targets = scored.tokens[:, 1:]
    n_targets = (targets != 0).sum(1)
    rows = []
    for i in range(len(texts)):
        nll_o, nll_t = -float(lp_oracle[i]), -float(scored.logp_pub[i])
        rows.append({"set": sets[i], "source": sources[i], "targets": int(n_targets[i]),
                     "nll_oracle": nll_o, "ppl_oracle": float(np.exp(nll_o)),
                     "nll_llm": nll_t, "ppl_llm": float(np.exp(nll_t)), "text": texts[i]})
    stats = {"train_clients": len(train), "train_sequences": int(len(train_tokens)),
             "heldout_clients": len(test), "private_samples": n_priv, "public_samples": n_pub,
             "student_vocab_size": tok.vocab_size, "unk_class_size": unk_class_size(restriction),
             "teacher": {"file": os.path.basename(teacher.path or ""),
                         "sha256": teacher.fingerprint}}
    return Figure3Samples(rows, stats, hist, scored.tokens, task, params)


MODELS = (("oracle on-device LM (non-private)", "nll_oracle"), ("public LLM (teacher)", "nll_llm"))


def _by_seed(rows: list[dict]) -> dict:
    """``{seed: rows}`` (rows without a ``seed`` key are one seed, 0)."""
    out: dict = {}
    for r in rows:
        out.setdefault(int(r.get("seed", 0)), []).append(r)
    return out


def _stats(rows: list[dict], s: str, key: str) -> tuple[float, float]:
    """(median, IQR) of ``key`` (a NLL = log PPL) over the samples of set ``s``."""
    v = np.array([r[key] for r in rows if r["set"] == s], np.float64)
    q1, med, q3 = np.percentile(v, [25, 50, 75]) if len(v) else (np.nan,) * 3
    return float(med), float(q3 - q1)


def figure3_summary(rows: list[dict]) -> list[dict]:
    """Median PPL, median and IQR of log PPL (= NLL) of each set under each model: per seed
    (an oracle and a sample draw), then mean ± std over seeds (one seed: std empty)."""
    seeds, out = _by_seed(rows), []
    for s in ("private", "public"):
        for model, key in MODELS:
            per = [_stats(rs, s, key) for rs in seeds.values()]
            med_m, med_s, _ = report.mean_std([m for m, _ in per])
            iqr_m, iqr_s, _ = report.mean_std([q for _, q in per])
            n = [sum(r["set"] == s for r in rs) for rs in seeds.values()]
            out.append({"set": s, "model": model, "samples": int(np.mean(n)) if n else 0,
                        "seeds": len(seeds),
                        "median PPL": float(np.exp(med_m)) if med_m is not None else None,
                        "median log PPL": med_m, "median log PPL std": med_s,
                        "IQR of log PPL": iqr_m, "IQR of log PPL std": iqr_s})
    return out


def figure3_verdicts(rows: list[dict]) -> list:
    """Figure 3's claims, from per-seed statistics paired by seed (each seed draws its own
    private and public samples; :mod:`fedpriv.verdicts`, 90 % interval): private samples have
    lower median PPL than public ones under the oracle, and also under the public LLM; public
    samples are more dispersed (larger IQR of log PPL, under each model). No trivial baseline:
    these compare two sample sets under one model, not two models' quality."""
    seeds = _by_seed(rows)

    def per_seed(s, key, i):
        return {seed: _stats(rs, s, key)[i] for seed, rs in seeds.items()}
    out = [V.compare(
        "private samples have lower median PPL under the oracle than public samples (Figure 3)",
        per_seed("private", "nll_oracle", 0), per_seed("public", "nll_oracle", 0),
        higher_is_better=False, trivial=None, names=("private median log PPL", "public median log PPL")),
        V.compare(
        "private samples also have low perplexity under the public LLM: lower median PPL than public "
        "samples (Figure 3)", per_seed("private", "nll_llm", 0), per_seed("public", "nll_llm", 0),
        higher_is_better=False, trivial=None, names=("private median log PPL", "public median log PPL"))]
    for key, model in (("nll_oracle", "oracle"), ("nll_llm", "LLM")):
        out.append(V.compare(
            f"public samples are more dispersed than private ones (IQR of log PPL under the "
            f"{model}; Figure 3)", per_seed("public", key, 1), per_seed("private", key, 1),
            higher_is_better=True, trivial=None, names=("public IQR", "private IQR")))
    return out


def plot_figure3(rows: list[dict], path: str, title: str = "") -> str:
    """Scatter (with marginal 2-D density contours) of (log PPL under the oracle, log PPL under
    the LLM), private vs public coloured."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 5))
    for s, color in (("private", "tab:blue"), ("public", "tab:orange")):
        x = np.array([r["nll_oracle"] for r in rows if r["set"] == s])
        y = np.array([r["nll_llm"] for r in rows if r["set"] == s])
        ax.scatter(x, y, s=6, alpha=0.35, color=color, label=f"{s} (n={len(x)})")
        if len(x) >= 50:  # a 2-D histogram's contours where there are enough samples
            h, xe, ye = np.histogram2d(x, y, bins=30)
            ax.contour((xe[:-1] + xe[1:]) / 2, (ye[:-1] + ye[1:]) / 2, h.T, levels=4,
                       colors=color, linewidths=0.8)
    ax.set_xlabel("log PPL under the oracle on-device LM (NON-PRIVATE)")
    ax.set_ylabel("log PPL under the public LLM (teacher)")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    return report.save_figure(fig, path)
