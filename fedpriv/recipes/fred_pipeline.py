"""FreD's three-stage pipeline (Hou et al. 2023, Fig. 1; Table 1 analogue) as ``fedpriv.fl.stages``.

(1) privately choose the prefinetuning dataset by FreD between each candidate public dataset
and the users' data, (2) prefinetune the on-device LM on it (central, public data), (3) DP
FL-finetune on the users -- one privacy ledger for the whole pipeline (FreD's two Gaussian
releases + DP-FTRL, composed; z of stage 3 is calibrated to what FreD left of the budget).

Private users: a random ``private_fraction`` of the chitchat senders (their training split are
the FL users and the FreD population). Candidates (``fedpriv.fred.embed``): (a) chitchat-like
text = messages of the other senders (disjoint users), (b) Wikipedia sentences, (c) Simpsons
lines. For comparison the baseline without prefinetuning (and, with ``compare_all``, every
other candidate) is also carried through stages 2-3; only FreD's choice runs under the
pipeline's own ledger, the others under copies (counterfactual runs).

Stages (``run_stages``, resumable per stage; ``workdir/<i>-<name>``):
``FreD`` (embed, release, rank), ``no prefinetuning``, ``rank 1`` (FreD's choice: prefinetune +
FL-finetune under the pipeline ledger), then ``rank 2``, ... with ``compare_all``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import dp_accounting as dpa
import jax
import numpy as np

from fedpriv.data import encode_examples, load_chitchat, load_public_pool, split_client_ids, train_sentencepiece
from fedpriv.data.populations import fred_train_clients
from fedpriv.dp import moments
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.checkpoint import ResumeMismatch
from fedpriv.fl.loop import NONPRIVATE, OUTPUTS
from fedpriv.fl.stages import Stage, StageContext, run_stages, stage_dir
from fedpriv.fred.distance import fred_nonprivate, pca_basis
from fedpriv.fred.embed import candidate_datasets, embed_all, sample_texts
from fedpriv.fred.private import private_stats, rank_candidates
from fedpriv.models import bert
from fedpriv.models.metrics import evaluate
from fedpriv.public.pretrain import adam_with_clipping, train_central
from fedpriv.recipes import lm as lm_recipe
from fedpriv.verdicts import unigram_perplexity

NONE = "(no prefinetuning)"
FRED = "FreD"
RELEASE = "FreD release (mean + covariance)"  # the ledger entry of stage 1

NOT_COVERED_NOTE = ("NOT covered by the ledger: columns prefixed nonprivate/ (noise-free FreD of the "
                    "private embeddings), the val/test accuracy, loss and perplexity (exact "
                    "evaluation on held-out private users) and the unigram baseline's test perplexity")


def outputs() -> dict:
    """Which outputs of the pipeline the ledger covers (the run record)."""
    return {"covered_by_ledger": ["FreD release (mean, covariance) and fred_private, private_rank, "
                                  "chosen_by_fred (post-processing)", "FL-finetuned model"],
            "not_covered": [NONPRIVATE + "fred (noise-free FreD of the private embeddings)",
                            "val_*/test_* (exact evaluation on held-out private users)"],
            "metrics.jsonl": OUTPUTS}


def build_data(cfg, progress: bool = True):
    """``(train, val, test, candidates, fred_private)``: the private users' client splits, the
    candidate datasets (name -> sentences) and each training user's FreD sentences (at most
    ``cfg.max_per_user``), all drawn from ``cfg.seed``."""
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
    candidates = candidate_datasets(held, cfg.num_sentences, rng, progress)
    fred_private = {cid: sample_texts(tr[cid], cfg.max_per_user, rng) for cid in tr.client_ids}
    return tr, va, te, candidates, fred_private


def fred_release_event(cfg) -> dpa.DpEvent:
    """What stage 1 charges: FreD's two Gaussian releases at ``(fred_epsilon, lm.delta)`` each."""
    sigma = moments.gaussian_sigma(cfg.fred_epsilon, cfg.lm.delta)
    return moments.release_event(moments.moment_events(sigma))


def fred_declared_users(cfg) -> int:
    """FreD's declared denominator ``n_public`` (user level, the pipeline's add/remove ledger:
    the exact count is private, ``fedpriv.fred.private`` module doc): the FL training users the
    config declares, from the config and the corpus' published size alone
    (``fedpriv.data.populations.fred_train_clients``, the population the plans account with); no
    private data is read. Also used by ``fedpriv.recipes.fred_mixtures``."""
    return fred_train_clients(cfg)


def _fred_stage(cfg, fred_private, candidates, progress) -> Callable[[StageContext], dict]:
    def run(ctx: StageContext) -> dict:
        # the private statistics are released once, reused for every candidate (post-processing)
        embedder = bert.load_embedder(max_length=cfg.embed_max_length)
        priv_emb, cand_emb, throughput = embed_all(embedder, fred_private, candidates, cfg.embed_batch,
                                                   os.path.join(ctx.workdir, "embeddings.npz"),
                                                   progress=progress)
        basis = pca_basis(np.concatenate(list(cand_emb.values())), cfg.pca_dims) if cfg.pca_dims else None
        proj = (lambda e: np.asarray(e) @ basis) if basis is not None else np.asarray
        release = private_stats([proj(priv_emb[c]) for c in priv_emb], cfg.fred_clip, cfg.fred_epsilon,
                                cfg.lm.delta, unit=cfg.fred_unit, key=jax.random.key(cfg.seed),
                                ledger=ctx.ledger, name=RELEASE, n_public=fred_declared_users(cfg))
        ranking = rank_candidates({n: proj(e) for n, e in cand_emb.items()}, release)
        all_priv = np.concatenate([proj(v) for v in priv_emb.values()])
        return {"ranking": [[n, float(s)] for n, s in ranking],
                "nonprivate_fred": {n: fred_nonprivate(proj(e), all_priv) for n, e in cand_emb.items()},
                "release": {"epsilon_basic": release.epsilon_basic, "delta_total": release.delta_total,
                            "epsilon_rdp": release.epsilon_rdp, "epsilon_pld": release.epsilon_pld},
                "embedder_sentences_per_s": throughput,
                # counterfactual rows start from here, not from the chosen run
                "ledger_after_fred": ctx.ledger.to_dict()}
    return run


def _pre_fl_params(cfg, name: str, task, tok, candidates, workdir: str, progress):
    """The model before FL-finetuning: the seeded init, prefinetuned on candidate ``name`` (public
    data; ``train_central`` resumes from ``workdir/prefinetune``) unless ``name`` is NONE."""
    lm = cfg.lm
    params = task.init(jax.random.key(lm.seed))
    if name != NONE:
        data = {"tokens": encode_examples(tok.encode(candidates[name]), lm.seq_len)}
        params, _ = train_central(task.loss_fn, params, data, steps=cfg.prefinetune_steps,
                                  batch_size=cfg.prefinetune_batch, seed=cfg.seed,
                                  optimizer=adam_with_clipping(cfg.prefinetune_lr),
                                  workdir=os.path.join(workdir, "prefinetune"), progress=progress,
                                  desc=f"prefinetune on {name}")
    return params


def perplexity_of(loss) -> float | None:
    """``exp(mean token loss)``, as ``fedpriv.models.metrics.evaluate`` reports perplexity."""
    return None if loss is None else float(np.exp(np.float64(loss)))


def _finetune_stage(cfg, rank: int | None, lm_data: Callable, candidates, progress):
    """Stage of one row: prefinetune on the candidate FreD ranked ``rank`` (None: none), then
    DP FL-finetune; FreD's choice (rank 1) under the pipeline's ledger."""
    lm = cfg.lm

    def run(ctx: StageContext) -> dict:
        fred = ctx.results[FRED]
        ranking = [tuple(r) for r in fred["ranking"]]
        name = NONE if rank is None else ranking[rank - 1][0]
        prepared, task, val_tokens, test_tokens = lm_data()
        params = _pre_fl_params(cfg, name, task, prepared.tokenizer, candidates, ctx.workdir, progress)
        before = evaluate(task, params, val_tokens, lm.eval_batch_size)
        before_test = evaluate(task, params, test_tokens, lm.eval_batch_size)
        if rank == 1:
            led = ctx.ledger                                # the pipeline's own budget
        elif name == NONE:
            led = PrivacyLedger(cfg.total_epsilon, lm.delta, unit="user")  # ran no FreD
        else:
            led = PrivacyLedger.from_dict(fred["ledger_after_fred"])  # counterfactual: FreD spent, no FL
        s = lm_recipe.run_lm_fl(lm, os.path.join(ctx.workdir, "fl"), prepared=prepared, init_params=params,
                                ledger=led, progress=progress, stage=f"DP-FTRL FL-finetune ({name})")
        # DP columns first; exact statistics of the private users (noise-free FreD, evaluation
        # on held-out private users) are marked ``nonprivate/`` and come last
        return {"prefinetune data": name, "fred_private": dict(ranking).get(name),
                "private_rank": rank, "chosen_by_fred": rank == 1,
                "fl_noise_multiplier": s["noise_multiplier"],
                "pipeline_epsilon": led.spent(), "pipeline_epsilon_executed": led.spent_executed(),
                "fl_epsilon_alone": s["epsilon"],
                "fl_epsilon_executed_alone": s["epsilon_executed_run"] if s["epsilon_executed_run"]
                is not None else s["epsilon"],
                "val_ppl_before_fl": before["perplexity"], "val_acc_before_fl": before["accuracy"],
                "val_acc_after_fl": s["val_accuracy"], "test_acc_after_fl": s["test_accuracy"],
                "val_loss_after_fl": s["val_loss"],
                "test_loss_before_fl": before_test["loss"], "test_ppl_before_fl": before_test["perplexity"],
                "test_loss_after_fl": s["test_loss"], "test_ppl_after_fl": perplexity_of(s["test_loss"]),
                NONPRIVATE + "fred": fred["nonprivate_fred"].get(name)}
    return run


TEST_COLUMNS = ("test_loss_before_fl", "test_ppl_before_fl", "test_loss_after_fl", "test_ppl_after_fl")


def _backfill_test_columns(cfg, row: dict, stage_workdir: str, lm_data: Callable, candidates,
                           progress) -> dict:
    """A row recorded by an earlier version (``stages.json`` without the test-perplexity
    columns; the fingerprint covers the config, not the code): the after-FL test loss from the
    FL run's own ``fl/summary.json``, the before-FL one re-evaluated on the prefinetuned model
    (the seeded init, or ``train_central`` resumed from the stage's finished checkpoint: public
    data, nothing charged). Missing records are an error, never a silent blank column."""
    path = os.path.join(stage_workdir, "fl", "summary.json")
    if not os.path.exists(path):
        raise ResumeMismatch(f"{stage_workdir}: a finished stage without the test-perplexity columns "
                             f"and no {path} to derive them from; use another workdir")
    with open(path) as f:
        test_loss = json.load(f)["test_loss"]
    prepared, task, _, test_tokens = lm_data()
    params = _pre_fl_params(cfg, row["prefinetune data"], task, prepared.tokenizer, candidates,
                            stage_workdir, progress)
    before_test = evaluate(task, params, test_tokens, cfg.lm.eval_batch_size)
    return {**row, "test_loss_before_fl": before_test["loss"], "test_ppl_before_fl": before_test["perplexity"],
            "test_loss_after_fl": test_loss, "test_ppl_after_fl": perplexity_of(test_loss),
            "backfilled": "test columns recomputed on resume (stage recorded by an earlier version)"}


def run_pipeline(cfg, workdir: str, progress: bool = True) -> dict:
    """Run (or resume) the pipeline of ``cfg`` (``configs/fred_pipeline.py``) in ``workdir``.

    Returns ``{"rows", "chosen", "ranking", "unigram_test_ppl", "nonprivate_fred", "fred_release",
    "embedder_sentences_per_s", "ledger", "resumed"}``: one row per prefinetuning choice
    (baseline first, then by FreD rank), FreD's private ranking ``[[name, score], ...]``, the
    test perplexity of the training users' unigram distribution (the trivial baseline,
    ``verdicts.unigram_perplexity``; NON-PRIVATE, not covered by the ledger) and the
    noise-free FreD of every candidate (NOT covered by the ledger), the pipeline's
    :class:`PrivacyLedger` after all stages, the stages resumed from an earlier session.

    Rows carry the test loss and perplexity (``exp`` of the mean token loss, as
    ``models.metrics.evaluate``) before and after FL (``TEST_COLUMNS``). A stage finished by an
    earlier version without them is back-filled on resume (``_backfill_test_columns``).
    """
    lm = cfg.lm
    os.makedirs(workdir, exist_ok=True)
    tr, va, te, candidates, fred_private = build_data(cfg, progress)
    cache = {}

    def lm_data():
        """(prepared data, task, validation tokens, test tokens) of stages 2-3, built once on
        first use (the test tokens are those ``run_lm_fl`` evaluates: ``max_eval_examples``)."""
        if not cache:
            tok = train_sentencepiece(load_public_pool(progress=progress).texts, vocab_size=lm.vocab_size)
            kw = dict(seq_len=lm.seq_len, max_examples_per_client=lm.max_examples_per_client,
                      batch_size=lm.batch_size, seed=lm.seed)
            datasets = [t.to_dataset(tok, **kw) for t in (tr, va, te)]
            stats = {"corpus": "chitchat (private half)", "vocab_size": tok.vocab_size,
                     "train_clients": len(datasets[0]), "val_clients": len(datasets[1])}
            cache["v"] = (lm_recipe.Prepared(*datasets, tok, stats), lm_recipe.build_task(lm, tok.vocab_size),
                          datasets[1].concat_examples()["tokens"][: lm.max_eval_examples],
                          datasets[2].concat_examples()["tokens"][: lm.max_eval_examples])
        return cache["v"]

    ranks = range(1, len(candidates) + 1) if cfg.compare_all else [1]
    stages = [Stage(FRED, _fred_stage(cfg, fred_private, candidates, progress)),
              Stage("no prefinetuning", _finetune_stage(cfg, None, lm_data, candidates, progress))]
    stages += [Stage(f"rank {r}", _finetune_stage(cfg, r, lm_data, candidates, progress)) for r in ranks]
    ledger = PrivacyLedger(cfg.total_epsilon, lm.delta, unit="user")
    # one seed's pipeline: which other seeds an invocation runs (``seeds``) is not part of it
    fingerprint = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "seeds"}
    out = run_stages(stages, workdir, ledger, fingerprint=fingerprint, log=print if progress else (lambda _: None))
    fred = out.results[FRED]
    rows = []
    for i, st in enumerate(stages[1:], start=1):
        row = out.results[st.name]
        if any(k not in row for k in TEST_COLUMNS):
            row = _backfill_test_columns(cfg, row, stage_dir(workdir, i, st.name), lm_data, candidates, progress)
        rows.append(row)
    prepared, _, _, test_tokens = lm_data()
    unigram = unigram_perplexity(prepared.train.concat_examples()["tokens"], test_tokens,
                                 prepared.tokenizer.vocab_size)
    return {"rows": rows, "chosen": fred["ranking"][0][0], "ranking": fred["ranking"],
            "unigram_test_ppl": unigram,
            "nonprivate_fred": fred["nonprivate_fred"],
            "fred_release": fred["release"], "embedder_sentences_per_s": fred["embedder_sentences_per_s"],
            "ledger": out.ledger, "resumed": out.resumed}
