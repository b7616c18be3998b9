"""Wang et al. 2023 ablations: Tables 4/5 (timing T' of public training, with and without
distribution matching) and Figures 2/4 (accuracy after private FL vs distillation steps, vs
top-k logits), on the set-up of ``experiments.public_training`` (chitchat users, DP-FTRL, the
packaged SmolLM2 teacher, the public pool).

    t_prime        rows mid_dm (Table 4) and mid_random (Table 5) at T' in {0, T/4, T/2, 3T/4, T};
                   at T' = 0 both are pretrain_distill (no private model to match with, §5.3);
                   at T' = T public training follows the last private round
    distill_steps  pretrain_distill over `distill_steps_grid` (Figure 2a/b)
    topk           pretrain_distill over `topk_grid` teacher logits (Figure 2c / 4)

Every point is a `fedpriv.recipes.sweep` point in ``<workdir>/<ablation>/<field=value>`` (read
back once finished; rows resume inside a point); the teacher cache is shared. A run that is the
same computation as one already finished (`fedpriv.recipes.public.run_key`: the T'=0 point, 150
distillation steps and top-10 are one pretrain_distill run; T'=T/2 is Table 2's mid_dm/mid_random)
is read back, from this workdir or from ``reuse_workdir`` (an override of ``lm``, e.g.
``reuse_workdir=runs/public_training``). Accuracy is on
validation users (the paper's dev set). Public training after T' is post-processing of the DP
checkpoint: every row's ledger holds the same T-round DP-FTRL event.

    python -m experiments.wang_ablations --config configs/wang_ablations.py:small \
        --workdir runs/wang_ablations
"""
from __future__ import annotations

import dataclasses
import os
import time

from experiments import common
from fedpriv import verdicts as V
from fedpriv.models import gguf
from fedpriv.recipes import ablations, public, sweep

METRIC = "val_accuracy"
# more seeds / epsilons: a finished point resumes its rows; reuse_workdir only says where
# identical runs may be read from (not part of any run: `fedpriv.recipes.public.run_key`); the
# per-epsilon server lrs differ between a whole point and an executor slice of it (`narrow`),
# and each run's key holds the server lr it used (a finished run of another lr is refused)
EXTENDABLE = ("seeds", "epsilons", "reuse_workdir", "server_lr", "epsilon_server_lrs")


def _points(cfg, teacher, workdir, log, progress):
    def fn(pcfg, pdir):
        rr = public.run_rows(pcfg, pdir, teacher=teacher, progress=progress, log=log,
                             cache_dir=os.path.join(workdir, "teacher_cache"),
                             reuse_dirs=(workdir,))
        # the verdicts' trivial baseline: most-frequent-token accuracy on the same validation set
        base = _mft_val(rr, pcfg)
        return [{**{k: v for k, v in r.items() if k != "curve"}, ablations.TRIVIAL_KEY: base}
                for r in rr.runs]
    return fn


def _mft_val(rr, pcfg) -> float | None:
    """Most-frequent-token validation accuracy of ``run_rows``' prepared data (None without it)."""
    prepared = getattr(rr, "prepared", None)
    if prepared is None:
        return None
    from fedpriv.models.metrics import most_frequent_token_accuracy
    val = prepared.val.concat_examples()["tokens"][: pcfg.max_eval_examples]
    return most_frequent_token_accuracy(prepared.train.concat_examples()["tokens"], val)


SWEPT = {"distill_steps": "distill_steps_grid", "topk": "topk_grid"}  # ablation -> its grid field


def sweeps(cfg, workdir: str, *, teacher=None, progress: bool = True, log=print) -> dict:
    """Every run of ``cfg``'s ablations: ``{ablation: its sweep's rows}`` (``fedpriv.recipes.sweep``
    points under ``<workdir>/<ablation>``; finished ones read back). Also a worker's slice."""
    lm = cfg.lm
    teacher = teacher or gguf.cached_teacher(lm.teacher_path)
    fn, out = _points(cfg, teacher, workdir, log, progress), {}
    if "t_prime" in cfg.ablations:
        tps = cfg.t_primes()
        rows = tuple(("pretrain_distill",) if tp == 0 else ("mid_dm", "mid_random") for tp in tps)
        out["t_prime"] = sweep.run_sweep(fn, lm, {"t_prime": tps, "rows": rows}, os.path.join(workdir, "t_prime"),
                                         mode="zip", log=log, extendable=EXTENDABLE)
    for ab, field in SWEPT.items():
        if ab in cfg.ablations:
            out[ab] = sweep.run_sweep(fn, dataclasses.replace(lm, rows=("pretrain_distill",)),
                                      {ab: getattr(cfg, field)}, os.path.join(workdir, ab), log=log,
                                      extendable=EXTENDABLE)
    return out


def slices(cfg) -> list[dict]:
    """The independent runs for the executor: one slice per (seed, epsilon), every ablation in it
    (a run shared by two ablations, e.g. the T'=0 point and 150 distillation steps, stays in one
    slice and is trained once)."""
    return [{"seed": s, "epsilon": e} for s in cfg.lm.seeds for e in cfg.lm.epsilons]


def narrow(cfg, part: dict):
    """One slice's config: the public-training config at that epsilon (its server lr there) and seed."""
    lm = public.at_epsilon(cfg.lm, part["epsilon"])
    return dataclasses.replace(cfg, lm=dataclasses.replace(lm, seeds=(part["seed"],), epsilons=(part["epsilon"],)))


def prepare(cfg, workdir: str) -> None:
    """The teacher's passes over the pool (``<workdir>/teacher_cache``), before the slices start."""
    public.prepare(cfg.lm, gguf.cached_teacher(cfg.lm.teacher_path), os.path.join(workdir, "teacher_cache"))


def train(cfg, workdir: str) -> None:
    sweeps(cfg, workdir)


__verdict_code__ = ("ablation_verdicts",)  # read-time code (experiments.results.verdict_code)


def ablation_verdicts(cfg, swept: dict) -> list:
    """The verdicts `run` writes, from the ablations' runs (``swept``: ``{ablation: rows}``,
    `sweeps`): Tables 4/5 (T'=T/2 best, T'=T worst, matching vs random at each T'), Figures 2/4
    (largest vs smallest, every consecutive pair, the saturation), and the claims at a paper budget
    the run skipped, "not run yet". The results page rebuilds the committed verdicts with it
    (``experiments.rejudge``); ``tests/experiments/test_rejudge.py`` checks it equals `run`'s."""
    lm, eps, verdicts = cfg.lm, cfg.lm.epsilons, []
    if "t_prime" in cfg.ablations and "t_prime" in swept:
        tps, runs = cfg.t_primes(), swept["t_prime"]
        verdicts += ablations.t_prime_verdicts(runs, lm.rounds, tps, eps, row="mid_dm",
                                               metric=METRIC, table="Table 4")
        verdicts += ablations.t_prime_verdicts(runs, lm.rounds, tps, eps, row="mid_random",
                                               metric=METRIC, table="Table 5")
        verdicts += ablations.dm_vs_random_verdicts(runs, lm.rounds, tps, eps, metric=METRIC)
        verdicts += ablations.skipped_epsilon_verdicts(
            lambda e: [v for row, table in (("mid_dm", "Table 4"), ("mid_random", "Table 5"))
                       for v in ablations.t_prime_verdicts([], lm.rounds, tps, [e], row=row, metric=METRIC,
                                                           table=table)]
            + ablations.dm_vs_random_verdicts([], lm.rounds, tps, [e], metric=METRIC),
            eps, f"{len(tps)} T' points x seeds of DP-FTRL")
    for ab, field, grid, xlabel, claim in (
            ("distill_steps", "distill_steps", cfg.distill_steps_grid, "distillation steps",
             "more distillation steps help (up to a point)"),
            ("topk", "topk", cfg.topk_grid, "top-k teacher logits", "larger top-k helps")):
        if ab not in cfg.ablations or ab not in swept:
            continue
        verdicts += [v for e in eps for v in ablations.sweep_verdicts(
            swept[ab], field, e, f"{claim} (eps~{e:g}; Figure 2/4)", metric=METRIC)]
        verdicts += ablations.skipped_epsilon_verdicts(
            lambda e, claim=claim: [V.not_run(f"{claim} (eps~{e:g}; Figure 2/4)", "not run")], eps,
            f"{len(grid)} {xlabel} points x seeds of DP-FTRL")
    return verdicts


def run(cfg, workdir: str, *, teacher=None, progress: bool = True, log=print) -> dict:
    t0, lm, eps = time.time(), cfg.lm, cfg.lm.epsilons
    swept = sweeps(cfg, workdir, teacher=teacher, progress=progress, log=log)
    out = {}
    notes = [f"{lm.corpus} users, DP-FTRL T={lm.rounds}, cohort {lm.cohort_size}, q={lm.q:g}, "
             f"{lm.distill_steps} distillation steps (batch {lm.central_batch_size}), top-{lm.topk}"
             f" (an ablation's swept field takes its grid values instead), seeds {list(lm.seeds)}; "
             "each distillation-step count is its own public run from the same seed (the "
             "paper takes checkpoints of one run); accuracy: validation (dev) in-vocabulary next-token "
             "accuracy (%), mean ± std over seeds",
             "public training after T' is post-processing of the DP checkpoint: each run's "
             "ledger holds only the T-round DP-FTRL event (each run's epsilons in its summary)"]
    if "t_prime" in cfg.ablations:
        tps = cfg.t_primes()
        runs = out["t_prime_runs"] = swept["t_prime"]
        for name, row, paper, title in (
                ("table4", "mid_dm", ablations.PAPER_TABLE4, "Table 4: timing T' with distribution "
                 "matching (mid_dm; T'=0: random sample)"),
                ("table5", "mid_random", ablations.PAPER_TABLE5, "Table 5: timing T' without "
                 "distribution matching (random public subset)")):
            out[name] = ablations.t_prime_table(runs, lm.rounds, tps, eps, row, paper=paper,
                                             metric=METRIC)
            common.write_table(out[name], workdir, name, title=title, notes=notes)
    for ab, field, xlabel in (("distill_steps", "distill_steps", "distillation steps"),
                              ("topk", "topk", "top-k teacher logits")):
        if ab not in cfg.ablations:
            continue
        runs = out[f"{ab}_runs"] = swept[ab]
        curves = ablations.ablation_curves(runs, field, eps, metric=METRIC)
        table = [{"epsilon": k[4:], field: x, "val accuracy (%)": f"{m:.2f}",
                  "std": f"{s:.2f}"} for k, (xs, ms, ss) in curves.items()
                 for x, m, s in zip(xs, ms, ss)]
        common.write_table(table, workdir, f"accuracy_vs_{ab}", notes=notes,
                           title=f"Accuracy after private FL vs {xlabel} (pretrain_distill)")
        common.plot_curves(curves, os.path.join(workdir, f"accuracy_vs_{ab}.png"), xlabel,
                           "validation accuracy (%)", f"{lm.corpus}, DP-FTRL T={lm.rounds}: "
                           f"pre-training w/ distillation (mean ± std, seeds {list(lm.seeds)})")
    verdicts = ablation_verdicts(cfg, swept)  # the same function the results page rebuilds with
    every = [r for k, v in out.items() if k.endswith("_runs") for r in v]
    common.write_table([{k: r.get(k) for k in ("row", "seed", "target_epsilon", "epsilon",
                                               "t_prime", "distill_steps", "topk",
                                               "val_accuracy", "test_accuracy", "wall_clock_s")}
                        for r in every], workdir, "runs")
    common.write_verdicts(verdicts, workdir)
    result = {**out, "verdicts": [v.to_json() for v in verdicts],
              "wall_clock_s": time.time() - t0, **common.run_record(cfg, list(lm.seeds))}
    common.save_json(result, os.path.join(workdir, "summary.json"))
    return result


def main(argv=None):
    cfg, workdir, _ = common.config_and_workdir(argv, __doc__, "wang_ablations")
    common.run_slices(train, cfg, workdir, slices(cfg), narrow=narrow, prepare=prepare)
    run(cfg, workdir)
    for name in ("table4", "table5", "accuracy_vs_distill_steps", "accuracy_vs_topk"):
        if os.path.exists(os.path.join(workdir, f"{name}.md")):
            print(open(os.path.join(workdir, f"{name}.md")).read())


if __name__ == "__main__":
    common.cli(main)
