"""Config of the correlated-noise comparison (issue 13): DP-FTRL with tree aggregation vs
matrix-factorization DP-FTRL (banded, BLT) vs DP-FedAvg at one epsilon, on the LM task of
``configs/lm_fl.py`` at the same scale.

``get_config("small,seeds=0/1/2,target_epsilon=18.7")``; the FL fields come from
``configs/lm_fl.py`` (overrides that are not this config's fields go there).
"""
from __future__ import annotations

import dataclasses

from configs.common import ConfigError, check, with_lm_config
from configs.lm_fl import ALGORITHMS, get_config as lm_config


@dataclasses.dataclass(frozen=True)
class MFComparisonConfig:
    lm: object                                   # configs.lm_fl.LMFLConfig shared by every row
    algorithms: tuple = ("dp_ftrl", "dp_mf_banded", "dp_mf_blt", "dp_fedavg")
    seeds: tuple = (0,)

    def __post_init__(self):
        check(self)
        bad = [a for a in self.algorithms if a not in ALGORITHMS or a == "fedavg"]
        if not self.algorithms or bad:
            raise ConfigError(f"algorithms = {self.algorithms!r}: each must be a DP algorithm of "
                              f"{ALGORITHMS[1:]}")
        if not self.seeds or not all(isinstance(s, int) and s >= 0 for s in self.seeds):
            raise ConfigError(f"seeds = {self.seeds!r}: non-negative integers")


SCALES = {"smoke": dict(), "small": dict(seeds=(0, 1, 2)), "paper": dict(seeds=(0, 1, 2))}
LM_SCALE = {"smoke": "smoke,rounds=3,eval_every=3", "small": "small",
            "paper": "paper,noise_multiplier=None,target_epsilon=1.77,simulated_population=None"}


def get_config(arg: str = "small") -> MFComparisonConfig:
    cfg = with_lm_config(MFComparisonConfig, SCALES, LM_SCALE, arg, lm_config,
                         derived={"algorithm": "each row sets it: set algorithms=a/b/..."})
    if cfg.lm.target_epsilon is None:
        raise ConfigError("the comparison is at equal epsilon: set target_epsilon")
    return cfg


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.mf_comparison_plan(cfg)
