"""Koga et al. 2023, Table 1: population expansion for private FL of LMs, on real CPU-sized data.

A target domain T with a small population is trained together with a larger source domain S
(population_expansion_koga2023.md, Sec. 3.2, 4). Two domain-adaptation datasets are built from
real user-keyed text (Sec. 4.1; the paper's Reddit / Common Voice cannot be downloaded here):

* ``spoken_vs_typed`` (the paper's "CV & Reddits"): T = Simpsons speakers (transcribed speech,
  ``load_simpsons``), S = chitchat senders (typed chat, ``load_chitchat``).
* ``topics`` (the paper's "SubReddits"): one source, two disjoint topic groups: T = Shakespeare's
  First Folio comedies, S = its histories and tragedies; clients = (play, role) (LEAF).

The populations are disjoint (different users), so every user is in exactly one of S, T. The
population ratio is set to alpha = |T| / (|S| + |T|) = 0.1 as in the paper by subsampling the
larger side (Sec. 4.1 subsamples Reddit; here T is the side in excess, so T is subsampled), after
dropping users with fewer than ``min_words_per_client`` words. App. A preprocessing: vocabulary =
top-k words (of the public pool by default; ``vocabulary="target_train"``: of T's training texts,
as the paper, recorded in the ledger as a non-private release, eps T = inf with the eps "if the
vocabulary is public" beside it), [BOS] words [EOS] cut into sequences of 10, 1,600 words per
user (`fedpriv.domain.encode_domain_dataset`); a stratified 6:2:2 client split (Sec. 4.2).

Every scheme of Table 1 (`fedpriv.domain.TRAINING_SCHEMES`: T w. alpha*C, T w. C, S u T, DSDSR,
DEMix, IW, PT, IWPT) is trained with DP-FedAvg (Poisson sampling, clip 0.5, Gaussian noise),
FedAdam server (lr 0.1) and SGD clients (lr 0.5) through the one round loop
(`fedpriv.fl.loop.train`). Privacy (unit: the user, add/remove neighbouring) goes through one
`PrivacyLedger(2, 1e-6)` per scheme:

* IW / IWPT first release private unigram frequencies u_hat_S, u_hat_T with the Geometric
  mechanism at (0.8, 0), each charged to its own population
  (`fedpriv.domain.domain_unigram_frequencies`), then weight S examples by Eq. 3,
  w(x) = p_T(x) / (alpha p_T(x) + (1 - alpha) p_S(x)) (T examples: w = 1), and train at (1.2, 1e-6).
* PT / IWPT pretrain on S with cohort C, then finetune on T with cohort alpha*C, each stage
  spending its budget on its own population: parallel composition, visible in the ledger's
  per-population epsilons.
* Noise cohort (McMahan et al. 2018; Sec. 4.2: C = 5000 for the noise, 400 trained): every stage
  trains with ``train_cohort`` (x alpha for alpha*C stages) clients per round in expectation but
  adds the noise of ``noise_cohort``. Its noise multiplier z is calibrated so that the stage's
  ``privacy_event`` (the simulated run: cohort ``noise_cohort`` from a population scaled up by the
  same factor, same sampling rate) meets the stage's budget. The epsilon of the run actually
  executed (``privacy_event(..., simulated=False)``) is far larger and reported next to it.

Outputs in ``--workdir``: ``table.{md,csv}`` (Table 1: val/test perplexity on T, mean +- std over
seeds, with per-population epsilons, simulated and executed), ``runs.csv`` (one row per seed),
``data.{md,csv}`` (populations and alpha), ``table1.png`` (bar chart), ``curves.png`` and
``summary.json`` (config, seeds, everything). Each (dataset, seed, scheme) trains in its own
subdirectory with the loop's checkpoints; a finished scheme writes ``summary.json`` there and a
rerun skips it.

    .venv/bin/python -m experiments.population_expansion \
        --config configs/population_expansion.py:small --workdir runs/pe
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import time
from typing import Any, Callable

import jax
import numpy as np
import optax

from experiments import common
from fedpriv import domain
from fedpriv.fl.loop import NONPRIVATE
from fedpriv.data import (WordTokenizer, load_chitchat, load_public_pool, load_shakespeare,
                          load_simpsons)
from fedpriv.data.text import FederatedText
from fedpriv.dp import accounting
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl import algorithms as algs
from fedpriv.fl.loop import train
from fedpriv.fl.samplers import PoissonSampler
from fedpriv.models.domain_lm import make_demix_task, make_dsdsr_task
from fedpriv.models.lm import LMConfig, count_params, make_lm, make_lm_task
from fedpriv.models.metrics import evaluate

# First Folio (1623) genres. Pericles is not in the Folio and belongs to neither group.
FOLIO_COMEDIES = (
    "tempest", "two_gentlemen_of_verona", "merry_wives_of_windsor", "measure_for_measure",
    "comedy_of_errors", "much_ado_about_nothing", "loves_labours_lost", "midsummer_nights_dream",
    "merchant_of_venice", "as_you_like_it", "taming_of_the_shrew", "alls_well_that_ends_well",
    "twelfth_night", "winters_tale")
FOLIO_HISTORIES = (
    "john", "richard_ii", "henry_iv_part_1", "henry_iv_part_2", "henry_v", "henry_vi_part_1",
    "henry_vi_part_2", "henry_vi_part_3", "richard_iii", "henry_viii")
FOLIO_TRAGEDIES = (
    "troilus_and_cressida", "coriolanus", "tragedy_of_titus_andronicus", "romeo_and_juliet",
    "timon_of_athens", "julius_caesar", "macbeth", "hamlet", "lear", "othello",
    "antony_and_cleopatra", "cymbeline")

DATASET_INFO = {
    "spoken_vs_typed": {"paper": "CV&Reddits", "T": "Simpsons speakers (spoken, transcribed)",
                        "S": "chitchat senders (typed)"},
    "topics": {"paper": "SubReddits", "T": "Shakespeare comedies, clients = (play, role)",
               "S": "Shakespeare histories + tragedies, clients = (play, role)"},
}

# Koga et al. Table 1 (val PPL, test PPL), for side-by-side orderings.
PAPER_TABLE1 = {
    "SubReddits": {"T w. alpha*C": (415.35, 414.61), "T w. C": (358.37, 358.06),
                   "S u T": (398.82, 400.90), "DSDSR": (379.06, 380.79),
                   "DEMix": (395.02, 396.68), "IW": (354.81, 356.37), "PT": (369.57, 370.24),
                   "IWPT": (346.85, 347.78)},
    "CV&Reddits": {"T w. alpha*C": (302.43, 320.13), "T w. C": (215.96, 241.42),
                   "S u T": (275.85, 302.64), "DSDSR": (206.07, 233.43),
                   "DEMix": (226.09, 255.87), "IW": (218.61, 234.22), "PT": (195.49, 217.62),
                   "IWPT": (180.98, 203.14)},
}

LABELS = {domain.SOURCE: "S", domain.TARGET: "T"}


def _epsilon(events: tuple, delta: float, neighboring: str, accountant: str) -> tuple[float, str]:
    return accounting.compute_epsilon(list(events), delta, neighboring, accountant)  # memoised there


# ---------------------------------------------------------------------------------------------
# Data (Sec. 4.1, App. A)
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Prepared:
    """A tokenized domain-adaptation dataset and what the table reports about it."""

    name: str
    ds: domain.DomainDataset     # FederatedDatasets with 'tokens' and 'domain'
    vocab_size: int
    val_tokens: np.ndarray       # the T-population val clients' T sequences, int32[n, L+1]
    test_tokens: np.ndarray
    stats: dict
    vocabulary_public: bool = True  # False: built from T's training text (a non-private release)


# the ledger entry of a vocabulary built from the target users' training text
PRIVATE_VOCABULARY = "vocabulary (top-k words of T's training text)"


def build_vocabulary(cfg, raw: domain.DomainDataset) -> tuple[WordTokenizer, bool]:
    """The word vocabulary and whether it is public. ``cfg.vocabulary``: ``"public"`` — the
    top-``vocab_words`` words of the public pool (``load_public_pool``; no privacy cost);
    ``"target_train"`` — those of T's training texts (Koga et al. App. A, who assume it known in
    advance): a word used by one user reveals that user, so every ledger of the run records it
    as a non-private release (``PrivacyLedger.record_nonprivate``)."""
    if cfg.vocabulary == "public":
        return WordTokenizer.fit(load_public_pool(progress=cfg.progress).texts, k=cfg.vocab_words), True
    if cfg.vocabulary == "target_train":
        return WordTokenizer.fit(raw.texts("train", domain.TARGET), k=cfg.vocab_words), False
    raise ValueError(f"vocabulary must be public or target_train, got {cfg.vocabulary!r}")


def _words(texts) -> int:
    return sum(len(t.split()) for t in texts)


def _active(text: FederatedText, min_words: int) -> dict[str, list[str]]:
    return {c: list(text[c]) for c in text.client_ids if _words(text[c]) >= min_words}


def balance_populations(source: dict, target: dict, alpha: float, seed: int
                        ) -> tuple[dict, dict, str]:
    """Subsample the side in excess so that |T| / (|S| + |T|) ~ alpha (seeded, sorted ids).

    The paper (Sec. 4.1, CV & Reddits) samples S clients so the total is 1/alpha times |T|;
    when S is too small for that, T is subsampled instead. Returns (source, target, which side
    was subsampled).
    """
    rng = np.random.default_rng(seed)
    n_s, n_t = len(source), len(target)

    def sample(d, k):
        ids = sorted(d)
        keep = sorted(rng.choice(len(ids), size=k, replace=False))
        return {ids[i]: d[ids[i]] for i in keep}

    want_t = round(alpha / (1 - alpha) * n_s)
    if n_t > want_t:
        return source, sample(target, max(1, want_t)), "T"
    want_s = round((1 - alpha) / alpha * n_t)
    if n_s > want_s:
        return sample(source, want_s), target, "S"
    return source, target, "none"


def _capped(d: dict, k: int | None, seed: int) -> dict:
    if k is None or len(d) <= k:
        return d
    ids = sorted(d)
    keep = sorted(np.random.default_rng(seed).choice(len(ids), size=k, replace=False))
    return {ids[i]: d[ids[i]] for i in keep}


def load_domains(name: str, cfg) -> tuple[dict, dict]:
    """(source, target): client id -> list of texts, ids prefixed so the populations are
    disjoint, users with fewer than ``cfg.min_words_per_client`` words dropped."""
    if name == "spoken_vs_typed":
        src = load_chitchat(max_examples_per_client=cfg.max_chitchat_messages, seed=cfg.data_seed,
                            progress=cfg.progress)
        tgt = load_simpsons(progress=cfg.progress)
        source = {f"chitchat/{c}": v for c, v in _active(src, cfg.min_words_per_client).items()}
        target = {f"simpsons/{c}": v for c, v in _active(tgt, cfg.min_words_per_client).items()}
    elif name == "topics":
        text = load_shakespeare(progress=cfg.progress)
        active = _active(text, cfg.min_words_per_client)
        play = lambda c: c.split("/", 1)[0]  # noqa: E731
        source = {c: v for c, v in active.items()
                  if play(c) in FOLIO_HISTORIES + FOLIO_TRAGEDIES}
        target = {c: v for c, v in active.items() if play(c) in FOLIO_COMEDIES}
    else:
        raise ValueError(f"unknown dataset {name!r}")
    return source, target


def prepare_dataset(name: str, cfg) -> Prepared:
    """Load, balance to alpha, split 6:2:2, build the T vocabulary, tokenize (App. A)."""
    source, target = load_domains(name, cfg)
    n_s0, n_t0 = len(source), len(target)
    source = _capped(source, cfg.max_source_clients, cfg.data_seed)
    target = _capped(target, cfg.max_target_clients, cfg.data_seed + 1)
    source, target, subsampled = balance_populations(source, target, cfg.alpha, cfg.data_seed)
    raw = domain.assemble_domain_dataset(source, target, seed=cfg.data_seed,
                                         fractions=tuple(cfg.split))
    tok, vocab_public = build_vocabulary(cfg, raw)
    ds = domain.encode_domain_dataset(raw, tok, seq_len=cfg.seq_len,
                                      max_tokens_per_client=cfg.max_tokens_per_client)

    def t_tokens(split):
        tok_ = ds.clients(split, (domain.TARGET,), (domain.TARGET,)).concat_examples()["tokens"]
        return tok_[: cfg.max_eval_examples] if cfg.max_eval_examples else tok_

    stats = {"dataset": name, "paper_dataset": DATASET_INFO[name]["paper"],
             "T": DATASET_INFO[name]["T"], "S": DATASET_INFO[name]["S"],
             "active_S_users": n_s0, "active_T_users": n_t0, "subsampled": subsampled,
             "alpha_train": ds.alpha, "vocab_size": tok.vocab_size,
             "vocabulary": ("public pool top-k words" if vocab_public else
                            "NON-PRIVATE: top-k words of T's training text")}
    for split in ("train", "val", "test"):
        for pop in (domain.SOURCE, domain.TARGET):
            sub = ds.clients(split, (pop,), (pop,))
            stats[f"{split}_{LABELS[pop]}_clients"] = len(sub)
            stats[f"{split}_{LABELS[pop]}_sequences"] = int(sub.concat_examples()["tokens"].shape[0])
    val, test = t_tokens("val"), t_tokens("test")
    stats["val_T_eval_sequences"], stats["test_T_eval_sequences"] = len(val), len(test)
    return Prepared(name, ds, tok.vocab_size, val, test, stats, vocab_public)


# ---------------------------------------------------------------------------------------------
# One scheme (a row of Table 1) on one dataset and seed
# ---------------------------------------------------------------------------------------------


def build_task(model: str, cfg, vocab_size: int):
    lm_cfg = LMConfig(vocab_size=vocab_size, embed_dim=cfg.embed_dim, hidden_dim=cfg.hidden_dim,
                      max_len=max(64, cfg.seq_len))
    if model == "lstm":
        return make_lm_task(make_lm(lm_cfg))
    if model == "dsdsr":
        return make_dsdsr_task(lm_cfg)
    if model == "demix":
        return make_demix_task(lm_cfg)
    raise ValueError(f"unknown model {model!r}")


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name.replace("*", "x")).strip("_")


@functools.lru_cache(maxsize=256)
def calibrate_stage(num_clients: int, rate: float, rounds: int, noise_cohort: int,
                    clip_norm: float, epsilon: float, delta: float) -> float:
    """z of a stage: the smallest multiplier whose simulated-run ``privacy_event`` (Poisson
    DP-FedAvg, ``rounds`` rounds at ``rate``, noise of ``noise_cohort``) meets (epsilon, delta)."""
    sampler = PoissonSampler(num_clients, rate)
    make = lambda z: algs.privacy_event(  # noqa: E731
        algs.DPConfig(clip_norm, z, "gaussian", noise_cohort_size=noise_cohort), sampler, rounds)
    return accounting.calibrate_noise_multiplier(make, epsilon, delta)


def stage_clients(ds: domain.DomainDataset, stage: domain.Stage, u_hat=None, weight_mode="none",
                  weight_max=None):
    """The stage's training clients (its populations, its example domains); for a weighted
    stage every example carries its Eq. 3 weight: S examples w(x) from (u_hat_S, u_hat_T), T
    examples exactly 1 (`fedpriv.domain.add_importance_weights`)."""
    clients = stage.clients(ds, "train")
    if stage.weighted:
        if u_hat is None:
            raise ValueError("a weighted stage needs the private unigram frequencies")
        clients = domain.add_importance_weights(clients, u_hat[0], u_hat[1], ds.alpha,
                                                mode=weight_mode, w_max=weight_max)
    return clients


@dataclasses.dataclass
class StagePlan:
    """Everything a stage needs before training: its clients (with Eq. 3 weights if weighted),
    Poisson sampler, DP config with the calibrated z, and its simulated / executed events."""

    stage: domain.Stage
    rounds: int
    clients: Any
    client_ids: list
    sampler: PoissonSampler
    dp: algs.DPConfig
    noise_cohort: int
    event: Any
    executed_event: Any


def plan_stages(scheme: domain.TrainingScheme, ds: domain.DomainDataset, cfg, seed: int,
                u_hat=None) -> list[StagePlan]:
    """The stages of ``scheme`` on ``ds``: expected cohort ``train_cohort`` (x alpha for alpha*C
    stages) by Poisson sampling at rate q = cohort / N (capped at 1), noise of ``noise_cohort``
    (x alpha), z calibrated so the stage's simulated-run event meets the stage's budget."""
    scheme_index = domain.TRAINING_SCHEMES.index(scheme)
    out = []
    for i, (stage, rounds) in enumerate(zip(scheme.stages, scheme.stage_rounds(cfg.rounds))):
        clients = stage_clients(ds, stage, u_hat, cfg.weight_mode, cfg.weight_max)
        ids = list(clients.client_ids)
        n = len(ids)
        train_c = stage.cohort_size(cfg.train_cohort, ds.alpha)
        noise_c = stage.cohort_size(cfg.noise_cohort, ds.alpha)
        rate = min(1.0, train_c / n)
        eps_i, delta_i = stage.budget
        z = calibrate_stage(n, rate, rounds, noise_c, cfg.clip_norm, eps_i, delta_i)
        sampler = PoissonSampler(n, rate, seed=_seed_for(seed, scheme_index, i))
        dp = algs.DPConfig(cfg.clip_norm, z, "gaussian", noise_cohort_size=noise_c)
        out.append(StagePlan(stage, rounds, clients, ids, sampler, dp, noise_c,
                             algs.privacy_event(dp, sampler, rounds, simulated=True),
                             algs.privacy_event(dp, sampler, rounds, simulated=False)))
    return out


def unigram_diagnostics(ds: domain.DomainDataset, u_hat, vocab_size: int, epsilon: float,
                        seed: int) -> dict:
    """Evaluation-only diagnostic of the unigram release (never fed back into training): per
    population, the number of counted tokens (<= 5 x 10 per user), the Geometric noise std per
    word, and the total-variation distance between the private u_hat and the same bounded
    counts without noise. With few users the noise mass (V words x std) swamps the counts.
    The counted tokens and the distance to the noise-free frequencies are exact statistics of
    the private users: keyed ``nonprivate/...`` (not covered by the ledger); the noise std is a
    function of epsilon only."""
    from fedpriv.dp import geometric
    out = {}
    for pop, u in zip((domain.SOURCE, domain.TARGET), u_hat):
        counts = domain.unigram_counts(ds.clients("train", (pop,), (pop,)), vocab_size,
                                       np.random.default_rng([seed, 11, pop]))
        exact = domain.normalise_counts(counts, zero_ids=domain.DEFAULT_IGNORE_IDS)
        out[LABELS[pop]] = {
            NONPRIVATE + "counted_tokens": int(counts.sum()),
            "noise_std_per_word": math.sqrt(geometric.geometric_variance(
                epsilon, domain.unigram_sensitivity())),
            NONPRIVATE + "tv_distance_to_nonprivate": float(0.5 * np.abs(np.asarray(u) - exact).sum())}
    return out


def _weight_stats(clients) -> dict:
    arr = clients.concat_examples()
    if "weight" not in arr:
        return {}
    out = {}
    for pop in (domain.SOURCE, domain.TARGET):
        w = arr["weight"][arr["domain"] == pop]
        if len(w):
            out[LABELS[pop]] = {"n": int(len(w)), "mean": float(w.mean()),
                                "min": float(w.min()), "max": float(w.max()),
                                "frac_below_0.1": float(np.mean(w < 0.1))}
    return out


def _fingerprint(cfg, dataset: str, seed: int, scheme: str) -> str:
    keep = {k: v for k, v in dataclasses.asdict(cfg).items()
            if k not in ("datasets", "schemes", "seeds", "progress", "eval_every",
                         "checkpoint_every", "eval_batch_size")}
    blob = json.dumps([keep, dataset, seed, scheme], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _seed_for(seed: int, scheme_index: int, stage_index: int) -> int:
    return int(seed) * 1000 + scheme_index * 10 + stage_index


def run_scheme(scheme: domain.TrainingScheme, prep: Prepared, cfg, seed: int, workdir: str,
               log: Callable[[str], None] = print) -> dict:
    """Train one scheme (all its stages) and evaluate perplexity on T; returns its summary.

    Resumable: each stage trains in ``workdir/stage<i>`` with the loop's checkpoints (and the
    ledger saved in them). A finished scheme's ``summary.json`` is returned without training.
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
    ds = prep.ds
    budget_eps, budget_delta = domain.TOTAL_BUDGET
    ledger = PrivacyLedger(budget_eps, budget_delta, accountant=cfg.accountant)
    if not prep.vocabulary_public:  # an explicit choice: recorded, eps = inf on T from here on
        ledger.record_nonprivate(
            PRIVATE_VOCABULARY, (LABELS[domain.TARGET],),
            note=f"NON-PRIVATE: the top-{cfg.vocab_words} words of the target users' training "
                 "text (Koga et al. assume it known in advance); the DP epsilon holds only if "
                 "this vocabulary is taken as public")
    scheme_index = domain.TRAINING_SCHEMES.index(scheme)
    u_hat = None
    if scheme.unigram_budget is not None:
        eps0, delta0 = scheme.unigram_budget
        if delta0 != 0:
            raise ValueError("the Geometric mechanism is (eps0, 0)-DP")
        # Seeded, so a resumed run re-derives the very same release; the ledger restored from
        # the stage checkpoint already holds its spend (and replaces this one).
        rng = np.random.default_rng([seed, scheme_index, 7])
        u_hat = domain.domain_unigram_frequencies(ds, prep.vocab_size, eps0, rng, ledger=ledger,
                                                  labels=LABELS)
    task = build_task(scheme.model, cfg, prep.vocab_size)
    params = jax.jit(task.init)(jax.random.key(seed))  # one compile, not one per eager op
    val_dom = np.full(len(prep.val_tokens), domain.TARGET, np.int32)
    test_dom = np.full(len(prep.test_tokens), domain.TARGET, np.int32)
    dom_kw = lambda d: {"domain": d} if task.uses_domain else {}  # noqa: E731
    eval_fn = lambda p: evaluate(task, p, prep.val_tokens, cfg.eval_batch_size,  # noqa: E731
                                 **dom_kw(val_dom))
    stages, curve, executed_events = [], [], []
    offset = 0
    for i, sp in enumerate(plan_stages(scheme, ds, cfg, seed, u_hat)):
        stage, rounds, clients, sampler, dp = sp.stage, sp.rounds, sp.clients, sp.sampler, sp.dp
        ids, n, noise_c, rate, z, event = (sp.client_ids, len(sp.client_ids), sp.noise_cohort,
                                           sp.sampler.sampling_rate, sp.dp.noise_multiplier,
                                           sp.event)
        train_c = stage.cohort_size(cfg.train_cohort, ds.alpha)
        alg = algs.build_algorithm(task.loss_fn, optax.sgd(cfg.client_lr),
                                   algs.server_optimizer(cfg.server_optimizer, cfg.server_lr),
                                   dp, sampler.expected_cohort_size)
        executed = sp.executed_event
        executed_events.append((executed, stage.population_labels))
        log(f"[{prep.name} seed {seed}] {scheme.name} stage {i}: "
            f"{'+'.join(stage.population_labels)} clients {n}, cohort "
            f"{sampler.expected_cohort_size:.1f} trained / {noise_c} noise, q = {rate:.4f}, "
            f"{rounds} rounds, z = {z:.4f}{', Eq. 3 weights' if stage.weighted else ''}")
        result = train(alg, params, clients, ids, sampler, rounds=rounds,
                       batch_size=cfg.batch_size, seed=_seed_for(seed, scheme_index, i),
                       workdir=os.path.join(workdir, f"stage{i}"), max_steps=cfg.max_local_steps,
                       eval_fn=eval_fn, eval_every=cfg.eval_every,
                       checkpoint_every=cfg.checkpoint_every, ledger=ledger,
                       stage=f"{scheme.name}/stage{i}", populations=stage.population_labels,
                       fingerprint={"config": fp}, progress=cfg.progress, log=log)
        params = result.state.params
        ledger = result.ledger  # on resume: holds the checkpoint's recorded cost (absorbed)
        curve += _stage_curve(os.path.join(workdir, f"stage{i}"), offset)
        offset += rounds
        stages.append({
            "populations": list(stage.population_labels),
            "example_domains": [LABELS[d] for d in stage.example_domains],
            "clients": n, "rounds": rounds, "cohort": stage.cohort,
            "train_cohort_expected": sampler.expected_cohort_size,
            "train_cohort_requested": train_c, "noise_cohort": noise_c, "sampling_rate": rate,
            "capacity": sampler.max_cohort_size, "noise_multiplier": z,
            "budget": list(stage.budget), "weighted": stage.weighted,
            "weight_stats": _weight_stats(clients),
            "epsilon_simulated_alone": _epsilon((event,), budget_delta, "add_remove",
                                                cfg.accountant)[0],
            "epsilon_executed_alone": _epsilon((executed,), budget_delta, "add_remove",
                                               cfg.accountant)[0],
            "resumed_from_round": result.resumed_from})
    diagnostics = None
    if u_hat is not None:
        diagnostics = unigram_diagnostics(ds, u_hat, prep.vocab_size, scheme.unigram_budget[0],
                                          seed)
    val = eval_fn(params)
    test = evaluate(task, params, prep.test_tokens, cfg.eval_batch_size, **dom_kw(test_dom))
    report = ledger.report()
    executed_by_pop = _executed_by_population(ledger, executed_events, budget_delta,
                                              cfg.accountant)
    if_public = None
    if ledger.nonprivate_entries:  # eps = inf; beside it the eps if those choices were public
        if_public = {"entries_taken_as_public": ledger.nonprivate_entries,
                     "epsilon_by_population": report["by_population_if_public"],
                     "epsilon_executed_by_population": _executed_by_population(
                         ledger, executed_events, budget_delta, cfg.accountant, if_public=True)}
    summary = {
        "dataset": prep.name, "scheme": scheme.name, "model": scheme.model, "seed": seed,
        "fingerprint": fp, "val_ppl": val["perplexity"], "test_ppl": test["perplexity"],
        "val_loss": val["loss"], "test_loss": test["loss"], "val_accuracy": val["accuracy"],
        "test_accuracy": test["accuracy"], "num_params": count_params(params),
        "alpha": ds.alpha, "stages": stages, "unigram_budget": scheme.unigram_budget,
        "ledger": report, "epsilon_by_population": report["by_population"],
        "epsilon_executed_by_population": executed_by_pop, "curve": curve,
        "epsilon_if_public": if_public, "outputs": outputs(),
        "unigram_diagnostics": diagnostics,
        "wall_clock_s": time.time() - t0, "skipped": False, "unit_of_privacy": "user",
    }
    common.save_json(summary, path)
    log(f"[{prep.name} seed {seed}] {scheme.name}: val PPL {val['perplexity']:.2f}, test PPL "
        f"{test['perplexity']:.2f}, eps by population {_fmt_eps(report['by_population'])} "
        f"(executed run: {_fmt_eps(executed_by_pop)}), {summary['wall_clock_s']:.0f}s")
    return summary


def _stage_curve(stage_dir: str, offset: int) -> list[tuple[int, float]]:
    """(global round, val PPL on T) from the stage's metrics.jsonl (resume-safe)."""
    out = []
    path = os.path.join(stage_dir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                if "eval_perplexity" in row:
                    out.append((offset + int(row["round"]), float(row["eval_perplexity"])))
    return out


def outputs() -> dict:
    """Which outputs of a scheme's run the ledger covers (the run record)."""
    from fedpriv.fl.loop import OUTPUTS
    return {"covered_by_ledger": ["private unigram frequencies (u_hat)", "trained model",
                                  "instance weights (post-processing of u_hat)"],
            "not_covered": ["unigram_diagnostics " + NONPRIVATE + "* (exact counted tokens, TV "
                            "distance to the noise-free frequencies)",
                            "val/test perplexity, loss, accuracy (exact evaluation on held-out "
                            "private T users)",
                            "the vocabulary, when vocabulary='target_train' (recorded in the "
                            "ledger as non-private: eps = inf)"],
            "metrics.jsonl": OUTPUTS}


def _executed_by_population(ledger: PrivacyLedger, executed_events, delta: float,
                            accountant: str, if_public: bool = False) -> dict:
    """Per population: the unigram releases (pure DP, unchanged) and non-private entries
    (eps = inf; left out with ``if_public``) composed with the training stages' events *as
    executed* (small cohort, noise z * train/noise cohort)."""
    per_pop: dict[str, list] = {}
    for entry in ledger.entries:
        if "unigram" in entry.name or (entry.nonprivate and not if_public):
            for p in entry.populations:
                per_pop.setdefault(p, []).append(entry.event)
    for event, pops in executed_events:
        for p in pops:
            per_pop.setdefault(p, []).append(event)
    return {p: _epsilon(tuple(evs), delta, "add_remove", accountant)[0]
            for p, evs in sorted(per_pop.items())}


def _fmt_eps(d: dict) -> str:
    return ", ".join(f"{k}: {v:.3g}" for k, v in sorted(d.items()))


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------


def _mean_std(xs) -> tuple[float, float]:
    xs = np.asarray(xs, np.float64)
    return float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else 0.0


def _pm(m: float, s: float, n: int) -> str:
    return f"{m:.1f} ± {s:.1f}" if n > 1 else f"{m:.1f}"


def aggregate(summaries: list[dict], cfg) -> list[dict]:
    """One row per (dataset, scheme): mean ± std over seeds, privacy, paper reference."""
    rows = []
    for name in cfg.datasets:
        for scheme in cfg.schemes:
            runs = [s for s in summaries if s["dataset"] == name and s["scheme"] == scheme]
            if not runs:
                continue
            vm, vs = _mean_std([r["val_ppl"] for r in runs])
            tm, ts = _mean_std([r["test_ppl"] for r in runs])
            r0 = runs[0]
            paper = PAPER_TABLE1[DATASET_INFO[name]["paper"]][scheme]
            eps = r0["epsilon_by_population"]
            exe = r0["epsilon_executed_by_population"]
            pub = r0.get("epsilon_if_public") or {}
            rows.append({
                "dataset": name, "scheme": scheme, "model": r0["model"],
                "val PPL on T": _pm(vm, vs, len(runs)), "test PPL on T": _pm(tm, ts, len(runs)),
                "val_ppl_mean": vm, "val_ppl_std": vs, "test_ppl_mean": tm, "test_ppl_std": ts,
                "seeds": "/".join(str(r["seed"]) for r in runs),
                "eps S (sim.)": eps.get("S"), "eps T (sim.)": eps.get("T"),
                "eps S (executed)": exe.get("S"), "eps T (executed)": exe.get("T"),
                **({"eps T (sim.) if vocab public": pub["epsilon_by_population"].get("T"),
                    "eps T (executed) if vocab public": pub["epsilon_executed_by_population"].get("T")}
                   if pub else {}),
                "stages": "; ".join(
                    f"{'+'.join(st['populations'])} C={st['noise_cohort']}/"
                    f"{st['train_cohort_expected']:.0f} q={st['sampling_rate']:.3f} "
                    f"z={st['noise_multiplier']:.3g} x{st['rounds']}"
                    + (" w" if st["weighted"] else "") for st in r0["stages"]),
                "paper val/test PPL": f"{paper[0]:.1f} / {paper[1]:.1f}",
                "wall_clock_s": float(np.mean([r["wall_clock_s"] for r in runs])),
            })
    return rows


TABLE_COLUMNS = ["dataset", "scheme", "val PPL on T", "test PPL on T", "seeds", "eps S (sim.)",
                 "eps T (sim.)", "eps S (executed)", "eps T (executed)", "stages",
                 "paper val/test PPL"]


def table_notes(cfg, preps: dict[str, Prepared]) -> list[str]:
    notes = [
        f"Perplexity on T (target-population val/test clients' T sequences, EOS and UNK counted), "
        f"mean ± std (ddof 1) over seeds {list(cfg.seeds)}; data split fixed (data_seed "
        f"{cfg.data_seed}), seeds vary init, sampling, DP noise and unigram noise.",
        "Privacy: unit = user, add/remove neighbouring, delta = 1e-6; one ledger per scheme with "
        "budget (2, 1e-6). 'eps X (sim.)' is the ledger's epsilon for population X: the "
        "simulated run whose cohort is the noise cohort drawn from a population scaled up by "
        f"the same factor (McMahan et al. 2018; the paper's C = 5000/400 convention), here "
        f"noise cohort C = {cfg.noise_cohort} and trained cohort {cfg.train_cohort} "
        f"(alpha*C stages: x alpha). 'eps X (executed)' is the epsilon of the run actually "
        f"executed (same noise, real cohort and population): the simulation's guarantee does "
        f"NOT hold for it.",
        "Not covered by the ledger: the perplexities (exact evaluation on held-out private T "
        "users) and, in summary.json, the unigram diagnostics keyed nonprivate/.",
        "IW/IWPT: private unigram frequencies at (0.8, 0) per population (Geometric mechanism, "
        "<= 5 sequences x 10 tokens per user), training at (1.2, 1e-6). PT/IWPT: pretrain on S "
        "(cohort C), finetune on T (cohort alpha*C); disjoint populations, so each spends the "
        "full budget (parallel composition: S and T columns).",
        f"stages: population C=noise/trained q=sampling rate z=noise multiplier x rounds "
        f"(w = Eq. 3 weights). DP-FedAvg, Poisson sampling, clip {cfg.clip_norm}, FedAdam "
        f"{cfg.server_lr}, SGD clients {cfg.client_lr}, batch {cfg.batch_size}, local steps "
        f"{cfg.max_local_steps or 'one epoch'}, LSTM {cfg.embed_dim}/{cfg.hidden_dim}, "
        f"{cfg.rounds} rounds per scheme.",
    ]
    for name, p in preps.items():
        s = p.stats
        notes.append(
            f"{name} ({s['paper_dataset']}): T = {s['T']}, S = {s['S']}; active users "
            f"(>= {cfg.min_words_per_client} words) S {s['active_S_users']}, T "
            f"{s['active_T_users']}; subsampled {s['subsampled']} to alpha = "
            f"{s['alpha_train']:.4f} (train: S {s['train_S_clients']}, T {s['train_T_clients']};"
            f" val T {s['val_T_clients']}, test T {s['test_T_clients']}); vocab "
            f"{s['vocab_size']} (" + (f"top-{cfg.vocab_words} words of the public pool + 4 "
                                      "specials: no privacy cost)." if cfg.vocabulary == "public"
                                      else f"top-{cfg.vocab_words} T training words + 4 specials: "
                                      "NON-PRIVATE, so eps T = inf; 'eps T ... if vocab public' is "
                                      "the epsilon that holds if this vocabulary is taken as "
                                      "public, as Koga et al. assume)."))
    notes.append("paper val/test PPL: Koga et al. Table 1 on the corresponding dataset (Reddit/"
                 "CV, 10K vocabulary, 2,000 rounds, C = 5000): compare orderings, not values.")
    return notes


def bar_chart(rows: list[dict], path: str, title: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4), squeeze=False)
    for ax, name in zip(axes[0], datasets):
        rs = [r for r in rows if r["dataset"] == name]
        x = np.arange(len(rs))
        ax.bar(x - 0.2, [r["val_ppl_mean"] for r in rs], 0.4,
               yerr=[r["val_ppl_std"] for r in rs], capsize=3, label="val")
        ax.bar(x + 0.2, [r["test_ppl_mean"] for r in rs], 0.4,
               yerr=[r["test_ppl_std"] for r in rs], capsize=3, label="test")
        ax.set_xticks(x, [r["scheme"] for r in rs], rotation=30, ha="right")
        ax.set_ylabel("perplexity on T (lower is better)")
        ax.set_title(f"{name} ({DATASET_INFO[name]['paper']})")
        lo = min(r["val_ppl_mean"] - r["val_ppl_std"] for r in rs)
        ax.set_ylim(max(0.0, 0.8 * lo), None)
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def curves_chart(summaries: list[dict], cfg, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(cfg.datasets), figsize=(6 * len(cfg.datasets), 4),
                             squeeze=False)
    seed = cfg.seeds[0]
    for ax, name in zip(axes[0], cfg.datasets):
        for s in summaries:
            if s["dataset"] == name and s["seed"] == seed and s["curve"]:
                xs, ys = zip(*s["curve"])
                ax.plot(xs, ys, marker=".", label=s["scheme"])
        ax.set_xlabel("server round")
        ax.set_ylabel("val perplexity on T")
        ax.set_yscale("log")
        ax.set_title(f"{name}, seed {seed}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def run(cfg, workdir: str, log: Callable[[str], None] = print) -> dict:
    """All datasets x seeds x schemes of ``cfg``; writes the tables, charts and summary."""
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)  # dp_accounting's RDP order warnings
    t0 = time.time()
    os.makedirs(workdir, exist_ok=True)
    schemes = [domain.SCHEMES_BY_NAME[n] for n in cfg.schemes]
    preps: dict[str, Prepared] = {}
    summaries = []
    for name in cfg.datasets:
        prep = preps[name] = prepare_dataset(name, cfg)
        log(f"[{name}] " + ", ".join(f"{k}={v}" for k, v in prep.stats.items()))
        for seed in cfg.seeds:
            for scheme in schemes:
                d = os.path.join(workdir, name, f"seed{seed}", slug(scheme.name))
                summaries.append(run_scheme(scheme, prep, cfg, seed, d, log))
    rows = aggregate(summaries, cfg)
    title = "Koga et al. 2023, Table 1 at CPU scale: perplexity on T with population expansion"
    notes = table_notes(cfg, preps)
    notes.append(f"Regenerate: .venv/bin/python -m experiments.population_expansion --config "
                 f"<configs/population_expansion.py:scale> --workdir {workdir}")
    columns = list(TABLE_COLUMNS)
    if cfg.vocabulary != "public":
        columns[columns.index("eps T (executed)") + 1:1 + columns.index("eps T (executed)")] = [
            "eps T (sim.) if vocab public", "eps T (executed) if vocab public"]
    common.write_table(rows, workdir, "table", columns, title=title, notes=notes)
    run_rows = [{k: s[k] for k in ("dataset", "scheme", "seed", "val_ppl", "test_ppl",
                                   "val_accuracy", "test_accuracy", "num_params",
                                   "wall_clock_s", "skipped")}
                | {f"eps_{p}": e for p, e in s["epsilon_by_population"].items()}
                | {f"eps_{p}_executed": e for p, e in s["epsilon_executed_by_population"].items()}
                | {f"eps_{p}_if_vocab_public": e for p, e in
                   ((s.get("epsilon_if_public") or {}).get("epsilon_by_population") or {}).items()}
                for s in summaries]
    common.write_table(run_rows, workdir, "runs", title="Table 1 runs (one row per seed)")
    common.write_table([p.stats for p in preps.values()], workdir, "data",
                       title="Domain-adaptation datasets (Sec. 4.1)")
    bar_chart(rows, os.path.join(workdir, "table1.png"), title)
    curves_chart(summaries, cfg, os.path.join(workdir, "curves.png"))
    out = {"table": rows, "runs": summaries, "data": {k: p.stats for k, p in preps.items()},
           "notes": notes, "wall_clock_s": time.time() - t0,
           # training + evaluation time of every scheme, including those a rerun skipped
           "schemes_wall_clock_s": sum(s["wall_clock_s"] for s in summaries),
           **common.run_record(cfg, list(cfg.seeds))}
    common.save_json(out, os.path.join(workdir, "summary.json"))
    return out


def main(argv=None):
    ap = common.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/population_expansion.py:small")
    ap.add_argument("--workdir", default="runs/population_expansion")
    args = ap.parse_args(argv)
    cfg = common.load_config(args.config)
    out = run(cfg, args.workdir)
    with open(os.path.join(args.workdir, "table.md")) as f:
        print(f.read())
    print(f"wall clock {out['wall_clock_s']:.0f}s; wrote {args.workdir}/table.md, table1.png")


if __name__ == "__main__":
    common.cli(main)
