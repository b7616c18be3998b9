"""Koga et al. 2023, Table 1: population expansion for private FL of LMs, on real CPU-sized data.

A target domain T with a small population is trained together with a larger source domain S
(population_expansion_koga2023.md, Sec. 3.2, 4). The datasets (`fedpriv.expansion.datasets`):
``spoken_vs_typed`` (the paper's "CV & Reddits": T = Simpsons speakers, S = chitchat senders) and
``topics`` ("SubReddits": T = Shakespeare's comedies, S = histories + tragedies), disjoint
populations balanced to alpha = |T| / (|S| + |T|), App. A preprocessing, a 6:2:2 client split.

Every scheme of Table 1 (``configs/population_expansion.py``: T w. alpha*C, T w. C, S u T, DSDSR,
DEMix, IW, PT, IWPT) is trained by `fedpriv.expansion.run_scheme`: DP-FedAvg (Poisson sampling,
clip 0.5, Gaussian noise of the noise cohort), FedAdam server, SGD clients, the stages (unigram
release -> PT -> FT) through `fedpriv.fl.stages.run_stages` with one `PrivacyLedger(2, 1e-6)` per
scheme (unit: the user). Per-population epsilons are reported for the simulated run (the
ledger's) and for the run actually executed (far larger).

Outputs in ``--workdir``: ``table.{md,csv}`` (Table 1: val/test perplexity on T, mean +- std over
seeds, with per-population epsilons, simulated and executed), ``runs.csv`` (one row per seed),
``data.{md,csv}`` (populations and alpha), ``table1.png`` (bar chart), ``curves.png`` and
``summary.json`` (config, seeds, everything). Each (dataset, seed, scheme) trains in its own
subdirectory (``stages.json`` and one directory per stage with the loop's checkpoints); a
finished scheme writes ``summary.json`` there and a rerun skips it.

    .venv/bin/python -m experiments.population_expansion \
        --config configs/population_expansion.py:small --workdir runs/pe
"""
from __future__ import annotations

import os
import re
import time
from typing import Callable

from experiments import common
from fedpriv import expansion
from fedpriv.expansion import tables

TITLE = "Koga et al. 2023, Table 1 at CPU scale: perplexity on T with population expansion"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name.replace("*", "x")).strip("_")


UNIGRAM_ROW = "unigram (trivial baseline)"


def trivial_perplexity(prep) -> float:
    """The verdicts' trivial baseline on ``prep``: test perplexity on T of the add-one unigram
    model of T's training targets (:func:`fedpriv.verdicts.unigram_perplexity`; NON-PRIVATE
    reference, used only to mark a scheme that learned nothing)."""
    from fedpriv.expansion.datasets import TARGET
    from fedpriv.verdicts import unigram_perplexity
    train = prep.ds.clients("train", (TARGET,), (TARGET,)).concat_examples()["tokens"]
    return unigram_perplexity(train, prep.test_tokens, prep.vocab_size)


def train(cfg, workdir: str, log: Callable[[str], None] = print) -> tuple[dict, list[dict]]:
    """Every (dataset, seed, scheme) run of ``cfg`` (a finished one read back): ``(preps,
    summaries)``. Also an executor slice (``common.product(cfg, "datasets", "seeds", "schemes")``:
    a scheme's run fingerprint leaves those lists out)."""
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)  # dp_accounting's RDP order warnings
    os.makedirs(workdir, exist_ok=True)
    preps, summaries = {}, []
    for name in cfg.datasets:
        prep = preps[name] = expansion.prepare_dataset(name, cfg)
        log(f"[{name}] " + ", ".join(f"{k}={v}" for k, v in prep.stats.items()))
        for seed in cfg.seeds:
            for scheme in cfg.training_schemes:
                d = os.path.join(workdir, name, f"seed{seed}", slug(scheme.name))
                summaries.append(expansion.run_scheme(scheme, prep, cfg, seed, d, log))
    return preps, summaries


def run(cfg, workdir: str, log: Callable[[str], None] = print) -> dict:
    """All datasets x seeds x schemes of ``cfg``; writes the tables, charts and summary."""
    t0 = time.time()
    preps, summaries = train(cfg, workdir, log)
    rows = tables.aggregate(summaries, cfg)
    trivial = {name: trivial_perplexity(p) for name, p in preps.items()}
    notes = tables.table_notes(cfg, preps) + [
        "unigram: the add-one unigram model of T's training targets, test perplexity on T (the verdicts' "
        "trivial baseline; NON-PRIVATE reference: a scheme not below it learned nothing)",
        "Regenerate: python -m experiments.population_expansion --config "
        f"<configs/population_expansion.py:scale> --workdir {workdir}"]
    common.write_table(rows + [{"dataset": name, "scheme": UNIGRAM_ROW, "test PPL on T": f"{t:.1f}"}
                               for name, t in trivial.items()], workdir, "table", tables.table_columns(cfg),
                       title=TITLE, notes=notes)
    common.write_verdicts(tables.verdicts(summaries, cfg, trivial), workdir)
    common.write_table(tables.run_rows(summaries), workdir, "runs",
                       title="Table 1 runs (one row per seed)")
    common.write_table([p.stats for p in preps.values()], workdir, "data",
                       title="Domain-adaptation datasets (Sec. 4.1)")
    groups = tables.chart_groups(rows)
    for name, t in trivial.items():  # the unigram baseline beside the schemes (its test perplexity)
        panel = next((k for k in groups if k.startswith(f"{name} (")), None)
        if panel is not None:
            groups[panel][UNIGRAM_ROW] = {"test": (t, 0.0)}
    common.bar_chart(groups, os.path.join(workdir, "table1.png"),
                     "perplexity on T (lower is better)", TITLE, series=("val", "test"))
    common.plot_curves(tables.curve_series(summaries, cfg.seeds[0]),
                       os.path.join(workdir, "curves.png"), "server round", "val perplexity on T",
                       f"seed {cfg.seeds[0]}", log=True)
    out = {"table": rows, "runs": summaries, "data": {k: p.stats for k, p in preps.items()},
           "nonprivate/trivial_test_ppl_T": trivial,
           "notes": notes, "wall_clock_s": time.time() - t0,
           # training + evaluation time of every scheme, including those a rerun skipped
           "schemes_wall_clock_s": sum(s["wall_clock_s"] for s in summaries),
           **common.run_record(cfg, list(cfg.seeds))}
    common.save_json(out, os.path.join(workdir, "summary.json"))
    return out


def main(argv=None):
    cfg, workdir, _ = common.config_and_workdir(argv, __doc__, "population_expansion")
    common.run_slices(train, cfg, workdir, common.product(cfg, "datasets", "seeds", "schemes"))
    out = run(cfg, workdir)
    with open(os.path.join(workdir, "table.md")) as f:
        print(f.read())
    print(f"wall clock {out['wall_clock_s']:.0f}s; wrote {workdir}/table.md, table1.png")


if __name__ == "__main__":
    common.cli(main)
