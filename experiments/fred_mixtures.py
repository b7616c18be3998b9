"""Prefinetuning mixtures on real corpora (Hou et al. 2023 §4.2: Table 2 and Figure 2, small).

Mixtures of Y% private-distribution text (held-out chitchat senders) and (100-Y)% Wikipedia,
fixed total size (``small``: 19,782 sentences, the packaged Wikipedia pool; 99% and 100% differ
by 198), nested (99% and 100% share 99% of their sentences). FreD to the private users
(non-private; private over several Algorithm-1 releases, each reused for every Y: at ``small``
SAMPLE level in the full 384-d embedding, as the paper's Figure 2), then for each (Y, seed):
prefinetune the LM, test perplexity, DP-FTRL FL-finetune, test perplexity (Table 2, Y = 99 and
100 included).

Privacy (configs/fred_mixtures.py, ``plans.fred_mixtures_plan``): a sample-level FreD release is
charged to its own sample-level ledger (replace-one, ``(2 fred_epsilon, 2 fred_delta)``) and the
FL-finetuning of every (Y, seed) to a user-level ledger with the whole ``total_epsilon``; the two
guarantees are separate (no composition across units is claimed). With ``fred_unit=user`` the
release is charged to the FL pipeline's ledger and the FL-finetuning gets what it left.
The stages are ``fedpriv.recipes.fred_mixtures`` (resumable per stage); this writes ``summary.json``,
``fred_mixtures.{md,csv}`` (Table 2 layout), ``fred_vs_y.png`` (Figure 2) and ``verdicts.json``.

    python -m experiments.fred_mixtures --config configs/fred_mixtures.py:small --workdir runs/fred_mixtures
"""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from experiments import common
from fedpriv import verdicts as V
from fedpriv.fred.mixtures import (
    mixture_counts,
    monotone_verdict,
    plot_fred_vs_y,
    separation_verdict,
    trials_epsilon,
)
from fedpriv.recipes.fred_mixtures import run_mixtures
from fedpriv.report import write_verdicts

# Hou et al. Table 2: Y% -> (test perplexity before, after DP FL-finetuning)
PAPER_TABLE2 = {10: (56.18, 52.77), 40: (44.01, 42.47), 70: (39.35, 38.52), 95: (37.18, 36.59),
                99: (36.90, 36.37), 100: (36.88, 36.33)}


def table2_pair_verdicts(fl_ys, before: dict, after: dict) -> list:
    """Hou et al. Table 2's last two rows: test perplexity at Y = 100 below Y = 99, before and after
    DP FL-finetuning (36.88 vs 36.90, 36.33 vs 36.37), paired by seed, with the paper's cells (their
    relative gap on our Y = 99 mean). ``before`` / ``after``: ``{Y: {seed: perplexity}}``. "not run
    yet" with the rerun when Y = 99 (or 100) was not FL-finetuned."""
    out = []
    for i, (when, vals) in enumerate((("before", before), ("after", after))):
        claim = (f"test perplexity {when} FL-finetuning is lower at Y=100 than at Y=99 (Table 2) -- the paper: "
                 f"{PAPER_TABLE2[100][i]} vs {PAPER_TABLE2[99][i]}")
        if 99 in vals and 100 in vals and vals[99] and vals[100]:
            out.append(V.compare(claim, vals[100], vals[99], higher_is_better=False, trivial=None,
                                 names=("Y=100", "Y=99"), paper=(PAPER_TABLE2[100][i], PAPER_TABLE2[99][i])))
        else:
            ys = "/".join(f"{y:g}" for y in fl_ys)
            out.append(V.not_run(claim, f"the Y=99 row was not FL-finetuned (fl_y_percents={ys}); rerun with "
                                 "fl_y_percents including 99 and 100 (the FreD columns have Y=99)"))
    return out


def space_label(cfg) -> str:
    """The space FreD is released in: the full 384-d embedding (the paper) or a public PCA basis."""
    return f"{cfg.pca_dims}-d public PCA basis" if cfg.pca_dims else "full 384-d embedding"


def setting_label(cfg) -> str:
    """Unit, space and sizes of the private FreD, for claims and notes."""
    k99 = cfg.num_sentences - mixture_counts(99, cfg.num_sentences)[0]
    return (f"{cfg.fred_unit} level, {space_label(cfg)}, mixtures of {cfg.num_sentences:,} sentences "
            f"(99% and 100% differ by {k99:,})")


def fred_verdicts(cfg, fr: dict) -> list:
    """Figure 2's claims (and our diagnostics) from the FreD stage's result ``fr``: non-private
    FreD decreases with Y (exact); private FreD decreases with Y (means over trials, paired by
    trial: one release serves every Y); private FreD separates 99 % from 100 % (max over trials
    of FreD(100 %) below the min of FreD(99 %): the paper's non-overlapping error bars), and its
    paired forms."""
    priv = np.asarray(fr["private"])  # [trials, Y]
    trial = lambda i: {t: float(v) for t, v in enumerate(priv[:, i])}  # noqa: E731
    where = setting_label(cfg)
    out = [monotone_verdict("non-private FreD (full 384-d embedding, sentences pooled) decreases monotonically "
                            "with Y (Fig. 2 left)", fr["y"], [[v] for v in fr["nonprivate_full"]], exact=True)]
    if cfg.pca_dims:
        out.append(monotone_verdict("(ours) non-private FreD in the release's PCA basis, sentences pooled, "
                                    "decreases monotonically with Y", fr["y"], [[v] for v in fr["nonprivate"]],
                                    exact=True, source="project"))
    if cfg.fred_unit == "user":
        out.append(monotone_verdict("(ours) non-private FreD of exactly what the release estimates (release "
                                    "space, user-weighted) decreases monotonically with Y", fr["y"],
                                    [[v] for v in fr["nonprivate_user"]], exact=True, source="project"))
    out.append(monotone_verdict(f"private FreD (eps={cfg.fred_epsilon}, delta={cfg.fred_delta:g} per release) "
                                f"decreases monotonically with Y, means over trials (Fig. 2 left; {where})",
                                fr["y"], [trial(i) for i in range(len(fr["y"]))], fragile_abs=0.0))
    if 99 in fr["y"] and 100 in fr["y"]:
        i99, i100 = fr["y"].index(99), fr["y"].index(100)
        out.append(separation_verdict(f"private FreD separates 99% from 100%: max FreD(100%) < min FreD(99%) "
                                      f"over the {len(priv)} trials (Fig. 2 right; {where})",
                                      priv[:, i100], priv[:, i99], ("FreD(100%)", "FreD(99%)")))
        d = priv[:, i99] - priv[:, i100]  # same release: the noise is shared by both Ys
        out.append(V.check("(ours, paired) within every trial FreD(100%) < FreD(99%)", bool((d > 0).all()),
                           f"FreD(99%) - FreD(100%) per trial: {', '.join(f'{x:+.3g}' for x in d)}",
                           basis=f"every one of the {len(d)} observed trials", source="project"))
        out.append(V.compare("(ours, paired by trial) FreD(100%) < FreD(99%) on average", trial(i100),
                             trial(i99), higher_is_better=False, trivial=None,
                             names=("FreD(100%)", "FreD(99%)"), source="project", fragile_abs=0.0))
    return out


def fred_note(cfg, fr: dict) -> str:
    """The notes' line on the private FreD: unit, relation, space, denominator, ledger, trials."""
    rel = fr["releases"][0]
    unit = fr.get("fred_unit", "user")
    ledger = (f"trial 0 charged to its OWN {unit}-level ledger ({rel.get('relation', 'replace_one')}, budget "
              f"(2 eps, 2 delta) = ({2 * cfg.fred_epsilon:g}, {2 * cfg.fred_delta:g})), never to the FL "
              "runs' user-level ledger (a sample-level guarantee does not compose with a user-level one)"
              if unit == "sample" else "trial 0 charged to the FL pipeline's user-level ledger")
    at_delta = 2 * cfg.fred_delta if unit == "sample" else cfg.lm.delta
    joint = trials_epsilon(cfg.fred_epsilon, cfg.fred_delta, cfg.fred_trials, at_delta,
                           rel.get("relation", "add_remove"))
    n = (f"n = {fr.get('fred_n', rel['n'])} sentences (the exact count, public under replace-one)"
         if unit == "sample" else f"n = {fr['private_users']} users (declared)")
    return (f"private FreD: {unit.upper()} level, in the {space_label(cfg)}, {n}, two Gaussian releases at "
            f"(eps={cfg.fred_epsilon}, delta={cfg.fred_delta:g}) each (RDP eps {rel['epsilon_rdp']:.3g} at delta "
            f"{rel['delta_total']:g}); {cfg.fred_trials} trials = release seeds, each release reused for every Y "
            f"(post-processing); {ledger}; trials 1.. are replicate releases of the same data for the spread "
            f"over trials (Fig. 2), NOT covered by any ledger: all {cfg.fred_trials} releases together are "
            f"(eps={joint:.3g}, delta={at_delta:g})")


def run(cfg, workdir: str, progress: bool = True) -> dict:
    t0 = time.time()
    res = run_mixtures(cfg, workdir, progress)
    fr, runs = res["fred"], res["runs"]
    priv = np.asarray(fr["private"])  # [trials, Y]
    by_y = {y: [r for r in runs if r["y"] == y] for y in cfg.fl_y_percents}
    col = lambda y, k: [r[k] for r in by_y.get(y, [])]  # noqa: E731
    rows = []
    for i, y in enumerate(fr["y"]):
        gains = [a - b for a, b in zip(col(y, "test_ppl_before_fl"), col(y, "test_ppl_after_fl"))]
        paper = PAPER_TABLE2.get(y, (None, None))
        row = {"Y%": y, "test ppl before FL": common.pm(col(y, "test_ppl_before_fl")),
               "test ppl after FL": common.pm(col(y, "test_ppl_after_fl")),
               "FL gain (before-after)": common.pm(gains), "seeds": len(by_y.get(y, [])),
               "paper before": paper[0], "paper after": paper[1],
               "private FreD (mean ± std)": common.pm(priv[:, i], digits=4),
               "private FreD min": float(priv[:, i].min()), "private FreD max": float(priv[:, i].max()),
               "nonprivate/FreD 384-d": fr["nonprivate_full"][i]}
        if cfg.pca_dims:
            row["nonprivate/FreD PCA"] = fr["nonprivate"][i]
        if cfg.fred_unit == "user":
            row["nonprivate/FreD user-weighted (release space)"] = fr["nonprivate_user"][i]
        rows.append(row)
    fl_ys = list(cfg.fl_y_percents)
    gain = lambda y: [a - b for a, b in zip(col(y, "test_ppl_before_fl"), col(y, "test_ppl_after_fl"))]  # noqa: E731
    # per-seed values keyed by seed (paired across Ys)
    seeded = lambda y, vals: dict(zip(col(y, "seed"), vals))  # noqa: E731
    verdicts = fred_verdicts(cfg, fr)
    if len(fl_ys) > 1:
        verdicts += [
            monotone_verdict("test perplexity before FL-finetuning decreases with Y (Table 2)", fl_ys,
                             [seeded(y, col(y, "test_ppl_before_fl")) for y in fl_ys]),
            monotone_verdict("test perplexity after DP FL-finetuning decreases with Y (Table 2)", fl_ys,
                             [seeded(y, col(y, "test_ppl_after_fl")) for y in fl_ys]),
            monotone_verdict("the FL-finetuning gain (before - after) shrinks as Y grows (Table 2)", fl_ys,
                             [seeded(y, gain(y)) for y in fl_ys], decreasing=True),
        ]
    verdicts += table2_pair_verdicts(fl_ys, {y: seeded(y, col(y, "test_ppl_before_fl")) for y in fl_ys},
                                     {y: seeded(y, col(y, "test_ppl_after_fl")) for y in fl_ys})
    write_verdicts(verdicts, workdir)
    curves = ("nonprivate_full",) + (("nonprivate",) if cfg.pca_dims else ()) + \
        (("nonprivate_user",) if cfg.fred_unit == "user" else ())
    plot_fred_vs_y(fr, os.path.join(workdir, "fred_vs_y.png"), curves=curves,
                   title=f"FreD vs Y (private: eps={cfg.fred_epsilon}, delta={cfg.fred_delta:g} per release, "
                         f"{cfg.fred_unit} level, {space_label(cfg)}, {cfg.fred_trials} trials; "
                         f"{cfg.num_sentences:,}-sentence mixtures)")
    ledger = runs[0]["ledger"] if runs else res["ledger"].report()
    fl_alone = cfg.fred_unit == "sample"
    notes = [f"mixtures of {cfg.num_sentences:,} sentences: Y% held-out chitchat senders' messages + (100-Y)% "
             "Wikipedia, nested prefixes of two shuffled pools (99% and 100% share 99% of sentences)",
             fred_note(cfg, fr),
             f"prefinetune {cfg.prefinetune_steps} steps (batch {cfg.prefinetune_batch}); DP-FTRL "
             f"{cfg.lm.rounds} rounds, z={runs[0]['fl_noise_multiplier']:.3g} calibrated so "
             + ("the FL-finetuning alone (user level, no FreD charge) fits" if fl_alone else "FreD + FL fit")
             + f" epsilon {cfg.total_epsilon} (delta {cfg.lm.delta:g})"
             + (f" of a SIMULATED population (the noise of a cohort of {cfg.lm.noise_cohort_size} while "
                f"training {cfg.lm.cohort_size}); the runs SPEND epsilon "
                f"{ledger['spent_epsilon_executed']:.3g} on our users"
                if ledger.get("spent_epsilon_executed") is not None else "")
             + "; each (Y, seed) run under its own copy of the user-level ledger after the FreD stage"
             if runs else "no FL runs",
             "test ppl = exact evaluation on held-out private users (NOT covered by the ledger); "
             "nonprivate/ columns are noise-free FreD (NOT covered)",
             "paper columns: Hou et al. Table 2 (DistilGPT-2, StackOverflow; their Y values are 10/40/70/95/99/100)"]
    common.write_table(rows, workdir, "fred_mixtures", title="FreD mixtures (Hou et al. 2023, Table 2 / Fig. 2)",
                       notes=notes)
    with open(os.path.join(workdir, "fred_mixtures.md"), "a") as f:
        f.write("\n## Hou et al. Table 2 (paper)\n\n| Y% | before FL | after FL |\n|---|---|---|\n"
                + "".join(f"| {y} | {b} | {a} |\n" for y, (b, a) in PAPER_TABLE2.items())
                + "\n## Verdicts\n\n" + "".join(f"- {v.claim}: **{v.status}** — {v.measured}\n" for v in verdicts))
    summary = {"rows": rows, "fred": {k: fr[k] for k in ("y", "nonprivate", "nonprivate_full", "nonprivate_user",
                                                          "private", "releases", "embedder_sentences_per_s",
                                                          "embedded_sentences", "private_users", "fred_unit",
                                                          "fred_n") if k in fr},
               "runs": [{k: v for k, v in r.items() if k != "ledger"} for r in runs],
               "verdicts": [v.to_json() for v in verdicts], "ledger": ledger,
               "fred_ledger": fr.get("fred_ledger_report"),
               "resumed": res["resumed"], "wall_clock_s_this_session": time.time() - t0,
               "stage_wall_s": {"FreD": fr["wall_s"], **{f"Y={r['y']:g}% seed={r['seed']}": r["wall_s"] for r in runs}},
               **common.run_record(dataclasses.asdict(cfg), cfg.seed)}
    common.save_json(summary, os.path.join(workdir, "summary.json"))
    return summary


main = common.printing_main(run, __doc__, "fred_mixtures", "fred_mixtures.md")


if __name__ == "__main__":
    common.cli(main)
