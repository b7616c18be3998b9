"""The one verdict function of the project: a paper's claim against what we measured.

Every artefact (``experiments/*.py``, the recipes, FreD, population expansion) judges its claims
through these functions, so every verdict on the results page (``python -m experiments.results``)
means the same thing (docs: DESIGN.md, "Verdicts"; issue 23):

- :func:`compare` — "A beats B" from the per-seed values of both sides. The gap is
  ``mean(A) - mean(B)`` with a two-sided ``level`` (default 90 %) t-interval: **paired** on the
  per-seed differences when both sides are ``{seed: value}`` mappings over the same seeds
  (``d_i = a_i - b_i``, ``n - 1`` degrees of freedom), **Welch** otherwise (``se^2 = s_a^2/n_a +
  s_b^2/n_b``, Welch–Satterthwaite degrees of freedom). Status:

  ``"inconclusive (below the trivial baseline)"`` when either side's mean is not better than its
  trivial baseline (e.g. the most-frequent-token accuracy; for a lower-is-better metric "better"
  means below it) — checked first, so a comparison of models that learned nothing is never
  "reproduced" or "not reproduced"; ``"inconclusive (too few seeds)"`` when the interval is
  undefined (n < 2 pairs, or a side with n < 2 unpaired); ``"reproduced"`` when the interval
  excludes 0 in the claimed direction; ``"not reproduced"`` when it excludes 0 in the opposite
  direction; ``"inconclusive (interval contains 0)"`` otherwise.
- :func:`equivalence` — a "negligible"-type claim, TOST-style: ``"equivalent"`` when the
  ``level`` interval of the gap lies inside ``[-margin, margin]`` (the two one-sided tests at
  ``(1 - level) / 2`` each: 5 % each for the 90 % interval), ``"not shown equivalent"``
  otherwise; the trivial-baseline and too-few-seeds rules as above.
- :func:`noninferior` — "A is at least as good as B" within a stated margin: the interval's
  worse end above ``-margin`` (oriented by the metric).
- :func:`monotone` — "the metric decreases (increases) along xs": every consecutive pair by
  :func:`compare` (each at ``level``, no multiplicity correction; the parts are kept).
- :func:`combine` — a claim that holds iff each of its parts does ("X is the best scheme": X
  beats every other scheme).
- :func:`check` — a claim about an exact computation (no sampling noise: a closed form, a
  deterministic statistic, every observed trial): ``"reproduced"`` / ``"not reproduced"``.
- :func:`not_testable` / :func:`not_run` — a claim that cannot be tested here (with the reason
  and the nearest feasible contrast) or whose runs do not exist yet.

A :class:`Verdict` keeps the numbers behind it (per-seed values, trivial baselines, interval),
so ``python -m experiments.results --json`` can print them and a compact committed summary can
rebuild the page without the runs.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

__all__ = ["Verdict", "compare", "equivalence", "noninferior", "monotone", "combine", "check",
           "not_testable", "not_run", "legacy", "t_interval", "unigram_perplexity", "STATUSES",
           "REPRODUCED", "NOT_REPRODUCED", "INCONCLUSIVE", "BELOW_TRIVIAL", "TOO_FEW_SEEDS",
           "EQUIVALENT", "NOT_EQUIVALENT", "NOT_TESTABLE", "NOT_RUN", "LEGACY", "LEVEL"]

LEVEL = 0.9
REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
INCONCLUSIVE = "inconclusive (interval contains 0)"
BELOW_TRIVIAL = "inconclusive (below the trivial baseline)"
TOO_FEW_SEEDS = "inconclusive (too few seeds)"
EQUIVALENT, NOT_EQUIVALENT = "equivalent", "not shown equivalent"
NOT_TESTABLE, NOT_RUN = "not testable here", "not run yet"
LEGACY = "inconclusive (old statistics: re-run)"
STATUSES = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, BELOW_TRIVIAL, TOO_FEW_SEEDS, EQUIVALENT,
            NOT_EQUIVALENT, NOT_TESTABLE, NOT_RUN, LEGACY)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A paper's claim and what we measured.

    ``status``: one of :data:`STATUSES`; ``measured``: the numbers in words. The rest is the
    evidence, JSON-ready: ``kind`` (``"ordering"``, ``"equivalence"``, ``"monotone"``,
    ``"exact"``, ``"untestable"``, ``"not run"``); ``gap`` = mean(A) - mean(B) (raw, not
    oriented) and ``ci`` its ``level`` interval; ``method`` (``"paired t"``, ``"Welch t"``);
    ``higher_is_better`` (the metric's orientation; the claim is "A better than B"); ``margin``
    (equivalence); ``sides``: per side ``{"name", "values" ({seed: value} or [values]), "mean",
    "n", "trivial"}``; ``parts``: the pairwise verdicts of a :func:`monotone` claim; ``reason``.
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

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"verdict status must be one of {list(STATUSES)}, got {self.status!r}")
        if self.ci is not None:
            object.__setattr__(self, "ci", tuple(self.ci))
        object.__setattr__(self, "sides", tuple(self.sides))
        object.__setattr__(self, "parts", tuple(p if isinstance(p, Verdict) else Verdict(**p)
                                                for p in self.parts))

    def to_json(self) -> dict:
        """A plain dict (``Verdict(**d)`` reads it back)."""
        return dataclasses.asdict(self)


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


def t_interval(a, b, *, level: float = LEVEL, paired: bool | None = None):
    """The ``level`` two-sided t-interval of mean(a) - mean(b).

    ``a``, ``b``: per-seed values, ``{seed: value}`` mappings or sequences. ``paired=None``:
    paired when both are mappings over the same seeds (n >= 2). Returns ``(gap, (lo, hi) or None,
    method, n_or_df)``: paired — mean of ``d = a - b`` ± ``t(n-1) s_d / sqrt(n)``; Welch — the
    difference of means ± ``t(df) sqrt(s_a^2/n_a + s_b^2/n_b)`` with the Welch–Satterthwaite
    ``df``. The interval is None when undefined (fewer than 2 pairs / 2 values on a side).
    """
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
            return gap, None, "paired t", n
        half = _t(level, n - 1) * float(d.std(ddof=1)) / math.sqrt(n)
        return gap, (gap - half, gap + half), "paired t", n
    xa, xb = np.array(list(fa.values())), np.array(list(fb.values()))
    gap = float(xa.mean() - xb.mean())
    if len(xa) < 2 or len(xb) < 2:
        return gap, None, "Welch t", None
    va, vb = float(xa.var(ddof=1)) / len(xa), float(xb.var(ddof=1)) / len(xb)
    se = math.sqrt(va + vb)
    if se == 0.0:  # both sides constant over seeds: the interval is the point
        return gap, (gap, gap), "Welch t", float("inf")
    den = va ** 2 / (len(xa) - 1) + vb ** 2 / (len(xb) - 1)
    # Welch-Satterthwaite; where the squares underflow (variances ~1e-160 and below) its
    # lower bound min(n_a, n_b) - 1, the conservative (wider) choice
    df = (va + vb) ** 2 / den if den > 0 else float(min(len(xa), len(xb)) - 1)
    half = _t(level, df) * se
    return gap, (gap - half, gap + half), "Welch t", df


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


def compare(claim: str, a, b, *, higher_is_better: bool, trivial, names: tuple[str, str] = ("A", "B"),
            level: float = LEVEL, paired: bool | None = None, digits: int = 4) -> Verdict:
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
    """
    ta, tb = _pair(trivial)
    sa, ok_a, text_a = _side(names[0], a, ta, higher_is_better, digits)
    sb, ok_b, text_b = _side(names[1], b, tb, higher_is_better, digits)
    gap, ci, method, ndf = t_interval(a, b, level=level, paired=paired)
    sign = 1.0 if higher_is_better else -1.0
    if not (ok_a and ok_b):
        status = BELOW_TRIVIAL
    elif ci is None:
        status = TOO_FEW_SEEDS
    elif sign * ci[0] > 0 and sign * ci[1] > 0:
        status = REPRODUCED
    elif sign * ci[0] < 0 and sign * ci[1] < 0:
        status = NOT_REPRODUCED
    else:
        status = INCONCLUSIVE
    orient = "higher is better" if higher_is_better else "lower is better"
    measured = (f"{text_a} vs {text_b}; {_interval_text(gap, ci, method, ndf, level, digits)} "
                f"(A - B, {orient})")
    return Verdict(claim, status, measured, "ordering", gap, ci, level, method, higher_is_better,
                   None, (sa, sb))


def equivalence(claim: str, a, b, *, margin: float, higher_is_better: bool, trivial,
                names: tuple[str, str] = ("A", "B"), level: float = LEVEL, paired: bool | None = None,
                digits: int = 4) -> Verdict:
    """Verdict on "A and B differ negligibly": equivalent when the ``level`` interval of
    mean(A) - mean(B) lies inside ``[-margin, margin]`` (TOST at ``(1 - level)/2`` per side);
    ``margin`` in the metric's units, stated in the claim's measured text."""
    if not margin > 0:
        raise ValueError(f"equivalence({claim!r}): margin must be > 0, got {margin!r}")
    ta, tb = _pair(trivial)
    sa, ok_a, text_a = _side(names[0], a, ta, higher_is_better, digits)
    sb, ok_b, text_b = _side(names[1], b, tb, higher_is_better, digits)
    gap, ci, method, ndf = t_interval(a, b, level=level, paired=paired)
    if not (ok_a and ok_b):
        status = BELOW_TRIVIAL
    elif ci is None:
        status = TOO_FEW_SEEDS
    elif -margin < ci[0] and ci[1] < margin:
        status = EQUIVALENT
    else:
        status = NOT_EQUIVALENT
    measured = (f"{text_a} vs {text_b}; {_interval_text(gap, ci, method, ndf, level, digits)} "
                f"(A - B); equivalence margin ±{margin:g}")
    return Verdict(claim, status, measured, "equivalence", gap, ci, level, method, higher_is_better,
                   float(margin), (sa, sb))


def noninferior(claim: str, a, b, *, margin: float, higher_is_better: bool, trivial,
                names: tuple[str, str] = ("A", "B"), level: float = LEVEL, paired: bool | None = None,
                digits: int = 4) -> Verdict:
    """Verdict on "A is at least as good as B" (a ">=" claim) within ``margin``: reproduced when
    the ``level`` interval of the gap lies entirely on the good side of ``-margin`` (oriented by
    ``higher_is_better``), not reproduced when it lies entirely beyond it, inconclusive otherwise;
    the trivial-baseline and too-few-seeds rules of :func:`compare`."""
    if not margin > 0:
        raise ValueError(f"noninferior({claim!r}): margin must be > 0, got {margin!r}")
    v = compare(claim, a, b, higher_is_better=higher_is_better, trivial=trivial, names=names,
                level=level, paired=paired, digits=digits)
    if v.status in (BELOW_TRIVIAL, TOO_FEW_SEEDS):
        status = v.status
    else:
        sign = 1.0 if higher_is_better else -1.0
        lo, hi = sorted((sign * v.ci[0], sign * v.ci[1]))
        status = REPRODUCED if lo > -margin else NOT_REPRODUCED if hi < -margin else INCONCLUSIVE
    return dataclasses.replace(v, status=status, kind="non-inferiority", margin=float(margin),
                               measured=v.measured + f"; non-inferiority margin {margin:g}")


def monotone(claim: str, xs: Sequence, values: Sequence, *, increasing: bool, higher_is_better: bool,
             trivial, label: str = "x", level: float = LEVEL, paired: bool | None = None,
             digits: int = 4) -> Verdict:
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
                             paired=paired, digits=digits))
    return combine(claim, parts, kind="monotone",
                   reason=f"every consecutive pair at {100 * level:g}% (no multiplicity correction)")


def combine(claim: str, parts: Sequence[Verdict], *, kind: str = "all of", reason: str = "") -> Verdict:
    """A claim that holds iff every part does (e.g. "X is the best": X beats each other one).

    Reproduced when every part is; not reproduced when some part is (its interval excludes 0
    against the claim); otherwise the first of below the trivial baseline / too few seeds /
    interval contains 0 among the parts. The parts are kept in ``parts``."""
    if not parts:
        raise ValueError(f"combine({claim!r}): no parts")
    st = [p.status for p in parts]
    if all(s == REPRODUCED for s in st):
        status = REPRODUCED
    elif NOT_REPRODUCED in st:
        status = NOT_REPRODUCED
    else:
        status = next((s for s in (BELOW_TRIVIAL, TOO_FEW_SEEDS, INCONCLUSIVE) if s in st), INCONCLUSIVE)
    measured = "; ".join(f"[{p.claim}: {p.status}] {p.measured}" for p in parts)
    return Verdict(claim, status, measured, kind, level=parts[0].level,
                   higher_is_better=parts[0].higher_is_better, parts=tuple(parts),
                   reason=reason or f"each of {len(parts)} comparisons (no multiplicity correction)")


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


def check(claim: str, holds: bool, measured: str, *, basis: str) -> Verdict:
    """A claim about an exact computation (``basis`` says which: a closed form, a deterministic
    statistic of fixed data, every observed trial): reproduced iff ``holds``."""
    return Verdict(claim, REPRODUCED if holds else NOT_REPRODUCED, measured, "exact",
                   reason=basis)


def not_testable(claim: str, reason: str) -> Verdict:
    """A claim this project cannot test, with the reason (and the nearest feasible contrast)."""
    if not reason:
        raise ValueError(f"not_testable({claim!r}): give the reason")
    return Verdict(claim, NOT_TESTABLE, reason, "untestable", reason=reason)


def not_run(claim: str, reason: str) -> Verdict:
    """A testable claim whose runs do not exist (yet), with what would run them."""
    if not reason:
        raise ValueError(f"not_run({claim!r}): give the reason")
    return Verdict(claim, NOT_RUN, reason, "not run", reason=reason)


def legacy(d: dict) -> Verdict:
    """A verdict written under the old rule ("reproduced (within noise)" by sqrt(s_a^2+s_b^2)):
    never shown as reproduced; marked for a re-run, the old text kept."""
    return Verdict(d["claim"], LEGACY, f"old status {d.get('status')!r}: {d.get('measured', '')}",
                   "legacy", reason="computed by the old 'within noise' rule")
