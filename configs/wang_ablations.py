"""Config of the Wang et al. 2023 ablations: Tables 4/5 (timing T' of public mid-training, with
and without distribution matching) and Figures 2/4 (accuracy after private FL vs distillation
steps and vs top-k logits).

``get_config("small,ablations=t_prime,seeds=0/1")``: fields of this class apply to it, every
other override (``rounds=80``, ``epsilons=1.77/18.71``, ``q=0.25`` ...) to the wrapped
``configs/public_training.py`` config (``lm``) at the same scale. ``seeds`` and ``epsilons`` are
those of ``lm``.
"""
from __future__ import annotations

import dataclasses

from configs.common import ConfigError, check, with_lm_config
from configs.public_training import PUBLISHED, get_config as public_config

ABLATIONS = ("t_prime", "distill_steps", "topk")


@dataclasses.dataclass(frozen=True)
class WangAblationsConfig:
    lm: object                                          # configs.public_training config
    ablations: tuple = ABLATIONS                        # which ablations to run
    t_prime_fractions: tuple = (0.0, 0.25, 0.5, 0.75, 1.0)  # T'/T (Tables 4/5: 0..1600 of 1600)
    distill_steps_grid: tuple = (0, 50, 150, 300)       # Figure 2a/b (pretrain_distill row)
    topk_grid: tuple = (1, 5, 10, 20)                   # Figure 2c / 4 (pretrain_distill row)

    def __post_init__(self):
        check(self)
        bad = set(self.ablations) - set(ABLATIONS)
        if not self.ablations or bad:
            raise ConfigError(f"ablations must be a non-empty subset of {ABLATIONS}, got "
                              f"{self.ablations!r}")
        fr = self.t_prime_fractions
        if not fr or any(not (isinstance(f, (int, float)) and 0 <= f <= 1) for f in fr) \
                or len(set(fr)) != len(fr):
            raise ConfigError(f"t_prime_fractions must be distinct numbers in [0, 1], got {fr!r}")
        T = self.lm.rounds
        if any(abs(f * T - round(f * T)) > 1e-9 for f in fr):
            raise ConfigError(f"every t_prime_fraction * rounds must be a whole round; got "
                              f"{fr!r} with rounds={T}")
        for name, grid, lo in (("distill_steps_grid", self.distill_steps_grid, 0),
                               ("topk_grid", self.topk_grid, 1)):
            if not grid or any(not isinstance(v, int) or isinstance(v, bool) or v < lo
                               for v in grid) or len(set(grid)) != len(grid):
                raise ConfigError(f"{name} must be distinct integers >= {lo}, got {grid!r}")

    def t_primes(self) -> list[int]:
        """T' in rounds, ascending."""
        return sorted(round(f * self.lm.rounds) for f in self.t_prime_fractions)


SCALES = {
    "smoke": dict(distill_steps_grid=(0, 2), topk_grid=(1, 4)),
    "small": dict(distill_steps_grid=(0, 50, 150, 300)),
    "paper": dict(distill_steps_grid=(0, 2000, 4000, 8000, 16000), topk_grid=(1, 5, 10, 20)),
}
# rounds=4 at smoke so that T/4 is a whole round; small: T=60 (T/4 = 15)
# paper: the LSTM only (Tables 4/5 and Figures 2/4 are the LSTM's), at its published server lr per
# epsilon and clip (configs.public_training.PUBLISHED)
LM_SCALE = {"smoke": "smoke,rounds=4,eval_every=4,checkpoint_every=4", "small": "small",
            "paper": "paper,archs=none,student_server_lrs=none,epsilon_server_lrs="
                     + "/".join(str(PUBLISHED["lstm"][e]) for e in (1.77, 18.71))}


def get_config(arg: str = "small") -> WangAblationsConfig:
    return with_lm_config(WangAblationsConfig, SCALES, LM_SCALE, arg, public_config)


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.wang_ablations_plan(cfg)
