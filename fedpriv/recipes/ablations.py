"""Recipe: Wang et al. 2023's ablations from the rows of ``recipes.public.run_rows`` collected over a
sweep (``fedpriv.recipes.sweep``): Tables 4/5 (timing T' of public mid-training, with and without
distribution matching) and Figures 2/4 (accuracy after private FL vs distillation steps, vs
top-k logits), with the paper's numbers and the verdicts on its claimed orderings.
"""
from __future__ import annotations

from fractions import Fraction

from fedpriv import report

# --------------------------------------------------------------------------------------------

# Wang et al. 2023, dev accuracy (%) at T' = 0, T/4, T/2, 3T/4, T (T = 1600); Table 5 has no T
PAPER_T_PRIME_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
PAPER_TABLE4 = {1.77: (25.41, 27.08, 27.73, 26.40, 18.40),
                18.71: (28.38, 30.07, 30.37, 29.45, 19.34)}
PAPER_TABLE5 = {1.77: (25.41, 26.43, 26.73, 25.20, None),
                18.71: (28.38, 29.55, 29.70, 28.93, None)}


def t_prime_label(t_prime: int, rounds: int) -> str:
    """``T'=T/2 (30)``: T' as a fraction of T, with the round."""
    f = Fraction(t_prime, rounds)
    frac = ("0" if f == 0 else "T" if f == 1 else
            f"{'' if f.numerator == 1 else f.numerator}T/{f.denominator}")
    return f"T'={frac} ({t_prime})"


def t_prime_row_name(row: str, t_prime: int) -> str:
    """The row that stands for `row` at T': at T' = 0 matching needs a private model, so the
    paper uses a random public sample for pre-training (``pretrain_distill``, §5.3 / App. C)."""
    return "pretrain_distill" if t_prime == 0 else row


def _runs_at(runs, row, eps, **where):
    return [r for r in runs if r["row"] == row and r["target_epsilon"] == eps
            and all(r.get(k) == v for k, v in where.items())]


def t_prime_table(runs: list[dict], rounds: int, t_primes, epsilons, row: str, *,
                  paper: dict | None = None, metric: str = "val_accuracy") -> list[dict]:
    """Tables 4/5 in the paper's layout: one row per epsilon (this run: mean ± std over seeds
    of `metric` in %, then the paper's row if it reports that epsilon), one column per T'."""
    table = []
    for eps in epsilons:
        out = {"epsilon": f"{eps:g}", "source": "this run"}
        for tp in t_primes:
            out[t_prime_label(tp, rounds)] = report.pm(
                [r.get(metric) for r in _runs_at(runs, t_prime_row_name(row, tp), eps,
                                                 t_prime=tp)], 100)
        table.append(out)
        ref = next((v for e, v in (paper or {}).items() if abs(e - eps) < 1e-9), None)
        if ref is not None:
            p = {"epsilon": f"{eps:g}", "source": "paper (StackOverflow, T=1600)"}
            for tp in t_primes:
                fr = tp / rounds
                j = next((i for i, f in enumerate(PAPER_T_PRIME_FRACTIONS) if abs(f - fr) < 1e-9),
                         None)
                p[t_prime_label(tp, rounds)] = (None if j is None or ref[j] is None
                                                else f"{ref[j]:.2f}")
            table.append(p)
    return table


def ablation_curves(runs: list[dict], x_key: str, epsilons, *, row: str = "pretrain_distill",
                    metric: str = "val_accuracy") -> dict:
    """``{"eps~E": (xs, mean %, std %)}`` of `metric` against the swept field `x_key`."""
    curves = {}
    for eps in epsilons:
        xs = sorted({r[x_key] for r in runs if r["row"] == row and r["target_epsilon"] == eps})
        stats = [report.mean_std([r.get(metric) for r in _runs_at(runs, row, eps,
                                                                  **{x_key: x})]) for x in xs]
        curves[f"eps~{eps:g}"] = (xs, [100 * (m or 0.0) for m, _, _ in stats],
                                  [100 * (s or 0.0) for _, s, _ in stats])
    return curves


def _best(groups: dict, higher: bool = True):
    """The key of `groups` (key -> per-seed values) with the best mean."""
    means = {k: report.mean_std(v)[0] for k, v in groups.items() if report.mean_std(v)[0] is not None}
    return (max if higher else min)(means, key=means.get)


def t_prime_verdicts(runs: list[dict], rounds: int, t_primes, epsilons, *, row: str = "mid_dm",
                     metric: str = "val_accuracy") -> list:
    """Verdicts on Table 4's orderings per epsilon: T' = T/2 beats the best other T'; T' = T is
    below the worst other T' (per-seed `metric`, validation)."""
    out = []
    for eps in epsilons:
        vals = {tp: [r.get(metric) for r in _runs_at(runs, t_prime_row_name(row, tp), eps,
                                                     t_prime=tp)] for tp in t_primes}
        vals = {tp: v for tp, v in vals.items() if report.mean_std(v)[0] is not None}
        half, T = rounds // 2, rounds
        if half in vals and len(vals) > 1:
            other = _best({k: v for k, v in vals.items() if k != half})
            out.append(report.ordering_verdict(
                f"T'=T/2 is the best T' ({row}, eps~{eps:g}; Table 4)", vals[half], vals[other],
                higher_is_better=True, names=(t_prime_label(half, T), t_prime_label(other, T))))
        if T in vals and len(vals) > 1:
            other = _best({k: v for k, v in vals.items() if k != T}, higher=False)
            out.append(report.ordering_verdict(
                f"T'=T is the worst T' ({row}, eps~{eps:g}; Table 4)", vals[other], vals[T],
                higher_is_better=True, names=(t_prime_label(other, T), t_prime_label(T, T))))
    return out


def sweep_verdict(runs: list[dict], x_key: str, eps: float, claim: str, *, largest: bool,
                  row: str = "pretrain_distill", metric: str = "val_accuracy"):
    """Verdict that more of `x_key` helps at `eps`: the largest value (``largest``) or the best
    value above the smallest ("up to a point") beats the smallest value."""
    vals = {r[x_key]: [] for r in runs if r["row"] == row and r["target_epsilon"] == eps}
    for x in vals:
        vals[x] = [r.get(metric) for r in _runs_at(runs, row, eps, **{x_key: x})]
    vals = {x: v for x, v in vals.items() if report.mean_std(v)[0] is not None}
    if len(vals) < 2:
        return None
    lo = min(vals)
    hi = max(vals) if largest else _best({k: v for k, v in vals.items() if k != lo})
    return report.ordering_verdict(claim, vals[hi], vals[lo], higher_is_better=True,
                                   names=(f"{x_key}={hi}", f"{x_key}={lo}"))
