"""Recipe: Wang et al. 2023's ablations from the rows of ``recipes.public.run_rows`` collected over a
sweep (``fedpriv.recipes.sweep``): Tables 4/5 (timing T' of public mid-training, with and without
distribution matching) and Figures 2/4 (accuracy after private FL vs distillation steps, vs
top-k logits), with the paper's numbers and the verdicts on its claimed orderings.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

from fedpriv import report, verdicts as V

__verdict_code__ = ("paper_t_prime", "_paper_pair", "t_prime_verdicts", "dm_vs_random_verdicts",
                    "saturation_verdicts", "sweep_verdicts", "skipped_epsilon_verdicts", "TRIVIAL_KEY",
                    "_per_seed", "_trivial")  # read-time code (experiments.results.verdict_code)

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


TRIVIAL_KEY = "most_frequent_token_val_accuracy"


def _per_seed(runs, row, eps, metric, **where) -> dict:
    """``{seed: 100 * metric}`` of the runs of (row, eps, where)."""
    return {r["seed"]: 100 * r[metric] for r in _runs_at(runs, row, eps, **where)
            if r.get(metric) is not None}


def _trivial(runs) -> float | None:
    """The trivial baseline (%) of these runs: the mean of their most-frequent-token validation
    accuracy (:data:`TRIVIAL_KEY`, recorded per run by the experiment); None if none has it."""
    vals = [100 * r[TRIVIAL_KEY] for r in runs if r.get(TRIVIAL_KEY) is not None]
    if vals and all(v == vals[0] for v in vals):  # one validation set: its value, not a float mean of
        return vals[0]                            # copies (which moves the last digit with the count)
    return sum(vals) / len(vals) if vals else None


#: the privacy budgets of Wang et al.'s Tables 2-5 and Figures 2/4 (delta 1e-6)
PAPER_EPSILONS = (1.77, 18.71)


def skipped_epsilon_verdicts(verdicts_at, run_epsilons, run_hint: str) -> list:
    """The claims a run did not test because it skipped one of the paper's epsilons, each
    "not run yet" with why and how to run it: ``verdicts_at(eps)`` gives the claims at ``eps``
    (from no runs: every comparison is then "not run"); claims that cannot be tested for another
    reason ("not testable here") keep that verdict. So a page built from an eps-1.77-only run
    still lists the eps-18.71 claims (e.g. Table 3's "negligible") instead of dropping them."""
    out = []
    for eps in PAPER_EPSILONS:
        if any(abs(eps - e) < 1e-9 for e in run_epsilons):
            continue
        reason = (f"this run trained epsilons={'/'.join(f'{e:g}' for e in run_epsilons)} only: every row "
                  f"again at eps {eps:g} ({run_hint}); rerun with epsilons="
                  f"{'/'.join(f'{e:g}' for e in sorted({*run_epsilons, eps}))}")
        out += [v if v.status != V.NOT_RUN else dataclasses.replace(v, measured=reason, reason=reason)
                for v in verdicts_at(eps)]
    return out


def paper_t_prime(table: dict, eps: float, t_prime: int, rounds: int) -> float | None:
    """The paper's Table 4 / 5 dev accuracy (%) at ``eps`` and T' = ``t_prime`` of ``rounds`` (its
    T' as a fraction of T), or None where the table has no such cell."""
    ref = next((v for e, v in table.items() if abs(e - eps) < 1e-9), None)
    j = next((i for i, f in enumerate(PAPER_T_PRIME_FRACTIONS) if abs(f - t_prime / rounds) < 1e-9), None)
    return None if ref is None or j is None else ref[j]


def _paper_pair(pa, pb) -> dict:
    """``compare``'s paper arguments and source for the paper's (A, B): the paper's claim when its
    numbers agree (A > B), a project check otherwise; nothing without numbers."""
    if pa is None or pb is None:
        return {}
    return {"paper": (pa, pb), "source": "paper" if pa > pb else "project"}


def t_prime_verdicts(runs: list[dict], rounds: int, t_primes, epsilons, *, row: str = "mid_dm",
                     metric: str = "val_accuracy", table: str = "Table 4") -> list:
    """Verdicts on the T' orderings of Table 4 (``row="mid_dm"``) or Table 5 (``"mid_random"``)
    per epsilon (:mod:`fedpriv.verdicts`, paired by seed, 90 % interval, trivial baseline the
    most-frequent-token accuracy): "T'=T/2 is the best T'" holds iff T/2 beats every other T'
    that ran; "T'=T is the worst" iff every other T' beats T (Table 4 only: Table 5 has no T).
    Each pairwise part carries the paper's two cells and their effect scaled to our level."""
    out, trivial = [], _trivial(runs)
    half, T = rounds // 2, rounds
    paper = PAPER_TABLE4 if table == "Table 4" else PAPER_TABLE5
    for eps in epsilons:
        vals = {tp: _per_seed(runs, t_prime_row_name(row, tp), eps, metric, t_prime=tp) for tp in t_primes}
        vals = {tp: v for tp, v in vals.items() if v}
        lab = lambda tp: t_prime_label(tp, T)  # noqa: E731
        cmp = lambda a, b: V.compare(f"{lab(a)} beats {lab(b)}", vals[a], vals[b],  # noqa: E731
                                     higher_is_better=True, trivial=trivial, names=(lab(a), lab(b)),
                                     **_paper_pair(paper_t_prime(paper, eps, a, T), paper_t_prime(paper, eps, b, T)))
        claim = f"T'=T/2 is the best T' ({row}, eps~{eps:g}; {table})"
        if half in vals and len(vals) > 1:
            out.append(V.combine(claim, [cmp(half, tp) for tp in vals if tp != half]))
        else:
            out.append(V.not_run(claim, f"T'={half} or any other T' not in this run"))
        if table == "Table 4":
            claim = f"T'=T is the worst T' ({row}, eps~{eps:g}; {table})"
            if T in vals and len(vals) > 1:
                out.append(V.combine(claim, [cmp(tp, T) for tp in vals if tp != T]))
            else:
                out.append(V.not_run(claim, f"T'={T} or any other T' not in this run"))
    return out


def dm_vs_random_verdicts(runs: list[dict], rounds: int, t_primes, epsilons, *,
                          metric: str = "val_accuracy") -> list:
    """"Distribution matching beats a random public subset at the same T'" (Table 4 vs Table 5),
    per epsilon and per 0 < T' that both rows ran (T' = 0 is the same random pre-training in
    both tables), paired by seed."""
    out, trivial = [], _trivial(runs)
    for eps in epsilons:
        for tp in t_primes:
            if tp == 0:
                continue
            claim = (f"distribution matching beats a random public subset at the same T' = "
                     f"{t_prime_label(tp, rounds)} (eps~{eps:g}; Table 4 vs Table 5)")
            dm, rnd = (_per_seed(runs, r, eps, metric, t_prime=tp) for r in ("mid_dm", "mid_random"))
            pa, pb = paper_t_prime(PAPER_TABLE4, eps, tp, rounds), paper_t_prime(PAPER_TABLE5, eps, tp, rounds)
            kw = _paper_pair(pa, pb) or {"source": "project"}  # Table 5 has no T'=T: not a paper claim
            if pb is None:
                claim += " [not in the paper: Table 5 has no T'=T]"
            out.append(V.compare(claim, dm, rnd, higher_is_better=True, trivial=trivial,
                                 names=("mid_dm", "mid_random"), **kw) if dm and rnd else
                       V.not_run(claim, "mid_dm or mid_random not run at this T'", source=kw["source"]))
    return out


def saturation_verdicts(runs: list[dict], eps: float, *, pool_size: int | None = None, q: float | None = None,
                        row: str = "pretrain_distill", metric: str = "val_accuracy") -> list:
    """Figure 2 (§4.2): "a consistent performance improvement when the distillation covers less than
    5% of the C4 dataset. But when we pre-train the LM for more epochs, the improvement becomes
    marginal" -- not testable here as stated (our q fraction of a small pool is covered in well
    under one step; more steps are more epochs over it, so "5 % of C4" has no counterpart), with
    the nearest contrast as a project check: the gain of the first step of the distill_steps grid
    (smallest -> second) is larger than the gain of its last (second-largest -> largest), paired
    by seed. [] if fewer than 3 grid points ran."""
    xs = sorted({r["distill_steps"] for r in runs if r["row"] == row and r["target_epsilon"] == eps})
    vals = {x: _per_seed(runs, row, eps, metric, distill_steps=x) for x in xs}
    vals = {x: v for x, v in vals.items() if v}
    xs = sorted(vals)
    if len(xs) < 3:
        return []
    where = (f"{q:g} of a {pool_size}-sentence pool" if q is not None and pool_size else "a small q of the pool")
    claim = (f"distillation gains saturate: consistent improvement while distillation covers < 5% of C4, "
             f"marginal beyond (eps~{eps:g}; Figure 2/4, §4.2)")
    out = [V.not_testable(claim, f"our distillation set is {where}: every grid point covers it more than once, "
                          "so '5 % of C4' has no counterpart; nearest contrast: the first increment of the "
                          "distill_steps grid vs its last (project check below); what would test it: a pool of "
                          ">= 10^5 sentences with distillation steps spanning < 1 to several passes")]
    seeds = sorted(set.intersection(*(set(vals[x]) for x in xs)))
    first = {s: vals[xs[1]][s] - vals[xs[0]][s] for s in seeds}
    last = {s: vals[xs[-1]][s] - vals[xs[-2]][s] for s in seeds}
    c = (f"(nearest contrast) the first distill_steps increment ({xs[0]} -> {xs[1]}) gains more than the last "
         f"({xs[-2]} -> {xs[-1]}) (eps~{eps:g}; Figure 2/4 saturation)")
    out.append(V.compare(c, first, last, higher_is_better=True, trivial=None,
                         names=(f"gain {xs[0]}->{xs[1]}", f"gain {xs[-2]}->{xs[-1]}"), source="project")
               if len(seeds) >= 1 else V.not_run(c, "no seed ran every grid point", source="project"))
    return out


def sweep_verdicts(runs: list[dict], x_key: str, eps: float, claim: str, *,
                   row: str = "pretrain_distill", metric: str = "val_accuracy") -> list:
    """Two verdicts that more of `x_key` helps at `eps` (paired by seed): the largest value beats
    the smallest (the end-to-end contrast), and the metric increases over every consecutive
    pair of the grid (:func:`fedpriv.verdicts.monotone`). Never the best of several against
    the smallest (that picks the winner after seeing the data). [] if fewer than 2 values ran."""
    xs = sorted({r[x_key] for r in runs if r["row"] == row and r["target_epsilon"] == eps})
    vals = {x: _per_seed(runs, row, eps, metric, **{x_key: x}) for x in xs}
    vals = {x: v for x, v in vals.items() if v}
    if len(vals) < 2:
        return []
    xs, trivial = sorted(vals), _trivial(runs)
    lo, hi = xs[0], xs[-1]
    out = [V.compare(f"{claim}: largest vs smallest {x_key}", vals[hi], vals[lo], higher_is_better=True,
                     trivial=trivial, names=(f"{x_key}={hi}", f"{x_key}={lo}"))]
    if len(xs) > 2:
        out.append(V.monotone(f"{claim}: every consecutive {x_key} pair", xs, [vals[x] for x in xs],
                              increasing=True, higher_is_better=True, trivial=trivial, label=x_key))
    if x_key == "distill_steps":  # Figure 2's saturation "beyond ~5 % of C4" (§4.2)
        out += saturation_verdicts(runs, eps, row=row, metric=metric)
    return out
