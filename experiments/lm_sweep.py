"""Hyper-parameter sweep of private LM FL (Wang et al. 2023, App. C): server lr x client lr x
clip norm at one noise multiplier / epsilon (`configs/lm_fl.py`'s set-up), each point a
`fedpriv.recipes.sweep` point (read back once finished), selected on VALIDATION accuracy
(`sweep.pick_best`; test accuracy is reported, never used to choose).

Writes ``lm_sweep.{md,csv}`` (mean ± std over seeds per point, the chosen one marked) and
``best.json`` (chosen values, their validation accuracy, the `experiments.lm_fl` command that
trains with them). Privacy: each point's epsilon is that of ONE run; the sweep trains every
point on the same users and selects among them, which is not covered by that epsilon (the
paper tunes the same way and reports the per-run epsilon; so do we, and say so).

    python -m experiments.lm_sweep --config configs/lm_sweep.py:small --workdir runs/lm_sweep
"""
from __future__ import annotations

import dataclasses
import os
import time

from configs import lm_fl as lm_fl_config
from configs.common import split_spec
from experiments import common
from fedpriv.recipes import lm, sweep

KEYS = ("server_lr", "client_lr", "clip_norm")
SUMMARY = ("epsilon", "noise_multiplier", "val_accuracy", "test_accuracy", "wall_clock_s")


def _fmt(v):
    return "/".join(map(str, v)) if isinstance(v, tuple) else "none" if v is None else str(v)


def lm_fl_command(lm_cfg, scale: str) -> str:
    """The `experiments.lm_fl` command line that trains `lm_cfg` (its fields that differ from
    ``configs/lm_fl.py`` at `scale`, as overrides)."""
    base = dataclasses.asdict(lm_fl_config.get_config(scale))
    over = [f"{k}={_fmt(v)}" for k, v in dataclasses.asdict(lm_cfg).items() if base.get(k) != v]
    return f"python -m experiments.lm_fl --config 'configs/lm_fl.py:{','.join([scale, *over])}'"


GRID = {"server_lr": "server_lrs", "client_lr": "client_lrs", "clip_norm": "clip_norms"}  # LM field -> grid


def sweep_rows(cfg, workdir: str, *, progress: bool = True, log=print) -> list[dict]:
    """Every (grid point, seed) run of ``cfg`` (finished ones read back); also a worker's slice."""
    prepared = {}

    def point(pcfg, pdir):  # every seed of one grid point
        out = []
        for seed in cfg.seeds:
            scfg = dataclasses.replace(pcfg, seed=seed)
            if seed not in prepared:  # data depend on the seed (split), not on the point
                prepared[seed] = lm.prepare_data(scfg, progress)
            s = lm.run_lm_fl(scfg, os.path.join(pdir, f"seed{seed}"), prepared=prepared[seed],
                             progress=progress, log=log)
            out.append({"seed": seed, **{k: s[k] for k in SUMMARY}})
        return out

    return sweep.run_sweep(point, cfg.lm, {k: getattr(cfg, f) for k, f in GRID.items()}, workdir, log=log,
                           fingerprint={"seeds": list(cfg.seeds)}, extendable=("seeds",))


def train(cfg, workdir: str) -> None:
    sweep_rows(cfg, workdir)


def run(cfg, workdir: str, *, scale: str = "small", progress: bool = True, log=print) -> dict:
    t0 = time.time()
    rows = sweep_rows(cfg, workdir, progress=progress, log=log)
    grid = {k: getattr(cfg, f) for k, f in GRID.items()}
    best = sweep.pick_best(rows, "val_accuracy", higher_is_better=True, keys=KEYS)
    table = []
    for p in sweep.grid_points(cfg.lm, grid):
        rs = [r for r in rows if all(r[k] == p[k] for k in KEYS)]
        table.append({**p, "epsilon (one run)": rs[0]["epsilon"],
                      "noise multiplier": rs[0]["noise_multiplier"],
                      "val accuracy (%)": common.pm([r["val_accuracy"] for r in rs], 100),
                      "test accuracy (%)": common.pm([r["test_accuracy"] for r in rs], 100),
                      "seeds": len(rs),
                      "chosen (on val)": "yes" if all(best[k] == p[k] for k in KEYS) else ""})
    chosen = dataclasses.replace(cfg.lm, **{k: best[k] for k in KEYS})
    c = cfg.lm
    privacy = (f"{c.algorithm}: each point one run at "
               + (f"z={c.noise_multiplier:g}" if c.noise_multiplier is not None
                  else f"target epsilon {c.target_epsilon:g}")
               + (f" of a SIMULATED population (the noise of a cohort of {c.noise_cohort_size} while training "
                  f"{c.cohort_size}; the epsilon each run SPENDS on our users is larger, in its summary)"
                  if c.noise_cohort_size else "") + f", delta={c.delta:g} (user-level); "
               f"the sweep ({len(table)} points x {len(cfg.seeds)} seeds on the same users) and the "
               "selection are NOT covered by that epsilon")
    common.write_table(table, workdir, "lm_sweep", notes=[
        f"{c.corpus}, {c.arch} (embed {c.embed_dim}, hidden {c.hidden_dim}), T={c.rounds}, "
        f"cohort {c.cohort_size}, server optimizer {c.server_optimizer}; grid of Wang et al. "
        "App. C (server lr x client lr x clip norm)", privacy,
        "chosen: highest mean validation accuracy; test accuracy shown, never used to choose"],
        title="Hyper-parameter sweep of private LM FL (Wang et al. 2023, App. C)")
    result = {"chosen": {k: best[k] for k in KEYS}, "val_accuracy": best["val_accuracy"],
              "seeds": best["n"], "selected_on": "val_accuracy (validation users)",
              "privacy": privacy, "command": lm_fl_command(chosen, scale),
              "wall_clock_s": time.time() - t0}
    common.save_json(result, os.path.join(workdir, "best.json"))
    common.save_json({"rows": rows, "table": table, "best": result,
                      **common.run_record(cfg, list(cfg.seeds))},
                     os.path.join(workdir, "summary.json"))
    return result


def main(argv=None):
    cfg, workdir, spec = common.config_and_workdir(argv, __doc__, "lm_sweep")
    scale = split_spec(spec.partition(":")[2], "small")[0]
    common.run_slices(train, cfg, workdir, common.product(cfg, "seeds", *GRID.values()))
    best = run(cfg, workdir, scale=scale)
    print(open(os.path.join(workdir, "lm_sweep.md")).read())
    print(f"chosen on validation: {best['chosen']}; train with: {best['command']}")


if __name__ == "__main__":
    common.cli(main)
