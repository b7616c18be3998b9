"""Training schemes of Koga et al. 2023 (Sec. 3.2, Sec. 4.2): the mechanics of a row of Table 1.

A `TrainingScheme` is data: its model variant, its DP-FL `Stage`s (populations, example domains,
cohort C or alpha*C, Eq. 3 weighting, share of the rounds, (eps, delta) budget each), the private
unigram release it needs, and its total (eps, delta) per user. Table 1's eight schemes are defined
in ``configs/population_expansion.py`` (``TRAINING_SCHEMES``); `fedpriv.expansion.pipeline` runs
one.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from fedpriv.dp.accounting import check_delta, check_epsilon
from fedpriv.expansion.data import POPULATION_LABELS, SOURCE, TARGET, DomainDataset
from fedpriv.expansion.weights import check_alpha
from fedpriv.util import check_int

__all__ = ["Stage", "TrainingScheme", "PlannedSpend", "schemes_markdown"]


@dataclasses.dataclass(frozen=True)
class Stage:
    """One DP-FL training stage of a scheme.

    populations: which clients are sampled (SOURCE and/or TARGET population).
    example_domains: which of their examples train (by per-example domain id).
    cohort: "C" or "alpha*C" (T-only and finetuning stages use alpha*C so their latency matches
      the C-cohort stages on the alpha-times-larger population, Sec. 3.2 PT).
    weighted: multiply per-example losses by Eq. 3 weights.
    rounds_fraction: this stage's share of the scheme's server rounds (PT: 1000 + 1000 of 2000).
    budget: (eps, delta) the stage's training spends on each user of its populations.
    """

    populations: tuple[int, ...]
    example_domains: tuple[int, ...]
    cohort: str
    weighted: bool
    rounds_fraction: float
    budget: tuple[float, float]

    def __post_init__(self):
        if self.cohort not in ("C", "alpha*C"):
            raise ValueError(f"cohort must be 'C' or 'alpha*C', got {self.cohort!r}")

    def cohort_size(self, C: int, alpha: float) -> int:
        """C, or max(1, round(alpha * C)) for an alpha*C stage (paper: 5000 / 500; 400 / 40)."""
        C = check_int(C, "C", 1)
        return C if self.cohort == "C" else max(1, round(check_alpha(alpha) * C))

    @property
    def population_labels(self) -> tuple[str, ...]:
        return tuple(POPULATION_LABELS[p] for p in self.populations)

    def clients(self, ds: DomainDataset, split: str = "train") -> Mapping:
        """The stage's clients of ``ds`` with only its example domains (`select_clients`)."""
        return ds.clients(split, self.populations, self.example_domains)


@dataclasses.dataclass(frozen=True)
class PlannedSpend:
    """One ledger entry a scheme makes: (eps, delta) charged to each user of ``populations``."""

    name: str
    epsilon: float
    delta: float
    populations: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class TrainingScheme:
    """A row of Koga et al. Table 1.

    model: "lstm" | "dsdsr" | "demix" (DSDSR: domain-shared + domain-specific representations;
      DEMix: domain-expert feed-forward layers; both get the per-example 'domain' ids).
    budget: total (eps, delta) per user of the scheme: the budget of its one ledger (the paper:
      (2, 1e-6), Sec. 4.2).
    unigram_budget: (eps0, delta0) of the private unigrams (released on S and on T separately,
      each costing eps0 to its own users by parallel composition), or None if unused.
    row: the scheme's row in its table; it seeds the scheme's unigram noise, sampling and
      training (`fedpriv.expansion.pipeline`), so two rows never share randomness.
    """

    name: str
    model: str
    stages: tuple[Stage, ...]
    budget: tuple[float, float]
    unigram_budget: tuple[float, float] | None = None
    row: int = 0

    def __post_init__(self):
        if self.model not in ("lstm", "dsdsr", "demix"):
            raise ValueError(f"model must be lstm, dsdsr or demix, got {self.model!r}")
        if not math.isclose(sum(s.rounds_fraction for s in self.stages), 1.0):
            raise ValueError("stage rounds fractions must sum to 1")
        check_epsilon(self.budget[0])
        check_delta(self.budget[1])
        check_int(self.row, "row", 0)

    @property
    def weighted(self) -> bool:
        return any(s.weighted for s in self.stages)

    def stage_rounds(self, total_rounds: int) -> tuple[int, ...]:
        """Rounds per stage (the paper: 2000 total; PT/IWPT 1000 + 1000); sums to total."""
        total_rounds = check_int(total_rounds, "total_rounds", 1)
        rounds = [round(s.rounds_fraction * total_rounds) for s in self.stages[:-1]]
        return tuple(rounds + [total_rounds - sum(rounds)])

    def privacy_plan(self, labels: Mapping[int, str] | None = None) -> tuple[PlannedSpend, ...]:
        """The ledger entries of the scheme in order; ``labels`` maps SOURCE/TARGET to ledger
        population labels (default "S"/"T")."""
        labels = dict(POPULATION_LABELS if labels is None else labels)
        plan = []
        if self.unigram_budget is not None:
            for pop in (SOURCE, TARGET):
                plan.append(PlannedSpend(f"{self.name}/unigrams[{labels[pop]}]",
                                         *self.unigram_budget, (labels[pop],)))
        for i, s in enumerate(self.stages):
            plan.append(PlannedSpend(f"{self.name}/stage{i}", *s.budget,
                                     tuple(labels[p] for p in s.populations)))
        return tuple(plan)

    def per_population_budget(self) -> dict[str, tuple[float, float]]:
        """Total (eps, delta) per user of each population by basic sequential composition within
        a population (spends on disjoint populations compose in parallel)."""
        tot: dict[str, list[float]] = {}
        for sp in self.privacy_plan():
            for pop in sp.populations:
                e = tot.setdefault(pop, [0.0, 0.0])
                e[0] += sp.epsilon
                e[1] += sp.delta
        return {k: (v[0], v[1]) for k, v in tot.items()}


def schemes_markdown(schemes: Sequence[TrainingScheme], *,
                     noise_cohort: int = 5000, train_cohort: int = 400, alpha: float = 0.1,
                     rounds: int = 2000) -> str:
    """Table 1's schemes as a Markdown table: per stage the population/examples, cohort sizes
    (noise-calibration / actual training, Sec. 4.2: 5000 / 400), rounds, weighting, and each
    scheme's (eps, delta) per population."""
    dom = {SOURCE: "S", TARGET: "T"}
    lines = ["| scheme | model | stages: clients[examples] cohort (noise/train) x rounds | "
             "unigrams (eps0, delta0) | (eps, delta) per population |",
             "|---|---|---|---|---|"]
    for s in schemes:
        stages = []
        for st, r in zip(s.stages, s.stage_rounds(rounds)):
            pops = "+".join(dom[p] for p in st.populations)
            exs = "+".join(dom[d] for d in st.example_domains)
            stages.append(f"{pops}[{exs}] {st.cohort_size(noise_cohort, alpha)}/"
                          f"{st.cohort_size(train_cohort, alpha)} x {r}"
                          f"{' weighted' if st.weighted else ''} @ {st.budget}")
        budget = ", ".join(f"{k}: ({e:g}, {d:g})" for k, (e, d) in
                           sorted(s.per_population_budget().items()))
        lines.append(f"| {s.name} | {s.model} | {'; then '.join(stages)} | "
                     f"{s.unigram_budget or '-'} | {budget} |")
    return "\n".join(lines)

