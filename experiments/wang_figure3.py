"""Wang et al. 2023 Figure 3: perplexity of private vs public samples under a NON-PRIVATE
"oracle" on-device LM and under the public LLM.

The oracle is trained centrally, WITHOUT DP noise, on the private training users' text (the
paper fine-tunes it "without DP noise to overfit the private data distribution"); it is not
covered by any privacy ledger and is never released: this figure is a diagnostic of the data,
not a private result. Samples: N messages of held-out private users and N public-pool
sentences, each scored as the same corpus-form sequence by the oracle and the teacher
(`fedpriv.recipes.oracle.figure3_samples`), once per seed (its own oracle and sample draw,
in ``<workdir>/seed<s>``; the teacher cache is shared). Writes ``figure3.png`` (first seed; both
axes log PPL),
``figure3_samples.csv`` (per sample), ``figure3_summary.{md,csv}`` (median PPL and IQR of log
PPL per set and model, mean ± std over seeds) and ``verdicts.json`` (orderings of the per-seed
statistics).

    python -m experiments.wang_figure3 --config configs/wang_figure3.py:small \
        --workdir runs/wang_figure3
"""
from __future__ import annotations

import dataclasses
import os
import time

from experiments import common
from fedpriv.recipes import oracle


def samples(cfg, workdir: str, *, teacher=None, progress: bool = True, log=print) -> tuple[list, list]:
    """Each seed's oracle (resumed once trained) and scored samples: ``(rows, figures)``; also an
    executor slice (one seed: ``common.product(cfg, "seeds")``)."""
    os.makedirs(workdir, exist_ok=True)
    rows, figs = [], []
    for seed in cfg.seeds:  # each seed: its own oracle (init, batches) and its own sample draw
        scfg = dataclasses.replace(cfg, seed=seed, sample_seed=seed)
        log(f"[seed {seed}]")
        fig = oracle.figure3_samples(scfg, os.path.join(workdir, f"seed{seed}"), teacher=teacher,
                                     progress=progress, log=log,
                                     cache_dir=os.path.join(workdir, "teacher_cache"))
        rows += [{"seed": seed, **r} for r in fig.rows]
        figs.append(fig)
    return rows, figs


def train(cfg, workdir: str) -> None:
    samples(cfg, workdir)


def run(cfg, workdir: str, *, teacher=None, progress: bool = True, log=print) -> dict:
    t0 = time.time()
    rows, figs = samples(cfg, workdir, teacher=teacher, progress=progress, log=log)
    common.write_table(rows, workdir, "figure3_samples")
    summary = oracle.figure3_summary(rows)
    fig, st = figs[0], figs[0].stats
    common.write_table(summary, workdir, "figure3_summary", notes=[
        oracle.NONPRIVATE_ORACLE,
        f"{cfg.corpus}: oracle {cfg.arch} (embed {cfg.embed_dim}, hidden {cfg.hidden_dim}), "
        f"{cfg.oracle_steps} Adam steps (lr {cfg.oracle_lr:g}, batch {cfg.oracle_batch_size}) on "
        f"{st['train_sequences']} sequences of {st['train_clients']} training users; samples: "
        f"{st['private_samples']} messages of {st['heldout_clients']} held-out users, "
        f"{st['public_samples']} public-pool sentences per seed; L={cfg.seq_len} teacher "
        f"tokens; seeds {list(cfg.seeds)} (each: its own oracle and sample draw), mean and std "
        "over seeds of the per-seed median / IQR; median PPL = exp(mean median log PPL)",
        "PPL = exp(NLL), NLL = mean negative log-prob per predicted token of the same sequence "
        "(teacher BOS, first L tokens, EOS if it fits); the oracle's p(UNK) is spread over the "
        f"{st['unk_class_size']} teacher ids folded into UNK"],
        title="Figure 3: PPL of private vs public samples (oracle on-device LM vs public LLM)")
    oracle.plot_figure3(fig.rows, os.path.join(workdir, "figure3.png"),
                        f"{cfg.corpus}: private vs public samples (oracle: NON-PRIVATE; seed "
                        f"{cfg.seeds[0]})")
    verdicts = oracle.figure3_verdicts(rows)
    common.write_verdicts(verdicts, workdir)
    result = {"summary": summary, "stats": st, "nonprivate": oracle.NONPRIVATE_ORACLE,
              "ledger": None, "oracle_final_loss": [f.oracle_history[-1]["loss"]
                                                    if f.oracle_history else None for f in figs],
              "verdicts": [v.to_json() for v in verdicts],
              "wall_clock_s": time.time() - t0, **common.run_record(cfg, list(cfg.seeds))}
    common.save_json(result, os.path.join(workdir, "summary.json"))
    return result


main = common.printing_main(run, __doc__, "wang_figure3", "figure3_summary.md",
                            slices=lambda cfg: (train, common.product(cfg, "seeds")))


if __name__ == "__main__":
    common.cli(main)
