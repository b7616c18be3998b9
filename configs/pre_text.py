"""Config of the PrE-Text comparison (issue 26; Hou et al., ICML 2024): private synthetic text
from the public LLM, guided by clients' DP votes, against on-device DP-FTRL at equal epsilon.

Arms, per (seed, epsilon), each in its own ledger of budget ``epsilon`` on the chitchat
training users (add/remove one user; the epsilon SPENT on them, no simulated population):

* ``ondevice``: DP-FTRL of the small LSTM (``configs/lm_fl.py`` small at the tuned
  high-noise setting ``TUNED[1.77]``, the server lr per epsilon: ``epsilon_server_lrs``), z
  calibrated to ``epsilon``;
* ``synthetic``: PrE-Text (``fedpriv.synth``) with its vote noise calibrated to ``epsilon``,
  then the same LSTM trained centrally on the released synthetic set only;
* ``synthetic_ft``: PrE-Text at ``ft_vote_share * epsilon``, synthetic pre-training, then
  DP-FTRL with z calibrated so that votes + DP-FTRL compose to ``epsilon``.

Every arm starts from the same model, ``init``: by default the LSTM pre-trained centrally on
the public pool (no private data; one per seed), which the results also report alone as the
reference a private arm must improve on; ``init=scratch`` starts from a random init (the first
small run's setting: at epsilon 1.29/7.58 on chitchat's 1,053 users DP-FTRL from scratch stayed
below the most-frequent-token baseline, so no comparison with it meant anything).

``get_config("small,seeds=0/1/2,epsilons=1.29/7.58")``; the FL fields come from
``configs/lm_fl.py`` (overrides that are not this config's fields go there). The epsilons
default to PrE-Text's (1.29 and 7.58).
"""
from __future__ import annotations

import dataclasses
import math

from configs.common import ConfigError, check, split_spec, with_lm_config
from configs.lm_fl import TUNED, get_config as lm_config

ARMS = ("ondevice", "synthetic", "synthetic_ft")
INITS = ("public", "scratch")
# public descriptions of the domain (the initial population's prompts; PrE-Text's initial
# samples are likewise the LLM's answers to a public description of the task)
INSTRUCTIONS = ("Write a short, casual text message to a friend.",
                "Reply to a friend who asked how your weekend was.",
                "Ask a friend a question about their plans.",
                "Write one line of small talk for a chat with someone you just met.",
                "Write a short chat message about a hobby you like.",
                "Write a short, friendly reply in a chat conversation.")


@dataclasses.dataclass(frozen=True)
class PreTextConfig:
    lm: object                         # configs.lm_fl.LMFLConfig (data, model, DP-FTRL)
    epsilons: tuple = (1.29, 7.58)     # PrE-Text's epsilons; each arm's ledger budget
    # the DP-FTRL server lr of (a) and (c) at each of epsilons, in order (None: lm.server_lr at
    # every epsilon); lm.server_lr must be one of them (one epsilon per process:
    # "epsilons=7.58,epsilon_server_lrs=0.2,server_lr=0.2"). Chosen on validation per budget
    # (Wang et al. App. C tune it per noise level): a lr right at one budget diverges at the other
    epsilon_server_lrs: tuple | None = None
    seeds: tuple = (0,)
    arms: tuple = ARMS
    # PrE-Text (fedpriv.synth.evolve.EvolveSettings; Hou et al. 2024 Alg. 1)
    num_samples: int = 64              # N synthetic samples per round
    pe_rounds: int = 3                 # T vote rounds
    vote_cohort: int = 300             # users per vote round (shuffled passes: T x m <= users
                                       # -> each user votes at most once: one Gaussian release)
    keep_fraction: float = 0.25
    expansion: int = 256               # final one-shot expansion of the last seeds
    max_new: int = 24                  # chitchat messages: ~12 words (seq_len 20 SentencePiece)
    temperature: float = 1.0
    top_k: int = 50
    gen_batch_size: int = 64
    prefix_min: float = 0.3
    prefix_max: float = 0.7
    vote_k: int = 1                    # votes per message
    messages_per_client: int = 16      # a user's messages that vote (embedding cost: ~16k texts)
    # FreD's reference set (experiments.pre_text's fred table): at most this many of the test
    # users' messages, a seeded uniform sample (None: all of them)
    fred_test_messages: int | None = None
    instructions: tuple = INSTRUCTIONS
    teacher_layers: int | None = None  # None: the whole public LLM; k: its first k blocks only
                                       # (a cheaper, worse generator: for smoke tests)
    embed_batch: int = 64              # the embedder's rows per batch for the synthetic sets and
                                       # FreD's sets (every batch is padded to it: smaller for a
                                       # few texts, as the smoke's 8-18)
    # synthetic_ft: the votes' share of epsilon (alone); DP-FTRL gets the rest (composed)
    ft_vote_share: float = 0.25
    # every arm's starting point: "public" = the LSTM pre-trained centrally on the public pool
    # (Wang et al.'s "pre-training w/ public data"; PrE-Text's small on-device models likewise
    # start from a public checkpoint), "scratch" = random init. With "public" the results also
    # hold the public model alone, the reference each arm must improve on.
    init: str = "public"
    public_steps: int = 300            # Adam steps on the public pool (public_training:small's)
    public_lr: float = 1e-3
    # central training on the synthetic set (Adam, as public pre-training), batches of
    # synth_batch_size: 25 steps are ~3 passes over the ~270 released samples (300 steps, ~35
    # passes, over-fitted them: test perplexity 5e4 in the first small run)
    synth_steps: int = 25
    synth_batch_size: int = 32
    synth_lr: float = 1e-3

    def __post_init__(self):
        check(self, positive=("num_samples", "pe_rounds", "vote_cohort", "expansion", "max_new",
                              "gen_batch_size", "vote_k", "messages_per_client", "synth_steps", "teacher_layers",
                              "embed_batch",
                              "fred_test_messages",
                              "synth_batch_size", "synth_lr", "public_lr"),
              non_negative=("temperature", "top_k", "public_steps"),
              choices={"init": INITS})
        if self.init == "public" and self.public_steps == 0:
            raise ConfigError("init='public' with public_steps=0 is a random init: set init=scratch")
        if not self.arms or set(self.arms) - set(ARMS) or len(set(self.arms)) != len(self.arms):
            raise ConfigError(f"arms = {self.arms!r}: distinct names from {ARMS}")
        if not self.seeds or not all(isinstance(s, int) and s >= 0 for s in self.seeds):
            raise ConfigError(f"seeds = {self.seeds!r}: non-negative integers")
        if not self.epsilons or any(not (isinstance(e, (int, float)) and e > 0) for e in self.epsilons):
            raise ConfigError(f"epsilons must be positive numbers, got {self.epsilons}")
        if self.epsilon_server_lrs is not None:
            lrs = _positive_floats(self.epsilon_server_lrs)  # an override arrives as strings
            if lrs is None or len(lrs) != len(self.epsilons):
                raise ConfigError(f"epsilon_server_lrs={'/'.join(map(str, self.epsilon_server_lrs))} must be one "
                                  f"positive server lr per epsilon of epsilons={'/'.join(map(str, self.epsilons))}")
            object.__setattr__(self, "epsilon_server_lrs", lrs)
            if self.lm.server_lr not in lrs:  # a server_lr the arms would silently not use
                raise ConfigError(f"server_lr={self.lm.server_lr:g} and epsilon_server_lrs="
                                  f"{'/'.join(f'{x:g}' for x in lrs)} disagree: the DP-FTRL arms run "
                                  f"epsilon_server_lrs (set server_lr to one of them, e.g. {lrs[0]:g})")
        from fedpriv.recipes.pretext import settings
        try:  # the loop's own settings check (keep_fraction, prefix range, sizes)
            settings(self)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not 0 < self.ft_vote_share < 1:
            raise ConfigError(f"ft_vote_share must be in (0, 1), got {self.ft_vote_share}")
        if not self.instructions:
            raise ConfigError("instructions: at least one public prompt")
        if self.lm.algorithm != "dp_ftrl":
            raise ConfigError(f"the on-device arms run DP-FTRL, not algorithm={self.lm.algorithm}")
        if self.lm.simulated_population is not None or self.lm.noise_cohort_size is not None:
            raise ConfigError("the arms compare the epsilon SPENT on our users: set "
                              "simulated_population=None and noise_cohort_size=None")


SCALES = {
    # smoke: every code path at the least cost its tests need (tests/experiments/test_pre_text.py);
    # the embedder and the LLM dominate it: 2 voting messages per user, 64 test messages for
    # FreD's reference, two instructions (one generate call per instruction and round)
    "smoke": dict(num_samples=8, pe_rounds=2, vote_cohort=8, expansion=16, max_new=6, teacher_layers=1,
                  gen_batch_size=8, messages_per_client=2, fred_test_messages=64, embed_batch=16,
                  instructions=INSTRUCTIONS[:2], synth_steps=4, synth_batch_size=8,
                  public_steps=4, epsilons=(7.58,)),
    # sized for the 2-core CPU (~100 min of one core for 3 seeds x 2 epsilons; the LLM's
    # generations, ~30-50 tokens/s here, are most of it): a synthetic set of 16 seeds + 256
    # expansions per run, far below PrE-Text's (their N and expansion are 10^3-10^5)
    # the DP-FTRL server lr per epsilon, chosen on validation (seed 0, (a) alone, val accuracy
    # after 50 rounds from the public start's 5.09 %):
    #   eps 1.29 (z 19.6): 0.003125 / 0.00625 / 0.0125 / 0.025 / 0.05 / 0.1 / 0.2 / 0.5 -> 7.08 / 7.00 /
    #     6.67 / 6.53 / 6.03 / 1.02 / 0.29 / 0.04 % (0.1 and up diverge; a plateau at 0.003-0.006,
    #     whose low edge was not extended: val loss rises there, 5.59 -> 5.68)
    #   eps 7.58 (z 3.96): 0.05 / 0.2 / 0.5 -> 7.44 / 8.70 / 8.30 %
    # (the first small run used TUNED[1.77]'s 0.05 at both: too large at 1.29, too small at 7.58)
    "small": dict(seeds=(0, 1, 2), epsilon_server_lrs=(0.003125, 0.2)),
    # PrE-Text's own setting: refused by get_config (PAPER_REFUSED says why) before anything is
    # built; the entry exists so the scale is listed, planned in tests and shown in docs/fidelity.md
    "paper": dict(seeds=(0, 1, 2)),
}
# PrE-Text's setting (houcharlie/PrE-Text: 1,250 clients of 8 texts per dataset, N_syn a multiple
# of 256 initialised from 100,000 C4 texts, variations and expansion with LLaMA-2-7B, students
# DistilGPT2 / LLaMA-2-7B) needs a 7B generator and its datasets; neither is packaged here
PAPER_REFUSED = ("pre_text:paper: PrE-Text's setting generates with LLaMA-2-7B on its own datasets "
                 "(1,250 clients of 8 texts); the packaged generator is SmolLM2-135M-Instruct and the "
                 "private data chitchat: run the nearest feasible setting, pre_text:small")
LM_SCALE = {
    # smoke: padded batches (packed batches compile one branch per row count: +11 s of CPU)
    "smoke": "smoke,rounds=2,eval_every=2,noise_cohort_size=None,batching=padded",
    # small: DP-FTRL on the real population (1,053 users, no simulated cohort) with cohorts of
    # 200 for 50 rounds: the noise on the averaged update, z C / m, is 0.098 at epsilon 1.29 and
    # 0.020 at 7.58, near the 0.088 (z 8.84 / cohort 100) at which TUNED[1.77]'s server lr was
    # chosen. Cohorts of 16 for 400 rounds (the first small run) put 1.5 there at 1.29 (z 24.2):
    # DP-FTRL from the public model diverged (test loss 1,072).
    # eval_every 5: (a)'s validation curve for rounds-to-match (experiments.pre_text.rounds_verdicts);
    # server_lr: the first epsilon's of epsilon_server_lrs (SCALES["small"])
    "small": ("small,rounds=50,cohort_size=200,eval_every=5,checkpoint_every=25,noise_cohort_size=None,"
              "max_eval_examples=3000,"
              + ",".join(f"{k}={v}" for k, v in {**TUNED[1.77], "server_lr": 0.003125}.items())),
}


def _positive_floats(values) -> tuple | None:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        return None
    return out if all(math.isfinite(v) and v > 0 for v in out) else None


def get_config(arg: str = "small") -> PreTextConfig:
    if split_spec(arg, "small")[0] == "paper":
        raise ConfigError(PAPER_REFUSED)
    cfg = with_lm_config(PreTextConfig, SCALES, LM_SCALE, arg, lm_config,
                         derived={"target_epsilon": "each arm sets it: set epsilons=a/b",
                                  "noise_multiplier": "each arm calibrates it: set epsilons=a/b",
                                  "algorithm": "the on-device arms run dp_ftrl"})
    # the recorded LM config names no epsilon of its own: each arm runs at one of ``epsilons``
    return dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, target_epsilon=cfg.epsilons[0]))


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.pre_text_plan(cfg)
