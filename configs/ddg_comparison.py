"""Config of the distributed discrete Gaussian vs central Gaussian comparison (issue 13):
DP-FedAvg on fixed-size cohorts with the noise added centrally (continuous Gaussian) or by the
clients under simulated secure aggregation (DDG, Kairouz et al. 2021) at several bit widths,
all at the same noise multiplier z (the std of the sum's noise over C), on the LM task of
``configs/lm_fl.py`` at the same scale.

``get_config("small,bits=8/16,seeds=0/1")``; the FL fields come from ``configs/lm_fl.py``
(overrides that are not this config's fields go there).
"""
from __future__ import annotations

import dataclasses

from configs.common import ConfigError, check, with_lm_config
from configs.lm_fl import get_config as lm_config


@dataclasses.dataclass(frozen=True)
class DDGComparisonConfig:
    lm: object                       # configs.lm_fl.LMFLConfig shared by every row (z fixed)
    bits: tuple = (8, 12, 16, 20)    # secure aggregation's modulus 2^bits, one DDG row each
    seeds: tuple = (0,)
    central_row: bool = True         # the central Gaussian row (False: the DDG rows only; an executor slice)

    def __post_init__(self):
        check(self)
        if any(not isinstance(b, int) or not 2 <= b <= 31 for b in self.bits) or not (self.bits or self.central_row):
            raise ConfigError(f"bits = {self.bits!r}: integers in [2, 31]")
        if not self.seeds or not all(isinstance(s, int) and s >= 0 for s in self.seeds):
            raise ConfigError(f"seeds = {self.seeds!r}: non-negative integers")
        if self.lm.noise_multiplier is None or self.lm.target_epsilon is not None:
            raise ConfigError("the comparison is at equal noise: set noise_multiplier and no "
                              "target_epsilon (each row reports its own epsilon)")


SCALES = {"smoke": dict(bits=(8, 16)), "small": dict(seeds=(0, 1, 2)), "paper": dict(seeds=(0, 1, 2))}
# small: the LM task of lm_fl:small with half its rounds (DDG's per-client encoding of a 2^20-d
# update roughly doubles a round's time on this 2-core CPU)
LM_SCALE = {"smoke": "smoke,rounds=3,eval_every=3,target_epsilon=None,noise_multiplier=1.0",
            "small": "small,rounds=60,eval_every=20,target_epsilon=None,noise_multiplier=1.0",
            "paper": "paper,noise_multiplier=1.0,simulated_population=None"}


def get_config(arg: str = "small") -> DDGComparisonConfig:
    return with_lm_config(DDGComparisonConfig, SCALES, LM_SCALE, arg, lm_config,
                          derived={n: "each row sets it: set bits=a/b/..." for n in ("algorithm", "ddg_bits")})


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.ddg_comparison_plan(cfg)
