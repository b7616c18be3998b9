"""Config of the privacy-utility table (Wang et al. 2023 §2, Table 1 "w/o pre-training"; Figure 1
with several tokenizers): FedAvg and DP-FTRL at epsilon ~18.71 and ~1.77 on one LM set-up, under
the paper-noise protocol (``fedpriv.dp.population``) at ``small`` and ``paper`` alike: the DP rows
run Wang et al.'s per-round noise on the averaged update (z = 1.13 / 8.83 for a cohort of 100;
``small`` trains 16 clients per round with the noise of 100), and their epsilons are SIMULATED for
Wang et al.'s StackOverflow population (342,477 users, each at most once); every run reports the
epsilon it SPENDS on chitchat's users beside it. ``small`` runs 800 of the paper's 1,600 rounds
(the most this CPU affords for 27 runs: 3 tokenizers x 3 rows x 3 seeds; the simulated epsilons
of 800 rounds are below the labels) with the hyper-parameters chosen on validation
(``configs.lm_fl.TUNED``).

``get_config("small,seeds=0/1/2,tokenizers=sentencepiece/word_public")``; the FL fields come
from ``configs/lm_fl.py`` at the same scale.
"""
from __future__ import annotations

import dataclasses

from configs.common import ConfigError, check, with_lm_config
from configs.lm_fl import TOKENIZERS, get_config as lm_config
from fedpriv.registry import parse_tokenizer


def _valid_tokenizer(spec) -> bool:
    try:
        parse_tokenizer(spec)
        return True
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class PrivacyUtilityConfig:
    lm: object                                  # configs.lm_fl.LMFLConfig of every row
    tokenizers: tuple = ("sentencepiece",)      # name[:vocab size], one table block each (Figure 1)
    seeds: tuple = (0,)
    epsilons: tuple = (18.71, 1.77)             # the DP-FTRL rows (delta = lm.delta)
    server_lrs: tuple[float, ...] | None = None  # grid for the DP rows (App. C); None = lm.server_lr
    tuned: bool = False                         # DP rows use configs.lm_fl.TUNED[epsilon]

    def __post_init__(self):
        check(self)
        for name, vals, ok in (("tokenizers", self.tokenizers, _valid_tokenizer),
                               ("seeds", self.seeds, lambda s: isinstance(s, int) and s >= 0),
                               ("epsilons", self.epsilons, lambda e: e > 0),
                               ("server_lrs", self.server_lrs or (), lambda v: v > 0)):
            if not all(ok(v) for v in vals) or (name != "server_lrs" and not vals):
                raise ConfigError(f"{name} = {vals!r}: invalid (tokenizers: name[:vocab size > 4], "
                                  f"name in {TOKENIZERS}; "
                                  "seeds >= 0; epsilons and server_lrs > 0)")


# Figure 1's tokenizers: the public SentencePiece model against word-level unigram vocabularies of
# the training users' top-k words at the paper's two sizes (10K and 32K beside SentencePiece's 32K;
# ``small``: the same ratios to its 2,000-token SentencePiece model)
SCALES = {"smoke": dict(), "small": dict(seeds=(0, 1, 2), tuned=True,
                                         tokenizers=("sentencepiece", "word:625", "word:2000")),
          "paper": dict(seeds=(0, 1, 2), tuned=True,
                        tokenizers=("sentencepiece", "word:10000", "word:32000"))}
# set per row by the experiment (a FedAvg row, one DP-FTRL row per epsilon), never by an override
DERIVED = {n: "each row sets it (a FedAvg row, then DP-FTRL at each of epsilons=...): set "
              "epsilons" for n in ("algorithm", "target_epsilon", "noise_multiplier")}
LM_SCALE = {"smoke": "smoke,rounds=2,eval_every=2",
            "small": "small,simulated_population=wang_stackoverflow,rounds=800,eval_every=100,"
                     "checkpoint_every=100",
            "paper": "paper"}


def get_config(arg: str = "small") -> PrivacyUtilityConfig:
    cfg = with_lm_config(PrivacyUtilityConfig, SCALES, LM_SCALE, arg, lm_config, derived=DERIVED)
    return cfg


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.privacy_utility_plan(cfg)
