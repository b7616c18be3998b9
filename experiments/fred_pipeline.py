"""FreD's three-stage pipeline on real data (Hou et al. 2023, Fig. 1; Table 1 analogue).

(1) privately choose the prefinetuning dataset by FreD between each candidate public dataset
and the users' data, (2) prefinetune the on-device LM on it (central, public data), (3) DP
FL-finetune on the users — one privacy ledger for the whole pipeline (FreD's two Gaussian
releases + DP-FTRL, composed; z of stage 3 is calibrated to what FreD left of the budget).

Private users: a random half of the chitchat senders (their training split are the FL users
and the FreD population). Candidates: (a) chitchat-like text = messages of the other half of
the senders (disjoint users), (b) Wikipedia sentences, (c) Simpsons lines. For comparison each
candidate (and no prefinetuning) is also carried through stages 2-3; only the FreD-chosen row
runs under the pipeline's own ledger, the others under copies (counterfactual runs).

    python -m experiments.fred_pipeline --config configs/fred_pipeline.py:small --workdir runs/fred_pipeline
"""
from __future__ import annotations

import dataclasses
import os
import pathlib

import jax
import numpy as np

from experiments import common
from fedpriv.recipes import lm as lm_recipe
from experiments.fred_table import _sample, embed_all
from fedpriv import fred as F
from fedpriv.data import (encode_examples, load_chitchat, load_public_pool, load_simpsons,
                          split_client_ids, train_sentencepiece)
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.loop import NONPRIVATE
from fedpriv.models import bert
from fedpriv.models.metrics import evaluate
from fedpriv.public.pretrain import adam_with_clipping, train_central

NONE = "(no prefinetuning)"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def build_data(cfg, progress=True):
    lm = cfg.lm
    rng = np.random.default_rng(cfg.seed)
    chat = load_chitchat(progress=progress)
    priv_ids, held_ids = split_client_ids(chat.client_ids, (cfg.private_fraction, 1 - cfg.private_fraction),
                                          seed=cfg.seed)
    private = chat.subset(priv_ids)
    if lm.max_clients is not None and lm.max_clients < len(private):
        keep = rng.choice(len(private.client_ids), lm.max_clients, replace=False)
        private = private.subset([private.client_ids[i] for i in sorted(keep)])
    tr, va, te = private.split_by_client(lm.split, seed=cfg.seed)
    held = [t for cid in held_ids for t in chat[cid]]
    simpsons = load_simpsons(progress=progress)
    candidates = {
        "chitchat (held-out senders)": _sample(held, cfg.num_sentences, rng),
        "wikipedia": _sample(load_public_pool(sources=("wikipedia",), progress=progress).texts,
                             cfg.num_sentences, rng),
        "simpsons": _sample([t for c in simpsons.client_ids for t in simpsons[c]], cfg.num_sentences, rng),
    }
    fred_private = {cid: _sample(tr[cid], cfg.max_per_user, rng) for cid in tr.client_ids}
    return tr, va, te, candidates, fred_private


NOT_COVERED_NOTE = ("NOT covered by the ledger: columns prefixed nonprivate/ (noise-free FreD of the "
                    "private embeddings) and the val/test accuracy, loss and perplexity (exact "
                    "evaluation on held-out private users)")


def outputs() -> dict:
    """Which outputs of the pipeline the ledger covers (the run record)."""
    from fedpriv.fl.loop import OUTPUTS
    return {"covered_by_ledger": ["FreD release (mean, covariance) and fred_private, private_rank, "
                                  "chosen_by_fred (post-processing)", "FL-finetuned model"],
            "not_covered": [NONPRIVATE + "fred (noise-free FreD of the private embeddings)",
                            "val_*/test_* (exact evaluation on held-out private users)"],
            "metrics.jsonl": OUTPUTS}


def run(cfg, workdir: str, progress: bool = True) -> dict:
    lm = cfg.lm
    os.makedirs(workdir, exist_ok=True)
    tr, va, te, candidates, fred_private = build_data(cfg, progress)

    # ---- stage 1: FreD (the private statistics are released once, reused for every candidate)
    embedder = bert.load_embedder()
    priv_emb, cand_emb, throughput = embed_all(embedder, fred_private, candidates, cfg.embed_batch,
                                               pathlib.Path(workdir) / "embeddings.npz")
    basis = F.pca_basis(np.concatenate(list(cand_emb.values())), cfg.pca_dims) if cfg.pca_dims else None
    proj = (lambda e: np.asarray(e) @ basis) if basis is not None else np.asarray
    ledger = PrivacyLedger(cfg.total_epsilon, lm.delta, unit="user")
    release = F.private_stats([proj(priv_emb[c]) for c in priv_emb], cfg.fred_clip, cfg.fred_epsilon, lm.delta,
                              unit=cfg.fred_unit, key=jax.random.key(cfg.seed), ledger=ledger,
                              name="FreD release (mean + covariance)")
    ranking = F.rank_candidates({n: proj(e) for n, e in cand_emb.items()}, release)
    all_priv = np.concatenate([proj(v) for v in priv_emb.values()])
    nonprivate = {n: F.fred_nonprivate(proj(e), all_priv) for n, e in cand_emb.items()}
    chosen = ranking[0][0]
    after_fred = ledger.to_dict()  # counterfactual rows start from here, not from the chosen run

    # ---- stages 2-3
    tok = train_sentencepiece(load_public_pool(progress=progress).texts, vocab_size=lm.vocab_size)
    kw = dict(seq_len=lm.seq_len, max_examples_per_client=lm.max_examples_per_client,
              batch_size=lm.batch_size, seed=lm.seed)
    datasets = [t.to_dataset(tok, **kw) for t in (tr, va, te)]
    prepared = lm_recipe.Prepared(*datasets, tok, {"corpus": "chitchat (private half)", "vocab_size": tok.vocab_size,
                                               "train_clients": len(datasets[0]), "val_clients": len(datasets[1])})
    task = lm_recipe.build_task(lm, tok.vocab_size)
    val_tokens = datasets[1].concat_examples()["tokens"][: lm.max_eval_examples]
    private_rank = {n: i + 1 for i, (n, _) in enumerate(ranking)}
    rows = []
    names = [NONE] + ([n for n, _ in ranking] if cfg.compare_all else [chosen])
    for name in names:
        sub = os.path.join(workdir, _slug(name))
        params = task.init(jax.random.key(lm.seed))
        if name != NONE:
            data = {"tokens": encode_examples(tok.encode(candidates[name]), lm.seq_len)}
            params, _ = train_central(task.loss_fn, params, data, steps=cfg.prefinetune_steps,
                                      batch_size=cfg.prefinetune_batch, seed=cfg.seed,
                                      optimizer=adam_with_clipping(cfg.prefinetune_lr),
                                      workdir=os.path.join(sub, "prefinetune"), progress=progress,
                                      desc=f"prefinetune on {name}")
        before = evaluate(task, params, val_tokens, lm.eval_batch_size)
        if name == chosen:
            led = ledger                                    # the pipeline's own budget
        elif name == NONE:
            led = PrivacyLedger(cfg.total_epsilon, lm.delta, unit="user")  # ran no FreD
        else:
            led = PrivacyLedger.from_dict(after_fred)  # counterfactual copy: FreD spent, no FL yet
        s = lm_recipe.run_lm_fl(lm, os.path.join(sub, "fl"), prepared=prepared, init_params=params, ledger=led,
                      progress=progress, stage=f"DP-FTRL FL-finetune ({name})")
        # DP columns first; exact statistics of the private users (noise-free FreD, evaluation
        # on held-out private users) are marked ``nonprivate/`` and come last
        rows.append({"prefinetune data": name,
                     "fred_private": dict(ranking).get(name), "private_rank": private_rank.get(name),
                     "chosen_by_fred": name == chosen, "fl_noise_multiplier": s["noise_multiplier"],
                     "pipeline_epsilon": led.spent(), "pipeline_epsilon_executed": led.spent_executed(),
                     "fl_epsilon_alone": s["epsilon"],
                     "fl_epsilon_executed_alone": s["epsilon_executed_run"] if s["epsilon_executed_run"]
                     is not None else s["epsilon"],
                     "val_ppl_before_fl": before["perplexity"], "val_acc_before_fl": before["accuracy"],
                     "val_acc_after_fl": s["val_accuracy"], "test_acc_after_fl": s["test_accuracy"],
                     "val_loss_after_fl": s["val_loss"],
                     NONPRIVATE + "fred": nonprivate.get(name)})
    summary = {"rows": rows, "chosen": chosen, "fred_unit": cfg.fred_unit, "fred_epsilon_per_release": cfg.fred_epsilon,
               "fred_release": {"epsilon_basic": release.epsilon_basic, "delta_total": release.delta_total,
                                "epsilon_rdp": release.epsilon_rdp, "epsilon_pld": release.epsilon_pld},
               "embedder_sentences_per_s": throughput, "pca_dims": cfg.pca_dims,
               "ledger": ledger.report(), "outputs": outputs(), **common.run_record(dataclasses.asdict(cfg), cfg.seed)}
    common.save_json(summary, os.path.join(workdir, "summary.json"))
    notes = [f"unit of privacy: {cfg.fred_unit}; pipeline budget epsilon = {cfg.total_epsilon}, delta = {lm.delta:g}",
             f"FreD: two Gaussian releases at (epsilon={cfg.fred_epsilon}, delta={lm.delta:g}) each"
             + (f", in a {cfg.pca_dims}-dim PCA basis of the public candidates (not in the paper)" if cfg.pca_dims else ""),
             "FL-finetuning z calibrated so FreD + DP-FTRL fit the budget; rows other than the chosen one are "
             "counterfactual runs with a copy of the ledger", f"pipeline ledger: {ledger}"]
    if lm.noise_cohort_size is not None:
        notes.append(f"SIMULATED: the FL stage adds the noise of a cohort of {lm.noise_cohort_size} (trains "
                     f"with {lm.cohort_size}); pipeline_epsilon / fl_epsilon_alone are those of the "
                     "simulated population, pipeline_epsilon_executed / fl_epsilon_executed_alone those "
                     "of the runs actually executed")
    notes.append(NOT_COVERED_NOTE)
    _, md = common.write_table(rows, workdir, "fred_pipeline", title="FreD pipeline (Hou et al. 2023)", notes=notes)
    return summary


def main(argv=None):
    ap = common.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/fred_pipeline.py:small")
    ap.add_argument("--workdir", default="runs/fred_pipeline")
    args = ap.parse_args(argv)
    cfg = common.load_config(args.config)
    run(cfg, args.workdir)
    print(open(os.path.join(args.workdir, "fred_pipeline.md")).read())


if __name__ == "__main__":
    common.cli(main)
