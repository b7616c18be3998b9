"""The stages of the prefinetuning-mixtures experiment (Hou et al. 2023 §4.2, Table 2 and
Figure 2): a recipe on top of :mod:`fedpriv.fred.mixtures` (the mixtures, FreD vs Y, the
verdicts), :mod:`fedpriv.recipes.fred_pipeline` (the data and FreD's declared population) and
:mod:`fedpriv.recipes.lm` (the DP FL-finetuning).

Stages (``fedpriv.fl.stages.run_stages``, resumable; ``workdir/<i>-<name>``): ``FreD`` (embed
the pools and users once, non-private FreD per Y, one Algorithm-1 release per trial reused for
every Y; the other trials are replicates of the experiment, each of which would cost the same),
then one stage per (Y, seed): prefinetune on the mixture, test perplexity, DP-FTRL FL-finetune
under a copy of the user-level ledger after the FreD stage, test perplexity.

Which ledger trial 0's release is charged to follows the config's ``fred_unit``
(configs/fred_mixtures.py; ``fedpriv.recipes.plans.fred_mixtures_plan`` states the same):

* ``"sample"`` (the paper): its own sample-level ledger (:func:`fred_ledger`: replace-one, the
  exact sentence count public, budget ``(2 fred_epsilon, 2 fred_delta)``), recorded in the FreD
  stage's result as ``fred_ledger``; the pipeline's user-level ledger gets no FreD entry, so
  every FL-finetuning is calibrated to the whole ``total_epsilon``. (A sample-level release on
  the user-level ledger is refused by ``fedpriv.fred.private``: fail closed.)
* ``"user"``: the pipeline's user-level ledger (add/remove, the declared user count); the
  FL-finetuning is calibrated to what FreD left.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable

import jax

from fedpriv.data import encode_examples, load_public_pool, train_sentencepiece
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.stages import Stage, run_stages, stage_dir
from fedpriv.fred.embed import HELD_OUT, embed_all
from fedpriv.fred.mixtures import (
    PUBLIC,
    RELEASE,
    fred_vs_y,
    mixture,
    nonprivate_fred_vs_y,
    shuffled_pools,
)
from fedpriv.models import bert
from fedpriv.models.metrics import evaluate
from fedpriv.public.pretrain import adam_with_clipping, train_central
from fedpriv.recipes import lm as lm_recipe
from fedpriv.recipes.fred_pipeline import build_data as pipeline_data, fred_declared_users
from fedpriv.recipes.plans import SAMPLE_RELATION, mixtures_fred_budget

# ============================================================================================
# The experiment's stages
# ============================================================================================

def build_data(cfg, progress: bool = True):
    """``(train, val, test, pools, fred_private)``: the private users' splits, the two pools
    (``{HELD_OUT: [str], PUBLIC: [str]}``, ``num_sentences`` each, shuffled) and each training
    user's FreD sentences. Same draws as :func:`fedpriv.recipes.fred_pipeline.build_data` (the Simpsons
    candidate is dropped)."""
    tr, va, te, candidates, fred_private = pipeline_data(cfg, progress)
    pools = shuffled_pools({HELD_OUT: candidates[HELD_OUT], PUBLIC: candidates[PUBLIC]}, cfg.seed)
    for name, texts in pools.items():
        if len(texts) < cfg.num_sentences:
            raise ValueError(f"pool {name!r} has {len(texts)} sentences < num_sentences "
                             f"{cfg.num_sentences}")
    return tr, va, te, pools, fred_private


def stage_name(y: float, seed: int) -> str:
    return f"Y={y:g}% seed={seed}"


def fred_ledger(cfg, pipeline_ledger: PrivacyLedger) -> PrivacyLedger:
    """The ledger FreD's trial-0 release is charged to: at ``fred_unit="user"`` the pipeline's
    user-level ledger itself; at ``"sample"`` a fresh sample-level ledger of its own (relation
    ``plans.SAMPLE_RELATION``, budget ``plans.mixtures_fred_budget``), never the pipeline's."""
    if cfg.fred_unit == "user":
        return pipeline_ledger
    return PrivacyLedger(*mixtures_fred_budget(cfg), neighboring=SAMPLE_RELATION, unit="sample")


def fred_release_args(cfg) -> dict:
    """``fred_vs_y``'s unit, relation and denominator: sample level, replace-one, the exact
    sentence count (public under replace-one: ``n_public=None``); user level, the pipeline's
    add/remove with the declared user count (``fred_declared_users``: the exact one is private)."""
    if cfg.fred_unit == "sample":
        return {"unit": "sample", "relation": SAMPLE_RELATION, "n_public": None}
    return {"unit": "user", "relation": "add_remove", "n_public": fred_declared_users(cfg)}


def _fred_stage(cfg, pools, fred_private, progress) -> Callable:

    def run(ctx) -> dict:
        t0 = time.time()
        embedder = bert.load_embedder(max_length=cfg.embed_max_length)
        priv_emb, pool_emb, throughput = embed_all(embedder, fred_private, pools, cfg.embed_batch,
                                                   os.path.join(ctx.workdir, "embeddings.npz"),
                                                   progress=progress)
        led = fred_ledger(cfg, ctx.ledger)
        fr = fred_vs_y(priv_emb, pool_emb, cfg.y_percents, cfg.num_sentences,
                       trials=cfg.fred_trials, clip=cfg.fred_clip, epsilon=cfg.fred_epsilon,
                       delta=cfg.fred_delta, seed=cfg.seed, pca_dims=cfg.pca_dims,
                       ledger=led, name=RELEASE, **fred_release_args(cfg))
        return {**fr, "embedder_sentences_per_s": throughput,
                "embedded_sentences": int(sum(len(v) for v in priv_emb.values())
                                          + sum(len(v) for v in pool_emb.values())),
                # the declared count (the exact one is private under the add/remove ledger)
                "private_users": fred_declared_users(cfg), "fred_unit": cfg.fred_unit,
                # the release's denominator: the exact sentence count at sample level (public under
                # replace-one), the declared user count at user level
                "fred_n": fr["releases"][0]["n"],
                "fred_ledger": led.to_dict(), "fred_ledger_report": led.report(),
                "ledger_after_fred": ctx.ledger.to_dict(), "wall_s": time.time() - t0}
    return run


def _finetune_stage(cfg, y: float, seed: int, lm_data: Callable, pools, progress) -> Callable:

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
        # counterfactual: every (Y, seed) run starts from the user-level ledger after the FreD stage
        # (FreD's trial 0 at fred_unit="user"; empty at "sample", whose release has its own ledger)
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
