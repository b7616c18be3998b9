"""Config of the latency figure of Koga et al. 2023 (Figure 1, Prop. 3.1; experiments/latency_figure.py).

``get_config(scale)`` with ``scale`` in {"smoke", "small", "paper"} (``configs.common.from_scale``);
overrides after the scale: ``"small,trials=500,seed=3"``. The table's (N, C, p, q, lambda, Monte
Carlo method) cases are data here (`TABLE_CASES`); the figure uses availability ``figure_p`` and a
server that oversamples, q = min(1, ``oversample`` C / N) >= C / N (the upper bound's assumption).
"""
from __future__ import annotations

import dataclasses

from configs.common import ConfigError, check, from_scale

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


@dataclasses.dataclass(frozen=True)
class LatencyFigureConfig:
    seed: int = 0                         # the Monte Carlo generator
    trials: int = 2000                    # Monte Carlo trials per point
    figure_cohorts: tuple = (100, 1_000, 5_000)  # C of the curves
    figure_p: float = 0.5                 # availability ratio of the figure
    oversample: float = 1.1               # q = min(1, oversample * C / N)
    expansion_alpha: float = 0.1          # panel (b): N vs the population expanded to N / alpha
    num_points: int = 40                  # population sizes per curve, log-spaced 2C .. max_population
    max_population: int = 10**7
    table_cases: tuple = TABLE_CASES

    def __post_init__(self):
        check(self, positive=("trials", "oversample", "num_points", "max_population"),
              non_negative=("seed",), open_unit=("expansion_alpha",))
        if not 0 <= self.figure_p <= 1:
            raise ConfigError(f"figure_p must be in [0, 1], got {self.figure_p}")
        if self.oversample < 1:
            raise ConfigError(f"oversample must be >= 1 (q >= C/N), got {self.oversample}")
        if self.oversample * self.figure_p >= 1:  # k = C - Npq <= 0 for every N: E[U_k] = 0
            raise ConfigError(f"oversample * figure_p must be < 1, got {self.oversample:g} * "
                              f"{self.figure_p:g}: the server would find a full cohort at once for every N "
                              "(every latency of the figure 0)")
        if not self.figure_cohorts or any(c < 1 for c in self.figure_cohorts):
            raise ConfigError(f"figure_cohorts must be integers >= 1, got {self.figure_cohorts}")
        if any(not isinstance(c, tuple) or len(c) != 6 for c in self.table_cases):
            raise ConfigError("table_cases must be (N, C, p, q, lambda, method) tuples")
        if 2 * max(self.figure_cohorts) >= self.max_population:
            raise ConfigError("max_population must exceed twice the largest figure cohort")


BASE = LatencyFigureConfig()

SCALES = {
    "smoke": dict(trials=40, num_points=8, seed=1),  # seconds, for tests
    "small": dict(),                                  # the figure in docs (a few seconds)
    "paper": dict(trials=20_000, num_points=80),      # smoother Monte Carlo points
}


def get_config(arg: str = "small") -> LatencyFigureConfig:
    return from_scale(BASE, SCALES, arg)


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.nothing("a Monte Carlo simulation of device-sampling latency: no user data")
