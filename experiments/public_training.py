"""Public pre-/mid-training, LLM distillation and distribution matching (Wang et al. 2023,
Table 2 rows and the Table 3 "w/o p_pub" ablation; §3.2, §4, §5, Algorithm 1).

Private data: chitchat users (user-level DP-FTRL). Public data: the project's public pool
(Wikipedia excerpt, Lee news, film quotes). Teacher: the packaged SmolLM2-135M. The on-device
student shares the teacher's BPE, restricted to the V most frequent teacher tokens of the public
pool. Rows (same data, model, init, seeds, z per epsilon):

    none               no public training
    pretrain_lm        T' = 0, LM loss on `pretrain_fraction` of the pool
    pretrain_distill   T' = 0, L_pub (distillation) on a random q fraction
    mid_random         T' = T/2, L_pub on a random q fraction (same subset as above)
    mid_dm             T' = T/2, L_pub on the top-q by ĥ = ½ log p_pub + ½ log p_priv
    mid_dm_priv_only   T' = T/2, top-q by log p_priv alone ("w/o p_pub", Table 3)

The first T' rounds are shared by `none` and the mid-training rows (computed once, then forked:
rounds and keys are functions of (seed, round), so a fork equals a fresh run). Each row's whole
T-round DP-FTRL event is in its ledger before round 0; public training after T' is recorded as
post-processing. Rows resume from their workdirs; a row whose summary exists is skipped.

    python -m experiments.public_training --config configs/public_training.py:small \
        --workdir runs/public_training
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np

from experiments import common
from fedpriv.recipes import lm
from fedpriv.data import load_public_pool
from fedpriv.dp import accounting
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl import algorithms as algs
from fedpriv.fl.loop import load_run
from fedpriv.models.lm import count_params
from fedpriv.models.metrics import evaluate, most_frequent_token_accuracy
from fedpriv.public import distill, pipeline, select

TITLES = {
    "none": "No public training",
    "pretrain_lm": "Pre-training w/ public data (T'=0, LM loss)",
    "pretrain_distill": "Pre-training w/ LLM distillation (T'=0)",
    "mid_random": "Mid-training (T'=T/2) w/ LLM distillation",
    "mid_dm": "+ distribution matching (beta=0.5)",
    "mid_dm_priv_only": "+ distribution matching w/o p_pub (beta=1)",
}


@dataclasses.dataclass
class Prepared:
    train: object
    val: object
    test: object
    tokenizer: pipeline.RestrictedTeacherTokenizer
    pool: pipeline.PublicPool
    stats: dict


def prepare(cfg, teacher, cache_dir: str, progress: bool = True, log=print) -> Prepared:
    """Vocabulary from the public pool, private users and the public pool in student ids, the
    teacher's passes over the pool (log p_pub, top-k corpus; cached in `cache_dir`)."""
    pub = load_public_pool(progress=progress)
    rng = np.random.default_rng(cfg.pool_seed)
    if cfg.vocab_kept is None:
        restriction = distill.VocabRestriction.full(teacher)
    else:
        vocab_idx = (np.arange(len(pub)) if cfg.vocab_texts is None or cfg.vocab_texts >= len(pub)
                     else np.sort(rng.choice(len(pub), cfg.vocab_texts, replace=False)))
        restriction = pipeline.restriction_from_texts(teacher, [pub.texts[i] for i in vocab_idx],
                                                      cfg.vocab_kept)
    tok = pipeline.RestrictedTeacherTokenizer(teacher, restriction)
    text = lm.LOADERS[cfg.corpus](progress=progress)
    if cfg.max_clients is not None and cfg.max_clients < len(text):
        ids = np.random.default_rng(cfg.split_seed).choice(len(text.client_ids), cfg.max_clients,
                                                           replace=False)
        text = text.subset([text.client_ids[i] for i in sorted(ids)])
    train, val, test = pipeline.private_datasets(
        text, tok, split=cfg.split, split_seed=cfg.split_seed, seq_len=cfg.seq_len,
        max_examples_per_client=cfg.max_examples_per_client, batch_size=cfg.batch_size,
        seed=cfg.split_seed)
    n = len(pub) if cfg.pool_size is None else min(cfg.pool_size, len(pub))
    sel = np.sort(np.random.default_rng([cfg.pool_seed, 1]).choice(len(pub), n, replace=False))
    log(f"public pool: {n} of {len(pub)} sentences; teacher passes (cached in {cache_dir})")
    pool = pipeline.build_public_pool(
        teacher, [pub.texts[i] for i in sel], [pub.sources[i] for i in sel], restriction,
        seq_len=cfg.seq_len, k=cfg.topk, cache_dir=cache_dir, with_topk=True,
        batch_size=cfg.teacher_batch_size, logits_dtype=cfg.logits_dtype, progress=progress)
    train_tokens = train.concat_examples()["tokens"]
    stats = {
        "student_vocab_size": tok.vocab_size, "vocab_kept": len(restriction.kept_teacher_ids),
        "unk_class_size": pipeline.unk_class_size(restriction),
        "train_clients": len(train), "train_examples": train.total_examples,
        "val_clients": len(val), "val_examples": val.total_examples,
        "test_clients": len(test), "test_examples": test.total_examples,
        "private_train_unk_rate": pipeline.unk_rate(train_tokens),
        "pool_unk_rate": pipeline.unk_rate(pool.tokens),
        "pool_sources": {s: c for s, c in zip(*np.unique(pool.sources, return_counts=True))},
        "teacher": {"file": os.path.basename(teacher.path or ""), "sha256": teacher.fingerprint},
        **pool.info,
    }
    stats["pool_sources"] = {str(k): int(v) for k, v in stats["pool_sources"].items()}
    return Prepared(train, val, test, tok, pool, stats)


def row_spec(row: str, cfg, seed: int) -> pipeline.PublicTrainingSpec:
    """The `PublicTrainingSpec` of a Table-2 row other than "none"."""
    common_kw = dict(kd_beta=cfg.kd_beta, temperature=cfg.temperature, steps=cfg.distill_steps,
                     batch_size=cfg.central_batch_size, learning_rate=cfg.central_lr, seed=seed,
                     unk_correction=cfg.unk_correction, q=cfg.q)
    tp = cfg.t_prime_rounds
    if row == "pretrain_lm":
        return pipeline.PublicTrainingSpec(
            t_prime=0,
            selection="all" if cfg.pretrain_fraction >= 1 else "random",
            **{**common_kw, "q": cfg.pretrain_fraction, "kd_beta": 0.0,
               "steps": cfg.pretrain_steps})
    if row == "pretrain_distill":
        return pipeline.PublicTrainingSpec(t_prime=0, selection="random", **common_kw)
    if row == "mid_random":
        return pipeline.PublicTrainingSpec(t_prime=tp, selection="random", **common_kw)
    if row == "mid_dm":
        return pipeline.PublicTrainingSpec(t_prime=tp, selection="matching",
                                           beta=cfg.match_betas[0], **common_kw)
    if row == "mid_dm_priv_only":
        return pipeline.PublicTrainingSpec(t_prime=tp, selection="matching",
                                           beta=cfg.match_betas[1], **common_kw)
    raise ValueError(f"no spec for row {row!r}")


def _curve(workdir: str) -> list:
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(r["round"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]


def run(cfg, workdir: str, *, teacher=None, progress: bool = True, log=print) -> dict:
    """Every (seed, epsilon, row) run of `cfg`; returns the tables (also written to disk)."""
    t_start = time.time()
    os.makedirs(workdir, exist_ok=True)
    teacher = teacher or pipeline.cached_teacher(cfg.teacher_path)
    prepared = prepare(cfg, teacher, os.path.join(workdir, "teacher_cache"), progress, log)
    T, tp = cfg.rounds, cfg.t_prime_rounds
    task = lm.build_task(cfg, prepared.tokenizer.vocab_size)  # one task: compilations reused
    ids = list(prepared.train.client_ids)
    val = prepared.val.concat_examples()["tokens"][: cfg.max_eval_examples]
    test = prepared.test.concat_examples()["tokens"][: cfg.max_eval_examples]
    mft = most_frequent_token_accuracy(prepared.train.concat_examples()["tokens"], test)
    eval_fn = lambda p: evaluate(task, p, val, cfg.eval_batch_size)  # noqa: E731
    suggest = pipeline.suggestion_eval_task(task)

    def add_suggestion_metrics(summary, params):
        summary["val_suggestion_accuracy"] = evaluate(suggest, params, val,
                                                      cfg.eval_batch_size)["accuracy"]
        summary["test_suggestion_accuracy"] = evaluate(suggest, params, test,
                                                       cfg.eval_batch_size)["accuracy"]

    def log_row(row):
        if "eval_accuracy" in row:
            log(f"  round {row['round']:4d}: val accuracy {row['eval_accuracy']:.4f}")

    runs, shares_rows, privacy = [], [], {}
    for seed in cfg.seeds:
        init = task.init(jax.random.key(seed))
        for eps in cfg.epsilons:
            fcfg = dataclasses.replace(cfg, seed=seed, target_epsilon=eps, noise_multiplier=None)
            alg, sampler, event, z = lm.build_algorithm(fcfg, len(ids), task.loss_fn)
            eps_val = accounting.compute_epsilon(event, cfg.delta)[0]
            eps_real = None
            if cfg.noise_cohort_size is not None:
                real = algs.privacy_event(alg.dp, sampler, T, simulated=False)
                eps_real = accounting.compute_epsilon(real, cfg.delta)[0]
            privacy[f"{eps:g}"] = {"target_epsilon": eps, "epsilon": eps_val, "noise_multiplier": z,
                                   "epsilon_executed_run": eps_real}
            private = pipeline.PrivateTraining(
                alg, sampler, prepared.train, ids, rounds=T, batch_size=cfg.batch_size, seed=seed,
                max_steps=cfg.max_local_steps, eval_fn=eval_fn,
                eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every,
                progress=progress, log_fn=log_row, lanes=cfg.lanes)
            base = os.path.join(workdir, f"seed{seed}", f"eps{eps:g}")
            stage1 = os.path.join(base, "_stage1")
            for row in cfg.rows:
                sub = os.path.join(base, row)
                done = os.path.join(sub, "summary.json")
                if os.path.exists(done):
                    with open(done) as f:
                        summary = json.load(f)
                    log(f"[seed {seed}, eps {eps:g}] {row}: done before, skipped")
                    if "test_suggestion_accuracy" not in summary:  # written by an older version
                        state = load_run(sub, private.template(init)).state
                        add_suggestion_metrics(summary, state.params)
                        common.save_json(summary, done)
                else:
                    log(f"[seed {seed}, eps {eps:g}] {row}: {TITLES[row]} (z = {z:.3f})")
                    t0 = time.time()
                    ledger = PrivacyLedger(eps_val * (1 + 1e-6), cfg.delta)
                    extra: dict = {}
                    if row == "none":
                        if pipeline.checkpoint_round(sub) is None:
                            pipeline.run_until(private, init, stage1, tp, ledger)
                            pipeline.fork_checkpoint(stage1, sub)
                        result = private.run(init, sub, None)
                    else:
                        spec = row_spec(row, cfg, seed)
                        out = pipeline.algorithm1(private, task, init, prepared.pool, spec,
                                                  workdir=sub, ledger=ledger,
                                                  stage1_workdir=stage1 if spec.t_prime else None,
                                                  progress=progress, log=log)
                        result = out.result
                        extra = {"spec": dataclasses.asdict(spec), "public": out.public,
                                 "num_selected": int(len(out.selected)), "shares": out.shares}
                    params = result.state.params
                    v = evaluate(task, params, val, cfg.eval_batch_size)
                    te = evaluate(task, params, test, cfg.eval_batch_size)
                    summary = {"row": row, "title": TITLES[row], "seed": seed,
                               "target_epsilon": eps, "epsilon": eps_val,
                               "epsilon_executed_run": eps_real, "noise_multiplier": z,
                               "delta": cfg.delta, "unit_of_privacy": "user",
                               "rounds": T, "t_prime": tp if row.startswith("mid") else 0,
                               "final_round": int(result.state.round),
                               "val_accuracy": v["accuracy"], "val_loss": v["loss"],
                               "test_accuracy": te["accuracy"], "test_loss": te["loss"],
                               "wall_clock_s": time.time() - t0,
                               "ledger": result.ledger.report() if result.ledger else None,
                               "curve": _curve(sub), **extra}
                    add_suggestion_metrics(summary, params)
                    common.save_json(summary, done)
                    log(f"  -> val {v['accuracy']:.4f}, test {te['accuracy']:.4f} "
                        f"({summary['wall_clock_s']:.0f}s)")
                runs.append(summary)
                if row.startswith("mid_dm"):
                    beta = summary["spec"]["beta"]
                    for src, r in summary["shares"].items():
                        shares_rows.append({"seed": seed, "target_epsilon": eps, "beta": beta,
                                            "source": src, "pool_share": r["pool_share"],
                                            "selected_share": r["selected_share"],
                                            "lift": r["lift"], "selected": r["selected_count"],
                                            "pool": r["pool_count"]})
    tables = write_outputs(cfg, workdir, runs, shares_rows, privacy, prepared, mft, task,
                           time.time() - t_start)
    return tables


def _mean_std(vals):
    a = np.array([v for v in vals if v is not None], float)
    if not len(a):
        return None, None
    return float(a.mean()), float(a.std())


def aggregate(cfg, runs: list[dict]) -> list[dict]:
    """One row per method: mean ± std over seeds of val/test accuracy at each epsilon."""
    table = []
    for row in cfg.rows:
        out = {"method": TITLES[row]}
        spec_q = {"none": 0.0, "pretrain_lm": cfg.pretrain_fraction}.get(row, cfg.q)
        out["q"] = spec_q
        out["distillation"] = "yes" if row not in ("none", "pretrain_lm") else ""
        out["matching"] = {"mid_dm": f"beta={cfg.match_betas[0]:g}",
                           "mid_dm_priv_only": f"beta={cfg.match_betas[1]:g}"}.get(row, "")
        for eps in cfg.epsilons:
            rs = [r for r in runs if r["row"] == row and r["target_epsilon"] == eps]
            for split, key in (("val", "val_accuracy"), ("test", "test_accuracy"),
                               ("val*", "val_suggestion_accuracy"),
                               ("test*", "test_suggestion_accuracy")):
                m, s = _mean_std([r.get(key) for r in rs])
                out[f"{split} eps={eps:g}"] = (None if m is None else
                                               f"{100 * m:.2f} ± {100 * s:.2f}" if len(rs) > 1
                                               else f"{100 * m:.2f}")
            after = [r.get("public", {}).get("eval_after_public_training", {}).get("accuracy")
                     for r in rs]
            m, _ = _mean_std(after)
            n_after = sum(a is not None for a in after)
            out[f"val after public training eps={eps:g}"] = (
                None if m is None else f"{100 * m:.2f}"
                + (f" (n={n_after})" if n_after < len(rs) else ""))
        out["seeds"] = len({r["seed"] for r in runs if r["row"] == row})
        table.append(out)
    return table


def aggregate_shares(rows: list[dict]) -> list[dict]:
    """Mean selected share per (epsilon, beta, source) over seeds, next to the pool share."""
    keys = sorted({(r["target_epsilon"], r["beta"], r["source"]) for r in rows})
    out = []
    for eps, beta, src in keys:
        rs = [r for r in rows if (r["target_epsilon"], r["beta"], r["source"]) == (eps, beta, src)]
        m, s = _mean_std([r["selected_share"] for r in rs])
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


def write_outputs(cfg, workdir, runs, shares_rows, privacy, prepared, mft, task, seconds):
    table = aggregate(cfg, runs)
    shares = aggregate_shares(shares_rows)
    st = prepared.stats
    lp = st.get("teacher_logprob_pass", {})
    tk = st.get("topk_pass", {})
    corpus = st.get("corpus", {})
    cost = st.get("restriction_cost", {})
    notes = [f"{cfg.corpus} (private, user-level DP-FTRL, delta={cfg.delta:g}); public pool "
             f"{st['num_sequences']} sentences {st['pool_sources']}; teacher SmolLM2-135M "
             f"(top-{cfg.topk}); student {cfg.arch} (embed {cfg.embed_dim}, hidden {cfg.hidden_dim}, "
             f"{count_params(task.init(jax.random.key(0)))} params) on the teacher's BPE restricted to "
             f"V={st['vocab_kept']} ids (+4 specials)",
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
             "never meets UNK; `pipeline.suggestion_eval_task`); most-frequent-token test "
             f"accuracy {100 * mft:.2f}%; 'val after public training': val accuracy of the "
             "model handed to DP-FTRL right after public training",
             f"UNK share of private training targets: {100 * prepared.stats['private_train_unk_rate']:.1f}%",
             "; ".join(f"eps target {k}: z={v['noise_multiplier']:.3f}, eps={v['epsilon']:.3f}"
                       + (f" (simulated population), executed run eps={v['epsilon_executed_run']:.3g}"
                          if v.get("epsilon_executed_run") is not None else "")
                       for k, v in privacy.items()),
             f"seeds {list(cfg.seeds)}; wall clock {seconds / 60:.1f} min"]
    if cfg.noise_cohort_size:
        notes.append(
            f"noise calibrated for a cohort of {cfg.noise_cohort_size} while training with "
            f"{cfg.cohort_size} (McMahan et al. 2018 simulation): epsilon is that of the simulated "
            f"population scaled by {cfg.noise_cohort_size}/{cfg.cohort_size}; the run actually "
            "executed has epsilon " + ", ".join(
                f"{v['epsilon_executed_run']:.3g} (target {k})" for k, v in privacy.items()))
    common.write_table(table, workdir, "public_training",
                       title="Public training for private FL (Wang et al. 2023, Table 2/3 rows)",
                       notes=notes)
    common.write_table([{k: v for k, v in r.items() if k not in ("ledger", "curve", "shares",
                                                                 "spec", "public")}
                        for r in runs], workdir, "public_training_runs")
    common.write_table(shares, workdir, "source_shares",
                       title="Public sources among the top-q selected sequences vs the pool",
                       notes=["mid-training selection at T'=T/2 from the DP checkpoint; "
                              "beta=0.5: (log p_pub + log p_priv)/2, beta=1: log p_priv only"])
    teacher_rows = [
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
    common.write_table(teacher_rows, workdir, "teacher_and_corpus",
                       title="Teacher, distillation corpus and vocabulary restriction",
                       notes=["teacher rates are those of the pass that built the cached "
                              "arrays (empty if that pass did not record them); batches of "
                              f"{cfg.teacher_batch_size} x L+1={cfg.seq_len + 1} tokens, float32 "
                              "on this machine's CPU"])
    for eps in cfg.epsilons:
        curves = {}
        for r in runs:
            if r["target_epsilon"] == eps and r["seed"] == cfg.seeds[0] and r.get("curve"):
                xs, ys = zip(*r["curve"])
                curves[r["row"]] = (list(xs), [100 * y for y in ys])
        if curves:
            common.plot_curves(curves, os.path.join(workdir, f"curves_eps{eps:g}.png"), "round",
                               "validation accuracy (%)",
                               f"chitchat, DP-FTRL eps~{eps:g}, seed {cfg.seeds[0]}")
    _plot_bars(cfg, runs, os.path.join(workdir, "public_training.png"))
    result = {"table": table, "shares": shares, "teacher_and_corpus": teacher_rows,
              "privacy": privacy, "stats": st, "most_frequent_token_test_accuracy": mft,
              "runs": [{k: v for k, v in r.items() if k != "curve"} for r in runs],
              "wall_clock_s": seconds, **common.run_record(cfg, list(cfg.seeds))}
    common.save_json(result, os.path.join(workdir, "summary.json"))
    return result


def _plot_bars(cfg, runs, path):
    """Grouped bars: final test accuracy (in-vocab, and as a suggester) per row and epsilon."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    width = 0.8 / max(len(cfg.epsilons), 1)
    for ax, (key, label) in zip(axes, (("test_accuracy", "in-vocab accuracy"),
                                       ("test_suggestion_accuracy", "suggestion accuracy*"))):
        for j, eps in enumerate(cfg.epsilons):
            stats = [_mean_std([r.get(key) for r in runs
                                if r["row"] == row and r["target_epsilon"] == eps])
                     for row in cfg.rows]
            xs = np.arange(len(cfg.rows)) + j * width
            ax.bar(xs, [100 * (m or 0) for m, _ in stats], width,
                   yerr=[100 * (sd or 0) for _, sd in stats], capsize=3, label=f"eps~{eps:g}")
        ax.set_xticks(np.arange(len(cfg.rows)) + width * (len(cfg.epsilons) - 1) / 2)
        ax.set_xticklabels(cfg.rows, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"test {label} (%)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"chitchat, DP-FTRL T={cfg.rounds}: public training rows "
                 f"(mean ± std over seeds {list(cfg.seeds)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = common.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/public_training.py:small")
    ap.add_argument("--workdir", default="runs/public_training")
    args = ap.parse_args(argv)
    cfg = common.load_config(args.config)
    run(cfg, args.workdir)
    for name in ("public_training", "source_shares", "teacher_and_corpus"):
        print(open(os.path.join(args.workdir, f"{name}.md")).read())


if __name__ == "__main__":
    common.cli(main)
