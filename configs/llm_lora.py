"""Config of the public-LLM-as-the-on-device-model comparison (issue 53): DP-FTRL LoRA
fine-tuning of the public LLM (SmolLM2-135M) against the best small LM the project trains with
the LLM's help, at equal epsilon, on chitchat's users, in bits per byte.

Arms, per (seed, epsilon) (``fedpriv.recipes.llm_lora``), every private arm on the same
training users with the same DP-FTRL schedule (``lm``: rounds, cohort, noise cohort, z from
``epsilons`` under the paper-noise protocol), hence the same privacy event and both epsilons
equal:

* ``small_lm`` (a): the small LSTM with public pre-training by LLM distillation
  (``configs/public_training.py``'s ``pretrain_distill_long`` row: the best row of the published
  wang-table2 at eps 1.77, 11.47 % test accuracy), then DP-FTRL; its own data and local work
  (``lm``: 64 examples per user, 2 local steps) and the server lr chosen per epsilon there
  (0.05 at 1.77, 0.5 at 18.71, clip 1.0);
* ``lora`` (b): DP-FTRL of LoRA adapters (``rank``, ``targets``) on the top ``top_layers``
  blocks of the public LLM (the lower blocks' outputs cached once per example);
* ``lora_upload`` (b=): the same with adapters on every target of the top blocks at the rank
  whose upload is closest to (a)'s parameter count (equal upload);
* ``lora_all_layers`` (b*): (b)'s adapters on every block (no cache; ~3.5x a step): what the
  top-k choice costs in quality (not in the default arms);
* ``zero_shot`` (c): the public LLM as it is (no private data, nothing charged).

``get_config("small,seeds=0/1/2")``; overrides naming this config's fields apply here, the rest
go to the wrapped ``configs/public_training.py`` config (``rounds=60``, ``epsilons=1.77``).
"""
from __future__ import annotations

import dataclasses
import math

from configs.common import ConfigError, check, split_spec, with_lm_config
from configs.public_training import get_config as public_config

ARMS = ("small_lm", "lora", "lora_upload", "zero_shot")
ALL_ARMS = ARMS + ("lora_all_layers",)
TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class LlmLoraConfig:
    lm: object                          # configs.public_training.PublicTrainingConfig: data, (a),
    #                                     the shared DP-FTRL schedule, epsilons, seeds
    arms: tuple = ARMS
    # LoRA (Hu et al. 2022) of (b): adapters on the top `top_layers` blocks (the lower ones cached)
    rank: int = 8
    alpha: float = 16.0
    targets: tuple = ("wq", "wv")
    top_layers: int = 2
    # (b=): these targets of the same blocks, rank chosen so its upload is closest to (a)'s
    upload_targets: tuple = TARGETS
    frozen_dtype: str = "float32"       # storage of the frozen weights (float32: bfloat16 is 13 %
    #                                     slower per step on this CPU, benchmarks/lora_step.py)
    cache_dtype: str = "float32"        # storage of the cached lower-block outputs
    # the LoRA clients' data and local work (few examples: a step runs the head's 49K-way softmax)
    lora_examples_per_client: int = 8   # also the evaluation users' examples (every arm's test set)
    lora_batch_size: int = 8
    lora_local_steps: int = 1
    lora_client_lr: float = 0.5
    lora_clip_norm: float = 1.0
    # the LoRA arms' clip norm at each of lm.epsilons (None: lora_clip_norm at every epsilon); the
    # event does not depend on it (z is relative to C), the noise on the sum does (z C)
    lora_clip_norms: tuple | None = None
    # the LoRA arms' server lr at each of lm.epsilons, in order (DP-FTRL, server SGD with momentum
    # lm.server_momentum); None: lm.server_lr at every epsilon
    lora_server_lrs: tuple | None = None
    # None: the whole public LLM; k: its first k blocks only (a cheaper, worse LLM: smoke tests)
    teacher_layers: int | None = None
    # the validation bits per byte the "rounds to reach" column counts to (None: (a)'s final one)
    target_bpb: float | None = None
    eval_batch_size: int = 32           # examples per compiled evaluation step of the LLM arms

    def __post_init__(self):
        check(self, positive=("rank", "alpha", "top_layers", "lora_examples_per_client", "lora_batch_size",
                              "lora_local_steps", "lora_client_lr", "lora_clip_norm", "teacher_layers",
                              "target_bpb", "eval_batch_size"),
              choices={"frozen_dtype": DTYPES, "cache_dtype": DTYPES})
        if not self.arms or set(self.arms) - set(ALL_ARMS) or len(set(self.arms)) != len(self.arms):
            raise ConfigError(f"arms = {'/'.join(self.arms)}: distinct names from {ALL_ARMS}")
        for name in ("targets", "upload_targets"):
            t = getattr(self, name)
            if not t or set(t) - set(TARGETS) or len(set(t)) != len(t):
                raise ConfigError(f"{name} = {'/'.join(t)}: distinct names from {TARGETS}")
        if self.teacher_layers is not None and self.top_layers > self.teacher_layers:
            raise ConfigError(f"top_layers={self.top_layers} exceeds the teacher's teacher_layers="
                              f"{self.teacher_layers} blocks")
        for name, what in (("lora_server_lrs", "server lr"), ("lora_clip_norms", "clip norm")):
            given = getattr(self, name)
            if given is None:
                continue
            vals = _positive_floats(given)  # an override arrives as strings
            if vals is None or len(vals) != len(self.lm.epsilons):
                raise ConfigError(f"{name}={'/'.join(map(str, given))} must be one positive {what} per epsilon "
                                  f"of epsilons={'/'.join(map(str, self.lm.epsilons))}")
            object.__setattr__(self, name, vals)
        if self.lm.algorithm != "dp_ftrl":
            raise ConfigError(f"the private arms run DP-FTRL, not algorithm={self.lm.algorithm}")
        if self.lm.rows != ("pretrain_distill_long",):
            raise ConfigError("arm (a) is public_training's pretrain_distill_long row: set "
                              "rows=pretrain_distill_long")
        if self.lm.archs is not None and self.lm.archs != (self.lm.arch,):
            raise ConfigError("arm (a) is one small LM: set archs=None (arch=lstm or transformer)")

    def lora_server_lr(self, epsilon: float) -> float:
        """The LoRA arms' server lr at ``epsilon`` (``lora_server_lrs``' entry, else lm.server_lr)."""
        if self.lora_server_lrs is None:
            return self.lm.server_lr
        return self.lora_server_lrs[list(self.lm.epsilons).index(epsilon)]

    def lora_clip(self, epsilon: float) -> float:
        """The LoRA arms' clip norm at ``epsilon`` (``lora_clip_norms``' entry, else lora_clip_norm)."""
        if self.lora_clip_norms is None:
            return self.lora_clip_norm
        return self.lora_clip_norms[list(self.lm.epsilons).index(epsilon)]


def _positive_floats(values) -> tuple | None:
    try:
        out = tuple(float(v) for v in values if not isinstance(v, bool))
    except (TypeError, ValueError):
        return None
    return out if len(out) == len(values) and all(math.isfinite(v) and v > 0 for v in out) else None


SCALES = {
    # seconds: the teacher's first 2 blocks (LoRA on the top 1, the other cached), a handful of
    # users with 2 short messages each, 2 rounds
    "smoke": dict(teacher_layers=2, top_layers=1, rank=2, lora_examples_per_client=2, lora_batch_size=2,
                  eval_batch_size=8, arms=("small_lm", "lora", "zero_shot"), lora_server_lrs=(0.3,),
                  lora_clip_norm=0.5),
    # the comparison on this CPU: (a) at its published hyper-parameters (wang-table2), the LoRA
    # arms at lora_server_lrs / lora_clip_norms per epsilon; every private arm runs lm's DP-FTRL
    # schedule. LoRA's, from 20-40-round pilots (seed 0, validation bits per byte, zero-shot 2.006):
    #   eps 18.71: server lr 0.5, clip 1.0 -> 1.751 at round 20 (clip 0.1, lr 1.0: 1.770)
    #   eps 1.77: clip 0.1 (the updates' norms start at ~0.05: clip 1.0 would be 10x the noise),
    #     server lr 0.5 -> 1.819 at round 15, 1.847 at 20 (noisy)
    # 20 rounds (LM_SCALE): the pilots' horizon, hence their lrs at both epsilons
    "small": dict(lora_server_lrs=(0.5, 0.5), lora_clip_norms=(0.1, 1.0)),
    # the paper's population and noise (cohort 100, 400 rounds), for a GPU
    "paper": dict(lora_server_lrs=(0.2, 0.5), lora_clip_norms=(0.1, 1.0), lora_examples_per_client=16,
                  lora_batch_size=16),
}
LM_SCALE = {
    # smoke: padded batches (packed ones compile one branch per row count)
    "smoke": "smoke,rows=pretrain_distill_long,max_clients=24,seq_len=8,epsilons=18.71,rounds=2,"
             "eval_every=2,checkpoint_every=2,max_eval_examples=16,batching=padded",
    # wang-table2's published (a): pretrain_distill_long, LSTM 96/128, teacher BPE restricted to
    # 3000 ids, clip 1.0, server lr 0.05 at eps 1.77 / 0.5 at 18.71, cohort 16 with the noise of
    # 100 (Wang et al.'s per-round noise, simulated StackOverflow), here for `rounds` rounds.
    # train_on_unk: bits per byte need p(UNK) (a density over all text), so UNK targets are trained.
    # rounds=20 (not wang-table2's 800): the budget of one CPU core, ~100 CPU-min for the whole grid
    # (3 seeds x 2 epsilons x small_lm/lora/lora_upload + zero-shot). Measured on one core
    # (benchmarks/lora_step.py --top-layers 2,30 --batch 8): a LoRA client step 0.39 CPU-s, so a
    # round of 16 clients ~6.5 CPU-s; the first grid run (seed 0, eps 1.77, lora): 135 CPU-s of
    # training for 20 rounds and 23 CPU-s per evaluation of the ~840 validation examples (6 at
    # eval_every=5: half the run), (a) 150 CPU-s (its public pre-training 1875 steps). Hence
    # eval_every=10 (evaluations at rounds 10 and 20: rounds to target in steps of 10): ~4 CPU-min
    # per LoRA run, x12, + 6 x 2.5 for (a). A short-horizon comparison: every arm (and (a)'s
    # DP-FTRL) gets the same 20 rounds
    "small": "small,rows=pretrain_distill_long,epsilons=1.77/18.71,simulated_population=wang_stackoverflow,"
             "clip_norm=1.0,server_lr=0.05,epsilon_server_lrs=0.05/0.5,train_on_unk=true,seeds=0/1/2,"
             "rounds=20,eval_every=10,checkpoint_every=5,max_eval_examples=2000",
    "paper": "paper,rows=pretrain_distill_long,archs=none,student_server_lrs=none,epsilons=1.77/18.71,"
             "train_on_unk=true,epsilon_server_lrs=0.05/0.5,"
             "server_lr=0.05,clip_norm=1.0,rounds=400,eval_every=50,checkpoint_every=50",
}


def get_config(arg: str = "small") -> LlmLoraConfig:
    # a field of this config the user overrides replaces the scale's before the config is built
    # (lora_server_lrs=0.5 with epsilons=18.71: the scale's two lrs would not match one epsilon)
    _, overrides = split_spec(arg, "small")
    named = {o.partition("=")[0].strip() for o in overrides}
    scales = {k: {f: v for f, v in d.items() if f not in named} for k, d in SCALES.items()}
    return with_lm_config(LlmLoraConfig, scales, LM_SCALE, arg, public_config)


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.llm_lora.privacy_plan``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import llm_lora
    return llm_lora.privacy_plan(cfg)
