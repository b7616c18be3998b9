"""Config of the FreD table (Hou et al. 2023, Table 1 / §4.1 analogue at small scale).

``get_config(scale)`` with ``scale`` in {"smoke", "small", "paper"}, then ``field=value``
overrides: ``"small,seeds=3,pca_dims=0,epsilon=1.2"``.
"""
from __future__ import annotations

import dataclasses

from configs.common import check, from_scale


@dataclasses.dataclass(frozen=True)
class FredTableConfig:
    num_sentences: int = 3000           # per candidate public dataset
    max_per_user: int = 8               # private messages kept per sender
    seeds: int = 5                      # releases (one per seed, reused for every candidate)
    epsilon: float = 0.6                # per release (mean, covariance), as in the paper
    delta: float = 1e-6                 # per release
    clip: float = 1.0
    embed_batch: int = 64
    embed_max_length: int | None = None  # word pieces per sentence (None: the model's 256)
    data_seed: int = 0
    pca_dims: int = 32                  # also score in a k-dim public PCA basis (0: off)

    def __post_init__(self):
        check(self, positive=("num_sentences", "max_per_user", "seeds", "epsilon", "clip",
                              "embed_batch", "embed_max_length"),
              non_negative=("data_seed", "pca_dims"), open_unit=("delta",))


SCALES = {
    # seconds, for tests: few short sentences, one embedding batch shape per bucket
    "smoke": dict(num_sentences=24, max_per_user=2, seeds=2, pca_dims=4, embed_batch=16,
                  embed_max_length=16),
    "small": dict(),
    # the paper's 150K sentences per candidate (§4.1)
    "paper": dict(num_sentences=150_000, max_per_user=256, pca_dims=0),
}


def get_config(arg: str = "small") -> FredTableConfig:
    cfg = from_scale(FredTableConfig(), SCALES, arg)
    from fedpriv.recipes import plans
    plans.check_fred_pools(cfg, ("wikipedia", "simpsons"))  # the paper's 150K: refused, not shrunk
    return cfg


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.fred_table_plan(cfg)
