"""IW regime study: when do the private unigrams of IW / IWPT carry signal (Koga et al. 2023)?

(1) No training: the target unigrams u_hat_T released by the library's Geometric mechanism
(`fedpriv.expansion.regime`, every release charged to a ledger) against the true u_T, as the
target population N_T (subsamples of the 1,144 chitchat senders), eps0, the vocabulary and the
per-user bound vary; the signal IW must beat is TV(u_T, u_{S u T}). Also the negative case: the
50-80 T training users of Table 1's two datasets. (2) IW / IWPT vs T w. alpha*C, T w. C, S u T,
PT on ``chat_target`` (T = chitchat senders) in the regime where (1) finds signal, >= 3 seeds.

Outputs in ``--workdir``: ``regime.{md,csv}`` (mean +- std over seeds per point),
``regime_runs.csv``, ``regime_{eps0,vocab,bound}.png`` (TV vs N_T), ``negative.{md,csv}``,
``table.{md,csv}`` (perplexity on T, mean +- std, with the trained release's TV),
``verdicts.json``, ``summary.json``; training runs under ``train/``
(experiments.population_expansion's outputs).

    .venv/bin/python -m experiments.iw_regime --config configs/iw_regime.py:small \
        --workdir runs/iw_regime
"""
from __future__ import annotations

import os
import time

from configs.population_expansion import TOTAL_BUDGET, UNIGRAM_BUDGET
from experiments import common
from experiments import population_expansion as pe_exp
from fedpriv import expansion, report
from fedpriv.expansion import regime

TITLE = "IW regime: private target unigrams vs the signal IW needs (Koga et al. 2023, Sec. 3.2)"
CLAIMS = (("IW", "S u T"), ("IW", "T w. C"), ("IW", "T w. alpha*C"), ("IWPT", "PT"),
          ("IWPT", "T w. C"), ("IWPT", "S u T"), ("PT", "T w. alpha*C"), ("T w. C", "T w. alpha*C"))
COLS = ["sweep", "vocab_words", "eps0", "bound", "N_T", "counted_tokens", "tv_release",
        "tv_release_std", "tv_noise", "tv_signal", "tv_predicted", "carries_signal", "ledger_eps"]


def regime_figures(summary: list[dict], cfg, workdir: str) -> None:
    for sweep, key in (("eps0", "eps0"), ("vocab", "vocab_words"), ("bound", "bound")):
        rows = [r for r in summary if r["sweep"] == sweep]
        curves = {}
        for v in dict.fromkeys(r[key] for r in rows):
            pts = sorted((r["N_T"], r["tv_release"], r["tv_signal"]) for r in rows if r[key] == v)
            curves[f"{key}={v}"] = ([p[0] for p in pts], [p[1] for p in pts])
            curves[f"signal, {key}={v}"] = ([p[0] for p in pts], [p[2] for p in pts])
        common.plot_curves(curves, os.path.join(workdir, f"regime_{sweep}.png"), "N_T (users)",
                           "TV distance", f"TV(u_hat_T, u_T) vs signal TV(u_T, u_SuT): {sweep}",
                           log=True)


def release_rows(prep, seeds, log) -> list[dict]:
    out = [{"dataset": prep.name, "seed": s, **regime.training_release(
        prep.ds, prep.vocab_size, UNIGRAM_BUDGET[0], s, TOTAL_BUDGET)} for s in seeds]
    log(f"[{prep.name}] TV(release, true) " + ", ".join(f"{r['tv_release']:.3f}" for r in out)
        + f"; signal {out[0]['tv_signal']:.3f}; N_T = {out[0]['n_users']}")
    return out


def run(cfg, workdir: str, log=print) -> dict:
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)
    t0 = time.time()
    os.makedirs(workdir, exist_ok=True)
    tcfg = cfg.training_config()
    rows = regime.measure_grid(cfg, tcfg, TOTAL_BUDGET, log)
    summary = regime.summarise_grid(rows)
    notes = ["TV(u_hat_T, u_T): the released target unigrams vs all of T's tokens; tv_noise: vs "
             "the same bounded counts without noise; tv_signal: TV(u_T, u_{S u T}), what IW "
             "must beat (carries_signal: tv_release < tv_signal, seeds out of n); tv_predicted: "
             "V E|noise| / (2 counted tokens). Each point is one what-if release on its own "
             f"ledger {TOTAL_BUDGET} (ledger_eps = its epsilon = eps0); the grid is a "
             "measurement study and never a deployment.",
             f"T = {cfg.regime_dataset} (all active users, subsampled to N_T; 0 = all), "
             f"seeds {list(cfg.regime_seeds)} (subsample + noise); vocab = top-k words of the "
             "public pool + 4 specials."]
    common.write_table(summary, workdir, "regime", COLS, title=TITLE, notes=notes)
    common.write_table(rows, workdir, "regime_runs", title="IW regime: one row per seed")
    regime_figures(summary, cfg, workdir)
    negative = [r for name in cfg.negative_datasets for r in release_rows(
        expansion.prepare_dataset(name, cfg.negative_config()), cfg.regime_seeds, log)]
    if negative:
        common.write_table(negative, workdir, "negative", title="Negative case: the unigram "
                           "release on Table 1's small target populations (small scale)")
    out = {"regime": summary, "regime_runs": rows, "negative": negative, "notes": notes}
    if cfg.train:
        tdir = os.path.join(workdir, "train")
        trained = pe_exp.run(tcfg, tdir, log)
        prep = expansion.prepare_dataset("chat_target", tcfg)
        rel = release_rows(prep, tcfg.seeds, log)
        tv, tv_sig = report.pm([r["tv_release"] for r in rel], digits=3), rel[0]["tv_signal"]
        ppl = {(s, k): [r[k] for r in trained["runs"] if r["scheme"] == s]
               for s in tcfg.schemes for k in ("val_ppl", "test_ppl")}
        table = [{"scheme": r["scheme"],
                  "val PPL on T": report.pm(ppl[r["scheme"], "val_ppl"], digits=3),
                  "test PPL on T": report.pm(ppl[r["scheme"], "test_ppl"], digits=3),
                  "seeds": r["seeds"], "eps S (sim.)": r["eps S (sim.)"],
                  "eps T (sim.)": r["eps T (sim.)"],
                  "unigram TV(release, true)": tv if r["scheme"] in ("IW", "IWPT") else "",
                  "signal TV(u_T, u_SuT)": tv_sig if r["scheme"] in ("IW", "IWPT") else ""}
                 for r in trained["table"]]
        common.write_table(table, workdir, "table", title="IW / IWPT vs baselines on "
                           "chat_target (perplexity on T, mean ± std over seeds)",
                           notes=[n for n in trained["notes"] if not n.startswith("Regenerate")]
                           + [f"IW/IWPT's unigram release on the {rel[0]['n_users']} T training "
                              f"users: TV(u_hat_T, u_T) {tv} (seeds {list(tcfg.seeds)}) vs signal "
                              f"TV(u_T, u_SuT) {tv_sig:.3f}",
                              "Regenerate: .venv/bin/python -m experiments.iw_regime --config "
                              f"configs/iw_regime.py:<scale> --workdir {workdir}"])
        verdicts = [report.ordering_verdict(
            f"{a} beats {b} (test PPL on T, chat_target, N_T = {rel[0]['n_users']})",
            ppl[a, "test_ppl"], ppl[b, "test_ppl"], higher_is_better=False, names=(a, b))
            for a, b in CLAIMS if ppl.get((a, "test_ppl")) and ppl.get((b, "test_ppl"))]
        report.write_verdicts(verdicts, workdir)
        out.update(table=table, release=rel, verdicts=[v.__dict__ for v in verdicts],
                   train_wall_clock_s=trained["wall_clock_s"])
    out.update(wall_clock_s=time.time() - t0,
               **common.run_record(cfg, list(cfg.regime_seeds) + list(cfg.seeds)))
    common.save_json(out, os.path.join(workdir, "summary.json"))
    return out


def main(argv=None):
    cfg, workdir, _ = common.config_and_workdir(argv, __doc__, "iw_regime")
    out = run(cfg, workdir)
    for name in ("regime", "table"):
        if os.path.exists(p := os.path.join(workdir, f"{name}.md")):
            print(open(p).read())
    print(f"wall clock {out['wall_clock_s']:.0f}s; wrote {workdir}")


if __name__ == "__main__":
    common.cli(main)
