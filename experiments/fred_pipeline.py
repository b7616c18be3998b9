"""FreD's three-stage pipeline on real data (Hou et al. 2023, Fig. 1; Table 1 analogue).

(1) privately choose the prefinetuning dataset by FreD between each candidate public dataset
and the users' data, (2) prefinetune the on-device LM on it (central, public data), (3) DP
FL-finetune on the users — one privacy ledger for the whole pipeline (FreD's two Gaussian
releases + DP-FTRL, composed; z of stage 3 is calibrated to what FreD left of the budget).
The stages are ``fedpriv.fred.pipeline`` (resumable per stage); this writes the artefacts:
``summary.json`` and ``fred_pipeline.{md,csv}`` (one row per prefinetuning choice; rows other
than FreD's choice are counterfactual runs under copies of the ledger).

    python -m experiments.fred_pipeline --config configs/fred_pipeline.py:small --workdir runs/fred_pipeline
"""
from __future__ import annotations

import dataclasses
import os

from experiments import common
from fedpriv.fred.pipeline import NONE, NOT_COVERED_NOTE, outputs, run_pipeline

__all__ = ["NONE", "run", "main"]


def run(cfg, workdir: str, progress: bool = True) -> dict:
    lm = cfg.lm
    res = run_pipeline(cfg, workdir, progress)
    ledger = res["ledger"]
    summary = {"rows": res["rows"], "chosen": res["chosen"], "fred_unit": cfg.fred_unit,
               "fred_epsilon_per_release": cfg.fred_epsilon, "fred_release": res["fred_release"],
               "embedder_sentences_per_s": res["embedder_sentences_per_s"], "pca_dims": cfg.pca_dims,
               "ledger": ledger.report(), "outputs": outputs(),
               **common.run_record(dataclasses.asdict(cfg), cfg.seed)}
    common.save_json(summary, os.path.join(workdir, "summary.json"))
    notes = [f"unit of privacy: {cfg.fred_unit}; pipeline budget epsilon = {cfg.total_epsilon}, delta = {lm.delta:g}",
             f"FreD: two Gaussian releases at (epsilon={cfg.fred_epsilon}, delta={lm.delta:g}) each"
             + (f", in a {cfg.pca_dims}-dim PCA basis of the public candidates (not in the paper)" if cfg.pca_dims else ""),
             "FL-finetuning z calibrated so FreD + DP-FTRL fit the budget; rows other than the chosen one are "
             "counterfactual runs with a copy of the ledger", f"pipeline ledger: {ledger}"]
    if lm.noise_cohort_size is not None:
        notes.append(f"SIMULATED: the FL stage adds the noise of a cohort of {lm.noise_cohort_size} (trains "
                     f"with {lm.cohort_size}); pipeline_epsilon / fl_epsilon_alone are those of the "
                     "simulated population, pipeline_epsilon_executed / fl_epsilon_executed_alone those "
                     "of the runs actually executed")
    notes.append(NOT_COVERED_NOTE)
    common.write_table(res["rows"], workdir, "fred_pipeline", title="FreD pipeline (Hou et al. 2023)", notes=notes)
    return summary


def main(argv=None):
    cfg, workdir, _ = common.config_and_workdir(argv, __doc__, "fred_pipeline")
    run(cfg, workdir)
    print(open(os.path.join(workdir, "fred_pipeline.md")).read())


if __name__ == "__main__":
    common.cli(main)
