"""Koga et al. 2023, Figure 1 and Prop. 3.1: device-sampling latency vs population size.

Model (Prop. 3.1, App. B): of N devices a fraction p is available and sampled with probability q;
the round waits for the remaining k = C - Npq of the m = N - Np unavailable devices, each becoming
available (and sampled) after an Exp(lambda) time. E[U_k] = (1/lambda) sum_{x=m-k+1}^{m} 1/x, and
(1/lambda)(C - Npq)/(N(1-p) + 1) <= E[U_k] <= C/(lambda(N - C)) when q >= C/N (Eq. 1).

Outputs in ``--workdir``:
  latency.png        (a) lambda * E[U_k] (exact, with the Eq. 1 bounds and Monte Carlo points)
                     vs N for several cohort sizes C; (b) latency relative to the population
                     expanded 10x (N -> N/alpha, alpha = 0.1), the gain the paper's population
                     expansion buys.
  latency.csv        Monte Carlo vs exact vs bounds for a few (N, C, p, q, lambda).
  latency.md         the same table in Markdown, with the command that regenerated it.
  latency_curve.csv  the curves of panel (a).

The figure uses p = 0.5 and a server that oversamples by 10%, q = min(1, 1.1 C/N), so the
assumption q >= C/N of the upper bound holds. Usage:

  .venv/bin/python -m experiments.latency_figure --workdir runs/latency --seed 0 --trials 2000
"""

from __future__ import annotations

import csv
import math
import os
import time

import numpy as np

from experiments import common
from fedpriv import domain

# (N, C, p, q, lambda, Monte Carlo method). The first rows use the literal simulator (m
# exponential clocks per trial); populations too large for it use the Beta order statistic.
TABLE_CASES = (
    (1_000, 100, 0.5, 0.11, 1.0, "clocks"),
    (10_000, 100, 0.5, 0.011, 1.0, "clocks"),
    (10_000, 1_000, 0.5, 0.11, 1.0, "clocks"),
    (6_000, 500, 0.5, 0.1, 1.0, "clocks"),  # a target population with cohort alpha*C
    (6_000, 5_000, 0.5, 0.9, 1.0, "clocks"),  # ... with the full cohort C: long waits
    (60_000, 5_000, 0.5, 0.1, 1.0, "clocks"),  # ... expanded 10x, cohort C: as fast as alpha*C
    (2_000, 1_000, 0.2, 0.5, 0.5, "clocks"),  # k close to m
    (100_000, 5_000, 0.5, 0.055, 1.0, "clocks"),
    (1_000_000, 5_000, 0.5, 0.0055, 1.0, "order_statistic"),
)
FIGURE_COHORTS = (100, 1_000, 5_000)
FIGURE_P = 0.5
OVERSAMPLE = 1.1
EXPANSION_ALPHA = 0.1


def _q(N: int, C: int) -> float:
    return min(1.0, OVERSAMPLE * C / N)


def comparison_table(rng: np.random.Generator, trials: int) -> list[dict]:
    rows = []
    for N, C, p, q, lam, method in TABLE_CASES:
        m, k = domain.latency_counts(N, C, p, q)
        est = domain.simulate_latency(N, C, p, q, lam, rng, trials, method=method)
        exact = domain.expected_latency(N, C, p, q, lam)
        rows.append({
            "N": N, "C": C, "p": p, "q": q, "lambda": lam, "m": m, "k": k,
            "lower": domain.latency_lower_bound(N, C, p, q, lam),
            "exact": exact,
            "upper_tight": domain.latency_upper_bound_tight(N, C, p, q, lam),
            "upper": domain.latency_upper_bound(N, C, lam),
            "mc_mean": est.mean, "mc_stderr": est.stderr, "trials": est.trials,
            "z": (est.mean - exact) / est.stderr if est.stderr > 0 else 0.0,
            "method": method,
        })
    return rows


def figure_curves(num_points: int = 40) -> list[dict]:
    rows = []
    for C in FIGURE_COHORTS:
        for N in np.unique(np.round(np.logspace(math.log10(2 * C), 7, num_points)).astype(int)):
            N = int(N)
            q = _q(N, C)
            big = int(round(N / EXPANSION_ALPHA))
            exact = domain.expected_latency(N, C, FIGURE_P, q, 1.0)
            rows.append({
                "C": C, "N": N, "p": FIGURE_P, "q": q,
                "lower": domain.latency_lower_bound(N, C, FIGURE_P, q, 1.0),
                "exact": exact,
                "upper": domain.latency_upper_bound(N, C, 1.0),
                "exact_expanded": domain.expected_latency(big, C, FIGURE_P, _q(big, C), 1.0),
            })
    return rows


def figure_monte_carlo(rng: np.random.Generator, trials: int) -> list[dict]:
    rows = []
    for C in FIGURE_COHORTS:
        for N in (3 * C, 30 * C, 300 * C):
            if N > 10**7:
                continue
            est = domain.simulate_latency(N, C, FIGURE_P, _q(N, C), 1.0, rng, trials,
                                          method="order_statistic")
            rows.append({"C": C, "N": N, "mean": est.mean, "stderr": est.stderr})
    return rows


def _write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.5g}"


def _markdown(rows: list[dict], command: str, seconds: float) -> str:
    head = ("| N | C | p | q | λ | m | k | lower (Eq. 1) | exact E[U_k] | Monte Carlo ± s.e. | "
            "(MC−exact)/s.e. | k/(λ(m−k)) | upper C/(λ(N−C)) | MC method |")
    lines = [
        "# Prop. 3.1 latency: Monte Carlo vs exact vs bounds (Koga et al. 2023)",
        "",
        "m = N − round(Np) unavailable devices, k = C − round(Npq) still needed, each becoming "
        "available after Exp(λ); times in the units of 1/λ's clock. Every row has q ≥ C/N, the "
        "assumption of the upper bound.",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for r in rows:
        lines.append(
            f"| {r['N']:,} | {r['C']:,} | {r['p']} | {r['q']} | {r['lambda']} | {r['m']:,} | "
            f"{r['k']:,} | {_fmt(r['lower'])} | {_fmt(r['exact'])} | "
            f"{_fmt(r['mc_mean'])} ± {r['mc_stderr']:.2g} | {r['z']:+.2f} | "
            f"{_fmt(r['upper_tight'])} | {_fmt(r['upper'])} | {r['method']} ({r['trials']}) |")
    lines += ["", f"Regenerate: `{command}` ({seconds:.1f} s).", ""]
    return "\n".join(lines)


def _plot(path: str, curves: list[dict], mc: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = dict(zip(FIGURE_COHORTS, ("tab:blue", "tab:orange", "tab:green")))
    for C in FIGURE_COHORTS:
        rs = [r for r in curves if r["C"] == C]
        N = np.array([r["N"] for r in rs])
        col = colors[C]
        ax1.plot(N, [r["exact"] for r in rs], color=col, label=f"C = {C:,} exact")
        ax1.plot(N, [r["upper"] for r in rs], color=col, ls="--", lw=0.9)
        ax1.plot(N, [r["lower"] for r in rs], color=col, ls=":", lw=0.9)
        ms = [r for r in mc if r["C"] == C]
        ax1.errorbar([r["N"] for r in ms], [r["mean"] for r in ms],
                     yerr=[2 * r["stderr"] for r in ms], fmt="o", ms=4, color=col)
        ax2.plot(N, [r["exact"] / r["exact_expanded"] for r in rs], color=col,
                 label=f"C = {C:,}")
    ax1.plot([], [], color="gray", ls="--", label="upper C/(λ(N−C))")
    ax1.plot([], [], color="gray", ls=":", label="lower k/(λ(m+1))")
    ax1.plot([], [], "o", color="gray", label="Monte Carlo (±2 s.e.)")
    ax1.set(xscale="log", yscale="log", xlabel="population size N",
            ylabel="λ · E[U_k]  (latency in units of 1/λ)",
            title=f"(a) Prop. 3.1, p = {FIGURE_P}, q = {OVERSAMPLE}·C/N")
    ax1.legend(fontsize=7)
    ax2.set(xscale="log", xlabel="population size N",
            ylabel="E[U_k](N) / E[U_k](N/α)",
            title=f"(b) relative latency vs the population expanded 1/α = {1/EXPANSION_ALPHA:g}×")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = common.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/latency")
    parser.add_argument("--seed", type=common.non_negative_int, default=0)
    parser.add_argument("--trials", type=common.positive_int, default=2000)
    args = parser.parse_args(argv)
    start = time.time()
    os.makedirs(args.workdir, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    table = comparison_table(rng, args.trials)
    curves = figure_curves()
    mc = figure_monte_carlo(rng, args.trials)
    _write_csv(os.path.join(args.workdir, "latency.csv"), table)
    _write_csv(os.path.join(args.workdir, "latency_curve.csv"), curves)
    _plot(os.path.join(args.workdir, "latency.png"), curves, mc)
    command = (f".venv/bin/python -m experiments.latency_figure --workdir {args.workdir} "
               f"--seed {args.seed} --trials {args.trials}")
    md = _markdown(table, command, time.time() - start)
    with open(os.path.join(args.workdir, "latency.md"), "w") as f:
        f.write(md)
    print(md)
    return {"table": table, "curves": curves, "monte_carlo": mc}


if __name__ == "__main__":
    common.cli(main)
