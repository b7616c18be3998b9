"""Recipe: the public-training rows of Wang et al. 2023 (Table 2, Table 3 "w/o p_pub"; §3.2–§5).

Turns a ``configs/public_training.py`` config into the data (`prepare`: vocabulary from the
public pool, private users and the public pool in student ids, the teacher's passes), one
`PublicTrainingSpec` per row (`row_spec`), every (seed, epsilon, row) run (`run_rows`: Algorithm 1
through `fedpriv.public.algorithm`, the no-public row through `private_only`) and the
aggregation over seeds (`aggregate`, `aggregate_shares`, `teacher_rows`, `table_notes`).
``experiments/public_training.py`` writes the artefacts::

    from fedpriv.recipes import public
    rr = public.run_rows(cfg, "runs/public_training")
    table = public.aggregate(cfg, rr.runs)

The first T' rounds are shared by ``none`` and the mid-training rows (computed once in
``seed*/eps*/_stage1``, then forked: rounds and keys are functions of (seed, round), so a fork
equals a fresh run). Each row's whole T-round DP-FTRL event is in its ledger before round 0;
public training is recorded as post-processing. Rows resume from their workdirs; a row whose
``summary.json`` exists is skipped.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import json
import os
import time

import jax
import numpy as np

from fedpriv import report, verdicts as V
from fedpriv.data.errors import ConfigError
from fedpriv.dp import accounting
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl import algorithms as algs
from fedpriv.models import gguf
from fedpriv.models.lm import LMConfig, count_params, make_lm, make_lm_task
from fedpriv.models.metrics import evaluate, most_frequent_token_accuracy
from fedpriv.public import distill, select, vocab
from fedpriv.public.algorithm import PrivateTraining, PublicTrainingSpec, algorithm1, private_only
from fedpriv.public.pool import PublicPool, build_public_pool
from fedpriv.recipes import lm

# read-time code: the page re-judges the stored numbers with it, so its changes do not make a
# run stale (experiments.results.verdict_code)
__verdict_code__ = ("MEANINGFUL_PP", "MEANINGFUL_REL", "WEAK_PRIVACY_EPSILON", "SEVEN_POINTS",
                    "NEGLIGIBLE_MARGIN_PP", "NONINFERIOR_MARGIN_PP", "paper_value", "paper_supports",
                    "_not_the_papers", "margin_at_our_level", "_mean", "verdicts", "zero_shot_verdicts",
                    "_arch_verdicts", "_EpsClaims", "_pair_verdicts", "_small_q_verdicts",
                    "_distillation_verdicts", "_equivalent", "_noninferior")
# Wang et al. 2023, Table 2, LSTM column (test accuracy %, StackOverflow): eps 1.77, eps 18.71
PAPER_TABLE2_LSTM = {
    "none": (20.68, 28.87), "pretrain_lm": (28.01, 30.70), "pretrain_distill_long": (28.68, 31.13),
    "pretrain_distill": (26.18, 29.53), "mid_random_lm": (26.67, 29.76), "mid_random": (27.01, 30.18),
    "mid_dm": (28.01, 30.63),
}
# Table 2's Transformer columns (eps 1.77, 18.71); Table 3's "w/o p_pub" row is mid_dm_priv_only
PAPER_TABLE2_TRANSFORMER = {
    "none": (23.98, 28.29), "pretrain_lm": (28.05, 30.10), "pretrain_distill_long": (27.75, 30.19),
    "pretrain_distill": (25.31, 29.36), "mid_random_lm": (25.83, 29.15), "mid_random": (26.04, 29.47),
    "mid_dm": (27.17, 29.83),
}
PAPER_TABLE3 = {"lstm": {"mid_dm": (28.01, 30.63), "mid_dm_priv_only": (27.77, 30.56)},
                "transformer": {"mid_dm": (27.17, 29.83), "mid_dm_priv_only": (26.70, 30.18)}}
PAPER_TABLE2 = {"lstm": PAPER_TABLE2_LSTM, "transformer": PAPER_TABLE2_TRANSFORMER}


def arch_of(run: dict) -> str:
    """The student a run trained (runs from before the Transformer column were LSTMs)."""
    return run.get("arch") or "lstm"

TITLES = {
    "none": "No public training",
    "pretrain_lm": "Pre-training w/ public data (T'=0, LM loss)",
    "pretrain_distill_long": "Pre-training w/ LLM distillation, long, larger q (T'=0; paper: 100k steps on 1%)",
    "pretrain_distill": "Pre-training w/ LLM distillation (T'=0)",
    "mid_random_lm": "Mid-training (T'=T/2) w/ public data, no distillation",
    "mid_random": "Mid-training (T'=T/2) w/ LLM distillation",
    "mid_dm": "+ distribution matching (beta=0.5)",
    "mid_dm_priv_only": "+ distribution matching w/o p_pub (beta=1)",
}


@dataclasses.dataclass
class Prepared:
    train: object
    val: object
    test: object
    tokenizer: vocab.RestrictedTeacherTokenizer
    pool: PublicPool
    stats: dict


@dataclasses.dataclass
class RowRuns:
    """What `run_rows` returns: one summary per (seed, epsilon, row), the source shares of the
    matching rows, the privacy of each epsilon, the data, the most-frequent-token test accuracy
    and the task (one task for all runs: compilations reused)."""
    runs: list
    shares: list
    privacy: dict
    prepared: Prepared
    mft: float
    task: object


def private_splits(cfg, tok, progress: bool = True):
    """``(text, train, val, test)``: the private users of ``cfg.corpus`` (at most ``max_clients``,
    drawn with ``split_seed``), split by client and tokenized with the student tokenizer ``tok``
    (``fedpriv.public.vocab.private_datasets``)."""
    text = lm.load_corpus(cfg, progress)  # packaged, or the papers' own file (corpus_path)
    if cfg.max_clients is not None and cfg.max_clients < len(text):
        ids = np.random.default_rng(cfg.split_seed).choice(len(text.client_ids), cfg.max_clients,
                                                           replace=False)
        text = text.subset([text.client_ids[i] for i in sorted(ids)])
    train, val, test = vocab.private_datasets(
        text, tok, split=cfg.split, split_seed=cfg.split_seed, seq_len=cfg.seq_len,
        max_examples_per_client=cfg.max_examples_per_client, batch_size=cfg.batch_size,
        seed=cfg.split_seed)
    return text, train, val, test


def prepare(cfg, teacher, cache_dir: str, progress: bool = True, log=print) -> Prepared:
    """Vocabulary from the public pool, private users and the public pool in student ids, the
    teacher's passes over the pool (log p_pub, top-k corpus; cached in `cache_dir`). The pool is
    ``public_pool_path`` (e.g. the paper's C4 realnewslike as a TFDS directory) or the packaged one."""
    pub = lm.load_public(cfg, progress)
    rng = np.random.default_rng(cfg.pool_seed)
    if cfg.vocab_kept is None:
        restriction = distill.VocabRestriction.full(teacher)
    else:
        vocab_idx = (np.arange(len(pub)) if cfg.vocab_texts is None or cfg.vocab_texts >= len(pub)
                     else np.sort(rng.choice(len(pub), cfg.vocab_texts, replace=False)))
        restriction = vocab.restriction_from_texts(teacher, [pub.texts[i] for i in vocab_idx],
                                                      cfg.vocab_kept)
    tok = vocab.RestrictedTeacherTokenizer(teacher, restriction)
    text, train, val, test = private_splits(cfg, tok, progress)
    n = len(pub) if cfg.pool_size is None else min(cfg.pool_size, len(pub))
    sel = np.sort(np.random.default_rng([cfg.pool_seed, 1]).choice(len(pub), n, replace=False))
    log(f"public pool: {n} of {len(pub)} sentences; teacher passes (cached in {cache_dir})")
    pool = build_public_pool(
        teacher, [pub.texts[i] for i in sel], [pub.sources[i] for i in sel], restriction,
        seq_len=cfg.seq_len, k=cfg.topk, cache_dir=cache_dir, with_topk=True,
        batch_size=cfg.teacher_batch_size, logits_dtype=cfg.logits_dtype, progress=progress)
    train_tokens = train.concat_examples()["tokens"]
    stats = {
        "student_vocab_size": tok.vocab_size, "vocab_kept": len(restriction.kept_teacher_ids),
        "unk_class_size": vocab.unk_class_size(restriction),
        "train_clients": len(train), "train_examples": train.total_examples,
        "val_clients": len(val), "val_examples": val.total_examples,
        "test_clients": len(test), "test_examples": test.total_examples,
        "private_train_unk_rate": vocab.unk_rate(train_tokens),
        "pool_unk_rate": vocab.unk_rate(pool.tokens),
        "pool_sources": {s: c for s, c in zip(*np.unique(pool.sources, return_counts=True))},
        "teacher": {"file": os.path.basename(teacher.path or ""), "sha256": teacher.fingerprint},
        **pool.info,
    }
    stats["pool_sources"] = {str(k): int(v) for k, v in stats["pool_sources"].items()}
    return Prepared(train, val, test, tok, pool, stats)


def row_spec(row: str, cfg, seed: int) -> PublicTrainingSpec:
    """The `PublicTrainingSpec` of a Table-2 row other than "none"."""
    common_kw = dict(kd_beta=cfg.kd_beta, temperature=cfg.temperature, steps=cfg.distill_steps,
                     batch_size=cfg.central_batch_size, learning_rate=cfg.central_lr, seed=seed,
                     unk_correction=cfg.unk_correction, q=cfg.q)
    tp = cfg.t_prime_rounds
    if row == "pretrain_lm":
        return PublicTrainingSpec(
            t_prime=0,
            selection="all" if cfg.pretrain_fraction >= 1 else "random",
            **{**common_kw, "q": cfg.pretrain_fraction, "kd_beta": 0.0,
               "steps": cfg.pretrain_steps})
    if row == "pretrain_distill":
        return PublicTrainingSpec(t_prime=0, selection="random", **common_kw)
    if row == "pretrain_distill_long":
        return PublicTrainingSpec(t_prime=0, selection="all" if cfg.long_q >= 1 else "random",
                                  **{**common_kw, "q": cfg.long_q, "steps": cfg.long_distill_steps})
    if row == "mid_random_lm":
        return PublicTrainingSpec(t_prime=tp, selection="random", **{**common_kw, "kd_beta": 0.0})
    if row == "mid_random":
        return PublicTrainingSpec(t_prime=tp, selection="random", **common_kw)
    if row == "mid_dm":
        return PublicTrainingSpec(t_prime=tp, selection="matching",
                                           beta=cfg.match_betas[0], **common_kw)
    if row == "mid_dm_priv_only":
        return PublicTrainingSpec(t_prime=tp, selection="matching",
                                           beta=cfg.match_betas[1], **common_kw)
    raise ValueError(f"no spec for row {row!r}")


def _task(cfg, vocab_size: int, train_on_unk: bool = True):
    """The student task of ``cfg``'s model (``lm.model_config``: its LM fields): the same object
    for every `run_rows` call with that model (the points of a sweep), so its compiled steps are
    reused. ``train_on_unk=False``: UNK targets carry no training loss
    (`fedpriv.public.unk_free_loss_task`)."""
    return _model_task(lm.model_config(cfg, vocab_size), train_on_unk)


@functools.lru_cache(maxsize=4)
def _model_task(model: LMConfig, train_on_unk: bool):
    task = make_lm_task(make_lm(model))
    return task if train_on_unk else vocab.unk_free_loss_task(task)


_NOT_IN_RUN_KEY = ("rows", "seeds", "seed", "epsilons", "target_epsilon", "noise_multiplier",
                   "t_prime", "reuse_workdir", "archs", "student_server_lrs", "train_missing",
                   "epsilon_server_lrs")


def at_epsilon(cfg, eps: float):
    """``cfg`` for its runs at ``eps``: ``server_lr`` = the entry of ``cfg.epsilon_server_lrs``
    (aligned with ``cfg.epsilons``; Wang et al. App. C tune the server lr per epsilon), the list
    dropped; ``cfg`` itself where it has none. Run keys are of this config (the server lr a run
    used), so a run at a per-epsilon lr is the same computation as one configured with that lr."""
    lrs = getattr(cfg, "epsilon_server_lrs", None)
    if not lrs:
        return cfg
    return dataclasses.replace(cfg, server_lr=float(lrs[list(cfg.epsilons).index(eps)]),
                               epsilon_server_lrs=None)


def run_key(cfg, row: str, seed: int, eps: float) -> str:
    """What determines one (row, seed, epsilon) run of `cfg`: every config field except those that
    only choose which runs exist, and T' as the row uses it (0 for pre-training rows). Two runs
    with the same key are the same computation (the engine is deterministic given its seeds)."""
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_IN_RUN_KEY}
    if not fields.get("adaptive_clip"):  # a fixed clip norm: the adaptive fields do nothing (keys of
        for k in ("adaptive_clip", "clip_quantile", "clip_lr", "clip_count_stddev"):  # earlier runs)
            fields.pop(k, None)
    if fields.get("batching") in lm.SAME_NUMBERS_BATCHINGS:
        fields.pop("batching")  # the same computation up to float order (and keys from before it)
    fields.update(row=row, seed=seed, epsilon=float(eps),
                  t_prime=cfg.t_prime_rounds if row.startswith("mid") else 0)
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _find_run(key: str, dirs) -> str | None:
    """The ``summary.json`` of a finished run with `key` under any of `dirs` (searched
    recursively), or None. Summaries without a key (older runs) never match."""
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "summary.json"), recursive=True)):
            try:
                with open(path) as f:
                    if json.load(f).get("run_key") == key:
                        return path
            except (OSError, ValueError):
                continue
    return None


def run_rows(cfg, workdir: str, *, teacher=None, progress: bool = True, log=print,
             cache_dir: str | None = None, reuse_dirs=()) -> RowRuns:
    """Every (seed, epsilon, row) run of `cfg` in ``workdir/seed*/eps*/<row>``.

    ``cache_dir``: where the teacher's passes are cached (default ``workdir/teacher_cache``; the
    cache is keyed by content, so the points of a sweep can share one). ``reuse_dirs``: workdirs
    of other `run_rows` calls; a finished run there with the same `run_key` (the same
    computation, e.g. Table 2's mid_dm at T'=T/2 and Table 4's T'=T/2 point) is read back
    instead of trained again, and its summary copied with ``reused_from``; ``cfg.reuse_workdir``
    is searched too."""
    if getattr(cfg, "reuse_workdir", None):
        reuse_dirs = (*reuse_dirs, cfg.reuse_workdir)
    os.makedirs(workdir, exist_ok=True)
    teacher = teacher or gguf.cached_teacher(cfg.teacher_path)
    prepared = prepare(cfg, teacher, cache_dir or os.path.join(workdir, "teacher_cache"),
                       progress, log)
    T, tp = cfg.rounds, cfg.t_prime_rounds
    task = _task(cfg, prepared.tokenizer.vocab_size, cfg.train_on_unk)  # one task: compilations reused
    ids = list(prepared.train.client_ids)
    val = prepared.val.concat_examples()["tokens"][: cfg.max_eval_examples]
    test = prepared.test.concat_examples()["tokens"][: cfg.max_eval_examples]
    mft = most_frequent_token_accuracy(prepared.train.concat_examples()["tokens"], test)
    eval_fn = lambda p: evaluate(task, p, val, cfg.eval_batch_size)  # noqa: E731
    suggest = vocab.suggestion_eval_task(task)

    def log_row(row):
        if "eval_accuracy" in row:
            log(f"  round {row['round']:4d}: val accuracy {row['eval_accuracy']:.4f}")

    runs, shares_rows, privacy = [], [], {}
    for seed in cfg.seeds:
        init = None  # initialised on the first row that runs (not for skipped rows)
        for eps in cfg.epsilons:
            ecfg = at_epsilon(cfg, eps)
            fcfg = dataclasses.replace(ecfg, seed=seed, target_epsilon=eps, noise_multiplier=None)
            alg, sampler, event, z = lm.build_algorithm(fcfg, len(ids), task.loss_fn)
            eps_val = accounting.compute_epsilon(event, cfg.delta)[0]
            eps_real = None
            if cfg.noise_cohort_size is not None:
                real = algs.privacy_event(alg.dp, sampler, T, simulated=False)
                eps_real = accounting.compute_epsilon(real, cfg.delta)[0]
            pn = lm.paper_noise(fcfg, z, alg, sampler, len(ids), T)  # the paper-noise protocol (or None)
            privacy[f"{eps:g}"] = {"target_epsilon": eps, "epsilon": eps_val, "noise_multiplier": z,
                                   "epsilon_executed_run": eps_real,
                                   "paper_noise": pn.as_dict() if pn is not None else None}
            private = PrivateTraining(
                alg, sampler, prepared.train, ids, rounds=T, batch_size=cfg.batch_size, seed=seed,
                max_steps=cfg.max_local_steps, eval_fn=eval_fn,
                eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every,
                progress=progress, log_fn=log_row, lanes=cfg.lanes, batching=cfg.batching)
            base = os.path.join(workdir, f"seed{seed}", f"eps{eps:g}")
            for row in cfg.rows:
                sub = os.path.join(base, row)
                done = os.path.join(sub, "summary.json")
                key = run_key(ecfg, row, seed, eps)
                summary = _finished_run(done, key, reuse_dirs, sub, log, f"[seed {seed}, eps {eps:g}] {row}")
                if summary is None and not getattr(cfg, "train_missing", True):
                    log(f"[seed {seed}, eps {eps:g}] {row}: not run (train_missing=False), left out")
                    continue
                if summary is None:
                    log(f"[seed {seed}, eps {eps:g}] {row}: {TITLES[row]} (z = {z:.3f})")
                    init = task.init(jax.random.key(seed)) if init is None else init
                    summary = _train_row(
                        cfg, row, private, task, prepared.pool, init, sub, base,
                        {"row": row, "title": TITLES[row], "seed": seed, "arch": cfg.arch, "run_key": key,
                         "target_epsilon": eps, "epsilon": eps_val, "epsilon_executed_run": eps_real,
                         "noise_multiplier": z, "delta": cfg.delta, "unit_of_privacy": "user",
                         "server_lr": ecfg.server_lr, "rounds": T, "t_prime": tp if row.startswith("mid") else 0},
                        (val, test, suggest), progress, log)
                    report.save_json(summary, done)
                runs.append(summary)
                if row.startswith("mid_dm"):
                    beta = summary["spec"]["beta"]
                    for src, r in summary["shares"].items():
                        shares_rows.append({"seed": seed, "target_epsilon": eps, "beta": beta,
                                            "source": src, "pool_share": r["pool_share"],
                                            "selected_share": r["selected_share"],
                                            "lift": r["lift"], "selected": r["selected_count"],
                                            "pool": r["pool_count"]})
    return RowRuns(runs, shares_rows, privacy, prepared, mft, task)


def _finished_run(done: str, key: str, reuse_dirs, sub: str, log, tag: str) -> dict | None:
    """The summary of ``run_rows``' run ``key`` if it finished: in its own folder (``done``, whose
    run key must be ``key``: another computation is never passed off as this one) or, the same
    computation, in one of ``reuse_dirs`` (copied to ``done`` with ``reused_from``); else None."""
    found = None if os.path.exists(done) else _find_run(key, reuse_dirs)
    if found:
        with open(found) as f:
            summary = {**json.load(f), "reused_from": os.path.dirname(found)}
        os.makedirs(sub, exist_ok=True)
        report.save_json(summary, done)
        log(f"{tag}: the same run is in {found}, read back")
        return summary
    if not os.path.exists(done):
        return None
    with open(done) as f:
        summary = json.load(f)
    if summary.get("run_key") != key:
        raise ConfigError(f"{done} is a finished run of another configuration (run key "
                          f"{summary.get('run_key')} != {key}): use another workdir")
    log(f"{tag}: done before, skipped")
    return summary


def _train_row(cfg, row: str, private, task, pool, init, sub: str, base: str, head: dict, evals,
               progress: bool, log) -> dict:
    """Train one Table-2 row of ``run_rows`` (Wang et al. Algorithm 1, or DP-FTRL alone for
    "none") from ``init`` under a fresh ledger of the run's epsilon, evaluate it on ``evals`` =
    (val tokens, test tokens, the suggestion task) and return its summary: ``head`` (the run's
    identity and privacy fields) followed by the results."""
    t0 = time.time()
    seed, tp = head["seed"], cfg.t_prime_rounds
    ledger = PrivacyLedger(head["epsilon"] * (1 + 1e-6), cfg.delta)
    extra: dict = {}
    if row == "none":
        result = private_only(private, init, sub, ledger, stage1_workdir=os.path.join(base, "_stage1"),
                              t_prime=tp)
        run_dir = sub
    else:
        spec = row_spec(row, cfg, seed)
        out = algorithm1(private, task, init, pool, spec, workdir=sub, ledger=ledger, progress=progress,
                         log=log, stage1_workdir=(os.path.join(base, "_stage1") if spec.t_prime else None))
        result, run_dir = out.result, out.workdir
        extra = {"spec": dataclasses.asdict(spec), "public": out.public,
                 "num_selected": int(len(out.selected)), "shares": out.shares}
    params, (val, test, suggest) = result.state.params, evals
    v = evaluate(task, params, val, cfg.eval_batch_size)
    te = evaluate(task, params, test, cfg.eval_batch_size)
    summary = {**head, "final_round": int(result.state.round),
               "val_accuracy": v["accuracy"], "val_loss": v["loss"],
               "test_accuracy": te["accuracy"], "test_loss": te["loss"],
               "wall_clock_s": time.time() - t0,
               "ledger": result.ledger.report() if result.ledger else None,
               "curve": report.metric_curve(run_dir, "eval_accuracy"),
               **extra, **report.git_state()}  # the commit (results page dates by it)
    summary["val_suggestion_accuracy"] = evaluate(suggest, params, val, cfg.eval_batch_size)["accuracy"]
    summary["test_suggestion_accuracy"] = evaluate(suggest, params, test, cfg.eval_batch_size)["accuracy"]
    log(f"  -> val {v['accuracy']:.4f}, test {te['accuracy']:.4f} ({summary['wall_clock_s']:.0f}s)")
    return summary


def aggregate(cfg, runs: list[dict]) -> list[dict]:
    """One row per method: mean ± std over seeds of val/test accuracy at each epsilon, per
    student (``cfg.students``; the columns name the student when there are several)."""
    table = []
    for row in cfg.rows:
        out = {"method": TITLES[row]}
        spec_q = {"none": 0.0, "pretrain_lm": cfg.pretrain_fraction,
                  "pretrain_distill_long": cfg.long_q}.get(row, cfg.q)
        out["q"] = spec_q
        out["distillation"] = "yes" if row not in ("none", "pretrain_lm", "mid_random_lm") else ""
        out["matching"] = {"mid_dm": f"beta={cfg.match_betas[0]:g}",
                           "mid_dm_priv_only": f"beta={cfg.match_betas[1]:g}"}.get(row, "")
        for arch in cfg.students:
            tag = f"{arch} " if len(cfg.students) > 1 else ""
            for eps in cfg.epsilons:
                rs = [r for r in runs if r["row"] == row and r["target_epsilon"] == eps and arch_of(r) == arch]
                for split, key in (("val", "val_accuracy"), ("test", "test_accuracy"),
                                   ("val*", "val_suggestion_accuracy"),
                                   ("test*", "test_suggestion_accuracy")):
                    out[f"{split} {tag}eps={eps:g}"] = report.pm([r.get(key) for r in rs], 100)
                after = [r.get("public", {}).get("eval_after_public_training", {}).get("accuracy")
                         for r in rs]
                m, _, n_after = report.mean_std(after)
                out[f"val after public training {tag}eps={eps:g}"] = (
                    None if m is None else f"{100 * m:.2f}"
                    + (f" (n={n_after})" if n_after < len(rs) else ""))
        for arch in cfg.students:
            paper = PAPER_TABLE2[arch].get(row) or PAPER_TABLE3[arch].get(row)
            for eps in cfg.epsilons:
                i = {1.77: 0, 18.71: 1}.get(eps)
                out[f"paper {'LSTM' if arch == 'lstm' else 'Transformer'} eps={eps:g}"] = (
                    paper[i] if paper and i is not None else None)
        out["seeds"] = len({r["seed"] for r in runs if r["row"] == row})
        table.append(out)
    return table


#: the smallest gap Wang et al. call an improvement in Tables 2/3: §5.3, "in the mid-training
#: setting, using LLM distillation on the 0.08% ... already gives better performance than
#: pre-training" -- Transformer, eps 18.71: 29.47 vs 29.36, 0.11 points (0.375 % of 29.36). Every
#: equivalence / non-inferiority margin of these tables is this gap, relative, applied to our B side
#: (no wider than the smallest effect the paper calls meaningful: issue 50); a "negligible" /
#: "comparable" / "at least as good" claim whose own paper numbers differ by more is not the
#: paper's claim (checked by `paper_supports`).
MEANINGFUL_PP = 0.11
MEANINGFUL_REL = 0.11 / 29.36
#: an epsilon at or above this is the paper's weak-privacy column (18.71)
WEAK_PRIVACY_EPSILON = 10.0
#: the contributions' "more than 7% accuracy improvement" from distillation at eps 1.77 (LSTM:
#: 28.68 vs 20.68), points
SEVEN_POINTS = 7.0


def paper_value(arch: str, row: str, eps: float) -> float | None:
    """Wang et al.'s Table 2 / Table 3 test accuracy (%) of ``row`` for ``arch`` at ``eps`` (None:
    not in the tables)."""
    i = {1.77: 0, 18.71: 1}.get(round(float(eps), 2))
    cell = PAPER_TABLE2.get(arch, {}).get(row) or PAPER_TABLE3.get(arch, {}).get(row)
    return None if cell is None or i is None else cell[i]


def paper_supports(kind: str, pa: float | None, pb: float | None) -> bool | None:
    """Whether the paper's own numbers (A, B) agree with a claim of ``kind``: "better" (A > B),
    "similar" (|A - B| < MEANINGFUL_PP), "at least" (A > B - MEANINGFUL_PP); None without numbers."""
    if pa is None or pb is None:
        return None
    return {"better": pa > pb, "similar": abs(pa - pb) < MEANINGFUL_PP,
            "at least": pa - pb > -MEANINGFUL_PP}[kind]


def _not_the_papers(pa, pb, what="Table 2") -> str:
    return f" [not the paper's claim here: its {what} has {pa:.2f} vs {pb:.2f}]"


def margin_at_our_level(ours_b: float) -> tuple[float, str]:
    """The equivalence / non-inferiority margin at our accuracy level (points) and its basis."""
    m = MEANINGFUL_REL * ours_b
    if not m > 0:  # a B side at 0 % (it learned nothing: the verdict is below its baseline anyway)
        return MEANINGFUL_PP, f"the paper's smallest meaningful gap {MEANINGFUL_PP:g} points as it is (our B mean is 0)"
    return m, (f"the paper's smallest meaningful gap {MEANINGFUL_PP:g} points of 29.36 "
               f"({100 * MEANINGFUL_REL:.3g} % relative, §5.3) applied to our B mean {ours_b:.4g}")


def _mean(d: dict) -> float:
    return float(np.mean(list(d.values())))


def verdicts(cfg, runs: list[dict], mft: float | None = None, mft_val: float | None = None) -> list:
    """Wang et al.'s claims of Tables 2 / 3 per epsilon, on test accuracy (%) paired by seed
    (:mod:`fedpriv.verdicts`, 90 % interval), each with the paper's numbers and its effect scaled
    to our level (the paper's relative gap on our B side). ``mft``: the most-frequent-token test
    accuracy (fraction; the trivial baseline of every row; None: no baseline); ``mft_val``: the
    same on validation users (the zero-shot claim's baseline; None: the test one). Claims whose
    rows did not run are "not run yet"; the Transformer column is "not run yet" unless
    ``cfg.students`` has it (each student's claims on its own runs: `arch_of`; the LSTM's
    unprefixed, as before); the paper's "1 % with distillation >= 100 % pre-training" is "not
    testable here" when the "1 %" row (``long_q``) uses as much of the pool as the 100 %
    pre-training, with the nearest feasible contrast (distillation on ``q`` vs pre-training on
    ``pretrain_fraction``) as its own (project) verdict. A claim the paper's own numbers
    contradict for a cell (e.g. Transformer eps 18.71: mid-training without distillation 29.15
    < pre-training with it 29.36) is kept as a project check and says so."""
    claims = (("pretrain_lm", "none", "public pre-training beats no public training (Tables 1/2)"),
              ("pretrain_distill_long", "pretrain_distill", "pre-training with distillation: longer on a "
               "larger q (paper: 100k steps on 1%) beats the short run on the small q (Table 2)"),
              ("mid_random", "mid_random_lm", "mid-training with LLM distillation beats mid-training "
               "on the same public data without it (Table 2)"),
              ("mid_random_lm", "pretrain_distill", "mid-training without distillation beats "
               "pre-training with distillation on the same q (Table 2)"),
              ("mid_random", "pretrain_distill", "mid-training (T'=T/2) beats pre-training (T'=0) with "
               "distillation on the same q (Table 2)"),
              ("mid_dm", "mid_random", "distribution matching beats a random public subset (Table 2)"))
    trivial = None if mft is None else 100 * mft
    out = []
    for arch in cfg.students:
        pre = "" if arch == "lstm" else "Transformer, "  # the LSTM's claims read as before the column
        out += _arch_verdicts(cfg, [r for r in runs if arch_of(r) == arch], claims, trivial, pre, arch)
    base, which = (mft_val, "validation") if mft_val is not None else (mft, "test")
    if "lstm" in cfg.students:
        out += zero_shot_verdicts(cfg, [r for r in runs if arch_of(r) == "lstm"],
                                  None if base is None else 100 * base, which)
    if "transformer" not in cfg.students:
        out.append(V.not_run("the Transformer column of Tables 2/3 (the same orderings with a transformer "
                             "student; Table 2 and Table 3)", f"this run trained archs={'/'.join(cfg.students)}; "
                             "run with archs=lstm/transformer"))
    return out


def zero_shot_verdicts(cfg, runs: list[dict], trivial: float | None, which: str) -> list:
    """Table 1 / §3.2: "after pre-training, it gives reasonable zero-shot accuracy on the private
    dataset even without private training (round=0)" (16.94 % at round 0 with pre-training vs 0.00
    without). Tested as: the pre-trained model's validation accuracy before any private round
    (``public.eval_after_public_training`` of the pretrain_lm runs) beats the most-frequent-token
    accuracy (``trivial``, %, on ``which`` users) -- a model at 0 % (the paper's "without") is
    below it by construction. One claim (round 0 does not depend on epsilon): the runs at the
    largest epsilon (Table 1's 18.71)."""
    claim = ("public pre-training gives reasonable zero-shot accuracy before any private round: above "
             "the most-frequent-token accuracy (Tables 1/2: Table 1's round 0, 16.94 % with pre-training, 0.00 "
             "without; §3.2)")
    eps = max(cfg.epsilons) if cfg.epsilons else None
    zs = {r["seed"]: 100 * r["public"]["eval_after_public_training"]["accuracy"] for r in runs
          if r["row"] == "pretrain_lm" and eps is not None and abs(r["target_epsilon"] - eps) < 1e-9
          and (r.get("public") or {}).get("eval_after_public_training")}
    if trivial is None:
        return [V.not_run(claim, "no most-frequent-token baseline recorded for these runs")]
    if not zs:
        return [V.not_run(claim, "no pretrain_lm run with its after-public-training evaluation")]
    return [V.compare(claim, zs, [trivial] * max(2, len(zs)), higher_is_better=True, trivial=None,
                      names=("pre-trained, round 0 (val)", f"most frequent token ({which})"))]


def _arch_verdicts(cfg, runs, claims, trivial, pre: str, arch: str = "lstm") -> list:
    """`verdicts` for one student's runs; ``pre`` prefixes each claim's epsilon tag."""
    out = []
    for eps in cfg.epsilons:
        acc = {row: {r["seed"]: 100 * r["test_accuracy"] for r in runs
                     if r["row"] == row and r["target_epsilon"] == eps and r.get("test_accuracy") is not None}
               for row in cfg.rows}
        acc = {k: v for k, v in acc.items() if v}
        ctx = _EpsClaims(cfg, acc, trivial, pre, arch, eps)
        out += _pair_verdicts(ctx, claims) + _small_q_verdicts(ctx) + _distillation_verdicts(ctx)
    return out


@dataclasses.dataclass(frozen=True)
class _EpsClaims:
    """One student's per-seed test accuracies at one epsilon (``acc``: row -> {seed: %}) and what
    its claims need: ``ran`` (rows present), ``missing`` (the not-run reason), ``pv`` (the
    paper's value of a row)."""
    cfg: object
    acc: dict
    trivial: object
    pre: str
    arch: str
    eps: float

    def ran(self, *rows) -> bool:
        return all(r in self.acc for r in rows)

    def missing(self, *rows) -> str:
        return "row(s) not in this run: " + ", ".join(r for r in rows if r not in self.acc)

    def pv(self, row):
        return paper_value(self.arch, row, self.eps)


def _pair_verdicts(ctx: "_EpsClaims", claims) -> list:
    """The pairwise Table-2 claims (``claims``) and Table 3's at one epsilon."""
    acc, trivial, pre, eps = ctx.acc, ctx.trivial, ctx.pre, ctx.eps
    ran, missing, pv = ctx.ran, ctx.missing, ctx.pv
    out = []
    for better, worse, claim in claims:
        c = f"[{pre}eps {eps:g}] {claim}"
        pa, pb = pv(better), pv(worse)
        ok = paper_supports("better", pa, pb)
        source = "project" if ok is False else "paper"
        if ok is False:
            c += _not_the_papers(pa, pb)
        out.append(V.compare(c, acc[better], acc[worse], higher_is_better=True, trivial=trivial,
                             names=(better, worse), source=source,
                             paper=None if pa is None or pb is None else (pa, pb))
                   if ran(better, worse) else V.not_run(c, missing(better, worse), source=source))
    pair = ("mid_dm", "mid_dm_priv_only")
    pa, pb = pv(pair[0]), pv(pair[1])
    if eps >= WEAK_PRIVACY_EPSILON:
        ok = paper_supports("similar", pa, pb)
        c = (f"[{pre}eps {eps:g}] matching with log p_pub + log p_priv vs log p_priv alone: the difference is "
             "negligible (Table 3; equivalence within the paper's smallest meaningful gap)"
             + (_not_the_papers(pa, pb, "Table 3") + " (more than its smallest meaningful gap "
                f"{MEANINGFUL_PP:g})" if ok is False else ""))
        out.append(_equivalent(c, acc, pair, trivial, "project" if ok is False else "paper", (pa, pb))
                   if ran(*pair) else V.not_run(c, missing(*pair)))
    else:
        ok = paper_supports("better", pa, pb)
        c = f"[{pre}eps {eps:g}] matching with log p_pub + log p_priv beats log p_priv alone (Table 3)"
        out.append(V.compare(c, acc[pair[0]], acc[pair[1]], higher_is_better=True, trivial=trivial,
                             names=pair, source="project" if ok is False else "paper",
                             paper=None if pa is None else (pa, pb))
                   if ran(*pair) else V.not_run(c, missing(*pair)))
    return out


def _small_q_verdicts(ctx: "_EpsClaims") -> list:
    """Distribution matching on a small q against whole-pool pre-training and against
    distillation on 1 % (the abstract, §5, §5.3) at one epsilon."""
    cfg, acc, trivial, pre, eps = ctx.cfg, ctx.acc, ctx.trivial, ctx.pre, ctx.eps
    ran, missing, pv = ctx.ran, ctx.missing, ctx.pv
    out = []
    # the abstract / §5.3: distribution matching on 0.08 % "comparable" to pre-training on the
    # whole corpus (and, §5 / abstract, "as well as using 1 % of public samples with distillation")
    for other, what in (("pretrain_lm", f"public pre-training on the whole pool (q={cfg.pretrain_fraction:g})"),):
        pa, pb = pv("mid_dm"), pv(other)
        ok = paper_supports("similar", pa, pb)
        c = (f"[{pre}eps {eps:g}] distribution matching on a small q (q={cfg.q:g}) is comparable to {what} "
             "(abstract, §5.3, Table 2; equivalence within the paper's smallest meaningful gap)"
             + (_not_the_papers(pa, pb) if ok is False else ""))
        out.append(_equivalent(c, acc, ("mid_dm", other), trivial, "project" if ok is False else "paper",
                               (pa, pb)) if ran("mid_dm", other) else V.not_run(c, missing("mid_dm", other)))
    pa, pb = pv("mid_dm"), pv("pretrain_distill_long")
    ok = paper_supports("similar", pa, pb)
    c = (f"[{pre}eps {eps:g}] distribution matching on 0.08% performs as well as distillation on 1% of the "
         "public data (abstract, §5, Table 2)"
         + (_not_the_papers(pa, pb) + f" (more than its smallest meaningful gap {MEANINGFUL_PP:g})"
            if ok is False else ""))
    if cfg.long_q >= cfg.pretrain_fraction:
        out.append(V.not_testable(c, f"the public pool is too small: the '1%' row uses q={cfg.long_q:g} "
                                  f"(the whole pool), so 'distillation on 1%' has no counterpart; nearest "
                                  f"contrast: mid_dm (q={cfg.q:g}) vs pretrain_distill_long "
                                  f"(q={cfg.long_q:g}), its own project verdict; what would test it: a pool "
                                  "large enough that 1 % of it is a real subset (>= 10^5 sentences)",
                                  source="project" if ok is False else "paper"))
        c2 = (f"[{pre}eps {eps:g}] (nearest feasible contrast) distribution matching on q={cfg.q:g} is "
              f"comparable to distillation on q={cfg.long_q:g} (equivalence within the paper's smallest "
              "meaningful gap; Table 2)")
        out.append(_equivalent(c2, acc, ("mid_dm", "pretrain_distill_long"), trivial, "project", (pa, pb))
                   if ran("mid_dm", "pretrain_distill_long") else
                   V.not_run(c2, missing("mid_dm", "pretrain_distill_long"), source="project"))
    else:
        pair = ("mid_dm", "pretrain_distill_long")
        out.append(_equivalent(c, acc, pair, trivial, "project" if ok is False else "paper", (pa, pb))
                   if ran(*pair) else V.not_run(c, missing(*pair)))
    return out


def _distillation_verdicts(ctx: "_EpsClaims") -> list:
    """Distillation on 1 % vs pre-training on 100 %, its nearest feasible contrast, and (LSTM,
    the strong-privacy epsilon) "more than 7 points over none" (§1) at one epsilon."""
    cfg, acc, trivial, pre, arch, eps = ctx.cfg, ctx.acc, ctx.trivial, ctx.pre, ctx.arch, ctx.eps
    ran, missing, pv = ctx.ran, ctx.missing, ctx.pv
    out = []
    pa, pb = pv("pretrain_distill_long"), pv("pretrain_lm")
    ok = paper_supports("at least", pa, pb)
    c = (f"[{pre}eps {eps:g}] pre-training with distillation on 1% of the public data is at least as good as "
         "pre-training on 100% of it without distillation (Table 2)"
         + (_not_the_papers(pa, pb) + f" (worse by more than its smallest meaningful gap {MEANINGFUL_PP:g})"
            if ok is False else ""))
    source = "project" if ok is False else "paper"
    if cfg.long_q >= cfg.pretrain_fraction:
        out.append(V.not_testable(c, f"the public pool is too small: the '1%' row uses q={cfg.long_q:g} "
                                  f"(>= the pre-training's {cfg.pretrain_fraction:g}), so the contrast has "
                                  "no data gap; nearest feasible contrast: pretrain_distill "
                                  f"(q={cfg.q:g}, distillation) vs pretrain_lm (q={cfg.pretrain_fraction:g}, "
                                  "no distillation), its own project verdict; what would test it: a pool "
                                  "large enough that 1 % of it is a real subset (>= 10^5 sentences)",
                                  source=source))
    elif ran("pretrain_distill_long", "pretrain_lm"):
        out.append(_noninferior(c, acc, ("pretrain_distill_long", "pretrain_lm"), trivial, source))
    else:
        out.append(V.not_run(c, missing("pretrain_distill_long", "pretrain_lm"), source=source))
    c = (f"[{pre}eps {eps:g}] (nearest feasible contrast) distillation on q={cfg.q:g} is at least as good as "
         f"pre-training on q={cfg.pretrain_fraction:g} without it (non-inferiority within the paper's "
         "smallest meaningful gap; Table 2)")
    out.append(_noninferior(c, acc, ("pretrain_distill", "pretrain_lm"), trivial, "project")
               if ran("pretrain_distill", "pretrain_lm") else V.not_run(c, missing("pretrain_distill",
                                                                                    "pretrain_lm"),
                                                                        source="project"))
    if eps < WEAK_PRIVACY_EPSILON and arch == "lstm":
        # §1 contributions: "distilling public LLM to pre-train on-device LM can lead to more than 7%
        # accuracy improvement with tight privacy bound (eps = 1.77)" (LSTM: 28.68 vs 20.68; the
        # Transformer's 27.75 vs 23.98 is not, so the LSTM only)
        c = (f"[{pre}eps {eps:g}] distillation pre-training improves on no public training by more than "
             "7 points (§1, Table 2: 28.68 vs 20.68; magnitude scaled to our level)")
        ours_b = _mean(acc["none"]) if ran("pretrain_distill_long", "none") else None
        if ours_b is not None and not ours_b > 0:
            # the paper's 7 points scale with our none mean: at 0 there is no effect to test against
            out.append(V.not_testable(c, f"no public training's mean accuracy is {ours_b:g}: the paper's 7 "
                                      "points scaled to it is no effect"))
        elif ours_b is not None:
            eff = SEVEN_POINTS / PAPER_TABLE2_LSTM["none"][0] * ours_b
            out.append(V.at_least(c, acc["pretrain_distill_long"], acc["none"], higher_is_better=True,
                                  trivial=trivial, names=("pretrain_distill_long", "none"),
                                  paper_effect=eff, paper_scaling=(
                                      f"7 points of the paper's 20.68 ({100 * SEVEN_POINTS / 20.68:.3g} % "
                                      f"relative) applied to our none mean {ours_b:.4g}: {eff:+.3g}")))
        else:
            out.append(V.not_run(c, missing("pretrain_distill_long", "none")))
    return out

def _equivalent(claim, acc, pair, trivial, source, paper):
    margin, basis = margin_at_our_level(_mean(acc[pair[1]]))
    return V.equivalence(claim, acc[pair[0]], acc[pair[1]], margin=margin, higher_is_better=True,
                         trivial=trivial, names=pair, source=source, margin_basis=basis,
                         paper=None if paper[0] is None or paper[1] is None else paper)


def _noninferior(claim, acc, pair, trivial, source):
    margin, basis = margin_at_our_level(_mean(acc[pair[1]]))
    return V.noninferior(claim, acc[pair[0]], acc[pair[1]], margin=margin, higher_is_better=True,
                         trivial=trivial, names=pair, source=source, margin_basis=basis)


def aggregate_shares(rows: list[dict]) -> list[dict]:
    """Mean selected share per (epsilon, beta, source) over seeds, next to the pool share."""
    keys = sorted({(r["target_epsilon"], r["beta"], r["source"]) for r in rows})
    out = []
    for eps, beta, src in keys:
        rs = [r for r in rows if (r["target_epsilon"], r["beta"], r["source"]) == (eps, beta, src)]
        m, s, _ = report.mean_std([r["selected_share"] for r in rs])
        out.append({"target_epsilon": eps, "beta": beta, "source": src,
                    "share of pool": f"{100 * rs[0]['pool_share']:.1f}%",
                    "share of top-q": f"{100 * m:.1f}%" + (f" ± {100 * s:.1f}" if len(rs) > 1 else ""),
                    "lift": round(m / rs[0]["pool_share"], 2), "seeds": len(rs)})
    return out


def _rates(info: dict) -> str | None:
    if "padded_tokens_per_second" not in info:
        return None
    real = info.get("real_tokens_per_second")
    return (f"{real:.0f} / " if real else "") + f"{info['padded_tokens_per_second']:.0f}"


def teacher_rows(cfg, stats: dict) -> list[dict]:
    """Teacher speed, distillation corpus size and the cost of the vocabulary restriction."""
    st, lp, tk = stats, stats.get("teacher_logprob_pass", {}), stats.get("topk_pass", {})
    corpus, cost = stats.get("corpus", {}), stats.get("restriction_cost", {})
    return [
        {"quantity": "teacher tokens/s (log p_pub pass: real / padded)",
         "value": _rates(lp)},
        {"quantity": "teacher tokens/s (top-k pass: real / padded)", "value": _rates(tk)},
        {"quantity": "distillation corpus bytes per 1K sequences",
         "value": corpus.get("bytes_per_1k_sequences")},
        {"quantity": "distillation corpus (k, L, dtype)",
         "value": f"k={corpus.get('k')}, L={corpus.get('seq_len')}, {corpus.get('logits_dtype')}"},
        {"quantity": "student vocabulary (V kept + 4)", "value": st["student_vocab_size"]},
        {"quantity": "UNK rate of private training targets", "value": st["private_train_unk_rate"]},
        {"quantity": "UNK rate of public pool targets", "value": cost.get("unk_rate")},
        {"quantity": "teacher top-k mass (full vocab)", "value": cost.get("topk_mass")},
        {"quantity": "teacher mass lost on dropped top-k ids", "value": cost.get("lost_mass")},
        {"quantity": "share of top-k softmax renormalised away", "value": cost.get("lost_topk_share")},
        {"quantity": "positions left without a teacher", "value": cost.get("no_teacher_rate")},
    ]


def _trained_minutes(runs: list[dict]) -> float:
    """Sum of the wall clocks of the runs trained here (not read back from elsewhere)."""
    return sum(r.get("wall_clock_s") or 0.0 for r in runs if "reused_from" not in r) / 60


def _num_params(cfg, arch: str, vocab_size: int) -> int:
    task = _model_task(dataclasses.replace(lm.model_config(cfg, vocab_size), arch=arch), cfg.train_on_unk)
    return count_params(jax.eval_shape(task.init, jax.random.key(0)))


def table_notes(cfg, rr: "RowRuns", seconds: float) -> list[str]:
    """The notes under the Table 2 table: data, models, schedule, metrics, privacy."""
    st, privacy, mft, prepared = rr.prepared.stats, rr.privacy, rr.mft, rr.prepared
    def lrs(c) -> str:
        return ", ".join(f"{at_epsilon(c, e).server_lr:g} at eps {e:g}" for e in c.epsilons) \
            if getattr(c, "epsilon_server_lrs", None) else f"{c.server_lr:g}"
    students = ", ".join(
        f"{a} ({_num_params(cfg, a, prepared.tokenizer.vocab_size)} params, server lr "
        f"{lrs(cfg.student(a) if hasattr(cfg, 'student') else cfg)})"
        for a in getattr(cfg, "students", (cfg.arch,)))
    notes = [f"{cfg.corpus} (private, user-level DP-FTRL, delta={cfg.delta:g}); public pool "
             f"{st['num_sequences']} sentences {st['pool_sources']}; teacher SmolLM2-135M "
             f"(top-{cfg.topk}); student {students} (embed {cfg.embed_dim}, hidden {cfg.hidden_dim}) on the "
             f"teacher's BPE restricted to V={st['vocab_kept']} ids (+4 specials)",
             f"T={cfg.rounds} rounds, T'={cfg.t_prime_rounds}, cohort {cfg.cohort_size}, "
             f"{cfg.max_local_steps} local steps of batch {cfg.batch_size}; q={cfg.q:g} of the pool "
             f"({select.num_selected(st['num_sequences'], cfg.q)} sequences), "
             f"{cfg.distill_steps} central steps (batch {cfg.central_batch_size}, Adam lr "
             f"{cfg.central_lr:g}) for distillation / mid-training, {cfg.pretrain_steps} for LM "
             f"pre-training on {cfg.pretrain_fraction:g} of the pool; L_pub beta={cfg.kd_beta:g}, "
             f"t={cfg.temperature:g}",
             "accuracy: in-vocabulary next-token accuracy (%) of the final model on validation/test "
             "users (PAD/BOS/EOS/UNK targets excluded; a predicted special token counts as wrong); "
             "val*/test*: the same with the argmax over real tokens only (the model as a "
             "suggester that never proposes UNK/EOS, as the paper's full-vocabulary student "
             "never meets UNK; `fedpriv.public.suggestion_eval_task`); most-frequent-token test "
             f"accuracy {100 * mft:.2f}%; 'val after public training': val accuracy of the "
             "model handed to DP-FTRL right after public training",
             f"UNK share of private training targets: {100 * prepared.stats['private_train_unk_rate']:.1f}%"
             + ("; UNK targets carry no loss in private training and in plain public LM "
                "training (train_on_unk=False, as the paper's full-vocabulary student never meets "
                "UNK: `fedpriv.public.unk_free_loss_task`); the distillation objective L_pub keeps "
                "them; val/test loss still counts them" if not cfg.train_on_unk else
                "; the student is trained on UNK targets too"),
             "; ".join(f"eps target {k}: z={v['noise_multiplier']:.3f}, eps={v['epsilon']:.3f}"
                       + (f" (simulated population), executed run eps={v['epsilon_executed_run']:.3g}"
                          if v.get("epsilon_executed_run") is not None else "")
                       for k, v in privacy.items()),
             f"seeds {list(cfg.seeds)}; wall clock {seconds / 60:.1f} min (this invocation; the "
             f"runs trained in this workdir took {_trained_minutes(rr.runs):.1f} min, "
             f"{sum('reused_from' in r for r in rr.runs)} runs were read back from another "
             "workdir)"]
    if cfg.noise_cohort_size:
        notes.append(
            f"noise calibrated for a cohort of {cfg.noise_cohort_size} while training with "
            f"{cfg.cohort_size} (McMahan et al. 2018 simulation): epsilon is that of the simulated "
            f"population scaled by {cfg.noise_cohort_size}/{cfg.cohort_size}; the run actually "
            "executed has epsilon " + ", ".join(
                f"{v['epsilon_executed_run']:.3g} (target {k})" for k, v in privacy.items()))
    for k, v in privacy.items():  # the paper-noise protocol: the row label k is SIMULATED
        if v.get("paper_noise"):
            pn = v["paper_noise"]
            notes.append(f"rows 'epsilon {k}': epsilon {pn['epsilon_simulated']:.3g} SIMULATED for "
                         f"{pn['population']}; epsilon {pn['epsilon_executed']:.3g} SPENT on "
                         f"{pn['our_users']} (the run executed), z = {pn['noise_multiplier']:.4g}")
    return notes
