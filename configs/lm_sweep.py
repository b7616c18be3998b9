"""Config of the hyper-parameter sweep of private LM FL (Wang et al. 2023, App. C): server lr,
client lr and clip norm at a given noise multiplier / epsilon, selected on validation accuracy.

``get_config("small,server_lrs=0.5/1/2,target_epsilon=1.77")``: fields of this class apply to it,
every other override to the wrapped ``configs/lm_fl.py`` config (``lm``) at the same scale.
"""
from __future__ import annotations

import dataclasses

from configs.common import ConfigError, check, with_lm_config
from configs.lm_fl import get_config as lm_config

# Wang et al. 2023, App. C (clip norms: the values adaptive clipping mostly landed on)
PAPER_SERVER_LRS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
PAPER_CLIENT_LRS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
PAPER_CLIP_NORMS = (0.1, 0.3, 0.4, 1.0)


@dataclasses.dataclass(frozen=True)
class LMSweepConfig:
    lm: object                              # configs.lm_fl.LMFLConfig of every point
    server_lrs: tuple = PAPER_SERVER_LRS
    client_lrs: tuple = PAPER_CLIENT_LRS
    clip_norms: tuple = PAPER_CLIP_NORMS
    seeds: tuple = (0,)

    def __post_init__(self):
        check(self)
        for name in ("server_lrs", "client_lrs", "clip_norms"):
            vals = getattr(self, name)
            if not vals or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0
                               for v in vals) or len(set(vals)) != len(vals):
                raise ConfigError(f"{name} must be distinct positive numbers, got {vals!r}")
        if not self.seeds or any(not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ConfigError(f"seeds must be integers >= 0, got {self.seeds!r}")
        if self.lm.algorithm != "fedavg" and self.lm.noise_multiplier is None \
                and self.lm.target_epsilon is None:
            raise ConfigError(f"{self.lm.algorithm} needs noise_multiplier or target_epsilon")


SCALES = {
    # seconds: a 2x2 grid of 2-round runs
    "smoke": dict(server_lrs=(0.5, 1.0), client_lrs=(0.1, 0.5), clip_norms=(1.0,)),
    # a 3x2x2 sub-grid of the paper's around the defaults, 3 seeds (36 small lm_fl runs)
    "small": dict(server_lrs=(0.5, 1.0, 2.0), client_lrs=(0.1, 0.5), clip_norms=(0.3, 1.0), seeds=(0, 1, 2)),
    # the paper's grid (144 points per noise level), for GPU/TPU
    "paper": dict(seeds=(0,)),
}
LM_SCALE = {"smoke": "smoke,rounds=2,eval_every=2", "small": "small", "paper": "paper"}


def get_config(arg: str = "small") -> LMSweepConfig:
    return with_lm_config(LMSweepConfig, SCALES, LM_SCALE, arg, lm_config)


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.lm_sweep_plan(cfg)
