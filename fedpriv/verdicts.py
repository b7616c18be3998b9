"""The one verdict function of the project: a paper's claim against what we measured.

Every artefact (``experiments/*.py``, the recipes, FreD, population expansion) judges its claims
through these functions, so every verdict on the results page (``python -m experiments.results``)
means the same thing (docs/design.md §5, "Verdicts"; issues 23 and 50):

- :func:`compare` — "A beats B" from the per-seed values of both sides. The gap is
  ``mean(A) - mean(B)`` with a two-sided ``level`` (default 90 %) t-interval: **paired** on the
  per-seed differences when both sides are ``{seed: value}`` mappings over the same seeds
  (``d_i = a_i - b_i``, ``n - 1`` degrees of freedom), **Welch** otherwise (``se^2 = s_a^2/n_a +
  s_b^2/n_b``, Welch–Satterthwaite degrees of freedom). Status, in this order:

  ``"inconclusive (below the trivial baseline)"`` when either side's mean is not better than its
  trivial baseline (e.g. the most-frequent-token accuracy; for a lower-is-better metric "better"
  means below it), so a comparison of models that learned nothing is never decided — **except**
  that a claimed-better A below its baseline whose interval lies entirely on the wrong side of 0
  against a B that *is* above its baseline (a working reference) is ``"not reproduced"``: the
  method the paper calls better learned nothing where the reference learned something;
  ``"inconclusive (too few seeds)"`` when the interval is undefined (n < 2 pairs, or a side with
  n < 2 unpaired); ``"reproduced"`` when the interval excludes 0 in the claimed direction;
  ``"not reproduced"`` when it excludes 0 in the opposite direction; ``"not reproduced (the
  paper's effect excluded)"`` when it contains 0 but lies entirely short of the paper's effect
  scaled to our level (``paper=`` / ``paper_effect=``, :func:`scaled_effect`: the data say the
  effect, if any, is smaller than the paper's); ``"inconclusive (interval contains 0)"``
  otherwise. An interval that excludes 0 in the claimed direction *and* the paper's effect stays
  "reproduced" (the ordering holds) with ``effect_excluded`` set and said in ``measured``.
- :func:`at_least` — a magnitude claim ("more than 7 points", "13 % lower"): reproduced when the
  interval lies beyond the (scaled) effect, "not reproduced (the paper's effect excluded)" when
  it lies short of it.
- :func:`equivalence` — a "negligible"-type claim, TOST-style: ``"equivalent"`` when the
  ``level`` interval of the gap lies inside ``[-margin, margin]`` (the two one-sided tests at
  ``(1 - level) / 2`` each: 5 % each for the 90 % interval), ``"not reproduced"`` when the
  interval lies entirely beyond the margin (the sides differ by more than the smallest meaningful
  effect: the one-sided test of ``|gap| > margin``), ``"not shown equivalent"`` otherwise; the
  trivial-baseline and too-few-seeds rules as above. The margin must be no wider
  than the smallest effect the paper calls meaningful (the callers say which: e.g.
  ``fedpriv.recipes.public.MEANINGFUL_PP``).
- :func:`noninferior` — "A is at least as good as B" within a stated margin: the interval's
  worse end above ``-margin`` (oriented by the metric).
- :func:`monotone` — "the metric decreases (increases) along xs": every consecutive pair by
  :func:`compare` (each at ``level``, no multiplicity correction here; the parts are kept and
  enter :func:`holm` one by one).
- :func:`combine` — a claim that holds iff each of its parts does ("X is the best scheme": X
  beats every other scheme).
- :func:`check` — a claim about an exact computation (no sampling noise: a closed form, a
  deterministic statistic, every observed trial): ``"reproduced"`` / ``"not reproduced"``.
- :func:`not_testable` / :func:`not_run` — a claim that cannot be tested here (with the reason
  and the nearest feasible contrast) or whose runs do not exist yet.

Beside each status a verdict carries:

- ``p_value``: the p-value of the test its status is decided by, on the scale of the interval
  (decided iff ``p_value < 1 - level``): two-sided for "A differs from B" (the 90 % interval
  excludes 0 iff p < 0.10); twice the one-sided p for the tests against a margin or the paper's
  effect (their 90 % interval edge is a 5 % one-sided test). :func:`holm` adjusts them per paper.
- ``fragile``: a decided verdict whose deciding interval edge lies within
  ``max(fragile_abs, 10 % of the distance of the point estimate)`` of its boundary (0, the
  margin or the paper's effect): float-level differences between reruns can flip it, so it is
  not counted as decided (:func:`tally`). A "not reproduced" whose interval also lies short of
  the paper's scaled effect by more than that tolerance is not fragile at its edge near 0: moved
  across 0 it would be "not reproduced (the paper's effect excluded)", the same decision.
  ``fragile_abs``: 0.1 in the metric's units by default (0.1 point of accuracy %, 0.1 of
  perplexity); a metric of another scale states its own.
- ``source``: ``"paper"`` — a claim the paper makes (its own numbers agree with it) — or
  ``"project"`` — the project's own check (a substitute contrast, a diagnostic, a claim the
  paper's own table contradicts, work beyond the papers). Counts keep them apart.
- ``paper_values`` / ``paper_effect`` / ``paper_scaling``: the paper's numbers for A and B, the
  effect scaled to our level (in the metric's units, as A - B) and how it was scaled.

:func:`rejudge` recomputes a stored verdict's status, p-value and fragility from the per-seed
values it keeps (the page applies the current rules to committed verdicts without re-running
anything); :func:`holm` gives the Holm-adjusted decisions of a family (one paper's verdicts,
family-wise ``alpha`` = 10 %); :func:`tally` counts statuses, decided / fragile verdicts, paper
claims vs project checks and Holm survivors; :func:`seeds_needed` and :func:`power` size an
experiment from a pilot's seed sd (``python -m experiments.power``).

A :class:`Verdict` keeps the numbers behind it (per-seed values, trivial baselines, interval),
so ``python -m experiments.results --json`` can print them and a compact committed summary can
rebuild the page without the runs.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

__all__ = ["Verdict", "compare", "at_least", "equivalence", "noninferior", "monotone", "combine",
           "check", "orders_agree", "not_testable", "not_run", "legacy", "t_interval", "unigram_perplexity",
           "scaled_effect", "rejudge", "holm", "tally", "decided", "seeds_needed", "power",
           "gap_sd", "STATUSES", "DECIDED", "REPRODUCED", "NOT_REPRODUCED", "EXCLUDED", "INCONCLUSIVE",
           "BELOW_TRIVIAL", "TOO_FEW_SEEDS", "EQUIVALENT", "NOT_EQUIVALENT", "NOT_TESTABLE",
           "NOT_RUN", "LEGACY", "HOLM_INCONCLUSIVE", "LEVEL", "FAMILY_ALPHA", "FRAGILE_ABS",
           "FRAGILE_REL", "SOURCES"]

__verdict_code__ = "*"  # read-time code: its changes do not make a run stale (experiments.results.verdict_code)
LEVEL = 0.9
FAMILY_ALPHA = 0.10   # Holm, family-wise error per paper
FRAGILE_ABS = 0.1     # an edge this close to its boundary (metric units) ...
FRAGILE_REL = 0.1     # ... or within this fraction of the point estimate's distance: fragile
REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
EXCLUDED = "not reproduced (the paper's effect excluded)"
INCONCLUSIVE = "inconclusive (interval contains 0)"
BELOW_TRIVIAL = "inconclusive (below the trivial baseline)"
TOO_FEW_SEEDS = "inconclusive (too few seeds)"
EQUIVALENT, NOT_EQUIVALENT = "equivalent", "not shown equivalent"
NOT_TESTABLE, NOT_RUN = "not testable here", "not run yet"
LEGACY = "inconclusive (old statistics: re-run)"
HOLM_INCONCLUSIVE = "inconclusive (not significant after Holm)"
STATUSES = (REPRODUCED, NOT_REPRODUCED, EXCLUDED, INCONCLUSIVE, BELOW_TRIVIAL, TOO_FEW_SEEDS,
            EQUIVALENT, NOT_EQUIVALENT, NOT_TESTABLE, NOT_RUN, LEGACY, HOLM_INCONCLUSIVE)
DECIDED = (REPRODUCED, NOT_REPRODUCED, EXCLUDED, EQUIVALENT)  # "decided", either way
SOURCES = ("paper", "project")
SCALINGS = ("relative", "absolute")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A paper's claim and what we measured.

    ``status``: one of :data:`STATUSES`; ``measured``: the numbers in words. The rest is the
    evidence, JSON-ready: ``kind`` (``"ordering"``, ``"magnitude"``, ``"equivalence"``,
    ``"non-inferiority"``, ``"monotone"``, ``"all of"``, ``"exact"``, ``"untestable"``,
    ``"not run"``); ``gap`` = mean(A) - mean(B) (raw, not oriented) and ``ci`` its ``level``
    interval; ``method`` (``"paired t"``, ``"Welch t"``); ``higher_is_better`` (the metric's
    orientation; the claim is "A better than B"); ``margin`` (equivalence, non-inferiority);
    ``sides``: per side ``{"name", "values" ({seed: value} or [values]), "mean", "n",
    "trivial"}``; ``parts``: the pairwise verdicts of a :func:`monotone` / :func:`combine` claim;
    ``reason``; ``source`` (:data:`SOURCES`); ``paper_values`` (the paper's A, B),
    ``paper_effect`` (scaled to our level, raw A - B units), ``paper_scaling`` (how);
    ``effect_excluded`` (the interval excludes the scaled effect); ``p_value``; ``fragile``;
    ``fragile_abs`` (the absolute fragility tolerance in the metric's units); ``margin_basis``
    (where an equivalence / non-inferiority margin comes from).
    """

    claim: str
    status: str
    measured: str = ""
    kind: str = "ordering"
    gap: float | None = None
    ci: tuple | None = None
    level: float | None = None
    method: str | None = None
    higher_is_better: bool | None = None
    margin: float | None = None
    sides: tuple = ()
    parts: tuple = ()
    reason: str = ""
    source: str = "paper"
    paper_values: tuple | None = None
    paper_effect: float | None = None
    paper_scaling: str = ""
    effect_excluded: bool | None = None
    p_value: float | None = None
    fragile: bool = False
    fragile_abs: float = FRAGILE_ABS
    margin_basis: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"verdict status must be one of {list(STATUSES)}, got {self.status!r}")
        if self.source not in SOURCES:
            raise ValueError(f"verdict source must be one of {list(SOURCES)}, got {self.source!r}")
        if self.ci is not None:
            object.__setattr__(self, "ci", tuple(self.ci))
        if self.paper_values is not None:
            object.__setattr__(self, "paper_values", tuple(self.paper_values))
        object.__setattr__(self, "sides", tuple(self.sides))
        object.__setattr__(self, "parts", tuple(p if isinstance(p, Verdict) else Verdict(**p)
                                                for p in self.parts))

    def to_json(self) -> dict:
        """A plain dict (``Verdict(**d)`` reads it back)."""
        return dataclasses.asdict(self)

    @property
    def decided(self) -> bool:
        """Decided either way (:data:`DECIDED`) and not fragile."""
        return self.status in DECIDED and not self.fragile


# ----------------------------------------------------------------------------------------------
# statistics
# ----------------------------------------------------------------------------------------------

def _finite(values) -> dict:
    """``{key: float}`` of the finite values (a sequence is keyed by position)."""
    items = values.items() if isinstance(values, Mapping) else enumerate(values)
    out = {}
    for k, v in items:
        if v is not None and math.isfinite(float(v)):
            out[k] = float(v)
    return out


def _t(level: float, df: float) -> float:
    from scipy import stats
    return float(stats.t.ppf(0.5 + level / 2, df))


def _interval(a, b, level: float, paired: bool | None):
    """``(gap, ci or None, method, n_or_df, se or None, df or None)`` (see :func:`t_interval`)."""
    fa, fb = _finite(a), _finite(b)
    if not fa or not fb:
        raise ValueError("t_interval: no finite values for one side")
    same = isinstance(a, Mapping) and isinstance(b, Mapping) and set(fa) == set(fb)
    if paired is None:
        paired = same and len(fa) >= 2
    if paired:
        if not same:
            raise ValueError("t_interval: a paired interval needs {seed: value} mappings over the same "
                             f"seeds, got {sorted(map(str, fa))} vs {sorted(map(str, fb))}")
        d = np.array([fa[k] - fb[k] for k in fa])
        gap, n = float(d.mean()), len(d)
        if n < 2:
            return gap, None, "paired t", n, None, None
        se = float(d.std(ddof=1)) / math.sqrt(n)
        half = _t(level, n - 1) * se
        return gap, (gap - half, gap + half), "paired t", n, se, float(n - 1)
    xa, xb = np.array(list(fa.values())), np.array(list(fb.values()))
    gap = float(xa.mean() - xb.mean())
    if len(xa) < 2 or len(xb) < 2:
        return gap, None, "Welch t", None, None, None
    va, vb = float(xa.var(ddof=1)) / len(xa), float(xb.var(ddof=1)) / len(xb)
    se = math.sqrt(va + vb)
    if se == 0.0:  # both sides constant over seeds: the interval is the point
        return gap, (gap, gap), "Welch t", float("inf"), 0.0, float("inf")
    den = va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1)
    # Welch-Satterthwaite; where the squares underflow (variances ~1e-160 and below) its
    # lower bound min(n_a, n_b) - 1, the conservative (wider) choice
    df = (va + vb) ** 2 / den if den > 0 else float(min(len(xa), len(xb)) - 1)
    half = _t(level, df) * se
    return gap, (gap - half, gap + half), "Welch t", df, se, df


def t_interval(a, b, *, level: float = LEVEL, paired: bool | None = None):
    """The ``level`` two-sided t-interval of mean(a) - mean(b).

    ``a``, ``b``: per-seed values, ``{seed: value}`` mappings or sequences. ``paired=None``:
    paired when both are mappings over the same seeds (n >= 2). Returns ``(gap, (lo, hi) or None,
    method, n_or_df)``: paired — mean of ``d = a - b`` ± ``t(n-1) s_d / sqrt(n)``; Welch — the
    difference of means ± ``t(df) sqrt(s_a^2/n_a + s_b^2/n_b)`` with the Welch–Satterthwaite
    ``df``. The interval is None when undefined (fewer than 2 pairs / 2 values on a side).
    """
    return _interval(a, b, level, paired)[:4]


def _p_two_sided(x: float, se: float | None, df: float | None) -> float | None:
    """Two-sided p of ``x / se`` under t(df); the point interval (se 0): 0 unless x is 0."""
    if se is None or df is None:
        return None
    if se == 0.0:
        return 1.0 if x == 0 else 0.0
    from scipy import stats
    return float(min(1.0, 2 * stats.t.sf(abs(x) / se, df)))


def _p_one_sided_twice(x: float, se: float | None, df: float | None) -> float | None:
    """Twice the one-sided p of "the oriented estimate ``x`` is > 0" (on the two-sided scale of
    the interval: an edge of the 90 % interval is a 5 % one-sided test)."""
    if se is None or df is None:
        return None
    if se == 0.0:
        return 0.0 if x > 0 else 1.0
    from scipy import stats
    return float(min(1.0, 2 * stats.t.sf(x / se, df)))


def _fmt(x, digits):
    return "nan" if x is None else f"{x:.{digits}g}"


def _side(name, values, trivial, higher_is_better, digits):
    f = _finite(values)
    if not f:
        raise ValueError(f"verdict: no finite values for {name!r}")
    if trivial is not None and not isinstance(trivial, (int, float)):
        trivial = float(np.mean([float(t) for t in trivial]))
    m = float(np.mean(list(f.values())))
    keyed = isinstance(values, Mapping)
    side = {"name": name, "values": {str(k): v for k, v in f.items()} if keyed else list(f.values()),
            "mean": m, "n": len(f), "trivial": None if trivial is None else float(trivial)}
    above = trivial is None or (m > trivial if higher_is_better else m < trivial)
    sd = float(np.std(list(f.values()), ddof=1)) if len(f) > 1 else 0.0
    text = f"{name} {_fmt(m, digits)}" + (f" ± {_fmt(sd, digits)} (n={len(f)})" if len(f) > 1 else " (n=1)")
    if trivial is not None:
        text += f" [trivial {_fmt(float(trivial), digits)}{'' if above else ': NOT above it'}]"
    return side, above, text


def _pair(trivial):
    if isinstance(trivial, tuple) and len(trivial) == 2:
        return trivial
    return trivial, trivial


def _interval_text(gap, ci, method, ndf, level, digits):
    if ci is None:
        return f"gap {gap:+.{digits}g}, no {100 * level:g}% interval ({method}: too few seeds)"
    dof = (f"n={ndf}" if method == "paired t" else
           ("df=inf" if ndf == float("inf") else f"df={ndf:.1f}"))
    return (f"gap {gap:+.{digits}g}, {100 * level:g}% CI [{ci[0]:+.{digits}g}, {ci[1]:+.{digits}g}] "
            f"({method}, {dof})")


def scaled_effect(paper_a: float, paper_b: float, ours_b: float, scaling: str = "relative") -> tuple[float, str]:
    """The paper's effect A - B scaled to our level: ``"relative"`` — the paper's relative gap
    ``(paper_a - paper_b) / paper_b`` applied to our B side's mean (``ours_b``), for metrics whose
    level differs (our accuracy is a fraction of the paper's); ``"absolute"`` — the paper's gap
    as it is, where the scale is the same. Returns ``(effect, how)`` (raw A - B units)."""
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    raw = float(paper_a) - float(paper_b)
    if scaling == "absolute":
        return raw, f"the paper's gap {paper_a:g} - {paper_b:g} = {raw:+.3g}, as it is (same scale)"
    if paper_b == 0:
        raise ValueError("scaled_effect: a relative scaling needs a nonzero paper B value")
    rel = raw / float(paper_b)
    eff = rel * float(ours_b)
    return eff, (f"the paper's {paper_a:g} vs {paper_b:g} ({100 * rel:+.3g} % relative) applied to our "
                 f"B mean {ours_b:.4g}: {eff:+.3g}")


def _fragile(dist: float, estimate_dist: float, tol: float, boundary: float = 0.0) -> bool:
    """The deciding edge lies ``dist`` from its boundary (>= 0 when decided), the point estimate
    ``estimate_dist``: fragile when ``dist < max(tol', FRAGILE_REL * |estimate_dist|)``, where
    ``tol'`` is ``tol`` at the boundary 0 and ``min(tol, FRAGILE_REL * |boundary|)`` at a margin or
    an effect (a 0.1-point margin is not "near" itself)."""
    if boundary:
        tol = min(tol, FRAGILE_REL * abs(boundary))
    return dist < max(tol, FRAGILE_REL * abs(estimate_dist))


def _fragile_below(hi: float, g: float, tol: float, effect: float | None) -> bool:
    """Fragility of "not reproduced" (the oriented interval below 0, upper edge ``hi``): its edge
    near 0 is fragile, unless the interval also lies short of the paper's effect (oriented, > 0)
    by more than the tolerance there -- then an edge moved across 0 gives "not reproduced (the
    paper's effect excluded)", which is the same decision (the claim is not reproduced)."""
    if not _fragile(-hi, g, tol):
        return False
    return effect is None or effect <= 0 or _fragile(effect - hi, effect - g, tol, effect)


def _decide_ordering(ok_a, ok_b, gap, ci, se, df, sign, effect, tol, magnitude=False):
    """(status, p_value, fragile, effect_excluded) of "A beats B" (``magnitude``: by at least
    ``effect``) from the oriented interval; ``effect`` oriented (> 0 in the claimed direction)."""
    if ci is None:
        return (TOO_FEW_SEEDS if ok_a and ok_b else BELOW_TRIVIAL), None, False, None
    lo, hi = sorted((sign * ci[0], sign * ci[1]))
    g = sign * gap
    p0 = _p_two_sided(g, se, df)
    excl = None if effect is None else bool(hi < effect)
    if not (ok_a and ok_b):
        if not ok_a and ok_b and hi < 0:  # claimed-better learned nothing, the reference did
            return NOT_REPRODUCED, p0, _fragile(-hi, g, tol), excl
        return BELOW_TRIVIAL, p0, False, excl
    if magnitude:
        p_beyond, p_short = _p_one_sided_twice(g - effect, se, df), _p_one_sided_twice(effect - g, se, df)
        if lo > effect:
            return REPRODUCED, p_beyond, _fragile(lo - effect, g - effect, tol, effect), excl
        if hi < 0:
            return NOT_REPRODUCED, p0, _fragile_below(hi, g, tol, effect), excl
        if hi < effect:
            return EXCLUDED, p_short, _fragile(effect - hi, effect - g, tol, effect), excl
        return INCONCLUSIVE, p_beyond, False, excl
    if lo > 0:
        return REPRODUCED, p0, _fragile(lo, g, tol), excl
    if hi < 0:
        return NOT_REPRODUCED, p0, _fragile_below(hi, g, tol, effect), excl
    if effect is not None and effect > 0 and hi < effect:
        return EXCLUDED, _p_one_sided_twice(effect - g, se, df), _fragile(effect - hi, effect - g, tol, effect), excl
    return INCONCLUSIVE, p0, False, excl


def _paper_effect(paper, paper_effect, paper_scaling, scaling, ours_b):
    """(paper_values, effect raw A - B or None, how) from the arguments of :func:`compare`."""
    if paper is not None and paper_effect is not None:
        raise ValueError("give paper=(a, b) or paper_effect=, not both")
    if paper is not None:
        pa, pb = paper
        eff, how = scaled_effect(pa, pb, ours_b, scaling)
        return (float(pa), float(pb)), eff, how
    if paper_effect is not None:
        if not paper_scaling:
            raise ValueError("paper_effect= needs paper_scaling= (how it was scaled to our level)")
        return None, float(paper_effect), paper_scaling
    return None, None, ""


def _effect_text(effect, how, excluded, digits):
    if effect is None:
        return ""
    where = ("" if excluded is None else ", excluded by the interval" if excluded else
             ", inside or beyond the interval")
    return f"; the paper's effect scaled to our level {effect:+.{digits}g} ({how})" + where


def compare(claim: str, a, b, *, higher_is_better: bool, trivial, names: tuple[str, str] = ("A", "B"),
            level: float = LEVEL, paired: bool | None = None, digits: int = 4, source: str = "paper",
            paper: tuple | None = None, scaling: str = "relative", paper_effect: float | None = None,
            paper_scaling: str = "", fragile_abs: float = FRAGILE_ABS) -> Verdict:
    """Verdict on "A is better than B" (see the module docstring for the rules).

    Args:
      a, b: per-seed values of each side: ``{seed: value}`` (paired when the seeds coincide) or
        sequences (Welch). Non-finite and None values are dropped.
      higher_is_better: the metric's orientation (accuracy: True; perplexity: False).
      trivial: each side's trivial baseline in the metric's units — one number for both, a pair
        ``(trivial_a, trivial_b)`` (each a number, per-seed numbers (their mean is used) or None),
        or None where the metric has none (say so in the claim's artefact). Required: every
        caller decides.
      level: the two-sided confidence level (90 %).
      source: ``"paper"`` (the paper's claim) or ``"project"`` (our own check).
      paper: the paper's ``(A, B)`` numbers in the same metric; the effect is scaled to our level
        by ``scaling`` (:func:`scaled_effect`). Or ``paper_effect`` (raw A - B, already scaled)
        with ``paper_scaling`` saying how.
      fragile_abs: the absolute fragility tolerance in the metric's units.
    """
    ta, tb = _pair(trivial)
    sa, ok_a, text_a = _side(names[0], a, ta, higher_is_better, digits)
    sb, ok_b, text_b = _side(names[1], b, tb, higher_is_better, digits)
    pv, eff, how = _paper_effect(paper, paper_effect, paper_scaling, scaling, sb["mean"])
    gap, ci, method, ndf, se, df = _interval(a, b, level, paired)
    sign = 1.0 if higher_is_better else -1.0
    status, p, fragile, excl = _decide_ordering(ok_a, ok_b, gap, ci, se, df, sign,
                                                None if eff is None else sign * eff, fragile_abs)
    orient = "higher is better" if higher_is_better else "lower is better"
    measured = (f"{text_a} vs {text_b}; {_interval_text(gap, ci, method, ndf, level, digits)} "
                f"(A - B, {orient})" + _effect_text(eff, how, excl, digits))
    return Verdict(claim, status, measured, "ordering", gap, ci, level, method, higher_is_better,
                   None, (sa, sb), source=source, paper_values=pv, paper_effect=eff, paper_scaling=how,
                   effect_excluded=excl, p_value=p, fragile=fragile, fragile_abs=float(fragile_abs))


def at_least(claim: str, a, b, *, higher_is_better: bool, trivial, names: tuple[str, str] = ("A", "B"),
             paper: tuple | None = None, scaling: str = "relative", paper_effect: float | None = None,
             paper_scaling: str = "", level: float = LEVEL, paired: bool | None = None, digits: int = 4,
             source: str = "paper", fragile_abs: float = FRAGILE_ABS) -> Verdict:
    """Verdict on a magnitude claim, "A beats B by at least the paper's effect" (e.g. "more than 7
    points", "13 % lower perplexity"), the effect scaled to our level as in :func:`compare`:
    reproduced when the interval lies beyond the scaled effect; "not reproduced" when it lies on
    the wrong side of 0; "not reproduced (the paper's effect excluded)" when it lies short of the
    effect; inconclusive otherwise (trivial-baseline and too-few-seeds rules as in compare)."""
    v = compare(claim, a, b, higher_is_better=higher_is_better, trivial=trivial, names=names,
                level=level, paired=paired, digits=digits, source=source, paper=paper, scaling=scaling,
                paper_effect=paper_effect, paper_scaling=paper_scaling, fragile_abs=fragile_abs)
    if v.paper_effect is None:
        raise ValueError(f"at_least({claim!r}): give the paper's effect")
    sign = 1.0 if higher_is_better else -1.0
    if not sign * v.paper_effect > 0:
        raise ValueError(f"at_least({claim!r}): the paper's effect {v.paper_effect:+g} is not in the claimed direction")
    ok_a = v.sides[0]["trivial"] is None or (v.sides[0]["mean"] > v.sides[0]["trivial"]) == higher_is_better
    ok_b = v.sides[1]["trivial"] is None or (v.sides[1]["mean"] > v.sides[1]["trivial"]) == higher_is_better
    _, _, _, _, se, df = _interval(a, b, level, paired)
    status, p, fragile, excl = _decide_ordering(ok_a, ok_b, v.gap, v.ci, se, df, sign, sign * v.paper_effect,
                                                fragile_abs, magnitude=True)
    return dataclasses.replace(v, status=status, kind="magnitude", p_value=p, fragile=fragile,
                               effect_excluded=excl,
                               measured=v.measured + "; magnitude claim: decided against the scaled effect")


def equivalence(claim: str, a, b, *, margin: float, higher_is_better: bool, trivial,
                names: tuple[str, str] = ("A", "B"), level: float = LEVEL, paired: bool | None = None,
                digits: int = 4, source: str = "paper", paper: tuple | None = None,
                margin_basis: str = "", fragile_abs: float = FRAGILE_ABS) -> Verdict:
    """Verdict on "A and B differ negligibly": equivalent when the ``level`` interval of
    mean(A) - mean(B) lies inside ``[-margin, margin]`` (TOST at ``(1 - level)/2`` per side),
    not reproduced when it lies entirely outside it (they differ by more than the margin);
    ``margin`` in the metric's units, no wider than the smallest effect the paper calls
    meaningful (``margin_basis`` says where it comes from), stated in the measured text.
    ``paper``: the paper's (A, B), kept for the record."""
    if not margin > 0:
        raise ValueError(f"equivalence({claim!r}): margin must be > 0, got {margin!r}")
    ta, tb = _pair(trivial)
    sa, ok_a, text_a = _side(names[0], a, ta, higher_is_better, digits)
    sb, ok_b, text_b = _side(names[1], b, tb, higher_is_better, digits)
    gap, ci, method, ndf, se, df = _interval(a, b, level, paired)
    status, p, fragile = _decide_equivalence(ok_a, ok_b, gap, ci, se, df, margin, fragile_abs)
    measured = (f"{text_a} vs {text_b}; {_interval_text(gap, ci, method, ndf, level, digits)} "
                f"(A - B); equivalence margin ±{margin:.{digits}g}" + (f" ({margin_basis})" if margin_basis else "")
                + ("; the whole interval lies beyond the margin: the sides differ by more than it"
                   if status == NOT_REPRODUCED else ""))
    return Verdict(claim, status, measured, "equivalence", gap, ci, level, method, higher_is_better,
                   float(margin), (sa, sb), source=source,
                   paper_values=None if paper is None else tuple(map(float, paper)), margin_basis=margin_basis,
                   p_value=p, fragile=fragile, fragile_abs=float(fragile_abs))


def _decide_equivalence(ok_a, ok_b, gap, ci, se, df, margin, tol):
    if not (ok_a and ok_b):
        return BELOW_TRIVIAL, None, False
    if ci is None:
        return TOO_FEW_SEEDS, None, False
    # TOST: both one-sided tests; on the interval's scale, twice the larger one-sided p
    p = max(_p_one_sided_twice(gap + margin, se, df), _p_one_sided_twice(margin - gap, se, df))
    if -margin < ci[0] and ci[1] < margin:
        dist = min(ci[0] + margin, margin - ci[1])
        return EQUIVALENT, p, _fragile(dist, margin - abs(gap), tol, margin)
    if ci[0] > margin or ci[1] < -margin:
        # the whole interval beyond the margin: the sides differ by more than the smallest
        # meaningful effect (the one-sided test of |gap| > margin at the edge, the mirror of TOST)
        dist = ci[0] - margin if ci[0] > margin else -margin - ci[1]
        return (NOT_REPRODUCED, _p_one_sided_twice(abs(gap) - margin, se, df),
                _fragile(dist, abs(gap) - margin, tol, margin))
    return NOT_EQUIVALENT, p, False


def noninferior(claim: str, a, b, *, margin: float, higher_is_better: bool, trivial,
                names: tuple[str, str] = ("A", "B"), level: float = LEVEL, paired: bool | None = None,
                digits: int = 4, source: str = "paper", margin_basis: str = "",
                fragile_abs: float = FRAGILE_ABS) -> Verdict:
    """Verdict on "A is at least as good as B" (a ">=" claim) within ``margin``: reproduced when
    the ``level`` interval of the gap lies entirely on the good side of ``-margin`` (oriented by
    ``higher_is_better``), not reproduced when it lies entirely beyond it, inconclusive otherwise;
    the trivial-baseline and too-few-seeds rules of :func:`compare`."""
    if not margin > 0:
        raise ValueError(f"noninferior({claim!r}): margin must be > 0, got {margin!r}")
    v = compare(claim, a, b, higher_is_better=higher_is_better, trivial=trivial, names=names,
                level=level, paired=paired, digits=digits, source=source, fragile_abs=fragile_abs)
    _, _, _, _, se, df = _interval(a, b, level, paired)
    status, p, fragile = _decide_noninferior(v, se, df, margin, higher_is_better, fragile_abs)
    return dataclasses.replace(v, status=status, kind="non-inferiority", margin=float(margin), p_value=p,
                               fragile=fragile, margin_basis=margin_basis,
                               measured=v.measured + f"; non-inferiority margin {margin:.{digits}g}"
                               + (f" ({margin_basis})" if margin_basis else ""))


def _decide_noninferior(v, se, df, margin, higher_is_better, tol):
    if v.status in (BELOW_TRIVIAL, TOO_FEW_SEEDS) or v.ci is None:
        return (v.status if v.status in (BELOW_TRIVIAL, TOO_FEW_SEEDS) else TOO_FEW_SEEDS), None, False
    sign = 1.0 if higher_is_better else -1.0
    lo, hi = sorted((sign * v.ci[0], sign * v.ci[1]))
    g = sign * v.gap
    if lo > -margin:
        return REPRODUCED, _p_one_sided_twice(g + margin, se, df), _fragile(lo + margin, g + margin, tol, margin)
    if hi < -margin:
        return NOT_REPRODUCED, _p_one_sided_twice(-margin - g, se, df), _fragile(-margin - hi, g + margin, tol, margin)
    return INCONCLUSIVE, _p_one_sided_twice(g + margin, se, df), False


def monotone(claim: str, xs: Sequence, values: Sequence, *, increasing: bool, higher_is_better: bool,
             trivial, label: str = "x", level: float = LEVEL, paired: bool | None = None,
             digits: int = 4, source: str = "paper", fragile_abs: float = FRAGILE_ABS) -> Verdict:
    """Verdict on "the metric increases (``increasing``) / decreases along ``xs``": every
    consecutive pair ``(x_i, x_{i+1})`` compared by :func:`compare` (each at ``level``).

    Reproduced when every pair is; not reproduced when some pair's interval excludes 0 against
    the claim; inconclusive (below the trivial baseline / too few seeds / interval contains 0) by
    the first such pair otherwise. ``values[i]``: per-seed values at ``xs[i]``; ``trivial``: one
    baseline for all, or one per x.
    """
    if len(xs) != len(values) or len(xs) < 2:
        raise ValueError(f"monotone({claim!r}): need >= 2 xs and one value list per x")
    triv = list(trivial) if isinstance(trivial, (list, tuple)) else [trivial] * len(xs)
    parts = []
    for i in range(len(xs) - 1):
        # "A better than B" in compare's sense: the later x is "better" iff the claim's direction
        # agrees with the metric's orientation
        lo, hi = (i, i + 1) if increasing == higher_is_better else (i + 1, i)
        parts.append(compare(f"{label}={xs[hi]} vs {label}={xs[lo]}", values[hi], values[lo],
                             higher_is_better=higher_is_better, trivial=(triv[hi], triv[lo]),
                             names=(f"{label}={xs[hi]}", f"{label}={xs[lo]}"), level=level,
                             paired=paired, digits=digits, source=source, fragile_abs=fragile_abs))
    return combine(claim, parts, kind="monotone", source=source,
                   reason=f"every consecutive pair at {100 * level:g}% (no multiplicity correction)")


def _combined_status(parts) -> tuple[str, bool]:
    st = [p.status for p in parts]
    if all(s == REPRODUCED for s in st):
        return REPRODUCED, any(p.fragile for p in parts)
    for s in (NOT_REPRODUCED, EXCLUDED):
        if s in st:
            return s, all(p.fragile for p in parts if p.status == s)
    return next((s for s in (BELOW_TRIVIAL, TOO_FEW_SEEDS, INCONCLUSIVE) if s in st), INCONCLUSIVE), False


def combine(claim: str, parts: Sequence[Verdict], *, kind: str = "all of", reason: str = "",
            source: str = "paper") -> Verdict:
    """A claim that holds iff every part does (e.g. "X is the best": X beats each other one).

    Reproduced when every part is (fragile if any part is); not reproduced when some part is (its
    interval excludes 0 against the claim), or "the paper's effect excluded" when some part's
    is; otherwise the first of below the trivial baseline / too few seeds / interval contains 0
    among the parts. The parts are kept in ``parts`` (and enter :func:`holm` one by one)."""
    if not parts:
        raise ValueError(f"combine({claim!r}): no parts")
    status, fragile = _combined_status(parts)
    measured = "; ".join(f"[{p.claim}: {p.status}] {p.measured}" for p in parts)
    return Verdict(claim, status, measured, kind, level=parts[0].level,
                   higher_is_better=parts[0].higher_is_better, parts=tuple(parts),
                   reason=reason or f"each of {len(parts)} comparisons (no multiplicity correction)",
                   source=source, fragile=fragile)


def unigram_perplexity(train_tokens, eval_tokens, vocab_size: int, pad: int = 0) -> float:
    """The trivial perplexity baseline: ``exp`` of the mean NLL of the non-PAD targets
    ``eval_tokens[:, 1:]`` under the add-one-smoothed unigram distribution of the non-PAD
    targets ``train_tokens[:, 1:]`` over ``vocab_size`` ids (a model that ignores the context).
    Lower is better; an LM whose perplexity is not below it has learned nothing. Shapes:
    ``int[N, L+1]`` each (or a sequence of such arrays). A NON-PRIVATE reference statistic."""
    def targets(tokens):
        arrays = [tokens] if isinstance(tokens, np.ndarray) and tokens.ndim == 2 else list(tokens)
        t = np.concatenate([np.asarray(a)[:, 1:].ravel() for a in arrays if np.asarray(a).size]
                           or [np.zeros((0,), np.int64)])
        return t[t != pad].astype(np.int64)
    tr, ev = targets(train_tokens), targets(eval_tokens)
    if ev.size == 0:
        return float("nan")
    counts = np.bincount(tr, minlength=vocab_size)[:vocab_size].astype(np.float64) + 1.0
    logp = np.log(counts) - np.log(counts.sum())
    return float(np.exp(-logp[ev].mean()))


def check(claim: str, holds: bool, measured: str, *, basis: str, source: str = "paper") -> Verdict:
    """A claim about an exact computation (``basis`` says which: a closed form, a deterministic
    statistic of fixed data, every observed trial): reproduced iff ``holds``."""
    return Verdict(claim, REPRODUCED if holds else NOT_REPRODUCED, measured, "exact",
                   reason=basis, source=source)


def orders_agree(claim: str, xs: Sequence, reference: Sequence[float], replicates, *, label: str = "x",
                 digits: int = 3, source: str = "project") -> Verdict:
    """A noisy measurement's resolution against its noise-free reference: for every consecutive
    pair of ``xs`` and every replicate (``replicates``: ``[replicate][x]``), the difference has
    the sign of the reference's (``reference``: one value per x). Reproduced iff all agree; a
    statement about every observed replicate (:func:`check`). It separates "the noisy values tell
    the xs apart" from the direction the reference itself takes."""
    p = np.asarray(replicates, float)
    if p.ndim != 2 or p.shape[1] != len(xs) or len(reference) != len(xs) or len(xs) < 2:
        raise ValueError(f"orders_agree({claim!r}): replicates must be [n][{len(xs)}] and reference "
                         f"[{len(xs)}], with >= 2 xs")
    d_ref = np.diff(np.asarray(reference, float))
    agree = np.sign(np.diff(p, axis=1)) == np.sign(d_ref)[None, :]
    parts = [f"{label}={a:g}->{b:g}: noise-free {'+' if g > 0 else '-' if g < 0 else '0'}{abs(g):.{digits}g}, "
             f"agrees in {int(k)}/{len(p)}" for a, b, g, k in zip(xs, xs[1:], d_ref, agree.sum(0))]
    return check(claim, bool(agree.all()), "; ".join(parts), basis=f"every one of the {len(p)} observed replicates",
                 source=source)


def not_testable(claim: str, reason: str, *, source: str = "paper") -> Verdict:
    """A claim this project cannot test, with the reason (and the nearest feasible contrast)."""
    if not reason:
        raise ValueError(f"not_testable({claim!r}): give the reason")
    return Verdict(claim, NOT_TESTABLE, reason, "untestable", reason=reason, source=source)


def not_run(claim: str, reason: str, *, source: str = "paper") -> Verdict:
    """A testable claim whose runs do not exist (yet), with what would run them."""
    if not reason:
        raise ValueError(f"not_run({claim!r}): give the reason")
    return Verdict(claim, NOT_RUN, reason, "not run", reason=reason, source=source)


def legacy(d: dict) -> Verdict:
    """A verdict written under the old rule ("reproduced (within noise)" by sqrt(s_a^2+s_b^2)):
    never shown as reproduced; marked for a re-run, the old text kept."""
    return Verdict(d["claim"], LEGACY, f"old status {d.get('status')!r}: {d.get('measured', '')}",
                   "legacy", reason="computed by the old 'within noise' rule")


# ----------------------------------------------------------------------------------------------
# the current rules applied to a stored verdict; families; counts
# ----------------------------------------------------------------------------------------------

def _side_values(side: dict):
    vals = side["values"]
    return dict(vals) if isinstance(vals, Mapping) else list(vals)


def rejudge(v: Verdict) -> Verdict:
    """``v`` with its status, p-value, fragility and effect flags recomputed by the current rules
    from the per-seed values it stores (ordering, magnitude, equivalence, non-inferiority, and
    monotone / all-of claims through their parts); other kinds unchanged. Numbers, sides, claim
    text, source and the paper's effect are kept; the measured text is rebuilt by the rule's own
    function. A status the builder set from information outside the sides (a
    below-the-trivial-baseline mark over a gap of gains) is kept. Idempotent."""
    if v.parts:
        parts = tuple(rejudge(p) for p in v.parts)
        status, fragile = _combined_status(parts)
        if v.status == BELOW_TRIVIAL and status != BELOW_TRIVIAL and not any(p.status == BELOW_TRIVIAL for p in parts):
            status, fragile = BELOW_TRIVIAL, False  # set by the builder from outside the parts
        return dataclasses.replace(v, parts=parts, status=status, fragile=fragile)
    if v.kind not in ("ordering", "magnitude", "equivalence", "non-inferiority") or len(v.sides) != 2:
        return v
    sa, sb = v.sides
    a, b = _side_values(sa), _side_values(sb)
    paired = False if v.method == "Welch t" else None
    hib = bool(v.higher_is_better)
    names = (sa["name"], sb["name"])
    trivial = (sa.get("trivial"), sb.get("trivial"))
    level = v.level or LEVEL
    common = dict(higher_is_better=hib, trivial=trivial, names=names, level=level, paired=paired,
                  source=v.source, fragile_abs=v.fragile_abs)
    if v.kind == "equivalence":
        new = equivalence(v.claim, a, b, margin=v.margin, paper=v.paper_values, margin_basis=v.margin_basis,
                          **common)
    elif v.kind == "non-inferiority":
        new = noninferior(v.claim, a, b, margin=v.margin, margin_basis=v.margin_basis, **common)
        new = dataclasses.replace(new, paper_values=v.paper_values)
    else:
        effect = dict(paper_effect=v.paper_effect, paper_scaling=v.paper_scaling) if v.paper_effect is not None else {}
        new = (at_least if v.kind == "magnitude" else compare)(v.claim, a, b, **common, **effect)
        new = dataclasses.replace(new, paper_values=v.paper_values)
    if v.status == BELOW_TRIVIAL and new.status != BELOW_TRIVIAL and \
            all(s.get("trivial") is None for s in v.sides):
        # the builder's mark from outside the sides (e.g. a model behind a gain of gains)
        new = dataclasses.replace(new, status=BELOW_TRIVIAL, fragile=False, measured=v.measured)
    return dataclasses.replace(new, reason=v.reason)


def _elementary(v: Verdict):
    """The tests of ``v`` that enter a Holm family: its parts (recursively), or itself when it
    has a p-value."""
    if v.parts:
        return [t for p in v.parts for t in _elementary(p)]
    return [v] if v.p_value is not None else []


def holm(verdicts: Sequence[Verdict], alpha: float = FAMILY_ALPHA) -> list[str]:
    """The Holm-adjusted status of each verdict of one family (one paper's verdicts), at
    family-wise error ``alpha``. The family is every test with a p-value: each ordering /
    equivalence / non-inferiority / magnitude verdict, and each part of a monotone / all-of claim
    (the claim survives iff its parts decide it after adjustment: a reproduced combined claim
    needs every part to survive, a not-reproduced one one not-reproduced part). Holm's step-down:
    sort the m p-values, reject the i-th smallest (0-based) while ``p <= alpha / (m - i)``.

    A decided verdict whose test is not rejected becomes :data:`HOLM_INCONCLUSIVE`; undecided
    verdicts, exact checks (no sampling noise) and untestable / not-run claims keep their
    status."""
    tests = [t for v in verdicts for t in _elementary(v)]
    order = sorted(range(len(tests)), key=lambda i: tests[i].p_value)
    rejected, m = set(), len(tests)
    for rank, i in enumerate(order):
        if tests[i].p_value <= alpha / (m - rank):
            rejected.add(id(tests[i]))
        else:
            break

    def adjusted(v: Verdict) -> str:
        if v.status not in DECIDED:
            return v.status
        if v.parts:
            sub = [(p, adjusted(p)) for p in v.parts]
            if v.status == REPRODUCED:
                return REPRODUCED if all(s == REPRODUCED for _, s in sub) else HOLM_INCONCLUSIVE
            return v.status if any(s == v.status for _, s in sub) else HOLM_INCONCLUSIVE
        if v.p_value is None:  # an exact check
            return v.status
        return v.status if id(v) in rejected else HOLM_INCONCLUSIVE
    return [adjusted(v) for v in verdicts]


def decided(v: Verdict) -> bool:
    """Decided either way and not fragile (the acceptance's "decided")."""
    return v.status in DECIDED and not v.fragile


def tally(verdicts: Sequence[Verdict], alpha: float = FAMILY_ALPHA) -> dict:
    """Counts of one family: ``{"total", "by_status", "paper", "project", "testable",
    "decided", "fragile", "holm": {"by_status", "decided"}}`` per source (``"paper"`` and
    ``"project"`` each a dict of the same counts). Testable = not "not testable here"."""
    hs = holm(verdicts, alpha)

    def counts(idx):
        by, hby = {}, {}
        for i in idx:
            by[verdicts[i].status] = by.get(verdicts[i].status, 0) + 1
            hby[hs[i]] = hby.get(hs[i], 0) + 1
        return {"total": len(idx), "by_status": by,
                "testable": sum(verdicts[i].status != NOT_TESTABLE for i in idx),
                "decided": sum(decided(verdicts[i]) for i in idx),
                "fragile": sum(verdicts[i].fragile and verdicts[i].status in DECIDED for i in idx),
                "holm": {"by_status": hby,
                         "decided": sum(hs[i] in DECIDED and not verdicts[i].fragile for i in idx)}}
    every = list(range(len(verdicts)))
    return {**counts(every), **{s: counts([i for i in every if verdicts[i].source == s]) for s in SOURCES}}


# ----------------------------------------------------------------------------------------------
# power: seeds needed to detect an effect (python -m experiments.power)
# ----------------------------------------------------------------------------------------------

def gap_sd(v: Verdict) -> tuple[float | None, int]:
    """``(sd of the per-seed gap, n seeds)`` of an ordering-type verdict from its stored sides:
    the sd of the paired differences where the sides share their seeds, else
    ``sqrt(s_a^2 + s_b^2)`` (the sd of a difference of independent seeds); None with < 2."""
    if len(v.sides) != 2:
        return None, 0
    a, b = (_finite(_side_values(s)) for s in v.sides)
    if set(a) == set(b) and isinstance(v.sides[0]["values"], Mapping) and v.method != "Welch t":
        d = np.array([a[k] - b[k] for k in a])
        return (float(d.std(ddof=1)) if len(d) > 1 else None), len(d)
    if len(a) < 2 or len(b) < 2:
        return None, min(len(a), len(b))
    return float(math.sqrt(np.var(list(a.values()), ddof=1) + np.var(list(b.values()), ddof=1))), min(len(a), len(b))


def power(n: int, sd: float, effect: float, level: float = LEVEL) -> float:
    """The power of the paired two-sided ``level`` t-test with ``n`` seeds to find an effect of
    size ``effect`` (same units as ``sd``, the per-seed gap's sd) in its direction: ``P(T >
    t_crit)`` under the noncentral t with ``n - 1`` degrees of freedom and noncentrality
    ``|effect| sqrt(n) / sd``."""
    from scipy import stats
    if n < 2:
        return 0.0
    if sd == 0:
        return 1.0 if effect != 0 else 0.0
    crit = _t(level, n - 1)
    return float(stats.nct.sf(crit, n - 1, abs(effect) * math.sqrt(n) / sd))


def seeds_needed(sd: float | None, effect: float | None, *, level: float = LEVEL, target: float = 0.8,
                 n_max: int = 100_000) -> int | None:
    """The fewest seeds (paired, >= 2) whose ``level`` interval excludes 0 with probability >=
    ``target`` when the true gap is ``effect`` and the per-seed gap's sd is ``sd``
    (:func:`power`, iterating on n); None when undefined (no sd / no effect / effect 0) or beyond
    ``n_max``."""
    if sd is None or effect is None or effect == 0 or not math.isfinite(sd):
        return None
    n = 2
    # start near the normal approximation, then walk up (power is increasing in n)
    from scipy import stats
    z = stats.norm.ppf(0.5 + level / 2) + stats.norm.ppf(target)
    n = max(2, int((z * sd / abs(effect)) ** 2) - 2)
    if n > n_max:
        return None
    while power(n, sd, effect, level) < target:
        n += 1
        if n > n_max:
            return None
    while n > 2 and power(n - 1, sd, effect, level) >= target:
        n -= 1
    return n
