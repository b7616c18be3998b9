"""docs/fidelity.md: per artefact, the paper's setting beside our ``paper`` scale, generated from
the configs (``python -m experiments.fidelity``), so a reader sees every substitution.

For each artefact of ``experiments.__main__.ARTEFACTS`` the row pairs the paper's stated setting
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

from fedpriv.data.errors import ConfigError

__all__ = ["PAPER_SETTINGS", "FIELDS", "artefact_rows", "render", "gpu_estimate"]

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
                "loop), 17.8 s compile with XLA's default autotuning. No Transformer paper run was measured.")
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
    "koga-iw-regime": dict(data="(not in the paper: our study of when IW can help)",
                           population="-", model="-", rounds="-", cohort="-", noise="-",
                           epsilon="as Table 1"),
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
    except Exception:  # noqa: BLE001 -- a model we cannot size is reported as such
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


def _epsilons(accounts) -> str:
    """The distinct (simulated, spent) pairs of a plan's runs."""
    seen = []
    for a in accounts:
        if a.budget is None:
            continue
        pn = a.paper_noise
        text = (f"{pn.epsilon_simulated:.3g} SIMULATED ({pn.population.split(' users')[0]} users) / "
                f"{pn.epsilon_executed:.3g} SPENT on our users ({pn.our_users})"
                if pn is not None else f"{a.epsilon_dp:.3g} spent on our users (no simulation)")
        if text not in seen:
            seen.append(text)
    return "; ".join(seen) or "no DP claim (non-private)"


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
            model=f"{lm.arch} (embed {lm.embed_dim}, hidden {lm.hidden_dim})"
                  + (f", {params:,} parameters" if params else ""),
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
            accounts = account(mod.privacy_plan(cfg))
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
    from experiments.__main__ import ARTEFACTS
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


def render(rows, commit: str | None = None) -> str:
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
    body = []
    for r in rows:
        body += [f"## {r['name']} ({r['paper']})", "", _cell(r["what"]), "",
                 "| | the paper | ours (`paper` scale) |", "|---|---|---|"]
        body += [f"| {f} | {_cell(r['theirs'][f])} | {_cell(r['ours'][f])} |" for f in FIELDS]
        body.append("")
    return "\n".join(head + body)


def write(path: str = "docs/fidelity.md", account_plans: bool = True) -> str:
    import subprocess
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    text = render(artefact_rows(account_plans), commit)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
    return path
