"""Config of the prefinetuning-mixture experiment (Hou et al. 2023 §4.2, Table 2, Figure 2).

Mixtures of ``Y%`` private-distribution text (held-out chitchat senders) and ``100 - Y%``
Wikipedia at a fixed total ``num_sentences``; FreD (non-private, and private over
``fred_trials`` Algorithm-1 releases at ``(fred_epsilon, fred_delta)`` per release) for every
``Y``; for ``fl_y_percents`` x ``seeds``: prefinetune, test perplexity, DP-FTRL FL-finetune, test
perplexity.

The unit of FreD's privacy (``fred_unit``) decides which ledger its release is charged to:

* ``"sample"`` (every scale; the paper's Def. 2.1 and Figure 2): one sentence of one user, with
  replace-one neighbours so that the exact sentence count ``n_2`` is public, as Prop. 3.1 divides
  by it (mean sensitivity ``2c``, ``fedpriv.fred.private``). A sample-level guarantee cannot be
  composed with the user-level FL ledger (``private_stats`` refuses it there), so the release --
  Figure 2's diagnostic; Table 2 prefinetunes on every ``Y`` whatever FreD says -- is charged to
  its OWN sample-level ledger of budget ``(2 fred_epsilon, 2 fred_delta)`` (Prop. 3.1), and the
  FL-finetuning of every (Y, seed) runs under a user-level ledger with the whole
  ``total_epsilon`` (z calibrated to it alone). The two guarantees are separate statements
  about different neighbouring relations; nothing here claims their composition.
* ``"user"`` (by override): a user's whole contribution bounded, add/remove with the declared
  user count; the release is charged to the FL pipeline's user-level ledger and the FL stage's
  z is calibrated to what FreD left of ``total_epsilon`` (as configs/fred_pipeline.py).

Either way ``lm.target_epsilon = total_epsilon`` and ``lm.noise_multiplier = None``: a fixed z
inherited from ``configs/lm_fl.py`` would ignore the budget and the ledger would refuse the run.
``privacy_plan`` states exactly the ledgers the run opens (``plans.fred_mixtures_plan``).
"""
from __future__ import annotations

import dataclasses

from configs.common import ConfigError, check, refuse_nonprivate, with_lm_config
from configs.lm_fl import get_config as lm_config


@dataclasses.dataclass(frozen=True)
class FredMixturesConfig:
    lm: object                          # configs.lm_fl.LMFLConfig of the FL-finetuning stage
    private_fraction: float = 0.5       # chitchat senders that are the private users
    max_per_user: int = 10              # messages per training user embedded for FreD
    num_sentences: int = 2000           # total size of every mixture (= size of each pool)
    y_percents: tuple = (0, 25, 50, 75, 99, 100)   # FreD for all of these
    fl_y_percents: tuple = (0, 25, 50, 75, 99, 100)  # prefinetune + FL-finetune these
    seeds: tuple = (0, 1, 2)            # prefinetuning / FL seeds per Y
    fred_trials: int = 5                # private FreD releases (trial = release seed)
    fred_unit: str = "sample"           # FreD's unit of privacy: "sample" (the paper) or "user"
    fred_epsilon: float = 0.6           # per release (mean, covariance), the paper's Fig. 2
    fred_delta: float = 2e-6            # per release, the paper's Fig. 2
    fred_clip: float = 1.0
    pca_dims: int | None = None         # None: the full 384-d embedding (the paper); k: a public
                                        # k-dim PCA basis (not in the paper; see fred.pca_basis)
    total_epsilon: float = 18.7         # the user-level ledger's budget: FL-finetuning alone
                                        # (fred_unit="sample"), FreD's trial 0 + FL ("user")
    prefinetune_steps: int = 300
    prefinetune_batch: int = 64
    prefinetune_lr: float = 3e-3
    embed_batch: int = 64
    embed_max_length: int | None = 64   # word pieces per sentence (None: the model's 256)
    seed: int = 0                       # data split, pools, release keys

    def __post_init__(self):
        check(self, positive=("max_per_user", "num_sentences", "fred_trials", "fred_epsilon",
                              "fred_clip", "pca_dims", "total_epsilon", "prefinetune_steps",
                              "prefinetune_batch", "prefinetune_lr", "embed_batch",
                              "embed_max_length"),
              non_negative=("seed",), open_unit=("private_fraction", "fred_delta"),
              choices={"fred_unit": ("sample", "user")})
        for name in ("y_percents", "fl_y_percents", "seeds"):
            v = getattr(self, name)
            if not v or len(set(v)) != len(v):
                raise ConfigError(f"{name} must be a non-empty tuple without repeats, got {v}")
        if any(not 0 <= y <= 100 for y in self.y_percents) or list(self.y_percents) != sorted(self.y_percents):
            raise ConfigError(f"y_percents must be increasing values in [0, 100], got {self.y_percents}")
        if not set(self.fl_y_percents) <= set(self.y_percents):
            raise ConfigError(f"fl_y_percents {self.fl_y_percents} must be among y_percents {self.y_percents}")
        if list(self.fl_y_percents) != sorted(self.fl_y_percents):
            raise ConfigError(f"fl_y_percents must be increasing, got {self.fl_y_percents}")
        if any(not (isinstance(s, int) and s >= 0) for s in self.seeds):
            raise ConfigError(f"seeds must be ints >= 0, got {self.seeds}")
        if self.num_sentences < 100:
            raise ConfigError(f"num_sentences must be >= 100 (99% and 100% must differ), got "
                              f"{self.num_sentences}")
        if self.fred_trials < 2:
            raise ConfigError("fred_trials must be >= 2 (a spread over trials)")


SCALES = {
    # seconds, for tests: 100-sentence mixtures of 16-piece sentences, tiny LM, 1 seed; the full
    # 384-d embedding and sample-level FreD, as small
    "smoke": dict(max_per_user=2, num_sentences=100, y_percents=(0, 50, 99, 100),
                  fl_y_percents=(0, 100), seeds=(0,), fred_trials=3, prefinetune_steps=3,
                  prefinetune_batch=16, total_epsilon=60.0, embed_batch=16, embed_max_length=16),
    # the CPU reproduction (one core, ~57 CPU-min): mixtures of 19,782 sentences, the largest the
    # packaged pools fill (the Wikipedia pool: 19,782 sentences, 19,656 distinct; the held-out
    # senders' pool holds ~62K): 99% and 100% differ by 198 sentences. Sample-level FreD in the
    # full 384-d embedding on all six Ys, of up to 256 messages per training user (the paper
    # scale's cap; 30,558 sentences of the 528 users at seed 0, against 4,006 at 10: the
    # release's noise on the mean and covariance scales with 1/n); 70,122 sentences embedded at
    # 40-240 sentences/s (10 min of the published run's 56 CPU-min); prefinetuning + FL-finetuning
    # (300 steps, 50 rounds: ~60 s per (Y, seed)) on Y = 0/50/99/100 x 16 seeds (64 runs):
    # Table 2's 99 vs 100 after FL (paper: -0.04) needs ~16 seeds (docs/fidelity.md's power
    # table, from the 3-seed pilot's paired sd 0.105 against the effect scaled to our level)
    "small": dict(max_per_user=256, num_sentences=19_782, fl_y_percents=(0, 50, 99, 100),
                  seeds=tuple(range(16))),
    # the paper's settings (§4.2): 150K-sentence mixtures, sample-level FreD (0.6, 2e-6) per
    # release with no PCA, FL-finetuning at epsilon 1.26 (delta 1e-6), for GPU/TPU; refused on the
    # packaged pools (plans.check_fred_pools)
    "paper": dict(max_per_user=256, num_sentences=150_000, y_percents=(0, 10, 40, 70, 95, 99, 100),
                  fl_y_percents=(10, 40, 70, 95, 99, 100), prefinetune_steps=20_000,
                  embed_max_length=None, total_epsilon=1.26),
}
# set here, never by an override: the FL stage's z is calibrated to what FreD left
DERIVED = {n: "the FL stage's noise is calibrated to total_epsilon (less FreD's release when "
              "fred_unit=user; set total_epsilon)" for n in ("target_epsilon", "noise_multiplier")}
LM_SCALE = {"smoke": "smoke,max_clients=80",
            "small": "small,rounds=50,eval_every=25,checkpoint_every=25",
            "paper": "paper,simulated_population=None"}  # FreD spends first: eps on our users


def get_config(arg: str = "small") -> FredMixturesConfig:
    cfg = with_lm_config(FredMixturesConfig, SCALES, LM_SCALE, arg, lm_config, derived=DERIVED)
    refuse_nonprivate(cfg.lm.algorithm, "total_epsilon")
    from fedpriv.recipes import plans
    plans.check_fred_pools(cfg)  # the paper's 150K mixtures: refused before any data is loaded
    if cfg.fred_unit == "user":  # FreD on the FL ledger: something must be left for FL
        plans.check_fred_budget(cfg, plans.mixtures_release_event(cfg))
    return dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, target_epsilon=cfg.total_epsilon,
                                                           noise_multiplier=None))


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.fred_mixtures_plan(cfg)
