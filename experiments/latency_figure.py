"""Koga et al. 2023, Figure 1 and Prop. 3.1: device-sampling latency vs population size.

Model (Prop. 3.1, App. B; `fedpriv.expansion.latency`): of N devices a fraction p is available
and sampled with probability q; the round waits for the remaining k = C - Npq of the m = N - Np
unavailable devices, each becoming available (and sampled) after an Exp(lambda) time.
E[U_k] = (1/lambda) sum_{x=m-k+1}^{m} 1/x, and (1/lambda)(C - Npq)/(N(1-p) + 1) <= E[U_k] <=
C/(lambda(N - C)) when q >= C/N (Eq. 1).

Outputs in ``--workdir``:
  latency.png        (a) lambda * E[U_k] (exact, with the Eq. 1 bounds and Monte Carlo points)
                     vs N for several cohort sizes C; (b) latency relative to the population
                     expanded 1/alpha times (N -> N/alpha), the gain population expansion buys.
  latency.{csv,md}   Monte Carlo vs exact vs bounds for the config's (N, C, p, q, lambda) cases,
                     with the command that regenerated it.
  latency_curve.{csv,md}  the curves of panel (a).

The figure uses p = ``figure_p`` and a server that oversamples, q = min(1, ``oversample`` C/N), so
the assumption q >= C/N of the upper bound holds (``configs/latency_figure.py``). Usage:

  .venv/bin/python -m experiments.latency_figure --config configs/latency_figure.py:small

``verdicts.json`` (for the results page): E[U_k] falls as N grows at fixed C; the exact value lies
within Eq. 1's bounds; Monte Carlo agrees with it (|z| <= 3 in every case).
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from experiments import common
from fedpriv import verdicts as V
from fedpriv.expansion import latency
from fedpriv.report import write_verdicts

NOTES = ["m = N − round(Np) unavailable devices, k = C − round(Npq) still needed, each becoming "
         "available after Exp(λ); times in the units of 1/λ's clock. Every row has q ≥ C/N, the "
         "assumption of the upper bound. Columns: lower = Eq. 1 lower bound, exact = E[U_k], "
         "upper_tight = k/(λ(m−k)), upper = C/(λ(N−C)), mc_mean ± mc_stderr = Monte Carlo, "
         "z = (MC−exact)/s.e."]


def _q(cfg, N: int, C: int) -> float:
    return min(1.0, cfg.oversample * C / N)


def figure_curves(cfg) -> list[dict]:
    """Panel (a)/(b): exact E[U_k], its Eq. 1 bounds and the expanded population's, per (C, N)."""
    rows, p = [], cfg.figure_p
    for C in cfg.figure_cohorts:
        grid = np.logspace(math.log10(2 * C), math.log10(cfg.max_population), cfg.num_points)
        for N in np.unique(np.round(grid).astype(int)):
            N, q = int(N), _q(cfg, int(N), C)
            big = int(round(N / cfg.expansion_alpha))
            rows.append({"C": C, "N": N, "p": p, "q": q,
                         "lower": latency.latency_lower_bound(N, C, p, q, 1.0),
                         "exact": latency.expected_latency(N, C, p, q, 1.0),
                         "upper": latency.latency_upper_bound(N, C, 1.0),
                         "exact_expanded": latency.expected_latency(big, C, p, _q(cfg, big, C), 1.0)})
    return rows


def figure_monte_carlo(cfg, rng: np.random.Generator) -> list[dict]:
    rows = []
    for C in cfg.figure_cohorts:
        for N in (3 * C, 30 * C, 300 * C):
            if N <= cfg.max_population:
                est = latency.simulate_latency(N, C, cfg.figure_p, _q(cfg, N, C), 1.0, rng,
                                               cfg.trials, method="order_statistic")
                rows.append({"C": C, "N": N, "mean": est.mean, "stderr": est.stderr})
    return rows


def verdicts(table: list[dict], curves: list[dict]) -> list:
    """The figure's claims checked on what was computed (``fedpriv.report.Verdict``)."""
    falls = all(a["exact"] > b["exact"] for a, b in zip(curves, curves[1:]) if a["C"] == b["C"])
    cohorts = sorted({r["C"] for r in curves})
    span = "; ".join(f"C={C}: {min(r['exact'] for r in curves if r['C'] == C):.3g}.."
                     f"{max(r['exact'] for r in curves if r['C'] == C):.3g}" for C in cohorts)
    inside = [r for r in curves + table if r["lower"] <= r["exact"] <= r["upper"]]
    zmax = max(abs(r["z"]) for r in table)
    return [V.check("a larger population lowers the latency E[U_k] at fixed C (Fig. 1)", falls,
                    f"lambda*E[U_k] over N = 2C..max: {span}", basis="exact values of Prop. 3.1"),
            V.check("lower bound <= E[U_k] <= C/(lambda(N-C)) (Eq. 1)", len(inside) == len(curves + table),
                    f"{len(inside)}/{len(curves + table)} (N, C) points within the bounds",
                    basis="exact values of Prop. 3.1 and Eq. 1"),
            V.check("Monte Carlo of the sampling process matches Prop. 3.1's E[U_k]", zmax <= 3,
                    f"max |z| = {zmax:.2f} over {len(table)} cases",
                    basis="|z| <= 3 of each Monte Carlo mean against the exact value")]


def _plot(cfg, path: str, curves: list[dict], mc: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for C, col in zip(cfg.figure_cohorts, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        rs = [r for r in curves if r["C"] == C]
        N = np.array([r["N"] for r in rs])
        ax1.plot(N, [r["exact"] for r in rs], color=col, label=f"C = {C:,} exact")
        ax1.plot(N, [r["upper"] for r in rs], color=col, ls="--", lw=0.9)
        ax1.plot(N, [r["lower"] for r in rs], color=col, ls=":", lw=0.9)
        ms = [r for r in mc if r["C"] == C]
        ax1.errorbar([r["N"] for r in ms], [r["mean"] for r in ms],
                     yerr=[2 * r["stderr"] for r in ms], fmt="o", ms=4, color=col)
        ax2.plot(N, [r["exact"] / r["exact_expanded"] if r["exact_expanded"] else math.nan for r in rs],
                 color=col, label=f"C = {C:,}")
    ax1.plot([], [], color="gray", ls="--", label="upper C/(λ(N−C))")
    ax1.plot([], [], color="gray", ls=":", label="lower k/(λ(m+1))")
    ax1.plot([], [], "o", color="gray", label="Monte Carlo (±2 s.e.)")
    ax1.set(xscale="log", yscale="log", xlabel="population size N",
            ylabel="λ · E[U_k]  (latency in units of 1/λ)",
            title=f"(a) Prop. 3.1, p = {cfg.figure_p}, q = {cfg.oversample}·C/N")
    ax2.set(xscale="log", xlabel="population size N", ylabel="E[U_k](N) / E[U_k](N/α)",
            title=f"(b) relative latency vs the population expanded 1/α = "
                  f"{1 / cfg.expansion_alpha:g}×")
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    cfg, workdir, spec = common.config_and_workdir(argv, __doc__, "latency_figure")
    start = time.time()
    os.makedirs(workdir, exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    table = latency.compare_latency(cfg.table_cases, rng, cfg.trials)
    curves = figure_curves(cfg)
    mc = figure_monte_carlo(cfg, rng)
    _plot(cfg, os.path.join(workdir, "latency.png"), curves, mc)
    command = (f".venv/bin/python -m experiments.latency_figure --config {spec} "
               f"--workdir {workdir}")
    notes = NOTES + [f"Regenerate: `{command}` ({time.time() - start:.1f} s)."]
    title = "Prop. 3.1 latency: Monte Carlo vs exact vs bounds (Koga et al. 2023)"
    common.write_table(table, workdir, "latency", title=title, notes=notes)
    common.write_table(curves, workdir, "latency_curve", title="Figure 1 (a) curves")
    write_verdicts(verdicts(table, curves), workdir)
    common.save_json({"table": table, "curves": curves, "monte_carlo": mc,
                      **common.run_record(cfg, cfg.seed)}, os.path.join(workdir, "summary.json"))
    with open(os.path.join(workdir, "latency.md")) as f:
        print(f.read())
    return {"table": table, "curves": curves, "monte_carlo": mc}


if __name__ == "__main__":
    common.cli(main)
