"""One row of Koga et al. 2023 Table 1 on one dataset and seed: unigram release -> PT -> FT.

`run_scheme` trains a `TrainingScheme` with DP-FedAvg (Poisson sampling, Gaussian noise), a
FedAdam-style server and SGD clients through the one round loop (`fedpriv.fl.loop.train`), as a
pipeline of `fedpriv.fl.stages` with ONE `PrivacyLedger(*scheme.budget)` threaded through
(unit: the user, add/remove neighbouring):

* ``unigrams`` (IW / IWPT): private unigram frequencies u_hat_S, u_hat_T with the Geometric
  mechanism at (0.8, 0), each charged to its own population (`domain_unigram_frequencies`);
  S examples are then weighted by Eq. 3, w(x) = p_T(x) / (alpha p_T(x) + (1 - alpha) p_S(x)),
  T examples w = 1, and training spends (1.2, 1e-6).
* ``stage0``, ``stage1``, ...: the scheme's DP-FL stages (PT / IWPT: pretrain on S with cohort C,
  then finetune on T with cohort alpha*C, each spending its budget on its own population:
  parallel composition, visible in the ledger's per-population epsilons).

Noise cohort (McMahan et al. 2018; Sec. 4.2: C = 5000 for the noise, 400 trained): every stage
trains with ``train_cohort`` (x alpha for alpha*C stages) clients per round in expectation but adds
the noise of ``noise_cohort``. Its noise multiplier z is calibrated so that the stage's
``privacy_event`` (the simulated run: cohort ``noise_cohort`` from a population scaled up by the
same factor, same sampling rate) meets the stage's budget (`calibrate_stage`). The epsilon of the
run actually executed (``privacy_event(..., simulated=False)``) is far larger and reported next to
it (`executed_by_population`).

``cfg`` is a ``configs/population_expansion.py`` config.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import time
from typing import Any, Callable

import jax
import numpy as np
import optax

from fedpriv.data.errors import ConfigError
from fedpriv.dp import accounting, geometric
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.expansion.data import POPULATION_LABELS as LABELS, SOURCE, TARGET, DomainDataset
from fedpriv.expansion.datasets import PRIVATE_VOCABULARY, Prepared
from fedpriv.expansion.schemes import Stage, TrainingScheme
from fedpriv.expansion.unigrams import (
    DEFAULT_IGNORE_IDS,
    domain_unigram_frequencies,
    normalise_counts,
    unigram_counts,
    unigram_entry_name,
    unigram_sensitivity,
)
from fedpriv.expansion.weights import add_importance_weights
from fedpriv.fl import algorithms as algs, stages as fl_stages
from fedpriv.fl.loop import NONPRIVATE, OUTPUTS, load_run, train
from fedpriv.fl.samplers import PoissonSampler
from fedpriv.models.domain_lm import make_demix_task, make_dsdsr_task
from fedpriv.models.lm import LMConfig, count_params, make_lm, make_lm_task
from fedpriv.models.metrics import evaluate
from fedpriv.report import git_state, metric_curve, save_json

__all__ = ["UNIGRAM_STAGE", "build_task", "calibrate_stage", "stage_clients", "StagePlan",
           "plan_stages", "unigram_diagnostics", "run_scheme", "executed_by_population",
           "outputs"]

UNIGRAM_STAGE = "unigrams"  # the pipeline stage of the unigram release (before the training stages)


def build_task(model: str, cfg, vocab_size: int):
    """The LM task of a scheme's ``model``: "lstm" (McMahan et al. 2018), "dsdsr" or "demix"."""
    lm_cfg = LMConfig(vocab_size=vocab_size, embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
                      max_len=max(64, cfg.seq_len))
    if model == "lstm":
        return make_lm_task(make_lm(lm_cfg))
    if model == "dsdsr":
        return make_dsdsr_task(lm_cfg)
    if model == "demix":
        return make_demix_task(lm_cfg)
    raise ValueError(f"unknown model {model!r}")


@functools.lru_cache(maxsize=256)
def calibrate_stage(num_clients: int, rate: float, rounds: int, noise_cohort: int,
                    clip_norm: float, epsilon: float, delta: float, accountant: str = "best") -> float:
    """z of a stage: the smallest multiplier whose simulated-run ``privacy_event`` (Poisson
    DP-FedAvg, ``rounds`` rounds at ``rate``, noise of ``noise_cohort``) meets (epsilon, delta)
    under ``accountant`` (the config's, the one its ledger charges with)."""
    sampler = PoissonSampler(num_clients, rate)
    make = lambda z: algs.privacy_event(
        algs.DPConfig(clip_norm, z, "gaussian", noise_cohort_size=noise_cohort), sampler, rounds)
    return accounting.calibrate_noise_multiplier(make, epsilon, delta, accountant=accountant)


def stage_clients(ds: DomainDataset, stage: Stage, u_hat=None, weight_mode="none",
                  weight_max=None):
    """The stage's training clients (its populations, its example domains); for a weighted
    stage every example carries its Eq. 3 weight: S examples w(x) from (u_hat_S, u_hat_T), T
    examples exactly 1 (`fedpriv.expansion.weights.add_importance_weights`)."""
    clients = stage.clients(ds, "train")
    if stage.weighted:
        if u_hat is None:
            raise ValueError("a weighted stage needs the private unigram frequencies")
        clients = add_importance_weights(clients, u_hat[0], u_hat[1], ds.alpha,
                                         mode=weight_mode, w_max=weight_max)
    return clients


@dataclasses.dataclass
class StagePlan:
    """Everything a stage needs before training: its clients (with Eq. 3 weights if weighted),
    Poisson sampler, DP config with the calibrated z, and its simulated / executed events."""

    stage: Stage
    rounds: int
    clients: Any
    client_ids: list
    sampler: PoissonSampler
    dp: algs.DPConfig
    noise_cohort: int
    event: Any
    executed_event: Any


def _seed_for(seed: int, row: int, stage_index: int) -> int:
    return int(seed) * 1000 + row * 10 + stage_index


def plan_stages(scheme: TrainingScheme, ds: DomainDataset, cfg, seed: int,
                u_hat=None) -> list[StagePlan]:
    """The stages of ``scheme`` on ``ds``: expected cohort ``train_cohort`` (x alpha for alpha*C
    stages) by Poisson sampling at rate q = cohort / N (a cohort > N raises ConfigError, never
    capped), noise of ``noise_cohort`` (x alpha), z calibrated so the stage's simulated-run
    event meets the stage's budget."""
    out = []
    for i, (stage, rounds) in enumerate(zip(scheme.stages, scheme.stage_rounds(cfg.rounds))):
        clients = stage_clients(ds, stage, u_hat, cfg.weight_mode, cfg.weight_max)
        ids = list(clients.client_ids)
        n = len(ids)
        train_c = stage.cohort_size(cfg.train_cohort, ds.alpha)
        noise_c = stage.cohort_size(cfg.noise_cohort, ds.alpha)
        if train_c > n:  # fail closed: never cap the rate at 1 (check_cohorts refuses earlier)
            raise ConfigError(f"scheme {scheme.name!r} stage {i}: cohort {train_c} exceeds its "
                              f"population of {n} training clients")
        rate = train_c / n
        z = calibrate_stage(n, rate, rounds, noise_c, cfg.clip_norm, *stage.budget,
                            accountant=cfg.accountant)
        sampler = PoissonSampler(n, rate, seed=_seed_for(seed, scheme.row, i))
        dp = algs.DPConfig(cfg.clip_norm, z, "gaussian", noise_cohort_size=noise_c)
        out.append(StagePlan(stage, rounds, clients, ids, sampler, dp, noise_c,
                             algs.privacy_event(dp, sampler, rounds, simulated=True),
                             algs.privacy_event(dp, sampler, rounds, simulated=False)))
    return out


def unigram_diagnostics(ds: DomainDataset, u_hat, vocab_size: int, epsilon: float,
                        seed: int, bound: tuple[int, int] = (5, 10)) -> dict:
    """Evaluation-only diagnostic of the unigram release (never fed back into training): per
    population, the number of counted tokens (<= 5 x 10 per user), the Geometric noise std per
    word, and the total-variation distance between the private u_hat and the same bounded
    counts without noise. With few users the noise mass (V words x std) swamps the counts.
    The counted tokens and the distance to the noise-free frequencies are exact statistics of
    the private users: keyed ``nonprivate/...`` (not covered by the ledger); the noise std is a
    function of epsilon only."""
    out = {}
    for pop, u in zip((SOURCE, TARGET), u_hat):
        counts = unigram_counts(ds.clients("train", (pop,), (pop,)), vocab_size,
                                np.random.default_rng([seed, 11, pop]), max_sequences=bound[0],
                                max_tokens_per_sequence=bound[1])
        exact = normalise_counts(counts, zero_ids=DEFAULT_IGNORE_IDS)
        out[LABELS[pop]] = {
            NONPRIVATE + "counted_tokens": int(counts.sum()),
            "noise_std_per_word": math.sqrt(geometric.geometric_variance(
                epsilon, unigram_sensitivity(*bound))),
            NONPRIVATE + "tv_distance_to_nonprivate": float(0.5 * np.abs(np.asarray(u) - exact).sum())}
    return out


def _weight_stats(clients) -> dict:
    arr = clients.concat_examples()
    if "weight" not in arr:
        return {}
    out = {}
    for pop in (SOURCE, TARGET):
        w = arr["weight"][arr["domain"] == pop]
        if len(w):
            out[LABELS[pop]] = {"n": int(len(w)), "mean": float(w.mean()),
                                "min": float(w.min()), "max": float(w.max()),
                                "frac_below_0.1": float(np.mean(w < 0.1))}
    return out


def _epsilon(events, delta: float, accountant: str) -> float:
    return accounting.compute_epsilon(list(events), delta, "add_remove", accountant)[0]


def executed_by_population(ledger: PrivacyLedger, executed_events, delta: float,
                           accountant: str, if_public: bool = False) -> dict:
    """Per population: the unigram releases (pure DP, unchanged; the entries named
    ``unigram_entry_name(label)``) and non-private entries (eps = inf; left out with
    ``if_public``) composed with the training stages' events *as executed* (small cohort, noise
    z * train/noise cohort). ``executed_events``: [(event, population labels)] per stage."""
    unigram_entries = {unigram_entry_name(label) for label in LABELS.values()}
    per_pop: dict[str, list] = {}
    for entry in ledger.entries:
        if entry.name in unigram_entries or (entry.nonprivate and not if_public):
            for p in entry.populations:
                per_pop.setdefault(p, []).append(entry.event)
    for event, pops in executed_events:
        for p in pops:
            per_pop.setdefault(p, []).append(event)
    return {p: _epsilon(evs, delta, accountant) for p, evs in sorted(per_pop.items())}


def outputs() -> dict:
    """Which outputs of a scheme's run the ledger covers (the run record)."""
    return {"covered_by_ledger": ["private unigram frequencies (u_hat)", "trained model",
                                  "instance weights (post-processing of u_hat)"],
            "not_covered": ["unigram_diagnostics " + NONPRIVATE + "* (exact counted tokens, TV "
                            "distance to the noise-free frequencies)",
                            "val/test perplexity, loss, accuracy (exact evaluation on held-out "
                            "private T users)",
                            "the vocabulary, when vocabulary='target_train' (recorded in the "
                            "ledger as non-private: eps = inf)"],
            "metrics.jsonl": OUTPUTS}


def unigram_bound(cfg) -> tuple[int, int]:
    """(max_sequences, max_tokens_per_sequence) per user of the unigram release: the config's
    ``unigram_bound`` (e.g. "5x10"), default the paper's 5 x 10 (Delta = 50)."""
    from fedpriv.expansion.unigrams import parse_bound
    return parse_bound(getattr(cfg, "unigram_bound", "5x10"))


def _fingerprint(cfg, dataset: str, seed: int, scheme: str) -> str:
    keep = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("datasets", "schemes", "seeds", "progress", "eval_every",
                         "checkpoint_every", "eval_batch_size")
            and not (k == "unigram_bound" and v == "5x10")}  # runs from before the field
    blob = json.dumps([keep, dataset, seed, scheme], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _fmt_eps(d: dict) -> str:
    return ", ".join(f"{k}: {v:.3g}" for k, v in sorted(d.items()))


def run_scheme(scheme: TrainingScheme, prep: Prepared, cfg, seed: int, workdir: str,
               log: Callable[[str], None] = print) -> dict:
    """Train one scheme (all its stages) and evaluate perplexity on T; returns its summary.

    The stages run through `fedpriv.fl.stages.run_stages` in ``workdir`` with one ledger:
    ``unigrams`` (if the scheme uses them), then ``stage0``, ``stage1``, ... (each in
    ``workdir/<i>-<name>`` with the loop's checkpoints). Resumable per stage; a finished
    scheme's ``summary.json`` is returned without training (``skipped``).
    """
    path = os.path.join(workdir, "summary.json")
    fp = _fingerprint(cfg, prep.name, seed, scheme.name)
    if os.path.exists(path):
        with open(path) as f:
            done = json.load(f)
        if done.get("fingerprint") != fp:
            raise ValueError(f"{path} was written by a different config; use another --workdir")
        done["skipped"] = True
        return done
    t0 = time.time()
    run = _SchemeRun(scheme, prep, cfg, seed, fp, log)
    pipeline = ([fl_stages.Stage(UNIGRAM_STAGE, run.release_unigrams)]
                if scheme.unigram_budget is not None else [])
    pipeline += [fl_stages.Stage(f"stage{i}", functools.partial(run.train_stage, i))
                 for i in range(len(scheme.stages))]
    done = fl_stages.run_stages(pipeline, workdir, run.ledger, log=log,
                                fingerprint={"config": fp, "scheme": scheme.name, "seed": seed})
    u_hat = _u_hat_of(done.results)
    if not run.plans:  # every stage was done in an earlier session
        run.plans.extend(plan_stages(scheme, prep.ds, cfg, seed, u_hat))
    last = len(run.plans) - 1
    final = run.trained(last, fl_stages.stage_dir(workdir, len(pipeline) - 1, f"stage{last}"))
    summary = _scheme_summary(run, done, u_hat, final, time.time() - t0)
    save_json(summary, path)
    log(f"{run.tag}: val PPL {summary['val_ppl']:.2f}, test PPL {summary['test_ppl']:.2f}, eps by "
        f"population {_fmt_eps(summary['epsilon_by_population'])} (executed run: "
        f"{_fmt_eps(summary['epsilon_executed_by_population'])}), {summary['wall_clock_s']:.0f}s")
    return summary


def _u_hat_of(results):
    u = results.get(UNIGRAM_STAGE)
    return None if u is None else (np.asarray(u["S"]), np.asarray(u["T"]))


class _SchemeRun:
    """One scheme's run (``run_scheme``): its ledger, task and initial model, the stages' plans
    and the params trained in this session; the stages' bodies as methods."""

    def __init__(self, scheme: TrainingScheme, prep: Prepared, cfg, seed: int, fp: str, log):
        self.scheme, self.prep, self.cfg, self.seed, self.fp, self.log = scheme, prep, cfg, seed, fp, log
        self.tag = f"[{prep.name} seed {seed}] {scheme.name}"
        self.budget_delta = scheme.budget[1]
        self.ledger = PrivacyLedger(scheme.budget[0], scheme.budget[1], accountant=cfg.accountant)
        if not prep.vocabulary_public:  # an explicit choice: recorded, eps = inf on T from here on
            self.ledger.record_nonprivate(
                PRIVATE_VOCABULARY, (LABELS[TARGET],),
                note=f"NON-PRIVATE: the top-{cfg.vocab_words} words of the target users' training "
                     "text (Koga et al. assume it known in advance); the DP epsilon holds only if "
                     "this vocabulary is taken as public")
        self.task = build_task(scheme.model, cfg, prep.vocab_size)
        self.init = jax.jit(self.task.init)(jax.random.key(seed))  # one compile, not one per eager op
        self.eval_fn = functools.partial(self.evaluate_on, prep.val_tokens)
        self.plans: list[StagePlan] = []
        self.params: dict[int, Any] = {}  # stage index -> params trained in this session

    def evaluate_on(self, tokens, p):  # T sequences; domain-adaptive models read their domain id
        dom = {"domain": np.full(len(tokens), TARGET, np.int32)} if self.task.uses_domain else {}
        return evaluate(self.task, p, tokens, self.cfg.eval_batch_size, **dom)

    def release_unigrams(self, ctx):
        eps0, delta0 = self.scheme.unigram_budget
        if delta0 != 0:
            raise ValueError("the Geometric mechanism is (eps0, 0)-DP")
        # seeded, so an interrupted stage re-derives the very same release (charged once)
        rng = np.random.default_rng([self.seed, self.scheme.row, 7])
        ms, mt = unigram_bound(self.cfg)
        u_s, u_t = domain_unigram_frequencies(self.prep.ds, self.prep.vocab_size, eps0, rng,
                                              ledger=ctx.ledger, labels=LABELS, max_sequences=ms,
                                              max_tokens_per_sequence=mt)
        return {"S": u_s.tolist(), "T": u_t.tolist()}

    def algorithm(self, sp: StagePlan):
        cfg = self.cfg
        return algs.build_algorithm(self.task.loss_fn, optax.sgd(cfg.client_lr),
                                    algs.server_optimizer(cfg.server_optimizer, cfg.server_lr),
                                    sp.dp, sp.sampler.expected_cohort_size)

    def trained(self, i: int, stage_dir: str):
        """Stage i's final params: from this session, else from its checkpoint."""
        if i not in self.params:
            self.params[i] = load_run(stage_dir, self.algorithm(self.plans[i]).init(
                self.init, jax.random.key(self.seed))).state.params
        return self.params[i]

    def train_stage(self, i: int, ctx):
        cfg, scheme, plans = self.cfg, self.scheme, self.plans
        if not plans:
            plans.extend(plan_stages(scheme, self.prep.ds, cfg, self.seed, _u_hat_of(ctx.results)))
        sp, offset = plans[i], sum(p.rounds for p in plans[:i])
        start = self.init if i == 0 else self.trained(i - 1, ctx.dir(f"stage{i - 1}"))
        self.log(f"{self.tag} stage {i}: {'+'.join(sp.stage.population_labels)} clients "
                 f"{len(sp.client_ids)}, cohort {sp.sampler.expected_cohort_size:.1f} trained / "
                 f"{sp.noise_cohort} noise, q = {sp.sampler.sampling_rate:.4f}, {sp.rounds} rounds, "
                 f"z = {sp.dp.noise_multiplier:.4f}{', Eq. 3 weights' if sp.stage.weighted else ''}")
        result = train(self.algorithm(sp), start, sp.clients, sp.client_ids, sp.sampler,
                       rounds=sp.rounds, batch_size=cfg.batch_size,
                       seed=_seed_for(self.seed, scheme.row, i), workdir=ctx.workdir,
                       max_steps=cfg.max_local_steps, eval_fn=self.eval_fn,
                       eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every,
                       ledger=ctx.ledger, stage=f"{scheme.name}/stage{i}",
                       populations=sp.stage.population_labels, fingerprint={"config": self.fp},
                       progress=cfg.progress, log=self.log)
        self.params[i] = result.state.params
        return {"populations": list(sp.stage.population_labels),
                "example_domains": [LABELS[d] for d in sp.stage.example_domains],
                "clients": len(sp.client_ids), "rounds": sp.rounds, "cohort": sp.stage.cohort,
                "train_cohort_expected": sp.sampler.expected_cohort_size,
                "train_cohort_requested": sp.stage.cohort_size(cfg.train_cohort, self.prep.ds.alpha),
                "noise_cohort": sp.noise_cohort, "sampling_rate": sp.sampler.sampling_rate,
                "capacity": sp.sampler.max_cohort_size, "noise_multiplier": sp.dp.noise_multiplier,
                "budget": list(sp.stage.budget), "weighted": sp.stage.weighted,
                "weight_stats": _weight_stats(sp.clients),
                "epsilon_simulated_alone": _epsilon((sp.event,), self.budget_delta, cfg.accountant),
                "epsilon_executed_alone": _epsilon((sp.executed_event,), self.budget_delta,
                                                   cfg.accountant),
                "resumed_from_round": result.resumed_from,
                "curve": metric_curve(ctx.workdir, "eval_perplexity", offset)}


def _scheme_summary(run: _SchemeRun, done, u_hat, final, wall_s: float) -> dict:
    """A finished scheme's summary: perplexities, stages, the ledger's epsilons per population
    (charged, and of the runs as executed), the unigram diagnostics, the run record."""
    cfg, scheme, prep, ledger, delta = run.cfg, run.scheme, run.prep, run.ledger, run.budget_delta
    stages = [dict(done.results[f"stage{i}"]) for i in range(len(run.plans))]
    curve = [tuple(pt) for st in stages for pt in st.pop("curve")]
    diagnostics = None
    if u_hat is not None:
        diagnostics = unigram_diagnostics(prep.ds, u_hat, prep.vocab_size, scheme.unigram_budget[0],
                                          run.seed, unigram_bound(cfg))
    val = run.eval_fn(final)
    test = run.evaluate_on(prep.test_tokens, final)
    report = ledger.report()
    executed = [(sp.executed_event, sp.stage.population_labels) for sp in run.plans]
    executed_by_pop = executed_by_population(ledger, executed, delta, cfg.accountant)
    if_public = None
    if ledger.nonprivate_entries:  # eps = inf; beside it the eps if those choices were public
        if_public = {"entries_taken_as_public": ledger.nonprivate_entries,
                     "epsilon_by_population": report["by_population_if_public"],
                     "epsilon_executed_by_population": executed_by_population(
                         ledger, executed, delta, cfg.accountant, if_public=True)}
    return {
        "dataset": prep.name, "scheme": scheme.name, "model": scheme.model, "seed": run.seed,
        "fingerprint": run.fp, "val_ppl": val["perplexity"], "test_ppl": test["perplexity"],
        "val_loss": val["loss"], "test_loss": test["loss"], "val_accuracy": val["accuracy"],
        "test_accuracy": test["accuracy"], "num_params": count_params(final),
        "alpha": prep.ds.alpha, "stages": stages, "unigram_budget": scheme.unigram_budget,
        "ledger": report, "epsilon_by_population": report["by_population"],
        "epsilon_executed_by_population": executed_by_pop, "curve": curve,
        "epsilon_if_public": if_public, "outputs": outputs(),
        "unigram_diagnostics": diagnostics, "stages_done_earlier": done.resumed,
        "wall_clock_s": wall_s, "skipped": False, "unit_of_privacy": "user",
        # the code it trained at: the results page dates an artefact by its runs' commits and
        # marks one whose runs recorded none STALE (experiments.results.trained_commits)
        **git_state(),
    }
