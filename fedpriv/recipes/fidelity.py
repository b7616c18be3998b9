"""docs/fidelity.md: per artefact, the paper's setting beside our ``paper`` scale, generated from
the configs (``python -m experiments.fidelity``), so a reader sees every substitution.

For each artefact of ``experiments.index.ARTEFACTS`` the row pairs the paper's stated setting
(:data:`PAPER_SETTINGS`, transcribed from the papers in papers/) with what our ``paper`` scale
does: data, population (training users, from the privacy plans' population table or the
papers' own files), model (parameters from ``jax.eval_shape``, nothing trained), rounds,
cohort, noise and the two epsilons of the paper-noise protocol (:mod:`fedpriv.dp.population`:
simulated for the paper's population / spent on our users, from the config's privacy plan). A
``paper`` scale that refuses (``ConfigError``) shows its one-line reason.

GPU time of a whole paper run is NOT measured (one H100 was lent for 30 minutes once:
:data:`MEASURED_GPU` gives what it measured, 40 rounds of ``lm_fl:paper``); each FL row has a
FLOP-count *estimate*, labelled as such: ``6 x parameters x tokens`` per round (forward +
backward, the usual dense-training count; an upper bound on tokens: every client at its example
cap), times rounds, at an assumed 2-40 % of one H100's dense BF16 peak (989 TFLOP/s). Small
recurrent models with local batches of 16 sit near the low end (docs/design.md's earlier
0.5-2 s per round is ~1-3 %); measure before relying on it.
"""
from __future__ import annotations

import importlib
import os

from experiments.index import ARTEFACTS
from fedpriv.data.errors import ConfigError

__all__ = ["PAPER_SETTINGS", "FIELDS", "SUBSTITUTIONS", "artefact_rows", "render", "gpu_estimate", "declare",
           "declaration_text", "plan_declaration", "needs_executed"]

# what the two GPU leases measured (issue 27; benchmarks/results/gpu_h100.md)
MEASURED_GPU = ("Measured on one H100 (2026-11-25, jax 0.11.2): `lm_fl:paper` (chitchat, "
                "LSTM 670-d, SentencePiece 32K, cohort 100) for 40 rounds: ~0.28 s/round float32 "
                "and ~0.20 s/round bfloat16 client compute in steady state, 43.8 s of training "
                "with compiles, 5 s per evaluation of 10,000 messages: a 1,600-round LSTM run is "
                "~8 min of rounds (benchmarks/results/gpu_h100.md). On one H200 (2026-11-27, "
                "benchmarks/results/gpu_h200.md): `lm_fl:paper` at z = 1.13 for 400 rounds, float32 and "
                "bfloat16 side by side on the one GPU, 173 s and 152 s of training with compiles "
                "(shared GPU), val accuracy 8.06 % vs 8.10 %; the Transformer (one 670-wide block) "
                "only in `benchmarks.round`: 0.097 s/round at cohort 100 (engine 8.9x the per-client "
                "loop), 17.8 s compile with XLA's default autotuning. On one H200 (2026-11-30, the same file): "
                "Wang Table 2's `paper` students (row none, eps 1.77, the full 49,139-id vocabulary, "
                "cohort 100, 16 local steps) for 300 rounds: Transformer 0.224 s/round, LSTM 0.262 "
                "s/round in steady state, < 18 GiB of GPU memory (a 1,600-round run ~6-7 min); at "
                "the published server lrs neither learns there (both diverge, below the trivial "
                "baseline): the lrs need App. C's grid at that scale.")
FIELDS = ("data", "population", "model", "rounds", "cohort", "noise", "epsilon", "GPU time")
H100_PEAK = 989e12            # dense BF16 FLOP/s, one H100 SXM
UTILIZATION = (0.02, 0.40)    # assumed sustained fraction of peak (an assumption, not a measurement)

_WANG = dict(
    data="private: TFF StackOverflow; public: C4 realnewslike (App. B.1)",
    population="342,477 training users, each in at most one round (shuffled, disjoint cohorts)",
    model="LSTM (embed 96, hidden 670) / transformer, SentencePiece 32K (App. B.2)",
    rounds="1,600", cohort="100",
    noise="DP-FTRL tree, z = 8.83 / 1.13 (clip adaptive, ~0.1-1)",
    epsilon="1.77 / 18.71 at delta 1e-6 (user level)")
_HOU_FRED = "FreD (0.6, 1e-6) per release, (2 eps, 2 delta) for mean + covariance"
PAPER_SETTINGS = {
    "wang-table1": _WANG,
    "wang-figure1": dict(_WANG, model="LSTM; SentencePiece 32K vs word vocabularies 10K-50K"),
    "wang-table2": dict(_WANG, data="as Table 1; public pre-training on C4 (1.4M steps, batch 512), "
                                    "distillation from a public LLM, q = 1 % / 0.08 % of C4"),
    "wang-table2-pool": dict(_WANG, data="as Table 2: pre-training on 100 % of C4 (1.4M steps, batch 512), "
                                         "distillation on 1 % (100k steps) and 0.08 % (8k steps)"),
    "wang-table3": dict(_WANG, data="as Table 2 (distribution matching with vs without log p_pub)"),
    "wang-table4-5": dict(_WANG, data="as Table 2; T' in {0, T/4, T/2, 3T/4, T}, q = 0.08 %"),
    "wang-figure2-4": dict(_WANG, data="as Table 2; distillation steps / top-k grids"),
    "wang-figure3": dict(data="StackOverflow vs C4 samples (10K each)", population="(analysis, no DP)",
                         model="an on-device LM and a public LLM", rounds="-", cohort="-",
                         noise="none (non-private analysis)", epsilon="-"),
    "wang-appc-sweep": dict(_WANG, noise="server lr x client lr x clip grid per noise level (App. C)"),
    "hou-table1": dict(data="FL-finetune: Reddit (~3,000 clients); prefinetune: StackOverflow / "
                            "Wikitext", population="~3,000 Reddit users",
                       model="DistilGPT-2", rounds="not stated", cohort="not stated",
                       noise="FL-finetuning non-private (§4.1); " + _HOU_FRED,
                       epsilon="FreD (0.6, 1e-6) per release; FL-finetuning: none"),
    "hou-table1-fred": dict(data="Reddit-train vs StackOverflow-train / Wikitext-train",
                            population="~3,000 Reddit users", model="sentence embedder",
                            rounds="-", cohort="-", noise=_HOU_FRED, epsilon="(0.6, 1e-6) per release"),
    "hou-table2": dict(data="prefinetune: 150K-sentence mixtures of StackOverflow-train1 and "
                            "Wikitext; FL-finetune on StackOverflow-train2",
                       population="StackOverflow-train2 (half of the train users)",
                       model="DistilGPT-2", rounds="one epoch", cohort="100",
                       noise="noise scale 1.5, clip 0.01 (Opacus)",
                       epsilon="FL-finetuning (1.26, 1e-6); FreD (0.6, 2e-6) per release"),
    "hou-figure2": dict(data="as Table 2 (FreD vs Y %, 5 private trials)",
                        population="StackOverflow-train2", model="sentence embedder", rounds="-",
                        cohort="-", noise=_HOU_FRED, epsilon="(0.6, 2e-6) per release"),
    "koga-table1": dict(data="SubReddits (stock -> news) and CV & Reddits (typed -> spoken)",
                        population="117,708 clients (14,072 with target data); 68,312 Common Voice "
                                   "clients + 10x Reddit", model="LSTM (McMahan et al. 2018)",
                        rounds="2,000 (PT/IWPT: 1,000 + 1,000)",
                        cohort="C = 5,000 for the noise, 400 trained; alpha = 0.1",
                        noise="Gaussian, clip 0.5, FedAdam; unigrams: Geometric (0.8, 0)",
                        epsilon="(2, 1e-6) per user; IW/IWPT training (1.2, 1e-6)"),
    "koga-iw-regime": dict(data="(not in the paper: our study of when IW can help; Table 1's schemes "
                                "on a large target)",
                           population="-", model="as Table 1", rounds="as Table 1 (2,000)", cohort="as Table 1",
                           noise="as Table 1", epsilon="as Table 1"),
    "koga-figure1": dict(data="latency model (Prop. 3.1), no data", population="N (model parameter)",
                         model="-", rounds="-", cohort="C (model parameter)", noise="-", epsilon="-"),
}
BEYOND = dict(data="(beyond the papers)", population="-", model="-", rounds="-", cohort="-",
              noise="-", epsilon="-")


def _lm_of(cfg):
    """The LM-FL config of an experiment config (its ``lm``, itself, or Koga's training config)."""
    if hasattr(cfg, "lm"):
        return cfg.lm
    if hasattr(cfg, "training_config"):
        return None
    return cfg if hasattr(cfg, "cohort_size") and hasattr(cfg, "rounds") else None


TEACHER_VOCAB = 49_152  # SmolLM2's byte-level BPE: public_training's student vocabulary when vocab_kept is None


def _vocab(lm) -> tuple[int, str]:
    """(model vocabulary, description) of an LM config (public_training: the teacher's BPE ids
    kept + 4 specials)."""
    if hasattr(lm, "vocab_size"):
        return lm.vocab_size, f"{getattr(lm, 'tokenizer', 'sentencepiece')} {lm.vocab_size:,}"
    kept = getattr(lm, "vocab_kept", None) or TEACHER_VOCAB
    return kept + 4, f"teacher BPE, {kept:,} ids kept (+4 specials)"


def _num_params(lm) -> int | None:
    try:
        import jax

        from fedpriv.models.lm import count_params
        from fedpriv.recipes import lm as recipe
        task = recipe.build_task(lm, _vocab(lm)[0])
        return count_params(jax.eval_shape(task.init, jax.random.key(0)))
    except Exception:  # a model we cannot size is reported as such
        return None


def gpu_estimate(params: int | None, cohort: int, examples: int, seq_len: int, rounds: int,
                 runs: int = 1) -> str:
    """The labelled FLOP-count estimate of one H100's time (module docstring)."""
    if not params:
        return "not measured; no FLOP estimate (no FL training)"
    flops = 6.0 * params * cohort * examples * seq_len * rounds * runs
    lo, hi = (flops / (H100_PEAK * u) / 3600 for u in reversed(UTILIZATION))
    return (f"not measured; ESTIMATE {lo:.2g}-{hi:.2g} H100-hours for {runs} run(s) "
            f"({flops:.2g} FLOP = 6 x {params:,} params x {cohort} clients x {examples} examples x "
            f"{seq_len} tokens x {rounds} rounds per run, at 2-40 % of 989 TFLOP/s)")


NOISE_COHORT_POPULATION = "noise-cohort simulation: the population scaled up to the noise cohort"


def needs_executed(plan) -> bool:
    """Whether a plan charges a simulated population (a charge with an ``executed_event``): then
    the epsilon SPENT on our users is the executed one (``account(plan, executed=True)``)."""
    return any(c.executed_event is not None for r in plan.runs for c in r.charges)


def declare(accounts) -> list[dict]:
    """Per run of a plan (:func:`fedpriv.dp.plan.account`, ``executed=True`` where
    :func:`needs_executed`): ``{"name", "copies", "simulated": [{"epsilon", "population"}],
    "spent", "our_users", "nonprivate"}``. ``simulated``: each declared simulation -- the paper's
    population (the paper-noise protocol) and/or the noise-cohort simulation (the ledger's budget
    is then a simulated population's epsilon); ``spent``: the epsilon of the run executed on our
    users (inf with a non-private choice such as a vocabulary of the users' words);
    ``spent_if_public``: the DP charges alone where a choice was non-private. A run without a DP
    claim: ``{"name", "copies", "nonprivate": True, "spent": None}``."""
    import math
    out = []
    for a in accounts:
        if a.budget is None:
            out.append({"name": a.name, "copies": a.copies, "nonprivate": True, "spent": None, "simulated": []})
            continue
        pn = a.paper_noise
        sims = []
        if pn is not None and not pn.same_population:
            sims.append({"epsilon": float(pn.epsilon_simulated), "population": pn.population})
        exe = a.epsilon_executed
        if exe is not None and math.isfinite(exe) and abs(exe - a.epsilon_dp) > 1e-3 * max(1.0, a.epsilon_dp):
            sims.append({"epsilon": float(a.epsilon_dp), "population": NOISE_COHORT_POPULATION})
        dp_spent = float(exe) if exe is not None and math.isfinite(exe) else float(a.epsilon_dp)
        nonpriv = not math.isfinite(a.epsilon)
        out.append({"name": a.name, "copies": a.copies, "simulated": sims, "nonprivate": nonpriv,
                    "spent": math.inf if nonpriv else dp_spent, "spent_if_public": dp_spent if nonpriv else None,
                    "our_users": pn.our_users if pn is not None else None})
    return out


def _short_population(text: str) -> str:
    """A declared population up to its user count ("TFF StackOverflow (train), 342,477 users")."""
    head, sep, _ = text.partition(" users")
    return head + sep if sep else text


def declaration_text(decl: list[dict]) -> str:
    """One line per distinct (simulated, spent) of a plan's declarations."""
    seen = []
    for d in decl:
        if d["spent"] is None:
            continue
        sims = "; ".join(f"{s['epsilon']:.3g} SIMULATED ({_short_population(s['population'])})"
                         for s in d["simulated"])
        spent = ("inf SPENT (a non-private choice" + (f"; {d['spent_if_public']:.3g} if it were public)"
                                                      if d.get("spent_if_public") is not None else ")")
                 if d["nonprivate"] else f"{d['spent']:.3g} SPENT on our users"
                 + (f" ({d['our_users']})" if d.get("our_users") else ""))
        text = (sims + " / " + spent) if sims else spent + " (no simulation)"
        if text not in seen:
            seen.append(text)
    return "; ".join(seen) or "no DP claim (non-private)"


def _epsilons(accounts) -> str:
    """The distinct (simulated, spent) of a plan's runs (:func:`declare`)."""
    return declaration_text(declare(accounts))


def plan_declaration(spec: str) -> list[dict] | None:
    """:func:`declare` of the privacy plan of a config spec (``configs/<name>.py:<scale>[,...]``),
    with the executed epsilons where the plan simulates a population; None without a plan."""
    from experiments import common
    from fedpriv.dp.plan import account
    name = spec.split(":", 1)[0].rsplit("/", 1)[-1][:-3]
    mod = importlib.import_module(f"configs.{name}")
    if not hasattr(mod, "privacy_plan"):
        return None
    plan = mod.privacy_plan(common.load_config(spec))
    return declare(account(plan, executed=needs_executed(plan)))


#: where the published runs differ from the paper in what decides a claim: the unit of privacy,
#: the data (private users, public pools), the models, the scale (shown on the results page and
#: in docs/fidelity.md; the papers' settings are in PAPER_SETTINGS)
SUBSTITUTIONS = {
    "wang-table1": ["private data: chitchat (1,053 training users) for StackOverflow (342K); the epsilons are "
                    "StackOverflow's under the paper-noise protocol (declared simulated)",
                    "model: LSTM 96/128 and 800 rounds at `small` for 96/670 and 1,600 rounds",
                    "'with pre-training' is wang-table2's pretrain_lm row: another pipeline (teacher-BPE "
                    "vocabulary of 3,000 ids, ~20 % UNK targets), whose own no-public row is the baseline for it"],
    "wang-figure1": ["word vocabularies of 625 / 2,000 words (chitchat's size) for 10K / 32K"],
    "wang-table2": ["public data: the packaged pool (1,024 of 25,463 sentences at `small`) for C4 realnewslike: "
                    "'1 %' and '0.08 %' are not real subsets (q = 1.0 / 0.125 of the pool; the whole pool, where "
                    "they are: wang-table2-pool)",
                    "teacher: SmolLM2-135M (GGUF) for LaMDA 2B; student vocabulary: its BPE restricted to 3,000 "
                    "ids (~20 % of targets UNK) for SentencePiece 32K",
                    "student: LSTM 96/128 or a one-block Transformer, 800 rounds, cohort 16 with the noise of 100"],
    "wang-table2-pool": ["public data: the whole packaged pool (25,463 sentences) for C4 realnewslike: 1 % = 255 "
                         "and 0.08 % = 20 sentences (real subsets, but 10^4-10^5 times fewer than the paper's)",
                         "student vocabulary: the teacher's BPE restricted to 26,000 ids (2.96 % of targets UNK) "
                         "for SentencePiece 32K; teacher: SmolLM2-135M (GGUF) for LaMDA 2B",
                         "central steps in the paper's 1,400 : 100 : 8 proportion: pre-training one pass over the "
                         "pool (796 steps at batch 32), distillation 57 / 5 steps",
                         "student: LSTM 96/128, 800 rounds, cohort 16 with the noise of 100, eps 1.77 only; "
                         "server lr 0.05 chosen at V = 3,000 (wang-table2), not re-tuned at V = 26,004"],
    "wang-table3": ["as wang-table2"],
    "wang-table4-5": ["as wang-table2; T' on 800 rounds (T/4 = 200 ...) for 1,600; validation users as the dev set"],
    "wang-figure2-4": ["as wang-table2; 'distillation steps' are epochs over the 128-sentence q (not a fraction "
                       "of C4)"],
    "wang-figure3": ["oracle: an LSTM fit without DP on chitchat; LLM: SmolLM2-135M; pools: chitchat vs the "
                     "packaged public pool"],
    "wang-appc-sweep": ["the App. C grid at one noise level on chitchat (cohort 16 with the noise of 100)"],
    "hou-table1": ["unit of privacy: the paper's FreD is SAMPLE-level (one sample of one client); ours is "
                   "USER-level (fred_unit=user)", "private: chitchat for Reddit; candidates: the packaged "
                   "public sources for StackOverflow / Wikitext; model: our LSTM for DistilGPT-2; FL-finetuning "
                   "is DP here (non-private in the paper's §4.1)"],
    "hou-table1-fred": ["both units of privacy shown (sample level as in the paper, user level as ours); a "
                        "public PCA basis besides the full 384-d embedding (MiniLM for ALBERT)"],
    "hou-table2": ["FL-finetuning DP at USER level (the whole epsilon on its own ledger; FreD's SAMPLE-level "
                   "release, as the paper's, on a separate sample-level ledger: the two are not composed)",
                   "mixtures of 19,782 sentences, the packaged Wikipedia pool (the paper: 150,000): 99 % and "
                   "100 % differ by 198 sentences", "model: our LSTM for DistilGPT-2; private: chitchat for "
                   "StackOverflow-train2"],
    "hou-figure2": ["unit of privacy: SAMPLE-level FreD as the paper, replace-one (the exact sentence count public, "
                    "Prop. 3.1's n_2), full 384-d embedding (MiniLM for the paper's embedder), on its own ledger "
                    "(1.2, 4e-6); 30,558 private sentences (<= 256 per user)", "mixtures of 19,782 sentences "
                    "(the paper: 150,000): 99 % and 100 % differ by 198"],
    "koga-table1": ["datasets: Simpsons / chitchat (spoken vs typed) and Shakespeare comedies / histories for "
                    "CV & Reddit and SubReddits; 52-76 target users", "40 rounds per scheme (the paper: 2,000); "
                    "LSTM 32/64"],
    "koga-iw-regime": ["Table 1's schemes on our own large-target dataset (not in the paper): chat_target "
                       "(T = chitchat senders, S = Simpsons + Shakespeare), 680 target training users, the "
                       "paper's 10K vocabulary cut to 50 words (where the private unigrams carry signal); "
                       "500 rounds per scheme at the small scale (the paper: 2,000); LSTM 32/64; the "
                       "small-target Table 1 datasets (koga-table1) stay the negative case"],
}


def _ours(artefact, account_plans: bool) -> dict:
    from experiments import common
    from fedpriv.dp.plan import account
    from fedpriv.recipes import plans
    spec = f"configs/{artefact.config}.py:paper"
    if "paper" not in artefact.scales:
        return dict.fromkeys(FIELDS, "-") | {"data": f"no paper scale (scales: {'/'.join(artefact.scales)})"}
    try:
        cfg = common.load_config(spec)
    except ConfigError as err:
        return dict.fromkeys(FIELDS, "-") | {"data": f"REFUSED: {err}"}
    mod = importlib.import_module(f"configs.{artefact.config}")
    lm = _lm_of(cfg)
    row = dict.fromkeys(FIELDS, "-")
    if lm is not None:
        n = (plans.lm_train_clients(lm) if lm.corpus in plans.CORPUS_CLIENTS or getattr(lm, "corpus_path", None)
             else None)
        params = _num_params(lm)
        row.update(
            data=f"{lm.corpus} (private), vocabulary: {_vocab(lm)[1]}"
                 + ("; public: packaged pool (Wikipedia excerpt, Lee news, film quotes)"
                    if not getattr(lm, "public_pool_path", None) else f"; public: {lm.public_pool_path}"),
            population=f"{n:,} training users" if n else "-",
            model=f"{' / '.join(getattr(lm, 'students', (lm.arch,)))} (embed {lm.embed_dim}, hidden {lm.hidden_dim})"
                  + (f", {params:,} parameters ({lm.arch})" if params else ""),
            rounds=f"{lm.rounds:,}", cohort=str(lm.cohort_size) + (
                f" (noise of {lm.noise_cohort_size})" if lm.noise_cohort_size else ""),
            noise=(f"{lm.algorithm}, z = {lm.noise_multiplier:g}" if lm.noise_multiplier is not None else
                   f"{lm.algorithm}, z calibrated per epsilon") + f", clip {lm.clip_norm:g}")
        row["GPU time"] = gpu_estimate(params, lm.cohort_size, lm.max_examples_per_client, lm.seq_len,
                                       lm.rounds)
    else:
        row["GPU time"] = gpu_estimate(None, 0, 0, 0, 0)
    if account_plans and hasattr(mod, "privacy_plan"):
        try:
            plan = mod.privacy_plan(cfg)
            accounts = account(plan, executed=needs_executed(plan))
        except ConfigError as err:
            row["epsilon"] = f"REFUSED: {err}"
        else:
            row["epsilon"] = _epsilons(accounts)
            zs = sorted({round(a.paper_noise.noise_multiplier, 4) for a in accounts if a.paper_noise})
            if lm is not None and zs:  # the z each run adds (calibrated on the paper's population)
                row["noise"] = f"{lm.algorithm}, z = {' / '.join(f'{z:g}' for z in zs)}, clip {lm.clip_norm:g}"
            if lm is not None:
                runs = sum(a.copies for a in accounts)
                row["GPU time"] = gpu_estimate(_num_params(lm), lm.cohort_size, lm.max_examples_per_client,
                                               lm.seq_len, lm.rounds, runs)
    elif not account_plans:
        row["epsilon"] = "(not accounted in this rendering)"
    return row


def artefact_rows(account_plans: bool = True, names=None) -> list[dict]:
    """One dict per artefact: ``name``, ``paper``, ``what``, ``theirs`` and ``ours`` (FIELDS)."""
    out = []
    for a in ARTEFACTS:
        if names is not None and a.name not in names:
            continue
        theirs = PAPER_SETTINGS.get(a.name, BEYOND)
        out.append(dict(name=a.name, paper=a.paper, what=a.what,
                        theirs={f: theirs.get(f, "-") for f in FIELDS} | {"GPU time": "not stated"},
                        ours=_ours(a, account_plans)))
    return out


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


PRIVACY_FILE = os.path.join("experiments", "results", "privacy.json")
SUMMARY_DIR = os.path.join("experiments", "results", "summaries")


def published_declarations(summary_dir: str = SUMMARY_DIR, previous: dict | None = None, log=None) -> dict:
    """``{module: {"config": spec, "runs": declare(...)}}`` of every committed compact summary's
    published config (the results page's privacy line of each artefact reads it). A module whose
    spec is unchanged in ``previous`` keeps its entry (the accounting of some plans takes
    minutes)."""
    import glob
    import json
    out = {}
    for path in sorted(glob.glob(os.path.join(summary_dir, "*.json"))):
        with open(path) as f:
            spec = json.load(f).get("config")
        module = os.path.basename(path)[:-5]
        if not spec:
            continue
        if previous and previous.get(module, {}).get("config") == spec:
            out[module] = previous[module]
            continue
        if log:
            log(f"accounting the published run of {module}: {spec}")
        try:
            runs = plan_declaration(spec)
        except ConfigError as err:
            out[module] = {"config": spec, "refused": str(err)}
            continue
        out[module] = {"config": spec, "runs": runs}
    return out


def render(rows, commit: str | None = None, published: dict | None = None, power_block: str = "") -> str:
    """docs/fidelity.md's Markdown."""
    head = [
        "# Fidelity: the papers' settings beside our `paper` scales",
        "",
        "Generated by `python -m experiments.fidelity` from `configs/*.py` (scale `paper`) and their "
        "privacy plans" + (f" at commit `{commit}`" if commit else "") + "; do not edit by hand.",
        "",
        "- **Epsilon**: under the paper-noise protocol (docs/privacy.md, `fedpriv.dp.population`) a "
        "run adds the paper's per-round noise and reports two epsilons: SIMULATED for the paper's "
        "population (a declared simulation, naming it) and SPENT on our users (what the ledger "
        "charges). With the papers' own data (`corpus=stackoverflow`, `corpus_path=...`) they coincide.",
        "- **REFUSED**: the `paper` scale cannot be the paper's setting on the packaged data; the "
        "reason is the config's one-line error.",
        "- **GPU time**: no whole paper run was measured; the figures are FLOP-count ESTIMATES "
        "(`fedpriv.recipes.fidelity.gpu_estimate`), not measurements. " + MEASURED_GPU,
        "",
    ]
    modules = {a.name: a.module for a in ARTEFACTS}
    body = []
    for r in rows:
        body += [f"## {r['name']} ({r['paper']})", "", _cell(r["what"]), "",
                 "| | the paper | ours (`paper` scale) |", "|---|---|---|"]
        body += [f"| {f} | {_cell(r['theirs'][f])} | {_cell(r['ours'][f])} |" for f in FIELDS]
        body.append("")
        pub = (published or {}).get(modules.get(r["name"]))
        if pub:
            body += [f"Published run (`{pub['config']}`): epsilon "
                     + (f"REFUSED: {pub['refused']}" if "refused" in pub else declaration_text(pub["runs"])), ""]
        if SUBSTITUTIONS.get(r["name"]):
            body += ["Substitutions that decide its claims: " + "; ".join(SUBSTITUTIONS[r["name"]]) + ".", ""]
    return "\n".join(head + body) + ("\n" + power_block if power_block else "")


def write(path: str = "docs/fidelity.md", account_plans: bool = True, privacy_file: str = PRIVACY_FILE,
          log=None, power_block: str = "") -> str:
    """docs/fidelity.md (and, with ``account_plans``, the published runs' privacy declarations
    ``privacy_file``, which the results page reads); ``power_block``: the power table from the
    committed per-seed values (``experiments.power.block()``, which ``python -m
    experiments.fidelity`` passes: the library does not import the experiments' page code)."""
    import json
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    previous = None
    if os.path.exists(privacy_file):
        with open(privacy_file) as f:
            previous = json.load(f)
    published = published_declarations(previous=previous, log=log) if account_plans else previous
    if account_plans:
        tmp = privacy_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(published, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
        os.replace(tmp, privacy_file)
    text = render(artefact_rows(account_plans), commit, published, power_block)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
    return path
