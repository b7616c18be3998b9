"""Config of private FL training of an on-device LM (Wang et al. 2023 §2, App. C).

``get_config(scale)`` with ``scale`` in {"smoke", "small", "paper"}; variants are
``dataclasses.replace`` overrides of one base, never copied files. Extra overrides:
``"small,algorithm=fedavg,target_epsilon=1.8"``.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from configs.common import ConfigError, check, check_lanes, from_scale

# every choice list is a registry of the library (fedpriv.registry; light: no JAX is imported):
# a new corpus, architecture, optimizer or algorithm is registered there -- in its own file, which
# a config names as "<module>:<name>" -- never a second list here
from fedpriv.recipes.algorithms import ALGORITHMS as ALGORITHM_REGISTRY, check_algorithm
from fedpriv.registry import (
    BATCHINGS,
    CORPORA as CORPUS_REGISTRY,
    MODELS,
    OPTIMIZERS,
    PATH_CORPORA as PATH_CORPUS_REGISTRY,
    TOKENIZERS,
)

# the built-in names (snapshots of the registries, for configs that list them)
PACKAGED_CORPORA = CORPUS_REGISTRY.names()
PATH_CORPORA = PATH_CORPUS_REGISTRY.names()
CORPORA = PACKAGED_CORPORA + PATH_CORPORA
ARCHS = MODELS.names()
ALGORITHMS = ALGORITHM_REGISTRY.names()
SERVER_OPTIMIZERS = OPTIMIZERS.names()
CLIENT_COMPUTE = ("float32", "bfloat16")        # fedpriv.fl.client.make_local_step compute_dtype


@dataclasses.dataclass(frozen=True)
class LMModelFields:
    """The on-device LM (App. B.2), declared once for every config that builds one
    (:class:`LMFLFields`, ``configs/wang_figure3.py``'s oracle): ``fedpriv.recipes.lm.build_task``
    reads these and ``seq_len``."""
    arch: str = "lstm"                    # lstm | transformer | a plugin's "<module>:<name>"
    embed_dim: int = 96
    hidden_dim: int = 670
    num_heads: int = 10                   # transformer heads (670 / 10 = 67, App. B.2)

    def check_heads(self, archs: tuple | None = None) -> None:
        """Refuse a transformer (``arch``, or any of ``archs``) whose heads do not divide its width,
        and fewer than one head (any arch: a field that can never be used so is a typo)."""
        if not self.num_heads >= 1:
            raise ConfigError(f"num_heads must be >= 1, got {self.num_heads}")
        if "transformer" in (archs or (self.arch,)) and self.hidden_dim % self.num_heads:
            raise ConfigError(f"num_heads={self.num_heads} must divide hidden_dim={self.hidden_dim} "
                              "(transformer)")


@dataclasses.dataclass(frozen=True)
class LMFLFields(LMModelFields):
    """The private FL of an on-device LM: its data, model (:class:`LMModelFields`), DP algorithm
    and loop, declared once for :class:`LMFLConfig` and ``configs/public_training.py`` (flat, so
    the overrides name them directly: ``rounds=80``). ``fedpriv.recipes.lm.build_task`` /
    ``build_algorithm`` read them; a config adds its own fields and checks in ``__post_init__``
    after ``super().__post_init__()``."""
    # the algorithms this config accepts (a class constant, not a field): every registered one
    # (fedpriv.recipes.algorithms, plugins included), or a tuple of names
    algorithms: ClassVar = ALGORITHM_REGISTRY
    # data
    corpus: str = "chitchat"              # chitchat | shakespeare | simpsons | stackoverflow | reddit_jsonl
    corpus_path: str | None = None        # stackoverflow: TFF's stackoverflow.sqlite(.lzma);
    #                                       reddit_jsonl: JSON lines, author/body or user/text
    public_pool_path: str | None = None   # the public pool (tokenizer): a C4 TFDS directory or
    #                                       .txt/.jsonl files (None: the packaged pool)
    max_clients: int | None = None        # subsample the population (None = all)
    split: tuple = (0.8, 0.1, 0.1)        # train / validation / test, by client
    seq_len: int = 20
    max_examples_per_client: int = 256
    batch_size: int = 16
    max_local_steps: int | None = 16
    # algorithm
    # a registered LM-FL algorithm (fedpriv.recipes.algorithms: mechanism, sampler, hooks,
    # optimizers): fedavg | dp_fedavg (Poisson cohorts) | dp_ftrl | dp_mf_banded | dp_mf_blt |
    # dp_fedavg_fixed (central Gaussian, fixed-size cohorts) | dp_ddg (distributed discrete
    # Gaussian under secure aggregation, fixed-size cohorts, no amplification) | dp_mf_banded_opt
    # (banded MF with jax_privacy-optimised coefficients; extra "mf") | a plugin's "<module>:<name>"
    algorithm: str = "dp_ftrl"
    rounds: int = 1600
    cohort_size: int = 100
    noise_cohort_size: int | None = None  # simulate the noise of a larger cohort (say so)
    # the paper-noise protocol (fedpriv.dp.population): the paper's population this run's noise
    # simulates (e.g. "wang_stackoverflow"); the outputs state its epsilon beside the epsilon
    # spent on our users, and target_epsilon (if set) is the SIMULATED population's epsilon
    simulated_population: str | None = None
    noise_multiplier: float | None = None # set z directly, or
    target_epsilon: float | None = None   # calibrate z to this epsilon for the whole run
    delta: float = 1e-6
    clip_norm: float = 0.3                # C (the initial C with adaptive_clip)
    # the paper's adaptive clipping (Wang et al. App. C: Andrew et al. 2021, as in Xu et al. 2023):
    # each round the noised count of clients whose update was not clipped, released on the same
    # cohort as the sum, moves C geometrically toward the clip_quantile of the update norms
    # (fedpriv.dp.adaptive). The count is part of the same subsampled release (docs/privacy.md):
    # the accounting charges sum + count as one mechanism, and a calibrated z (target_epsilon, or
    # the paper-noise protocol's simulated population) is raised so the pair meets the epsilon.
    adaptive_clip: bool = False
    clip_quantile: float = 0.5            # gamma, the target quantile of the update norms
    clip_lr: float = 0.2                  # eta_C, the geometric step (Andrew et al.)
    clip_count_stddev: float | None = None  # sigma_b; None: cohort_size / 20 (Andrew et al.)
    client_lr: float = 0.5
    server_optimizer: str = "sgdm"        # sgd | sgdm | adam | a registered one (fedpriv.registry.OPTIMIZERS)
    server_lr: float = 1.0
    server_momentum: float = 0.9
    # loop
    eval_every: int = 100
    eval_batch_size: int = 256
    max_eval_examples: int | None = 10000
    checkpoint_every: int = 50
    # clients trained concurrently ("lanes", fedpriv.fl.execution): "auto" = one sequential lane
    # per CPU device, balanced vmapped lanes on GPU/TPU; or "balanced" or a number.
    lanes: str = "auto"
    # local batches (fedpriv.fl.cohort, "Length-aware batches"): "padded" (every step runs all
    # seq_len positions), "trimmed" (the same batches cut to their longest row: the same numbers
    # up to float order; needs one lane), "sorted" (each client's examples sorted by length into
    # batches, batch order shuffled, then trimmed: another local SGD trajectory, less padding),
    # "packed" (the padded batches, each step's sentences packed end to end into fewer rows with
    # the LSTM state / attention reset per sentence: the same numbers up to float order; one lane),
    # "auto": packed on one sequential lane (CPU), padded on vmapped lanes (GPU/TPU).
    # padded/trimmed/packed/auto identify the same run (fedpriv.recipes.lm.SAME_NUMBERS_BATCHINGS)
    batching: str = "auto"
    seed: int = 0

    def __post_init__(self):
        check(self, positive=("max_clients", "seq_len", "max_examples_per_client", "batch_size",
                              "max_local_steps", "embed_dim", "hidden_dim", "num_heads", "rounds",
                              "cohort_size", "noise_cohort_size", "target_epsilon", "clip_norm",
                              "client_lr", "server_lr", "eval_every", "eval_batch_size",
                              "max_eval_examples", "checkpoint_every"),
              non_negative=("noise_multiplier", "server_momentum", "seed"), open_unit=("delta",),
              choices={"corpus": (CORPUS_REGISTRY, PATH_CORPUS_REGISTRY), "arch": MODELS,
                       "algorithm": self.algorithms, "server_optimizer": OPTIMIZERS,
                       "batching": BATCHINGS + ("auto",)},
              fractions=("split",))
        check_lanes(self.lanes)
        if not 0 < self.clip_quantile < 1:
            raise ConfigError(f"clip_quantile must be in (0, 1), got {self.clip_quantile}")
        if not self.clip_lr > 0:
            raise ConfigError(f"clip_lr must be > 0, got {self.clip_lr}")
        if self.clip_count_stddev is not None and not self.clip_count_stddev > 0:
            raise ConfigError(f"clip_count_stddev must be > 0 (an exact count is not private), got "
                              f"{self.clip_count_stddev}")
        if self.adaptive_clip and self.algorithm == "fedavg":
            raise ConfigError("adaptive_clip needs a DP algorithm (its count is a DP release); "
                              "fedavg has no clipping to adapt")


#: the adaptive-clipping fields: they identify a run only when adaptive_clip is on (a run from
#: before them, or with them off, keeps its fingerprint and run key)
ADAPTIVE_FIELDS = ("adaptive_clip", "clip_quantile", "clip_lr", "clip_count_stddev")


@dataclasses.dataclass(frozen=True)
class LMFLConfig(LMFLFields):
    # (LMFLFields: data, model, algorithm, loop)
    # tokenizer (Wang et al. §3.1): public SentencePiece or private top-k words
    # sentencepiece | word_public (top-k words of the public pool) | word (top-k words of the
    # training users' own text: NON-PRIVATE, recorded so in the ledger, eps reported as inf)
    tokenizer: str = "sentencepiece"
    vocab_size: int = 8000
    mf_bands: int = 64                    # dp_mf_banded: bands (at most the min-separation)
    ddg_bits: int = 16                    # dp_ddg: secure aggregation modulus 2^bits
    # client forward/backward precision: "bfloat16" casts the parameters for the local pass
    # (mixed precision); gradients, clipping, sums and noise stay float32 (the DP release is
    # unchanged). For accelerators: on a CPU bfloat16 is emulated and slower.
    client_compute: str = "float32"

    def __post_init__(self):
        super().__post_init__()
        check(self, positive=("mf_bands", "ddg_bits"),
              choices={"tokenizer": TOKENIZERS, "client_compute": CLIENT_COMPUTE})
        self.check_heads()
        if self.vocab_size <= 4:
            raise ConfigError(f"vocab_size must be > 4 (the 4 special tokens), got {self.vocab_size}")
        if not self.server_momentum < 1:
            raise ConfigError(f"server_momentum must be in [0, 1), got {self.server_momentum}")
        if self.noise_cohort_size is not None and self.noise_cohort_size < self.cohort_size:
            raise ConfigError(f"noise_cohort_size ({self.noise_cohort_size}) must be >= cohort_size "
                              f"({self.cohort_size}): it simulates the noise of a larger cohort")


def check_run(cfg: LMFLConfig) -> LMFLConfig:
    """Cross-field checks of a config about to run (not of the bare defaults)."""
    # (cross-field: checked once every override is applied; the recipe re-checks what it reads:
    # lm.load_corpus the path, lm.simulated_population the protocol)
    if cfg.corpus in PATH_CORPUS_REGISTRY and not cfg.corpus_path:
        raise ConfigError(f"corpus={cfg.corpus} needs corpus_path (the file with the paper's data)")
    if cfg.corpus not in PATH_CORPUS_REGISTRY and cfg.corpus_path:
        raise ConfigError(f"corpus_path is set but corpus={cfg.corpus} is packaged (it reads no path)")
    if cfg.simulated_population is not None and cfg.algorithm != "fedavg":
        from fedpriv.dp.population import check_protocol, get_population
        check_protocol(get_population(cfg.simulated_population), algorithm=cfg.algorithm,
                       cohort_size=cfg.cohort_size, noise_cohort_size=cfg.noise_cohort_size)
    # the algorithm's mechanism, sampler and optimizers are ones the registries know
    private = check_algorithm(cfg.algorithm).private
    if private and cfg.noise_multiplier is None and cfg.target_epsilon is None:
        raise ConfigError(f"{cfg.algorithm} needs noise_multiplier or target_epsilon (set one, "
                          "e.g. target_epsilon=18.7)")
    return cfg


BASE = LMFLConfig()

# Server lr, client lr and clip norm per epsilon, chosen on VALIDATION accuracy: how, with the
# commands and the numbers, is docs/tuning.md
TUNED = {
    18.71: dict(server_lr=1.0, client_lr=0.5, clip_norm=0.3),
    1.77: dict(server_lr=0.05, client_lr=0.5, clip_norm=1.0),
}

SCALES = {
    # seconds, for tests: tiny model, few clients and rounds
    "smoke": dict(max_clients=60, vocab_size=300, embed_dim=16, hidden_dim=32, num_heads=4, rounds=4,
                  cohort_size=8, noise_cohort_size=None, max_examples_per_client=16,
                  max_local_steps=1, batch_size=16, eval_every=2, checkpoint_every=2,
                  target_epsilon=50.0, max_eval_examples=256, clip_norm=1.0),
    # a real reproduction on a 2-core CPU in minutes; target_epsilon 18.7 is the noise-cohort
    # simulation's (McMahan et al. 2018: cohort 16 trained with the noise of 100, population
    # scaled by 100/16); on chitchat's 1,053 training users the run spends ~262 (both reported)
    "small": dict(vocab_size=2000, embed_dim=96, hidden_dim=128, num_heads=4, rounds=120, cohort_size=16,
                  noise_cohort_size=100, max_examples_per_client=64, max_local_steps=4,
                  eval_every=20, checkpoint_every=20, target_epsilon=18.7, max_eval_examples=5000),
    # the paper's settings (Wang et al. §2, App. C), for GPU/TPU, under the paper-noise protocol
    # (fedpriv.dp.population): z = 8.83 on cohorts of 100 for 1600 rounds is epsilon 1.77
    # SIMULATED for StackOverflow's 342,477 users (each at most once); on chitchat's 1,053
    # training users the same run SPENDS epsilon 18.15 (~152 tree epochs; 1.77 there would need
    # z ~ 67.5). Both are reported. With corpus=stackoverflow (the real data) they coincide.
    "paper": dict(vocab_size=32000, rounds=1600, cohort_size=100, noise_multiplier=8.83,
                  simulated_population="wang_stackoverflow",
                  max_examples_per_client=256, max_local_steps=16, eval_every=100, **TUNED[1.77]),
}


def get_config(arg: str = "small") -> LMFLConfig:
    return check_run(from_scale(BASE, SCALES, arg))


def privacy_plan(cfg):
    """Every ledger the experiment opens and what it charges, from ``cfg`` alone (no data, no
    training): ``fedpriv.recipes.plans``; accounted in tests/experiments/test_configs.py."""
    from fedpriv.recipes import plans
    return plans.lm_fl_plan(cfg)
