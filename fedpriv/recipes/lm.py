"""Recipe: private FL of an on-device LM on a real user-keyed corpus (Wang et al. 2023 §2, §3, App. C).

Turns a config (``configs/lm_fl.py``'s fields) into data, task, algorithm, sampler and privacy
event, and runs them: data -> tokenizer -> model -> algorithm -> ledger -> the one round loop
(``fedpriv.fl.loop.train``) -> summary (JSON, Markdown, PNG learning curve). The building block
of the LM experiments (``make demo``, the privacy-utility table, the public-data and FreD
pipelines)::

    from fedpriv.recipes import lm
    summary = lm.run_lm_fl(cfg, "runs/lm_fl")      # or the pieces: prepare_data, build_task,
                                                   # build_algorithm
    summary = lm.run_lm_fl(cfg, "runs/mine", model=MyLM(...), client=my_hooks)  # your model, hooks

One job per module: the data (``lm_data``), the run's pieces from the config (``lm_build``: model,
task, algorithm, sampler, event, fingerprint), what it reports (``lm_report``), and the run
itself (here, re-exporting the others' names). The algorithms a config names are registered
objects (``fedpriv.recipes.algorithms``).

Privacy: the unit is the user (client). With ``noise_cohort_size`` the run trains with
``cohort_size`` clients per round but adds the noise of ``noise_cohort_size`` (McMahan et al.
2018): the reported epsilon is that of the simulated run whose cohort is ``noise_cohort_size``
drawn from a population scaled up by the same factor; the epsilon of the run actually
executed is reported next to it. With ``simulated_population`` (the paper-noise protocol,
:mod:`fedpriv.dp.population`) the run adds the paper's per-round noise on the paper's cohort and
its summary states both epsilons side by side (``paper_noise``): the paper's population's
(declared) and the one spent on our users (the ledger's charge, ``epsilon``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax

from fedpriv import report
from fedpriv.dp import accounting
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl import algorithms as algs
from fedpriv.fl.loop import train
from fedpriv.models.lm import count_params, make_lm_task
from fedpriv.models.metrics import evaluate, most_frequent_token_accuracy
from fedpriv.recipes.lm_build import (  # noqa: F401 (re-exported: the run's pieces)
    SAME_NUMBERS_BATCHINGS,
    build_algorithm,
    build_task,
    client_compute_dtype,
    model_config,
    paper_noise,
    run_fingerprint,
    simulated_population,
)
from fedpriv.recipes.lm_data import (  # noqa: F401 (re-exported: the data)
    TOKENIZER_NAMES,
    Prepared,
    load_corpus,
    load_public,
    parse_tokenizer,
    prepare_data,
    with_tokenizer,
)
from fedpriv.recipes.lm_report import (  # re-exported: what a run reports
    PRIVATE_VOCABULARY,
    outputs,
    previous_wall_clock,
    tokenizer_accuracies,
    write_summary_md,
)
from fedpriv.util import PhaseTimer  # re-exported


def run_lm_fl(cfg, workdir: str, *, prepared: Prepared | None = None, init_params=None,
              ledger: PrivacyLedger | None = None, progress: bool = True, log=print,
              stage: str = "fl-training", sp_tokenizer=None, task=None, model=None, client=None,
              server=None) -> dict:
    """Train per ``cfg``; write ``metrics.jsonl``, ``summary.{json,md}``, ``learning_curve.png``.

    ``init_params`` (e.g. a publicly pre-trained checkpoint) and ``ledger`` (a pipeline's
    shared budget) are optional; by default the ledger's budget is this run's epsilon.
    ``stage`` names the run in the ledger and tags its PRNG keys (one per run on the same users).
    A researcher's own model: ``task`` (an ``LMTask``, ``fedpriv.models.lm.make_lm_task``) or
    ``model`` (a Flax LM, wrapped by ``make_lm_task``) replaces ``cfg``'s architecture;
    ``client`` / ``server`` (``ClientHooks`` / ``ServerHooks``) replace the algorithm's hooks.
    The event charged is the mechanism's whatever they are. The summary has
    ``val_accuracy_round0`` (the initial model, Wang et al. Table 1's round-0 column) and the
    :func:`tokenizer_accuracies` of the final model on validation (``val_`` prefixed;
    ``sp_tokenizer`` converts a word model's accuracy to next-token accuracy).
    """
    t0 = time.time()
    os.makedirs(workdir, exist_ok=True)
    phases = PhaseTimer()
    with phases("data"):
        prepared = prepared or prepare_data(cfg, progress)
    task = task or (make_lm_task(model) if model is not None else build_task(cfg, prepared.tokenizer.vocab_size))
    params = init_params if init_params is not None else task.init(jax.random.key(cfg.seed))
    ids = list(prepared.train.client_ids)
    prior = ledger.dp_events() if ledger is not None else ()
    alg, sampler, event, z = build_algorithm(cfg, len(ids), task.loss_fn, prior,
                                             num_params=count_params(params), client=client, server=server)
    eps, eps_real, ledger = _ledger(cfg, alg, sampler, event, ledger, prepared)
    val = prepared.val.concat_examples()["tokens"][: cfg.max_eval_examples]
    eval_fn = phases.timed("evaluation", lambda p: evaluate(task, p, val, cfg.eval_batch_size))
    round0 = eval_fn(params)["accuracy"]
    noise_note, pn = _noise_note(cfg, z, eps, eps_real, alg, sampler, len(ids), event is not None, log)
    with phases("training (rounds, compile, checkpoints; without evaluation)", exclude=("evaluation",)):
        result = train(alg, params, prepared.train, ids, sampler, rounds=cfg.rounds, batch_size=cfg.batch_size,
                       seed=cfg.seed, workdir=workdir, max_steps=cfg.max_local_steps, eval_fn=eval_fn,
                       eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, ledger=ledger,
                       stage=stage, fingerprint=run_fingerprint(cfg), progress=progress,
                       log_fn=_log_row(log), lanes=cfg.lanes, batching=getattr(cfg, "batching", "auto"),
                       log=log)
    eps, eps_real, if_public, noise_note = _charged(result, stage, eps, eps_real, noise_note)
    final = (result.evals[-1] if result.evals and result.evals[-1]["round"] == cfg.rounds
             else {f"eval_{k}": v for k, v in eval_fn(result.state.params).items()})
    test = prepared.test.concat_examples()["tokens"][: cfg.max_eval_examples]
    with phases("evaluation"):
        test_metrics = evaluate(task, result.state.params, test, cfg.eval_batch_size)
        tok_acc = tokenizer_accuracies(task, result.state.params, val, prepared.tokenizer,
                                       cfg.eval_batch_size, sp_tokenizer)
    summary = {
        "algorithm": cfg.algorithm, "noise_multiplier": z, "epsilon": eps, "delta": cfg.delta,
        "epsilon_executed_run": eps_real, **if_public, "unit_of_privacy": "user", "noise_note": noise_note,
        "rounds": cfg.rounds, "cohort_size": cfg.cohort_size, "noise_cohort_size": cfg.noise_cohort_size,
        "paper_noise": None if pn is None else pn.as_dict(),
        "val_accuracy": final.get("eval_accuracy"), "val_loss": final.get("eval_loss"),
        "val_accuracy_round0": round0,
        **{f"val_{k}": v for k, v in tok_acc.items()},
        "test_accuracy": test_metrics["accuracy"], "test_loss": test_metrics["loss"],
        "most_frequent_token_val_accuracy": most_frequent_token_accuracy(
            prepared.train.concat_examples()["tokens"], val),
        "num_params": count_params(result.state.params), "wall_clock_s": _wall(workdir, result, cfg, t0),
        "phase_seconds": phases.as_dict(),
        "resumed_from_round": result.resumed_from, "data": prepared.stats,
        "ledger": result.ledger.report() if result.ledger else None,
        "curve": report.metric_curve(workdir, "eval_accuracy"),
        "outputs": outputs(prepared.stats.get("vocabulary_public", True)),
        **report.run_record(cfg, cfg.seed),
    }
    _write(summary, workdir, cfg)
    return summary


def _ledger(cfg, alg, sampler, event, ledger, prepared):
    """``(epsilon of this run alone, of the run executed (noise-cohort simulation) or None, the
    ledger)``: a fresh ledger of this run's epsilon unless one is given; a vocabulary from the
    training users' text is recorded in it as non-private."""
    eps = eps_real = None
    if event is None:
        return eps, eps_real, ledger
    rel = algs.neighboring_for(sampler)
    eps = accounting.compute_epsilon(event, cfg.delta, rel)[0]  # this run alone
    if cfg.noise_cohort_size is not None:
        real = algs.privacy_event(alg.dp, sampler, cfg.rounds, simulated=False)
        eps_real = accounting.compute_epsilon(real, cfg.delta, rel)[0]
    if ledger is None:
        ledger = PrivacyLedger(eps * (1 + 1e-6), cfg.delta, neighboring=rel)
    if not prepared.stats.get("vocabulary_public", True) and ledger.entry(PRIVATE_VOCABULARY) is None:
        ledger.record_nonprivate(PRIVATE_VOCABULARY, note=(
            f"NON-PRIVATE: the top-{cfg.vocab_size - 4} words of the training users' text (Wang "
            "et al.'s word-tokenizer baseline); the DP epsilon holds only if it is taken as public"))
    return eps, eps_real, ledger


def _noise_note(cfg, z, eps, eps_real, alg, sampler, num_clients, private, log):
    """The run's privacy line (logged) and its paper-noise pair (None without one)."""
    if not private:
        return "", None
    note = (f"{cfg.algorithm}: z = {z:.4f}, clip {cfg.clip_norm}, epsilon = {eps:.3f} at delta = "
            f"{cfg.delta:g} (user-level)")
    if cfg.noise_cohort_size is not None:
        note += (f"; trains with cohort {cfg.cohort_size} but adds the noise of a cohort of "
                 f"{cfg.noise_cohort_size}: the epsilon is that of the simulated population "
                 f"{num_clients * cfg.noise_cohort_size // cfg.cohort_size}; the run actually "
                 f"executed has epsilon = {eps_real:.3g}")
    # the paper-noise pair's "spent" side is the run executed on our users
    pn = paper_noise(cfg, z, alg, sampler, num_clients)
    if pn is not None:
        note += "; paper-noise protocol: " + pn.line()
    log(note)
    return note, pn


def _log_row(log):
    def log_row(row):
        if "eval_accuracy" in row:
            extra = (f", epsilon spent {row['epsilon_spent']:.3f} (the whole run, charged before round 0)"
                     if "epsilon_spent" in row else "")
            log(f"round {row['round']:5d}: val accuracy {row['eval_accuracy']:.4f}, "
                f"val loss {row['eval_loss']:.3f}{extra}")
    return log_row


def _charged(result, stage, eps, eps_real, noise_note):
    """The epsilons recorded for this run (more if a resume extended it); with a non-private
    choice recorded (the vocabulary), infinite, and beside them the epsilons if it is public."""
    if result.ledger is not None:
        mine = next(e for e in result.ledger.report()["entries"] if e["name"] == stage)
        eps, eps_real = mine["epsilon_alone"], mine.get("epsilon_executed_alone", eps_real)
    if_public = {}
    if result.ledger is not None and result.ledger.nonprivate_entries:
        if_public = {"epsilon_if_vocabulary_public": eps, "epsilon_executed_run_if_vocabulary_public": eps_real,
                     "nonprivate_entries": result.ledger.nonprivate_entries}
        eps, eps_real = float("inf"), (float("inf") if eps_real is not None else None)
        noise_note += (f"; NON-PRIVATE vocabulary (top-k words of the training users): epsilon = inf; "
                       f"{if_public['epsilon_if_vocabulary_public']:.3f} if the vocabulary is taken as public")
    return eps, eps_real, if_public, noise_note


def _wall(workdir, result, cfg, t0) -> float:
    """Training wall clock: a rerun of a finished run trains nothing (its recorded time is kept);
    a resumed run adds this session's time to what the interrupted session recorded."""
    elapsed, prev = time.time() - t0, previous_wall_clock(workdir)
    return (prev if result.resumed_from >= cfg.rounds and prev is not None
            else elapsed + (prev or 0.0) if result.resumed_from > 0 else elapsed)


def _write(summary: dict, workdir: str, cfg) -> None:
    report.save_json(summary, os.path.join(workdir, "summary.json"))
    write_summary_md(summary, workdir)
    if summary["curve"]:
        xs, ys = zip(*summary["curve"])
        report.plot_curves({cfg.algorithm: (list(xs), list(ys))}, os.path.join(workdir, "learning_curve.png"),
                           "round", "validation accuracy (in-vocab)", f"{cfg.corpus}: {cfg.arch} LM")


def run_variants(lm_cfg, seeds, variants, workdir: str, *, progress: bool = True) -> list[dict]:
    """Run (or read back, once finished) every ``(label, name, overrides)`` of ``variants`` on
    ``lm_cfg`` for each seed, in ``workdir/seed<S>-<name>``; the data are prepared once per seed.

    Returns one dict per (seed, variant): ``label``, ``seed``, ``workdir``, the run's ``summary``
    and its comparison fields (``epsilon``, ``epsilon_executed_run``, ``noise_multiplier``,
    ``val_accuracy``, ``test_accuracy``, ``s_per_round``, ``baseline`` = most-frequent token)."""
    out = []
    for seed in seeds:
        base = dataclasses.replace(lm_cfg, seed=seed)
        prepared = prepare_data(base, progress)
        for label, name, overrides in variants:
            sub = os.path.join(workdir, f"seed{seed}-{name}")
            done = os.path.join(sub, "summary.json")
            if os.path.exists(done):
                with open(done) as f:
                    s = json.load(f)
            else:
                s = run_lm_fl(dataclasses.replace(base, **overrides), sub, prepared=prepared,
                              progress=progress, stage=f"fl-training ({label})")
            out.append({"label": label, "seed": seed, "workdir": sub, "summary": s,
                        **{k: s[k] for k in ("epsilon", "epsilon_executed_run", "noise_multiplier",
                                             "val_accuracy", "test_accuracy")},
                        "s_per_round": s["wall_clock_s"] / base.rounds,
                        "baseline": s["most_frequent_token_val_accuracy"]})
    return out
