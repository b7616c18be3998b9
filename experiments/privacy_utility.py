"""Privacy-utility of DP-FTRL on a real user-keyed corpus (Wang et al. 2023 §2, Table 1 "w/o
pre-training" columns; Figure 1 with several tokenizers).

Rows: non-private FedAvg, DP-FTRL at each epsilon of the config (18.71 and 1.77 at delta 1e-6;
z calibrated for this run's own schedule of rounds and epochs), and the trivial baselines: the
accuracy of always predicting the most frequent training token, and in the with-OOV metric the
better of it and always predicting UNK (``tokenizer_study.constant_baselines``). Same data,
model, seeds and rounds for every row.
Tokenizers are ``name[:vocab size]`` (``sentencepiece``, ``word_public``, ``word``); a word
model's accuracy is also converted to next-token accuracy with the public SentencePiece model
of the first ``sentencepiece`` entry (§3.1), with and without OOV targets.

Outputs: ``privacy_utility.{md,csv}`` (every row, mean ± std over seeds), ``table1.{md,csv}``
(Table 1's layout: rows epsilon, columns round 0 / round T, the paper's numbers beside),
``figure1.png`` (Figure 1: token accuracy per tokenizer and epsilon, without / with OOV),
``verdicts.json``.

    python -m experiments.privacy_utility --config configs/privacy_utility.py:small
    python -m experiments.privacy_utility --config "configs/privacy_utility.py:small,tokenizers=sentencepiece/word:5000"
"""
from __future__ import annotations

import dataclasses
import json
import os

from configs import lm_fl as lm_fl_config
from experiments import common
from fedpriv.data import load_public_pool, train_sentencepiece
from fedpriv.recipes import lm
from fedpriv.recipes.tokenizer_study import constant_baselines, figure1, table1, verdicts

SUMMARY_KEYS = ("epsilon", "epsilon_executed_run", "epsilon_if_vocabulary_public",
                "epsilon_executed_run_if_vocabulary_public", "noise_multiplier", "val_accuracy",
                "test_accuracy", "val_loss", "wall_clock_s", "val_accuracy_round0",
                "val_token_accuracy", "val_token_accuracy_with_oov", "val_accuracy_with_oov")
def variants(cfg):
    """(row name, LM-config overrides) of the table's training rows."""
    out = [("FedAvg (non-private)", dict(algorithm="fedavg", target_epsilon=None, noise_multiplier=None))]
    tuned = lambda e: lm_fl_config.TUNED.get(e, {}) if cfg.tuned else {}  # noqa: E731
    return out + [(f"DP-FTRL eps~{e:.3g}", dict(algorithm="dp_ftrl", target_epsilon=e, noise_multiplier=None,
                                                **tuned(e))) for e in cfg.epsilons]


def prepare(cfg, workdir: str) -> None:
    """The public SentencePiece model (cached), before the executor's slices start."""
    sp_size = next((v or cfg.lm.vocab_size for n, v in map(lm.parse_tokenizer, cfg.tokenizers)
                    if n == "sentencepiece"), cfg.lm.vocab_size)
    train_sentencepiece(load_public_pool().texts, vocab_size=sp_size)


def run(cfg, workdir: str, progress: bool = True) -> list[dict]:
    """One row per (tokenizer, seed, method[, server lr]); a finished run is read back, not rerun.
    ``cfg.server_lrs`` is a grid for the DP rows (App. C tunes the server lr per noise level)."""
    rows = []
    sp_size = next((v or cfg.lm.vocab_size for n, v in map(lm.parse_tokenizer, cfg.tokenizers)
                    if n == "sentencepiece"), cfg.lm.vocab_size)
    sp = train_sentencepiece(load_public_pool(progress=progress).texts, vocab_size=sp_size)
    for tok in cfg.tokenizers:
        for seed in cfg.seeds:
            base = dataclasses.replace(lm.with_tokenizer(cfg.lm, tok), seed=seed)
            prepared = lm.prepare_data(base, progress)
            for name, over in variants(cfg):
                over = dict(over)
                lr0 = over.pop("server_lr", base.server_lr)  # a tuned row's own server lr
                grid = cfg.server_lrs if over["algorithm"] != "fedavg" and cfg.server_lrs else [lr0]
                for lr in grid:
                    vcfg = dataclasses.replace(base, server_lr=lr, **over)
                    tag = "" if lr == base.server_lr else f"-slr{lr:g}"
                    sub = os.path.join(workdir, f"{tok.replace(':', '-v')}-seed{seed}-{vcfg.algorithm}-"
                                       f"{vcfg.target_epsilon}{tag}")
                    done = os.path.join(sub, "summary.json")
                    s = (json.load(open(done)) if os.path.exists(done) else
                         lm.run_lm_fl(vcfg, sub, prepared=prepared, progress=progress,  # own noise keys
                                      stage=f"fl-training ({vcfg.algorithm} eps={vcfg.target_epsilon}{tag})",
                                      sp_tokenizer=sp))
                    rows.append({"tokenizer": tok, "seed": seed, "method": name, "server_lr": lr,
                                 **{k: s[k] for k in SUMMARY_KEYS if k in s},
                                 # the paper-noise protocol's simulated epsilon (paper population)
                                 **({"epsilon_paper_population": s["paper_noise"]["epsilon_simulated"]}
                                    if s.get("paper_noise") else {})})
            # the trivial baselines: the best constant prediction in each metric (the MFT, or
            # UNK where OOV targets count: tokenizer_study.constant_baselines)
            rows.append({"tokenizer": tok, "seed": seed, "method": "most frequent token",
                         **constant_baselines(prepared.train.concat_examples()["tokens"],
                                              prepared.val.concat_examples()["tokens"][: base.max_eval_examples],
                                              prepared.tokenizer, sp)})
    return rows


def aggregate(rows: list[dict]) -> list[dict]:
    """Mean ± std over seeds per (tokenizer, method, server lr); ``best_on_val`` marks the server
    lr a practitioner would pick on validation accuracy."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["tokenizer"], r["method"], r.get("server_lr")), []).append(r)
    table = []
    for (tok, method, slr), rs in groups.items():
        (vm, vs, n), (tm, _, _) = (common.mean_std(r.get(k) for r in rs) for k in ("val_accuracy", "test_accuracy"))
        table.append({"tokenizer": tok, "method": method, "server_lr": slr,
                      **{k: rs[0][k] for k in ("epsilon_paper_population", *SUMMARY_KEYS[:5]) if k in rs[0]},
                      "seeds": n,
                      "val_accuracy_mean": vm, "val_accuracy_std": vs, "test_accuracy_mean": tm,
                      **{f"{k}_mean": common.mean_std(r.get(k) for r in rs)[0] for k in
                         ("val_accuracy_round0", "val_token_accuracy", "val_token_accuracy_with_oov")}})
    best = {}
    for row in table:
        key = (row["tokenizer"], row["method"])
        if key not in best or row["val_accuracy_mean"] > best[key]["val_accuracy_mean"]:
            best[key] = row
    for row in table:
        row["best_on_val"] = best[(row["tokenizer"], row["method"])] is row
    return table


def notes(cfg) -> list[str]:
    c = cfg.lm
    out = [f"{c.corpus}, {c.arch} (embed {c.embed_dim}, hidden {c.hidden_dim}), {c.rounds} rounds, cohort "
           f"{c.cohort_size}, delta {c.delta:g}, seeds {list(cfg.seeds)}, unit of privacy: user",
           "in-vocabulary next-token accuracy on validation users (PAD/BOS/EOS/UNK targets excluded)",
           "not covered by the ledger: the accuracies (exact evaluation on held-out private users)"]
    if "word" in cfg.tokenizers:
        out.append("tokenizer 'word': the top-k words of the training users' text, a NON-PRIVATE release: its "
                   "epsilon is inf; epsilon_if_vocabulary_public is the epsilon if it is taken as public")
    if c.noise_cohort_size:
        out.append(f"noise calibrated for a cohort of {c.noise_cohort_size} while training {c.cohort_size} clients "
                   f"per round (McMahan et al. 2018): epsilon_executed_run is the epsilon SPENT on our users by "
                   f"the run "
                   f"actually executed; epsilon is the noise-cohort simulation's (population scaled by "
                   f"{c.noise_cohort_size}/{c.cohort_size}: the ledger's budget), a simulated figure")
    if cfg.server_lrs:
        out.append(f"server learning rate grid for the DP rows: {list(cfg.server_lrs)} (every point shown)")
    if getattr(c, "simulated_population", None):  # the paper-noise protocol (fedpriv.dp.population)
        from fedpriv.dp.population import get_population
        out.append(f"paper-noise protocol: the DP rows' labels and epsilon_paper_population are SIMULATED for "
                   f"{get_population(c.simulated_population).describe(c.rounds)} (z = the paper's per-round noise "
                   "for that epsilon over its 1,600 rounds; this run's rounds give the epsilon_paper_population "
                   "shown); epsilon_executed_run (or epsilon without a noise cohort) is what each run SPENT on "
                   "our users; each run's summary.json has both (paper_noise)")
    return out


def main(argv=None):
    cfg, workdir, _ = common.config_and_workdir(argv, __doc__, "privacy_utility")
    common.run_slices(run, cfg, workdir, common.product(cfg, "tokenizers", "seeds"), prepare=prepare)
    rows = run(cfg, workdir)
    common.write_table(rows, workdir, "privacy_utility_runs")
    _, md = common.write_table(aggregate(rows), workdir, "privacy_utility",
                               title="Privacy-utility (Wang et al. §2)", notes=notes(cfg))
    common.write_table(table1(cfg, rows, variants(cfg)), workdir, "table1",
                       title=f"Table 1 (without pre-training; tokenizer {cfg.tokenizers[0]}): validation "
                             "next-token accuracy, mean ± std over seeds",
                       notes=["with pre-training: wang-table2's pretrain_lm row (experiments.public_training) -- "
                              "another pipeline (teacher-BPE student vocabulary, its own rounds): compare it with "
                              "that table's own no-public-training row, not with this table",
                              "paper: StackOverflow, 1600 rounds, cohort 100; ours: the privacy-utility table of "
                              "this run"])
    if len(cfg.tokenizers) > 1:
        figure1(cfg, rows, variants(cfg), os.path.join(workdir, "figure1.png"))
    common.write_verdicts(verdicts(cfg, rows, variants(cfg)), workdir)
    common.save_json({"rows": rows, **common.run_record(cfg, list(cfg.seeds))},
                     os.path.join(workdir, "summary.json"))
    print(open(md).read())


if __name__ == "__main__":
    common.cli(main)
