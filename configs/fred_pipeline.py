"""Config of the FreD three-stage pipeline (Hou et al. 2023, Fig. 1 / Table 1 analogue).

Choose a prefinetuning dataset by private FreD -> prefinetune the on-device LM on it ->
DP FL-finetune on the users; one privacy ledger for the whole pipeline. The FL stage's noise
multiplier is always calibrated to what FreD left of ``total_epsilon`` (``lm.target_epsilon =
total_epsilon``, ``lm.noise_multiplier = None``): a fixed z inherited from ``configs/lm_fl.py``
(its paper scale's 8.83) would ignore the budget, and the ledger would refuse the run.
"""
from __future__ import annotations

import dataclasses

from configs.common import ConfigError, apply_overrides, check, refuse_derived, refuse_nonprivate, split_spec
from configs.lm_fl import get_config as lm_config


@dataclasses.dataclass(frozen=True)
class FredPipelineConfig:
    lm: object                          # configs.lm_fl.LMFLConfig of the FL-finetuning stage
    private_fraction: float = 0.5       # chitchat senders that are the private users
    max_per_user: int = 40              # messages per user embedded for FreD
    num_sentences: int = 3000           # sentences per candidate public dataset
    fred_epsilon: float = 0.6           # per release (mean, covariance), as in the paper
    fred_unit: str = "user"             # the pipeline's unit of privacy
    fred_clip: float = 1.0
    pca_dims: int | None = 32           # public PCA basis (not in the paper; see fred.pca_basis)
    total_epsilon: float = 18.7         # the whole pipeline's budget (FreD + FL-finetuning)
    prefinetune_steps: int = 300
    prefinetune_batch: int = 64
    prefinetune_lr: float = 3e-3
    embed_batch: int = 64
    embed_max_length: int | None = None  # word pieces per sentence (None: the model's 256)
    compare_all: bool = True            # also carry the non-chosen candidates through stages 2-3
    seeds: tuple = (0,)                 # replicates: each its own split, FreD release, init and FL
    seed: int = 0                       # set per replicate from `seeds` (also lm.seed)

    def __post_init__(self):
        check(self, positive=("max_per_user", "num_sentences", "fred_epsilon", "fred_clip",
                              "pca_dims", "total_epsilon", "prefinetune_steps",
                              "prefinetune_batch", "prefinetune_lr", "embed_batch",
                              "embed_max_length"),
              non_negative=("seed",), open_unit=("private_fraction",),
              choices={"fred_unit": ("user", "sample")})
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or any(
                not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in self.seeds):
            raise ConfigError(f"seeds must be distinct integers >= 0, got {self.seeds!r}")


SCALES = {
    # seconds, for tests: few short sentences (one embedding shape), tiny LM
    "smoke": dict(max_per_user=2, num_sentences=16, prefinetune_steps=3, prefinetune_batch=16,
                  pca_dims=8, total_epsilon=60.0, compare_all=False, embed_batch=16,
                  embed_max_length=16),
    "small": dict(max_per_user=20, num_sentences=2000, prefinetune_steps=300, seeds=(0, 1, 2)),
    "paper": dict(max_per_user=256, num_sentences=150_000, prefinetune_steps=20_000, pca_dims=None,
                  total_epsilon=1.26 + 1.2, seeds=(0, 1, 2)),
}
# set here, never by an override: the FL stage's z is calibrated to what FreD left
DERIVED = {**{n: "the FL stage's noise is calibrated to what FreD left of total_epsilon (set "
                 "total_epsilon)" for n in ("target_epsilon", "noise_multiplier")},
           "seed": "each replicate's seed comes from seeds (e.g. seeds=0/1/2)"}
LM_SCALE = {"smoke": "smoke,max_clients=80", "small": "small,rounds=60,eval_every=20,checkpoint_every=20",
            "paper": "paper,simulated_population=None"}  # FreD spends first: eps on our users


def get_config(arg: str = "small") -> FredPipelineConfig:
    scale, overrides = split_spec(arg, "small")
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r}; choose one of {sorted(SCALES)} "
                          "(the spec is scale[,field=value,...])")
    if any(o.partition("=")[0].strip() == "lm" for o in overrides):
        raise ConfigError("set the FL stage through configs/lm_fl.py fields, not 'lm'")
    refuse_derived([o.partition("=")[0].strip() for o in overrides], DERIVED)
    cfg = apply_overrides(FredPipelineConfig(lm=lm_config(LM_SCALE[scale]), **SCALES[scale]), overrides,
                          scale=scale, scale_fields=set(SCALES[scale]))
    refuse_nonprivate(cfg.lm.algorithm, "total_epsilon")
    from fedpriv.recipes import plans
    plans.check_fred_pools(cfg, ("wikipedia", "simpsons"))  # the paper's 150K: refused, not shrunk
    from fedpriv.recipes.fred_pipeline import fred_release_event
    plans.check_fred_budget(cfg, fred_release_event(cfg))  # something left for FL-finetuning
    return dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, target_epsilon=cfg.total_epsilon,
                                                           noise_multiplier=None))


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.fred_pipeline_plan(cfg)
