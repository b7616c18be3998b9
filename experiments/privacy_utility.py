"""Privacy-utility of DP-FTRL on a real user-keyed corpus (Wang et al. 2023 §2, Table 1 "w/o
pre-training" column; Figure 1 with ``--tokenizers``).

Rows: non-private FedAvg, DP-FTRL at epsilon ~ 18.71 and ~ 1.77 (delta = 1e-6; z calibrated
for this run's own schedule of rounds and epochs), and the accuracy of always predicting the
most frequent training token. Same data, model, seeds and rounds for every row.

    python -m experiments.privacy_utility --config configs/lm.py:small --workdir runs/privacy_utility
    python -m experiments.privacy_utility --config configs/lm.py:small --tokenizers sentencepiece,word
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from experiments import common
from fedpriv.recipes import lm

VARIANTS = [("FedAvg (non-private)", dict(algorithm="fedavg", target_epsilon=None, noise_multiplier=None)),
            ("DP-FTRL eps~18.7", dict(algorithm="dp_ftrl", target_epsilon=18.71, noise_multiplier=None)),
            ("DP-FTRL eps~1.8", dict(algorithm="dp_ftrl", target_epsilon=1.77, noise_multiplier=None))]


def run(cfg, workdir: str, tokenizers=("sentencepiece",), seeds=(0,), progress: bool = True,
        server_lrs=None) -> list[dict]:
    """One row per (tokenizer, seed, method[, server lr]). ``server_lrs`` is a grid for the DP rows
    (Wang et al. App. C tune the server learning rate per noise level); every point is reported."""
    rows = []
    for tok in tokenizers:
        for seed in seeds:
            base = dataclasses.replace(cfg, tokenizer=tok, seed=seed)
            prepared = lm.prepare_data(base, progress)
            runs = [(name, over, lr) for name, over in VARIANTS
                    for lr in ([cfg.server_lr] if over["algorithm"] == "fedavg" or not server_lrs else server_lrs)]
            for name, over, lr in runs:
                vcfg = dataclasses.replace(base, server_lr=lr, **over)
                tag = "" if lr == cfg.server_lr else f"-slr{lr:g}"
                sub = os.path.join(workdir, f"{tok}-seed{seed}-{vcfg.algorithm}-{vcfg.target_epsilon}{tag}")
                done = os.path.join(sub, "summary.json")
                if os.path.exists(done):
                    import json
                    s = json.load(open(done))
                else:
                    s = lm.run_lm_fl(vcfg, sub, prepared=prepared, progress=progress,  # own noise keys
                                  stage=f"fl-training ({vcfg.algorithm} eps={vcfg.target_epsilon}{tag})")
                rows.append({"tokenizer": tok, "seed": seed, "method": name, "server_lr": lr, "epsilon": s["epsilon"],
                             "epsilon_executed_run": s["epsilon_executed_run"],
                             **({k: s[k] for k in ("epsilon_if_vocabulary_public",
                                                   "epsilon_executed_run_if_vocabulary_public") if k in s}),
                             "noise_multiplier": s["noise_multiplier"], "val_accuracy": s["val_accuracy"],
                             "test_accuracy": s["test_accuracy"], "val_loss": s["val_loss"],
                             "wall_clock_s": s["wall_clock_s"]})
            rows.append({"tokenizer": tok, "seed": seed, "method": "most frequent token",
                         "val_accuracy": s["most_frequent_token_val_accuracy"]})
    return rows


def aggregate(rows):
    """Mean and std over seeds per (tokenizer, method)."""
    out = {}
    for r in rows:
        out.setdefault((r["tokenizer"], r["method"], r.get("server_lr")), []).append(r)
    table = []
    for (tok, method, slr), rs in out.items():
        acc = np.array([r["val_accuracy"] for r in rs], float)
        test = np.array([r.get("test_accuracy") or np.nan for r in rs], float)
        table.append({"tokenizer": tok, "method": method, "server_lr": slr, "epsilon": rs[0].get("epsilon"),
                      "epsilon_executed_run": rs[0].get("epsilon_executed_run"),
                      **({k: rs[0][k] for k in ("epsilon_if_vocabulary_public",
                                                "epsilon_executed_run_if_vocabulary_public")
                          if k in rs[0]}),
                      "noise_multiplier": rs[0].get("noise_multiplier"), "seeds": len(rs),
                      "val_accuracy_mean": acc.mean(), "val_accuracy_std": acc.std(),
                      "test_accuracy_mean": np.nanmean(test) if np.isfinite(test).any() else None})
    best = {}
    for row in table:  # best server lr per (tokenizer, method), chosen on validation accuracy
        key = (row["tokenizer"], row["method"])
        if key not in best or row["val_accuracy_mean"] > best[key]["val_accuracy_mean"]:
            best[key] = row
    for row in table:
        row["best_on_val"] = best[(row["tokenizer"], row["method"])] is row
    return table


def _tokenizer_name(text: str) -> str:
    if text not in ("sentencepiece", "word_public", "word"):
        raise ValueError(text)
    return text


def main(argv=None):
    ap = common.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/lm.py:small")
    ap.add_argument("--workdir", default="runs/privacy_utility")
    ap.add_argument("--tokenizers", default=("sentencepiece",),
                    type=common.csv_of(_tokenizer_name, "tokenizers (sentencepiece, word_public, word)"))
    ap.add_argument("--seeds", default=(0,), type=common.csv_of(common.non_negative_int, "seeds >= 0"))
    ap.add_argument("--server-lrs", default=None, type=common.csv_of(common.positive_float, "numbers > 0"),
                    help="grid of server learning rates for the DP rows, e.g. 1,0.3,0.1")
    args = ap.parse_args(argv)
    cfg = common.load_config(args.config)
    lrs = args.server_lrs
    rows = run(cfg, args.workdir, args.tokenizers, args.seeds, server_lrs=lrs)
    table = aggregate(rows)
    notes = [f"{cfg.corpus}, {cfg.arch} (embed {cfg.embed_dim}, hidden {cfg.hidden_dim}), {cfg.rounds} rounds, "
             f"cohort {cfg.cohort_size}, delta {cfg.delta:g}, unit of privacy: user",
             "in-vocabulary next-token accuracy on validation users (PAD/BOS/EOS/UNK targets excluded)"]
    if "word" in args.tokenizers:
        notes.append("tokenizer 'word': the top-k words of the training users' text, a NON-PRIVATE "
                     "release: its epsilon is inf; epsilon_if_vocabulary_public is the epsilon that holds "
                     "if the vocabulary is taken as public")
    notes.append("not covered by the ledger: the accuracies (exact evaluation on held-out private users)")
    if cfg.noise_cohort_size:
        notes.append(f"noise calibrated for a cohort of {cfg.noise_cohort_size} (simulated population scaled "
                     f"by {cfg.noise_cohort_size}/{cfg.cohort_size}); epsilon_executed_run is the run actually executed")
    if lrs:
        notes.append(f"server learning rate grid for the DP rows: {list(lrs)} (every point shown; best_on_val marks "
                     f"the one a practitioner would pick on validation accuracy)")
    common.write_table(rows, args.workdir, "privacy_utility_runs")
    _, md = common.write_table(table, args.workdir, "privacy_utility", title="Privacy-utility (Wang et al. §2)",
                               notes=notes)
    print(open(md).read())


if __name__ == "__main__":
    common.cli(main)
