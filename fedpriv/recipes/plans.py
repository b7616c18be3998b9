"""Privacy plans of the experiments (``fedpriv.dp.plan``): every ledger an experiment opens and
the events it would charge, built from its config alone -- no data loaded, nothing trained.

Each builder constructs the events with the functions the run itself calls
(``fedpriv.recipes.lm.build_algorithm`` with the pipeline's prior events,
``fedpriv.recipes.fred_pipeline.fred_release_event``, ``fedpriv.expansion.pipeline.calibrate_stage`` and
``fl.algorithms.privacy_event``, the schemes' budgets and unigram releases), so a config the
run's ledger would refuse is refused here, before anything runs. ``configs/<experiment>.py``
exposes ``privacy_plan(cfg)`` returning one of these; ``tests/experiments/test_configs.py``
accounts every scale of every config with :func:`fedpriv.dp.plan.account`.

Populations (they set the sampling rates) come from the config and :data:`CORPUS_CLIENTS` /
:data:`EXPANSION_ACTIVE_USERS`, the user counts of the packaged corpora (measured once with the
loaders' defaults; a corpus or filter missing there is an error, never a guess), through the
same split functions the runs use (``split_client_ids``, ``balance_populations``,
``split_clients``). Not modelled: clients dropped because tokenization left them no example
(none at the measured scales: the counts match the runs' recorded ``train_clients``).

Budgets: a run with ``target_epsilon`` is checked against it -- also when ``noise_multiplier``
fixes z (the run then ignores the target; the plan does not, fail closed). A run with a fixed z
and no target claims no particular epsilon; its ledger's budget is its own epsilon, as in
``run_lm_fl``.
"""
from __future__ import annotations

import dataclasses

import dp_accounting as dpa
import jax

from fedpriv.data.errors import ConfigError
from fedpriv.data.populations import (  # re-exported: the populations plans account
    CORPUS_CLIENTS,
    corpus_clients,
    fred_train_clients,
    lm_train_clients,
    split_sizes,
)
from fedpriv.dp import accounting, geometric, moments
from fedpriv.dp.plan import Charge, PlannedRun, PrivacyPlan
from fedpriv.fl import algorithms as algs
from fedpriv.models.lm import count_params

__all__ = ["CORPUS_CLIENTS", "EXPANSION_ACTIVE_USERS", "corpus_clients", "split_sizes",
           "lm_train_clients", "lm_run", "lm_fl_plan", "privacy_utility_plan",
           "mf_comparison_plan", "ddg_comparison_plan", "public_training_plan", "fred_pipeline_plan",
           "fred_table_plan", "fred_mixtures_plan", "population_expansion_plan", "wang_ablations_plan", "lm_sweep_plan",
           "oracle_plan", "iw_regime_plan", "pre_text_plan", "nothing"]

# Koga et al. datasets (`fedpriv.expansion.datasets.load_domains`): (source, target) users with
# >= min_words_per_client words, keyed (dataset, min_words_per_client, max_chitchat_messages);
# "topics" has no chitchat side (None).
EXPANSION_ACTIVE_USERS = {("spoken_vs_typed", 20, 1000): (1144, 905),
                          ("topics", 20, None): (772, 304),
                          ("chat_target", 20, 1000): (2014, 1144)}
# FreD's candidate public datasets (`fedpriv.fred.embed.candidate_datasets`): held-out chitchat,
# Wikipedia, Simpsons.
FRED_CANDIDATES = 3
# Sentences of the packaged FreD pools that do not depend on the config (measured with the
# loaders' defaults: load_public_pool(sources=("wikipedia",)), load_simpsons()); the held-out
# chitchat pool (61,903-63,681 sentences for seeds 0-2 at private_fraction 0.5) is checked
# where it is built. Every FreD experiment draws a Wikipedia candidate of num_sentences.
FRED_POOL_SENTENCES = {"wikipedia": 19_782, "simpsons": 36_974}


def check_fred_pools(cfg, pools=("wikipedia",)) -> None:
    """Refuse (``ConfigError``, before any data is loaded) FreD candidates of ``num_sentences``
    that the packaged pools cannot fill: the papers' 150K-sentence StackOverflow / Wikitext /
    Reddit sets are not packaged, and a smaller draw would silently change the experiment."""
    for name in pools:
        have = FRED_POOL_SENTENCES[name]
        if cfg.num_sentences > have:
            raise ConfigError(
                f"num_sentences={cfg.num_sentences:,} but the packaged {name} pool has {have:,} sentences "
                f"(Hou et al.'s 150K-sentence StackOverflow/Wikitext sets are not packaged): "
                f"set num_sentences <= {have:,}")


def check_fred_budget(cfg, event) -> None:
    """Refuse (``ConfigError``, before any data is loaded) a ``total_epsilon`` that FreD's release
    ``event`` alone already spends at the FL stage's delta: nothing would be left for the
    FL-finetuning it is followed by (its calibration would fail after FreD ran)."""
    eps, _ = accounting.compute_epsilon(event, cfg.lm.delta)
    if not eps < cfg.total_epsilon:
        raise ConfigError(
            f"total_epsilon={cfg.total_epsilon:g} leaves nothing for FL-finetuning: FreD's release alone "
            f"costs epsilon {eps:.4g} at delta {cfg.lm.delta:g} (fred_epsilon={cfg.fred_epsilon:g} per "
            "release); raise total_epsilon or lower fred_epsilon")


def _nonprivate_vocabulary(cfg) -> tuple:
    from fedpriv.recipes.lm import PRIVATE_VOCABULARY
    return ((PRIVATE_VOCABULARY, ("users",)),) if getattr(cfg, "tokenizer", None) == "word" else ()


def lm_run(cfg, num_clients: int, name: str, *, prior: tuple[Charge, ...] = (),
           budget: float | None = None, stage: str = "fl-training", copies: int = 1,
           note: str = "") -> PlannedRun:
    """The ledger of one ``run_lm_fl``-style run of ``cfg`` on ``num_clients`` training users:
    ``prior`` charges (a pipeline's earlier releases) then the FL event ``build_algorithm``
    returns (z calibrated against ``prior`` when ``target_epsilon`` is set). ``budget``: the
    ledger's epsilon (default ``target_epsilon``; with neither, the run's own epsilon)."""
    from fedpriv.recipes import lm
    task = lm.build_task(cfg, cfg.vocab_size if hasattr(cfg, "vocab_size") else 8)
    size = (count_params(jax.eval_shape(task.init, jax.random.key(0)))  # DDG's accounting needs it
            if cfg.algorithm == "dp_ddg" else None)
    alg, sampler, event, z = lm.build_algorithm(cfg, num_clients, task.loss_fn,
                                                [c.event for c in prior], num_params=size)
    rel = algs.neighboring_for(sampler)
    if event is None:  # FedAvg: a non-private baseline
        return PlannedRun(name, None, cfg.delta, copies=copies,
                          note=note or f"{cfg.algorithm}: non-private baseline (no DP claim)")
    executed = (algs.privacy_event(alg.dp, sampler, cfg.rounds, simulated=False)
                if cfg.noise_cohort_size is not None else None)
    charges = (*prior, Charge(stage, event, ("users",), executed))
    pn = lm.paper_noise(cfg, z, alg, sampler, num_clients)  # the paper-noise protocol
    if budget is None:
        # with a simulated population, target_epsilon is the population's (simulated) epsilon:
        # the ledger's budget is what the run spends on our users
        budget = cfg.target_epsilon if pn is None else None
    what = (f"{cfg.algorithm}, z = {z:.4g}, {cfg.rounds} rounds, cohort {cfg.cohort_size}"
            + (f" (noise of {cfg.noise_cohort_size})" if cfg.noise_cohort_size else "")
            + f" of {num_clients} clients")
    if budget is None:  # fixed z, no target: the ledger's budget is the run's own epsilon
        budget = accounting.compute_epsilon([c.event for c in charges], cfg.delta, rel)[0] * (1 + 1e-6)
        what += ("; z fixed, no target epsilon: budget = its own epsilon" if pn is None else
                 "; budget = its own epsilon on our users" if cfg.noise_cohort_size is None else
                 "; budget = its own epsilon (the noise-cohort simulation's)")
    if pn is not None:
        what += "; paper-noise protocol: " + pn.line()
    return PlannedRun(name, budget, cfg.delta, charges, _nonprivate_vocabulary(cfg), copies=copies,
                      note=note or what, neighboring=rel, paper_noise=pn)


def lm_fl_plan(cfg) -> PrivacyPlan:
    """``experiments.lm_fl`` / ``experiments.demo``: one run, its own ledger."""
    return PrivacyPlan((lm_run(cfg, lm_train_clients(cfg), f"{cfg.algorithm} on {cfg.corpus}"),))


def _sim(cfg) -> str:
    """Label suffix of a run whose target epsilon is a simulated population's."""
    return " (SIMULATED population's epsilon)" if getattr(cfg, "simulated_population", None) else ""


def privacy_utility_plan(cfg) -> PrivacyPlan:
    """``experiments.privacy_utility``: per tokenizer, FedAvg (non-private) and DP-FTRL at each
    epsilon (``variants``), one ledger per (tokenizer, seed, method, server lr)."""
    from fedpriv.recipes import lm
    runs = []
    lrs = len(cfg.server_lrs) if cfg.server_lrs else 1
    for tok in cfg.tokenizers:
        base = lm.with_tokenizer(cfg.lm, tok)
        n = lm_train_clients(base)
        runs.append(lm_run(dataclasses.replace(base, algorithm="fedavg", target_epsilon=None,
                                               noise_multiplier=None), n,
                           f"{tok}: FedAvg (non-private)", copies=len(cfg.seeds)))
        for e in cfg.epsilons:
            runs.append(lm_run(dataclasses.replace(base, algorithm="dp_ftrl", target_epsilon=e,
                                                   noise_multiplier=None), n,
                               f"{tok}: DP-FTRL eps~{e:g}{_sim(base)}", copies=len(cfg.seeds) * lrs))
    return PrivacyPlan(tuple(runs))


def mf_comparison_plan(cfg) -> PrivacyPlan:
    """``experiments.mf_comparison``: one ledger per (seed, algorithm), all at ``target_epsilon``
    (the events do not depend on the seed: built once, ``copies`` = seeds)."""
    n = lm_train_clients(cfg.lm)
    return PrivacyPlan(tuple(
        lm_run(dataclasses.replace(cfg.lm, algorithm=a, seed=cfg.seeds[0]), n, a,
               stage=f"fl-training ({a})", copies=len(cfg.seeds)) for a in cfg.algorithms))


def ddg_comparison_plan(cfg) -> PrivacyPlan:
    """``experiments.ddg_comparison``: one ledger per (seed, row): the central Gaussian on
    fixed-size cohorts and DDG at each bit width, all at the config's z (budget = own epsilon)."""
    n = lm_train_clients(cfg.lm)
    rows = [("dp_fedavg_fixed", cfg.lm.ddg_bits)] + [("dp_ddg", b) for b in cfg.bits]
    return PrivacyPlan(tuple(
        lm_run(dataclasses.replace(cfg.lm, algorithm=a, ddg_bits=b, seed=cfg.seeds[0]), n,
               f"{a} ({b} bits)" if a == "dp_ddg" else a, copies=len(cfg.seeds)) for a, b in rows))


def public_training_plan(cfg) -> PrivacyPlan:
    """``recipes.public.run_rows``: per epsilon, the whole T-round DP-FTRL event in each row's
    ledger (public training after T' is post-processing, no cost). The run's ledger budget is the
    calibrated epsilon itself; here it is the claimed ``epsilons`` entry (stricter)."""
    n = lm_train_clients(cfg)
    runs = tuple(lm_run(dataclasses.replace(cfg, seed=cfg.seeds[0], target_epsilon=e,
                                            noise_multiplier=None), n, f"DP-FTRL eps~{e:g}{_sim(cfg)}",
                        copies=len(cfg.seeds) * len(cfg.rows) * len(getattr(cfg, "students", (cfg.arch,))))
                 for e in cfg.epsilons)  # each student (Table 2's columns) runs every row: the same event
    return PrivacyPlan(runs)


def pre_text_plan(cfg) -> PrivacyPlan:
    """``fedpriv.recipes.pretext.run_arms``: per (epsilon, arm), one ledger of budget epsilon on
    the training users: DP-FTRL alone (ondevice), the PrE-Text votes alone (synthetic), or the
    votes at ``ft_vote_share * epsilon`` then DP-FTRL calibrated to what they left
    (synthetic_ft). The votes' event is ``release.votes_event`` of the run's own sampler."""
    from fedpriv.recipes import pretext
    from fedpriv.synth import release as R
    n = lm_train_clients(cfg.lm)
    sampler = pretext.vote_sampler(cfg, n, cfg.seeds[0])
    runs = []
    for e in cfg.epsilons:
        fl = dataclasses.replace(cfg.lm, seed=cfg.seeds[0], target_epsilon=e, noise_multiplier=None)
        arms = {
            "ondevice": lambda: lm_run(fl, n, f"ondevice DP-FTRL eps {e:g}", copies=len(cfg.seeds)),
            "synthetic": lambda: PlannedRun(
                f"PrE-Text votes eps {e:g}", e, cfg.lm.delta,
                (Charge("pretext-votes", R.votes_event(sampler, cfg.pe_rounds,
                                                       pretext.vote_noise(cfg, n, e))),),
                copies=len(cfg.seeds), neighboring=sampler.neighboring,
                note=f"{cfg.pe_rounds} vote rounds of {cfg.vote_cohort} users, z calibrated to {e:g}"),
            "synthetic_ft": lambda: lm_run(
                fl, n, f"PrE-Text votes + DP-FTRL eps {e:g}", budget=e, copies=len(cfg.seeds),
                prior=(Charge("pretext-votes", R.votes_event(
                    sampler, cfg.pe_rounds, pretext.vote_noise(cfg, n, pretext.ft_vote_epsilon(cfg, e)))),)),
        }
        runs += [arms[a]() for a in cfg.arms]
    return PrivacyPlan(tuple(runs))


def fred_pipeline_plan(cfg) -> PrivacyPlan:
    """``fedpriv.recipes.fred_pipeline.run_pipeline``: the pipeline ledger (FreD release, then the
    FL-finetuning of FreD's choice, z calibrated to what FreD left), the no-prefinetuning row
    (a fresh ledger of the same budget) and, with ``compare_all``, the other candidates'
    counterfactual rows (copies of the pipeline ledger after FreD); each once per seed."""
    from fedpriv.recipes.fred_pipeline import NONE, RELEASE, fred_release_event
    check_fred_pools(cfg, ("wikipedia", "simpsons"))
    if cfg.fred_unit == "sample":  # as private_stats refuses it on the pipeline's ledger
        raise ValueError("a sample-level FreD release cannot be charged to the pipeline's "
                         "user-level ledger")
    lm = cfg.lm
    n, k = fred_train_clients(cfg), len(cfg.seeds)  # one pipeline per seed, same events
    fred = (Charge(RELEASE, fred_release_event(cfg)),)
    chosen = lm_run(lm, n, "pipeline: FreD + FL-finetune (rank 1)", prior=fred, budget=cfg.total_epsilon,
                    stage="DP-FTRL FL-finetune (rank 1)", copies=k)
    runs = [chosen, lm_run(lm, n, f"no prefinetuning {NONE}", budget=cfg.total_epsilon,
                           stage=f"DP-FTRL FL-finetune ({NONE})", copies=k)]
    if cfg.compare_all:
        runs.append(dataclasses.replace(chosen, name="ranks 2.. (counterfactual, ledger after FreD)",
                                        copies=(FRED_CANDIDATES - 1) * k))
    return PrivacyPlan(tuple(runs))


def mixtures_release_event(cfg) -> dpa.DpEvent:
    """FreD's trial-0 release in ``fred_mixtures``: two Gaussian releases at ``(fred_epsilon,
    fred_delta)`` each (noise multipliers relative to the release's own sensitivity, at either
    unit and relation)."""
    return moments.release_event(moments.moment_events(moments.gaussian_sigma(cfg.fred_epsilon,
                                                                               cfg.fred_delta)))


#: the neighbouring relation of fred_mixtures' sample-level FreD ledger: replace-one, so that the
#: exact sentence count is public and the release divides by it (Hou et al. Prop. 3.1, "n_2
#: known"; ``fedpriv.fred.private`` module doc)
SAMPLE_RELATION = "replace_one"


def mixtures_fred_budget(cfg) -> tuple[float, float]:
    """The budget of ``fred_mixtures``' own sample-level FreD ledger: ``(2 fred_epsilon,
    2 fred_delta)``, the pair of releases by basic composition (Hou et al. Prop. 3.1)."""
    return 2.0 * cfg.fred_epsilon, 2.0 * cfg.fred_delta


def fred_mixtures_plan(cfg) -> PrivacyPlan:
    """``fedpriv.recipes.fred_mixtures.run_mixtures``, by FreD's unit of privacy:

    * ``fred_unit="sample"``: two kinds of ledger. FreD's trial-0 release on its own
      sample-level ledger (replace-one, budget ``mixtures_fred_budget``: Figure 2's diagnostic),
      and one user-level ledger per (Y, seed) holding only that run's FL-finetuning, z calibrated
      to the whole ``total_epsilon``. The sample-level release is never charged to a user-level
      ledger (``fedpriv.fred.private`` refuses it).
    * ``fred_unit="user"``: FreD's trial-0 release (user level) on the pipeline ledger, then one
      FL-finetuning per (Y, seed) on its own copy of the ledger after FreD, z calibrated to what
      FreD left.

    FreD's other trials are replicate releases, not charged (``fedpriv.fred.mixtures.trials_epsilon``
    is their joint cost, stated in the outputs)."""
    from fedpriv.fred.mixtures import RELEASE, trials_epsilon
    check_fred_pools(cfg)
    fred = (Charge(RELEASE, mixtures_release_event(cfg)),)
    copies = len(cfg.fl_y_percents) * len(cfg.seeds)
    if cfg.fred_unit == "sample":
        runs = (PlannedRun("FreD (trial 0), SAMPLE level: its own ledger", *mixtures_fred_budget(cfg), fred,
                           neighboring=SAMPLE_RELATION,
                           note=f"({cfg.fred_epsilon:g}, {cfg.fred_delta:g}) per Gaussian release, one sentence "
                                "of one user replaced (the exact sentence count public)"),
                lm_run(cfg.lm, fred_train_clients(cfg), "FL-finetune per (Y, seed), USER level (no FreD charge)",
                       budget=cfg.total_epsilon, copies=copies))
    elif cfg.fred_unit == "user":
        runs = (lm_run(cfg.lm, fred_train_clients(cfg), "FreD (trial 0) + FL-finetune per (Y, seed)", prior=fred,
                       budget=cfg.total_epsilon, copies=copies),)
    else:
        raise ConfigError(f"fred_unit must be 'sample' or 'user', got {cfg.fred_unit!r}")
    joint = trials_epsilon(cfg.fred_epsilon, cfg.fred_delta, cfg.fred_trials, cfg.lm.delta)
    return PrivacyPlan(runs, notes=(f"FreD trials 1..{cfg.fred_trials - 1}: replicate releases, not "
                                    f"charged (all {cfg.fred_trials} together: eps {joint:.3g})",))


def fred_table_plan(cfg) -> PrivacyPlan:
    """``experiments.fred_table``: no pipeline ledger; each release (one per seed, unit and
    embedding space) claims (eps, delta) per Gaussian release, (2 eps, 2 delta) for the pair
    (Prop. 3.1) -- accounted here as a ledger of that budget charged with the pair's event."""
    check_fred_pools(cfg, ("wikipedia", "simpsons"))
    event = moments.release_event(moments.moment_events(moments.gaussian_sigma(cfg.epsilon, cfg.delta)))
    spaces = 2 if cfg.pca_dims else 1
    return PrivacyPlan(tuple(
        PlannedRun(f"FreD release ({unit} level)", 2 * cfg.epsilon, 2 * cfg.delta,
                   (Charge("FreD release (mean + covariance)", event),), copies=cfg.seeds * spaces,
                   note=f"one release per seed and embedding space ({cfg.seeds} x {spaces}), each "
                        f"its own claim: ({cfg.epsilon:g}, {cfg.delta:g}) per Gaussian release")
        for unit in ("sample", "user")))


def expansion_train_clients(dataset: str, cfg) -> tuple[int, int]:
    """(S, T) training clients of a Koga et al. dataset (``expansion.prepare_dataset``): active
    users, caps, balancing to alpha, the stratified client split."""
    from fedpriv.expansion.data import split_clients
    from fedpriv.expansion.datasets import balance_populations
    key = (dataset, cfg.min_words_per_client,
           cfg.max_chitchat_messages if dataset in ("spoken_vs_typed", "chat_target") else None)
    if key not in EXPANSION_ACTIVE_USERS:
        raise ConfigError(f"no known population for {key} (dataset, min_words_per_client, "
                          "max_chitchat_messages): add it to fedpriv.recipes.plans.EXPANSION_ACTIVE_USERS")
    n_s, n_t = EXPANSION_ACTIVE_USERS[key]
    n_s = min(n_s, cfg.max_source_clients or n_s)
    n_t = min(n_t, cfg.max_target_clients or n_t)
    s, t, _ = balance_populations(dict.fromkeys(range(n_s)), dict.fromkeys(range(n_t)),
                                  cfg.alpha, cfg.data_seed)
    return (len(split_clients(list(s), 0, tuple(cfg.split))[0]),
            len(split_clients(list(t), 0, tuple(cfg.split))[0]))


def check_expansion_cohorts(cfg) -> None:
    """Refuse (``ConfigError``, no data loaded) a Koga et al. config whose trained cohort of some
    stage exceeds that stage's training users (as ``expansion.check_cohorts`` would after
    loading the data), e.g. the paper's C = 400 on "T w. C" with the packaged stand-ins' 76 / 52
    target training users at alpha = 0.1."""
    from fedpriv.expansion.data import POPULATION_LABELS as LABELS, SOURCE, TARGET
    for dataset in cfg.datasets:
        n_s, n_t = expansion_train_clients(dataset, cfg)
        alpha, train = n_t / (n_s + n_t), {SOURCE: n_s, TARGET: n_t}
        for scheme in cfg.training_schemes:
            for stage in scheme.stages:
                n = sum(train[p] for p in stage.populations)
                train_c = stage.cohort_size(cfg.train_cohort, alpha)
                if train_c > n:
                    raise ConfigError(
                        f"{dataset} / {scheme.name}: a trained cohort of {train_c:g} exceeds the {n} "
                        f"training users of {'+'.join(LABELS[p] for p in stage.populations)} at alpha "
                        f"{cfg.alpha:g} (the paper's Reddit / Common Voice populations are not packaged)")


def population_expansion_plan(cfg) -> PrivacyPlan:
    """``experiments.population_expansion``: one ledger per (dataset, seed, scheme) with the
    scheme's budget and the config's accountant: the unigram releases (Geometric, on S and on T)
    if the scheme uses them, then each stage's DP-FedAvg event, z calibrated to the stage's
    budget for the stage's population (``expansion.pipeline.plan_stages``)."""
    from fedpriv.expansion.data import POPULATION_LABELS as LABELS, SOURCE, TARGET
    from fedpriv.expansion.datasets import PRIVATE_VOCABULARY
    from fedpriv.expansion.pipeline import calibrate_stage
    from fedpriv.expansion.unigrams import unigram_entry_name, unigram_sensitivity
    from fedpriv.fl.samplers import PoissonSampler
    runs = []
    for dataset in cfg.datasets:
        n_s, n_t = expansion_train_clients(dataset, cfg)
        alpha = n_t / (n_s + n_t)
        train = {SOURCE: n_s, TARGET: n_t}
        for scheme in cfg.training_schemes:
            charges = []
            if scheme.unigram_budget is not None:
                eps0, delta0 = scheme.unigram_budget
                if delta0 != 0:
                    raise ValueError("the Geometric mechanism is (eps0, 0)-DP")
                ev = geometric.geometric_dp_event(eps0, unigram_sensitivity())
                charges += [Charge(unigram_entry_name(LABELS[p]), ev, (LABELS[p],)) for p in (SOURCE, TARGET)]
            for i, (stage, rounds) in enumerate(zip(scheme.stages, scheme.stage_rounds(cfg.rounds))):
                n = sum(train[p] for p in stage.populations)
                train_c = stage.cohort_size(cfg.train_cohort, alpha)
                noise_c = stage.cohort_size(cfg.noise_cohort, alpha)
                if train_c > n:  # as expansion.pipeline.plan_stages / check_cohorts refuse it
                    raise ConfigError(f"{dataset} / {scheme.name}: a trained cohort of {train_c:g} exceeds the "
                                      f"{n} training users of {'+'.join(LABELS[p] for p in stage.populations)}")
                rate = train_c / n
                z = calibrate_stage(n, rate, rounds, noise_c, cfg.clip_norm, *stage.budget,
                                    accountant=cfg.accountant)
                sampler = PoissonSampler(n, rate)
                dp = algs.DPConfig(cfg.clip_norm, z, "gaussian", noise_cohort_size=noise_c)
                charges.append(Charge(f"{scheme.name}/stage{i}",
                                      algs.privacy_event(dp, sampler, rounds, simulated=True),
                                      stage.population_labels,
                                      algs.privacy_event(dp, sampler, rounds, simulated=False)))
            declared = [sp.populations for sp in scheme.privacy_plan(LABELS)]
            if declared != [c.populations for c in charges]:  # the scheme's own budget table
                raise ValueError(f"{scheme.name}: charges on {[c.populations for c in charges]} but "
                                 f"the scheme declares {declared}")
            nonprivate = (((PRIVATE_VOCABULARY, (LABELS[TARGET],)),)
                          if cfg.vocabulary == "target_train" else ())
            runs.append(PlannedRun(f"{dataset}/{scheme.name}", *scheme.budget, tuple(charges),
                                   nonprivate, accountant=cfg.accountant, copies=len(cfg.seeds),
                                   note=f"train clients S={n_s}, T={n_t}"))
    return PrivacyPlan(tuple(runs))


def wang_ablations_plan(cfg) -> PrivacyPlan:
    """``experiments.wang_ablations``: every (ablation point, seed, row) run is a
    ``recipes.public.run_rows`` row with its own ledger charged the same T-round DP-FTRL event at
    each epsilon (public training, at any T', is post-processing): ``public_training``'s plan."""
    return public_training_plan(cfg.lm)


def lm_sweep_plan(cfg) -> PrivacyPlan:
    """``experiments.lm_sweep``: one ``lm_fl`` run (own ledger) per grid point and seed. The grid
    changes lr and clip norm; the event depends on z, rounds and sampling only, so each point's
    event is that of the base config (the clip norm scales the noise with it). The SELECTION over
    the grid is not covered by the per-run epsilon (the outputs say so)."""
    n = lm_train_clients(cfg.lm)
    points = len(cfg.server_lrs) * len(cfg.client_lrs) * len(cfg.clip_norms) * len(cfg.seeds)
    return PrivacyPlan((lm_run(cfg.lm, n, f"{cfg.lm.algorithm} grid point", copies=points),),
                       notes=("hyper-parameter selection over the grid is not accounted",))


def oracle_plan(cfg) -> PrivacyPlan:
    """``experiments.wang_figure3``: a NON-PRIVATE oracle LM trained on the private training users
    (no noise; never released) and per-sample perplexities of held-out private users: no DP
    claim, recorded as a non-private use of the users' data."""
    return PrivacyPlan((PlannedRun("oracle LM + per-sample perplexities (NON-PRIVATE)", None, 1e-6,
                                   note="non-private analysis, no DP claim (Wang et al. Figure 3)"),))


def iw_regime_plan(cfg) -> PrivacyPlan:
    """``experiments.iw_regime``: (1) every point of the unigram-release grid is its own what-if
    release (Geometric at eps0, Delta = sequences x tokens) on its own ``PrivacyLedger(2, 1e-6)``
    (``fedpriv.expansion.regime``); composed over the grid they would cost the sum of their eps0
    (the outputs say so); (2) the training part is ``population_expansion``'s plan of
    ``cfg.training_config()`` (and of the control vocabulary, the same events)."""
    from fedpriv.expansion.unigrams import parse_bound, unigram_sensitivity
    runs = []
    for eps0 in sorted(set(cfg.epsilons0) | {cfg.base_epsilon0}):
        for b in sorted(set(cfg.bounds) | {cfg.base_bound}):
            ev = geometric.geometric_dp_event(eps0, unigram_sensitivity(*parse_bound(b)))
            runs.append(PlannedRun(f"unigram release eps0={eps0:g}, bound {b}", 2.0, 1e-6,
                                   (Charge("target unigrams", ev, ("T",)),),
                                   note="one what-if release per grid point and seed, its own ledger"))
    plan = PrivacyPlan(tuple(runs), notes=("the grid's releases are what-if runs on the same users: "
                                           "composed, they cost the sum of their eps0",))
    if cfg.train:
        plan = dataclasses.replace(plan, runs=plan.runs + population_expansion_plan(cfg.training_config()).runs)
    return plan


def nothing(reason: str) -> PrivacyPlan:
    """The plan of an experiment that touches no private data."""
    return PrivacyPlan.nothing(reason)
