"""Config of the public-training experiment (Wang et al. 2023, Table 2 / Table 3 rows, §3.2–§5).

``get_config(scale)`` with ``scale`` in {"smoke", "small", "paper"}; variants are
``dataclasses.replace`` overrides of one base, never copied files. Extra overrides:
``"small,rounds=80,seeds=0/1,epsilons=1.77/18.71"``.

The private FL fields are ``configs/lm_fl.py``'s :class:`~configs.lm_fl.LMFLFields` (inherited:
the same names, defaults and checks; ``fedpriv.recipes.lm.build_task``/``build_algorithm`` read
them); the student vocabulary is the teacher's BPE restricted to ``vocab_kept`` ids of the
public pool (`fedpriv.public.distill.VocabRestriction`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

from configs.common import ConfigError, check, from_scale, refuse_nonprivate
from configs.lm_fl import LMFLFields

ROWS = ("none", "pretrain_lm", "pretrain_distill_long", "pretrain_distill", "mid_random_lm",
        "mid_random", "mid_dm", "mid_dm_priv_only")


@dataclasses.dataclass(frozen=True)
class PublicTrainingConfig(LMFLFields):
    # private data (chitchat users; split by client), or the papers' own (configs/lm_fl.py:
    # corpus=stackoverflow | reddit_jsonl with corpus_path); public pool: public_pool_path (a C4
    # TFDS directory or .txt/.jsonl files; None: the packaged pool); the on-device model (App.
    # B.2) and DP-FTRL (§2, App. C) (LMFLFields: corpus, corpus_path, public_pool_path,
    # max_clients, split, seq_len, max_examples_per_client, batch_size, max_local_steps, arch,
    # embed_dim, hidden_dim, num_heads, algorithm, rounds, cohort_size, noise_cohort_size, delta,
    # clip_norm, client_lr, server_optimizer, server_lr, server_momentum, eval_every,
    # eval_batch_size, max_eval_examples, checkpoint_every, lanes, batching; seed,
    # target_epsilon and noise_multiplier are set per run from `seeds` and `epsilons`;
    # simulated_population: the paper-noise protocol, with which `epsilons` are the SIMULATED
    # population's epsilons, z = the paper's noise)
    algorithms: ClassVar[tuple] = ("fedavg", "dp_fedavg", "dp_ftrl")
    split_seed: int = 0                   # draws max_clients and splits the users
    # teacher and student vocabulary (§4.1; App. B.3)
    teacher_path: str | None = None       # None: the packaged SmolLM2-135M GGUF
    vocab_kept: int | None = None         # V kept teacher ids (student vocab V+4); None: all
    vocab_texts: int | None = None        # public sentences used to count tokens (None: all)
    topk: int = 10
    logits_dtype: str = "float16"
    teacher_batch_size: int = 32
    # public pool (Wikipedia excerpt, Lee news, film quotes); a uniform sample of it
    pool_size: int | None = None          # None: the whole pool
    pool_seed: int = 0
    # the students of Table 2/3's columns, each trained on every row (None: just `arch`); the
    # first must be `arch`. LSTM runs stay at the workdir's top level, others in <workdir>/<arch>/
    archs: tuple[str, ...] | None = None
    # the server lr of each student of archs, in order (chosen per student on validation; None:
    # server_lr for every student); or one per (student, epsilon), student-major, as App. C tunes
    # it per epsilon: archs=lstm/transformer, epsilons=1.77/18.71 -> lstm at 1.77 / lstm at 18.71 /
    # transformer at 1.77 / transformer at 18.71. server_lr must be the first of them
    student_server_lrs: tuple[float, ...] | None = None
    # the one student's server lr at each of epsilons, in order (None: server_lr at every epsilon;
    # several students: student_server_lrs' per-epsilon form). server_lr must be the first
    epsilon_server_lrs: tuple[float, ...] | None = None
    t_prime: int | None = None            # None: T/2 (§5.3)
    epsilons: tuple = (1.77, 18.71)       # z calibrated to each for this run's schedule
    # public training (§3.2, §4, §5; App. B.2–B.3)
    q: float = 0.0008                     # fraction of the pool for distillation / mid-training
    pretrain_fraction: float = 1.0        # "pre-training w/ public data" (LM loss)
    pretrain_steps: int = 1_400_000
    distill_steps: int = 8000             # pre-training w/ distillation and mid-training
    long_distill_steps: int = 100_000     # Table 2's "LLM distillation (100k steps)" row ...
    long_q: float = 0.01                  # ... on 1% of the public data
    kd_beta: float = 0.1                  # β of L_pub (grid 1e-1, 1e-2, 1e-3)
    temperature: float = 1.0
    central_batch_size: int = 128
    central_lr: float = 1e-3
    match_betas: tuple = (0.5, 1.0)       # ĥ and "w/o p_pub"
    unk_correction: bool = True
    # UNK targets in the LM loss of the task (`task.loss_fn`: the private FL loss and the plain
    # public LM loss of pretrain_lm / mid_random_lm). False: as the paper's full-vocabulary
    # student, which never meets UNK (`unk_free_loss_task`). The distillation objective L_pub
    # (`distill.make_distill_loss`) is unchanged: its L_LM term and the teacher's UNK mass keep UNK
    train_on_unk: bool = True
    rows: tuple = ROWS
    # another experiment's workdir (public_training <-> wang_ablations): a finished run there that
    # is the same computation (`fedpriv.recipes.public.run_key`) is read back, not retrained
    reuse_workdir: str | None = None
    # False: a (student, seed, epsilon, row) run that is neither finished here nor found by run key
    # is left out ("not run yet" in the tables and verdicts), never trained: publishes the runs
    # that exist (e.g. a column finished over several sessions) without starting the rest
    train_missing: bool = True
    seeds: tuple = (0,)

    def __post_init__(self):
        super().__post_init__()
        check(self, positive=("vocab_kept", "vocab_texts", "topk", "teacher_batch_size", "pool_size", "q",
                              "pretrain_fraction", "central_batch_size", "central_lr", "long_q",
                              "temperature"),
              non_negative=("split_seed", "pool_seed", "t_prime", "pretrain_steps", "distill_steps",
                            "long_distill_steps", "kd_beta"))
        if self.reuse_workdir is not None and not os.path.isdir(self.reuse_workdir):
            raise ConfigError(f"reuse_workdir {self.reuse_workdir!r} is not a directory")
        archs = self.archs if self.archs is not None else (self.arch,)
        if not archs or any(a not in ("lstm", "transformer") for a in archs) or len(set(archs)) < len(archs):
            raise ConfigError(f"archs must be distinct choices of ('lstm', 'transformer'), got {self.archs}")
        if archs[0] != self.arch:
            raise ConfigError(f"arch={self.arch!r} and archs={'/'.join(archs)} disagree: archs runs each "
                              f"student; its first is arch (set arch={archs[0]} or reorder archs)")
        if any(not (isinstance(e, (int, float)) and e > 0) for e in self.epsilons):
            raise ConfigError(f"epsilons must be positive numbers, got {self.epsilons}")
        n_eps = len(self.epsilons)
        for name, sizes, what in (
                ("student_server_lrs", {len(archs), len(archs) * n_eps},
                 f"one positive server lr per student of archs={'/'.join(archs)}, or one per (student, "
                 f"epsilon) ({len(archs) * n_eps}: each student's at epsilons={'/'.join(map(str, self.epsilons))})"),
                ("epsilon_server_lrs", {n_eps},
                 f"one positive server lr per epsilon of epsilons={'/'.join(map(str, self.epsilons))}")):
            given = getattr(self, name)
            if given is None:
                continue
            lrs = _positive_floats(given)
            if lrs is None or len(lrs) not in sizes:
                raise ConfigError(f"{name}={'/'.join(map(str, given))} must be {what}")
            object.__setattr__(self, name, lrs)
        if self.epsilon_server_lrs is not None and (self.student_server_lrs is not None or len(archs) > 1):
            raise ConfigError("epsilon_server_lrs is the one student's server lr per epsilon; with archs="
                              f"{'/'.join(archs)} or student_server_lrs give student_server_lrs one per "
                              "(student, epsilon) instead")
        first = (self.student_server_lrs or self.epsilon_server_lrs or (self.server_lr,))[0]
        if first != self.server_lr:
            name = "student_server_lrs" if self.student_server_lrs is not None else "epsilon_server_lrs"
            shown = "/".join(f"{x:g}" for x in getattr(self, name))
            raise ConfigError(f"server_lr={self.server_lr:g} and {name}={shown} disagree: the first run's "
                              f"server lr is {first:g} (set server_lr={first:g})")
        self.check_heads(archs)
        unknown = set(self.rows) - set(ROWS)
        if unknown:
            raise ConfigError(f"unknown rows {sorted(unknown)}; choose from {ROWS}")

    @property
    def students(self) -> tuple:
        """The archs of the table's columns (``archs``, or just ``arch``)."""
        return self.archs if self.archs is not None else (self.arch,)

    def student(self, arch: str):
        """This config for one student's runs: ``arch`` and its server lr (per epsilon, where
        ``student_server_lrs`` gives one per (student, epsilon)) set, no student lists."""
        i, lrs = self.students.index(arch), self.student_server_lrs
        if lrs is None:
            return dataclasses.replace(self, arch=arch, archs=None)
        if len(lrs) == len(self.students):
            return dataclasses.replace(self, arch=arch, archs=None, student_server_lrs=None, server_lr=lrs[i])
        per_eps = lrs[i * len(self.epsilons):(i + 1) * len(self.epsilons)]
        return dataclasses.replace(self, arch=arch, archs=None, student_server_lrs=None, server_lr=per_eps[0],
                                   epsilon_server_lrs=per_eps)

    @property
    def t_prime_rounds(self) -> int:
        return self.rounds // 2 if self.t_prime is None else self.t_prime


def _positive_floats(values) -> tuple | None:
    """``values`` as positive finite floats, or None if one is not (a bool, or a value float() refuses)."""
    try:
        out = tuple(float(x) for x in values if not isinstance(x, bool))
    except (TypeError, ValueError):
        return None
    ok = len(out) == len(values) and all(0 < x < float("inf") for x in out)
    return out if ok else None


BASE = PublicTrainingConfig()

# The server lr per (student, epsilon) and the clip norm of the published Wang Tables 2-5 runs
# (experiments/results/run_store/wang2/README.md; the invocations in
# experiments/results/summaries/public_training.json and wang_ablations.json: server lr 0.05 /
# 0.5 for the LSTM and 0.02 / 0.1 for the Transformer at eps 1.77 / 18.71, clip 1.0, chosen on
# validation at the small model size on a 2-core CPU; not re-tuned at 670-d: the `paper` scale
# starts from them, App. C's grid (experiments.lm_sweep) re-chooses them at scale)
PUBLISHED = {"lstm": {1.77: 0.05, 18.71: 0.5}, "transformer": {1.77: 0.02, 18.71: 0.1}, "clip_norm": 1.0}

SCALES = {
    # seconds, for tests: a handful of public sequences, tiny LSTM, a few rounds
    "smoke": dict(max_clients=40, seq_len=8, max_examples_per_client=8, max_local_steps=1,
                  vocab_kept=200, vocab_texts=500, pool_size=8, teacher_batch_size=8,
                  embed_dim=8, hidden_dim=16, num_heads=4, rounds=2, cohort_size=8, q=0.25,
                  pretrain_steps=2, distill_steps=2, long_distill_steps=4, long_q=0.5,
                  central_batch_size=2, clip_norm=1.0,
                  epsilons=(18.71,), eval_every=2, checkpoint_every=2,
                  max_eval_examples=64, eval_batch_size=64),
    # a real reproduction on a shared 2-core CPU: ~50 min for 3 seeds (wang_ablations: ~90 min)
    "small": dict(max_clients=None, seq_len=20, max_examples_per_client=64, max_local_steps=2,
                  vocab_kept=3000, pool_size=1024, embed_dim=96, hidden_dim=128, num_heads=4, rounds=60,
                  cohort_size=16, noise_cohort_size=100, q=0.125, pretrain_steps=300,
                  distill_steps=150, central_batch_size=32, central_lr=1e-3, kd_beta=0.1,
                  # the paper's 100k-vs-8k steps and 1%-vs-0.08% ratios (12.5x each); 12.5 q
                  # exceeds the 1024-sentence pool: the whole pool
                  long_distill_steps=1875, long_q=1.0,
                  # UNK (20% of chitchat targets at V=3000) untrained: otherwise the argmax of a
                  # 60-round model is UNK and in-vocabulary accuracy ~0 (measured: stop 20 runs)
                  train_on_unk=False, seeds=(0, 1, 2),
                  eval_every=30, checkpoint_every=10, max_eval_examples=3000),
    # the paper's settings (Wang et al. §2, §5.3, App. B–C), for GPU/TPU, under the paper-noise
    # protocol: epsilons 1.77 / 18.71 are StackOverflow's (SIMULATED: z = 8.84 / 1.13 on cohorts
    # of 100); on chitchat's 1,053 training users the runs SPEND ~18.1 / ~367 (both reported)
    "paper": dict(vocab_kept=None, rounds=1600, cohort_size=100, max_examples_per_client=256,
                  simulated_population="wang_stackoverflow",
                  max_local_steps=16, q=0.0008, pretrain_steps=1_400_000, distill_steps=8000,
                  central_batch_size=128, seeds=(0, 1, 2), **{
                      # Table 2/3's LSTM and Transformer columns at the server lrs and clip the
                      # published small runs found (PUBLISHED below); the paper's adaptive clipping:
                      # add adaptive_clip=true (clip_norm is then its initial C)
                      "archs": ("lstm", "transformer"), "arch": "lstm",
                      "student_server_lrs": tuple(PUBLISHED[a][e] for a in ("lstm", "transformer")
                                                  for e in (1.77, 18.71)),
                      "server_lr": PUBLISHED["lstm"][1.77], "clip_norm": PUBLISHED["clip_norm"]}),
}


# set per run from `epsilons` by the experiment, never by an override
DERIVED = {n: "each run sets it from epsilons=...: set epsilons" for n in
           ("target_epsilon", "noise_multiplier")}


def get_config(arg: str = "small") -> PublicTrainingConfig:
    cfg = from_scale(BASE, SCALES, arg, derived=DERIVED)
    refuse_nonprivate(cfg.algorithm, f"epsilons={'/'.join(f'{e:g}' for e in cfg.epsilons)}")
    return cfg


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.public_training_plan(cfg)
