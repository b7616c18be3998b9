"""The public LLM as the on-device model (issue 53): DP-FTRL LoRA fine-tuning of SmolLM2-135M
against the small LM trained with its help, and the LLM zero-shot, at equal epsilon, in bits
per byte (``configs/llm_lora.py`` names the arms; ``experiments/llm_lora.py`` writes the tables).

Per (seed, epsilon) every private arm runs DP-FTRL on the same chitchat training users with the
same schedule (``cfg.lm``: rounds, cohort, noise cohort, z calibrated for the label epsilon
under the paper-noise protocol), so the privacy events -- hence the simulated epsilon, the
noise-cohort epsilon the ledger budgets and the epsilon spent on our users -- are the same;
each arm has its own ledger (``privacy_plan``). What differs is the model and the client's work:

* (a) ``small_lm``: the small LM of ``configs/public_training.py``, publicly pre-trained by
  distillation from the LLM (Wang et al. 2023 Algorithm 1 at T' = 0, the ``pretrain_distill_long``
  row) over the teacher's BPE restricted to ``vocab_kept`` ids (+ UNK), then DP-FTRL;
* (b) ``lora`` / (b=) ``lora_upload`` / (b*) ``lora_all_layers``: LoRA adapters on the public
  LLM (`fedpriv.models.lora`) over the teacher's full BPE (`distill.VocabRestriction.full`), the
  adapters the trainable pytree (clipped, noised, uploaded), the frozen weights an argument of
  the jitted round (`fedpriv.fl.frozen`), the lower blocks' outputs cached once per example
  (`hidden_cache`, on disk in the fedpriv cache: exact, the lower blocks never change);
* (c) ``zero_shot``: the LLM as it is (no private data).

**One test set for every arm**: the test users' examples in the LLM's tokens (at most
``lora_examples_per_client`` per user, ``lm.max_eval_examples`` in all); the small LM reads the
same examples through its vocabulary restriction (teacher id -> kept id or UNK, position by
position: the restriction maps tokens one to one, so truncation and targets align). Bits per
byte (`fedpriv.models.metrics.bits_per_byte`): EOS one byte, UNK targets of (a) charged
``-log2 q(token | UNK)`` with q the public pool's unigram over the folded tokens (add 1/2).
Accuracy: each model's own next-token accuracy over its in-vocabulary targets, the argmax over
text tokens only (the model as a suggester: (a) is trained on UNK, whose probability bits per
byte need); and both on the *common* targets (tokens in (a)'s vocabulary).

Layout of a workdir: ``seed<S>/eps<E>/<arm>/`` (``summary.json`` when finished, read back
and checked against the config (``run_key``), never rerun; ``fl/`` the DP-FTRL run, resumed from
its checkpoints), ``zero_shot/``, ``teacher_cache/`` (the distillation corpus).
"""
from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv import report
from fedpriv.data.cache import resolve_cache_dir
from fedpriv.data.errors import ConfigError
from fedpriv.data.federated import FederatedDataset
from fedpriv.dp import accounting
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.dp.plan import PrivacyPlan
from fedpriv.fl import algorithms as algs
from fedpriv.fl.frozen import build_frozen_algorithm
from fedpriv.fl.loop import train
from fedpriv.models import gguf, lora as L, metrics as M
from fedpriv.models.flops import matmul_flops
from fedpriv.models.lm import count_params, make_lm, make_lm_task
from fedpriv.public import distill, vocab
from fedpriv.public.algorithm import PrivateTraining, algorithm1
from fedpriv.recipes import lm, plans, public
from fedpriv.recipes.pretext import truncated_teacher

__all__ = ["ARM_LABELS", "LlmData", "prepare_llm_data", "hidden_cache", "lora_config", "upload_rank",
           "run_arms", "privacy_plan", "small_lm_step_flops", "lora_step_flops", "run_key"]

ARM_LABELS = {"small_lm": "(a) small LM: public pre-training + LLM distillation, then DP-FTRL",
              "lora": "(b) DP-FTRL LoRA of the public LLM",
              "lora_upload": "(b=) DP-FTRL LoRA of the public LLM, upload matched to (a)",
              "lora_all_layers": "(b*) DP-FTRL LoRA of the public LLM, adapters on every block",
              "zero_shot": "(c) the public LLM zero-shot (no private data)"}
LORA_ARMS = ("lora", "lora_upload", "lora_all_layers")
SMOOTHING = 0.5  # add-1/2: the unigram baseline and q(token | UNK)


def run_teacher(cfg, teacher=None):
    """The public LLM of ``cfg``: the packaged SmolLM2-135M (``cached_teacher``), or its first
    ``teacher_layers`` blocks (smoke tests)."""
    return truncated_teacher(teacher or gguf.cached_teacher(cfg.lm.teacher_path), cfg.teacher_layers)


# ------------------------------------------------------------------------------ data


@dataclasses.dataclass
class LlmData:
    """The LLM arms' data (the teacher's full BPE in project ids) and the byte accounting.

    Attributes:
      full: `distill.VocabRestriction.full(teacher)` (every non-control teacher token).
      train: `FederatedDataset` of ``{'tokens': int32[n, L+1]}`` (at most
        ``lora_examples_per_client`` per user).
      val, test: ``int32[N, L+1]`` evaluation examples (every arm's).
      token_bytes: ``int32[V]`` UTF-8 bytes of each full id (`metrics.byte_level_token_bytes`).
      val_bytes, test_bytes: ``float64[N, L]`` bytes each target covers (EOS: 1).
      unigram: ``float64[V]`` log-probabilities of the training users' add-1/2 unigram (the
        trivial baseline; an exact statistic of private users, not covered by the ledger).
    """
    full: object
    train: FederatedDataset
    val: np.ndarray
    test: np.ndarray
    token_bytes: np.ndarray
    val_bytes: np.ndarray
    test_bytes: np.ndarray
    unigram: np.ndarray
    stats: dict


def prepare_llm_data(cfg, teacher, progress: bool = True) -> LlmData:
    """The users of ``cfg.lm`` (same draw and split as (a): ``split_seed``) in the LLM's tokens."""
    full = distill.VocabRestriction.full(teacher)
    tok = vocab.RestrictedTeacherTokenizer(teacher, full)
    data_cfg = dataclasses.replace(cfg.lm, max_examples_per_client=cfg.lora_examples_per_client,
                                   batch_size=cfg.lora_batch_size)
    _, train, val_ds, test_ds = public.private_splits(data_cfg, tok, progress)
    n = cfg.lm.max_eval_examples
    val, test = (d.concat_examples()["tokens"][:n] for d in (val_ds, test_ds))
    train_tokens = train.concat_examples()["tokens"]
    for name, t in (("training", train_tokens), ("validation", val), ("test", test)):
        if np.any(t[:, 1:] == M.UNK):  # a control token typed into a message: its bytes are unknown
            raise ConfigError(f"{int((t[:, 1:] == M.UNK).sum())} {name} targets are not text tokens of the "
                              "teacher's BPE (control tokens in the messages): bits per byte would be undefined")
    strings = [teacher.tokenizer.id_to_token(int(t)) if t >= 0 else "" for t in full.student_to_teacher]
    special = [i for i in range(len(strings)) if i < distill.NUM_SPECIAL]
    token_bytes = M.byte_level_token_bytes(strings, special)
    unigram = M.unigram_log_probs(train_tokens, full.student_vocab_size, SMOOTHING)
    stats = {"train_clients": len(train), "train_examples": train.total_examples,
             "val_examples": int(len(val)), "test_examples": int(len(test)),
             "test_bytes": float(M.target_byte_counts(test, token_bytes).sum()),
             "test_targets": int((test[:, 1:] != M.PAD).sum()), "llm_vocab_size": full.student_vocab_size}
    return LlmData(full, train, val, test, token_bytes, M.target_byte_counts(val, token_bytes),
                   M.target_byte_counts(test, token_bytes), unigram, stats)


def to_restricted(full_tokens: np.ndarray, full, restriction) -> np.ndarray:
    """``int32[N, L+1]`` LLM (full-vocabulary) examples -> the same examples in the ids of a
    restricted vocabulary: text tokens through the teacher id (kept id or UNK), PAD/BOS/EOS kept."""
    f = np.asarray(full_tokens)
    teacher_ids = full.student_to_teacher[f]
    out = restriction.teacher_to_student[np.maximum(teacher_ids, 0)].astype(np.int32)
    special = f < distill.NUM_SPECIAL
    out[special] = f[special]
    return out


def unk_log_q(full, restriction, teacher, public_texts) -> np.ndarray:
    """``float64[V_full]``: log q(token | UNK), the public pool's add-1/2 unigram over the text
    tokens the restriction folds into UNK (-inf elsewhere): the code (a) pays for a folded token."""
    counts = np.zeros(teacher.config.vocab_size, np.float64)
    for ids in vocab.encode_teacher(teacher, list(public_texts)):
        np.add.at(counts, np.asarray(ids, np.int64), 1.0)
    s2t = np.asarray(full.student_to_teacher, np.int64)
    text = np.arange(len(s2t)) >= distill.NUM_SPECIAL
    folded = text & (restriction.teacher_to_student[np.maximum(s2t, 0)] == M.UNK)
    mass = np.where(folded, counts[np.maximum(s2t, 0)] + SMOOTHING, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(mass / mass.sum())


# ------------------------------------------------------------------------------ the hidden cache


def hidden_cache(task: L.LoraTask, tokens: np.ndarray, dtype: str, fingerprint: str, batch_size: int = 64,
                 cache_dir=None, log=None) -> np.ndarray:
    """`lora.cache_hidden` of ``tokens`` (the lower blocks' output per example), computed once
    and kept on disk in the fedpriv cache (``lora_hidden/<key>.npy``, read memory-mapped), keyed
    by the teacher's fingerprint, the split point, the frozen and cache dtypes and the tokens.
    Concurrent processes wait on one lock: one computes, the others read."""
    n_lower = task.config.n_layers - task.lora.adapted(task.config.n_layers)
    key = hashlib.sha256(json.dumps([fingerprint, n_lower, task.lora.frozen_dtype, dtype, list(tokens.shape)])
                         .encode() + np.ascontiguousarray(tokens, np.int32).tobytes()).hexdigest()[:24]
    root = resolve_cache_dir(cache_dir) / "lora_hidden"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{key}.npy"
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            if log:
                log(f"caching the lower {n_lower} blocks' outputs of {len(tokens):,} examples in {path}")
            h = L.cache_hidden(task, tokens, batch_size, dtype)
            tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npy")
            np.save(tmp, h)
            os.replace(tmp, path)
    return np.load(path, mmap_mode="r")


# ------------------------------------------------------------------------------ models and costs


def lora_config(cfg, arm: str, upload_params: int | None = None, llama_config=None) -> L.LoraConfig:
    """The `LoraConfig` of a LoRA arm: (b) ``rank``/``targets`` on the top ``top_layers``
    blocks; (b=) ``upload_targets`` at `upload_rank` (needs ``upload_params``, (a)'s parameter
    count, and ``llama_config``); (b*) (b)'s adapters on every block."""
    common = dict(alpha=cfg.alpha, frozen_dtype=cfg.frozen_dtype)
    if arm == "lora":
        return L.LoraConfig(rank=cfg.rank, targets=cfg.targets, top_layers=cfg.top_layers, **common)
    if arm == "lora_all_layers":
        return L.LoraConfig(rank=cfg.rank, targets=cfg.targets, top_layers=None, **common)
    if arm == "lora_upload":
        rank = upload_rank(cfg, upload_params, llama_config)
        return L.LoraConfig(rank=rank, targets=cfg.upload_targets, top_layers=cfg.top_layers,
                            **{**common, "alpha": cfg.alpha * rank / cfg.rank})  # the same alpha / r scaling
    raise ValueError(f"not a LoRA arm: {arm!r}")


def upload_rank(cfg, upload_params: int, llama_config) -> int:
    """The rank of ``upload_targets`` on the top ``top_layers`` blocks whose adapter count is
    closest to ``upload_params`` (at least 1)."""
    per_rank = L.num_adapter_params(llama_config, L.LoraConfig(rank=1, targets=cfg.upload_targets,
                                                               top_layers=cfg.top_layers))
    return max(1, int(round(upload_params / per_rank)))


def small_lm_step_flops(model_cfg, rows: int, length: int) -> float:
    """FLOPs of one local step of the on-device LM on ``rows`` x ``length`` (padded) positions,
    a closed form counting matmuls (multiply-add = 2): the forward per position is ``2 P_mm`` with
    LSTM ``P_mm = E·4H + H·4H + (layers - 1)·(H·4H + H·4H) + H·E + E·V`` and transformer
    ``E·H + layers·(4H² + 2·length·H + 2H·F) + H·E + E·V``; training is 3x the forward
    (gradients of activations and of weights)."""
    c = model_cfg
    E, H, V = c.embed_dim, c.hidden_dim, c.vocab_size
    if c.arch == "lstm":
        mm = 4 * E * H + 4 * H * H + (c.num_layers - 1) * 8 * H * H + H * E + E * V
    else:
        mm = E * H + c.num_layers * (4 * H * H + 2 * length * H + 2 * H * c.ffn_width) + H * E + E * V
    return float(3 * 2 * mm * rows * length)


def lora_step_flops(llama_config, lora_cfg: L.LoraConfig, rows: int, length: int) -> float:
    """FLOPs of one LoRA client step on ``rows`` x ``length`` positions (closed form, matmuls;
    multiply-add = 2). Per position, MACs: the k adapted blocks' projections ``P = d·(Hh + 2Gh)
    + Hh·d + 3 d·F`` forward and backward to the activations through the frozen weights (2P; no
    weight gradient; the lowest block's input gradient too: the blocks run as one loop body),
    their attention ``2·length·Hh`` forward and twice that backward, the tied head ``d·V``
    forward and backward, and the adapters' forward + both gradients (3 x ``r (d_in + d_out)``
    per target). Equal to `fedpriv.models.flops.matmul_flops` of the step
    (`tests/experiments/test_llm_lora.py`)."""
    c = llama_config
    hq, hkv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    k = lora_cfg.adapted(c.n_layers)
    proj = c.dim * (hq + 2 * hkv) + hq * c.dim + 3 * c.dim * c.ffn_dim
    shapes = L.target_shapes(c)
    adapter = sum(lora_cfg.rank * sum(shapes[t]) for t in lora_cfg.targets)
    macs = k * (2 * proj + 6 * length * hq) + 2 * c.dim * c.vocab_size + 3 * k * adapter
    return float(2 * macs * rows * length)


def lower_flops(llama_config, lora_cfg: L.LoraConfig, length: int) -> float:
    """FLOPs of the cache pass per position (of rows of ``length``): the N - k frozen lower
    blocks' forward (projections and attention, matmuls)."""
    c = llama_config
    hq, hkv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    block = c.dim * (hq + 2 * hkv) + hq * c.dim + 3 * c.dim * c.ffn_dim + 2 * length * hq
    return float(2 * (c.n_layers - lora_cfg.adapted(c.n_layers)) * block)


def _xla_memory(compiled) -> int | None:
    """Peak bytes XLA reserves for a compiled step: arguments + outputs + temporaries (aliased
    outputs not double-counted)."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - getattr(m, "alias_size_in_bytes", 0))


def _client_step(loss, opt):
    def step(params, opt_state, batch):
        (_, _), g = jax.value_and_grad(loss, has_aux=True)(params, batch)
        upd, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state
    return step


def small_lm_costs(cfg, task, model_cfg, params) -> dict:
    """Client cost per round of (a): bytes down/up (float32 params), the matmul FLOPs of its local
    steps on padded batches (counted on the step's jaxpr, `fedpriv.models.flops`; the closed form
    beside), XLA's peak bytes of one compiled local step."""
    c = cfg.lm
    steps = c.max_local_steps or 1
    opt = optax.sgd(c.client_lr)
    batch = {"tokens": jnp.zeros((c.batch_size, c.seq_len + 1), jnp.int32),
             "mask": jnp.ones((c.batch_size,), jnp.float32)}
    step = _client_step(lambda p, b: task.loss_fn(p, b, None), opt)
    compiled = jax.jit(step).lower(params, opt.init(params), batch).compile()
    n = count_params(params)
    return {"params": n, "down_bytes": 4 * n, "up_bytes": 4 * n, "local_steps": steps,
            "flops": steps * matmul_flops(step, params, opt.init(params), batch),
            "flops_closed_form": steps * small_lm_step_flops(model_cfg, c.batch_size, c.seq_len),
            "step_peak_bytes": _xla_memory(compiled), "model_bytes": 4 * n}


def lora_costs(cfg, task: L.LoraTask, adapters) -> dict:
    """Client cost per round of a LoRA arm: bytes down/up (float32 adapters; the frozen LLM is a
    one-time download, ``model_bytes``), the matmul FLOPs of the local steps (counted on the
    step's jaxpr; the closed form beside) and, once per example, of the cache pass (closed form),
    XLA's peak bytes of one compiled local step."""
    steps, B, T = cfg.lora_local_steps, cfg.lora_batch_size, cfg.lm.seq_len
    opt = optax.sgd(cfg.lora_client_lr)
    batch = {"tokens": jnp.zeros((B, T + 1), jnp.int32), "mask": jnp.ones((B,), jnp.float32)}
    if task.lora.adapted(task.config.n_layers) < task.config.n_layers:
        batch["hidden"] = jnp.zeros((B, T, task.config.dim), jnp.dtype(cfg.cache_dtype))
    def step(fz, p, s, b):
        return _client_step(lambda pp, bb: task.loss_with(fz, pp, bb), opt)(p, s, b)

    args = (task.frozen, adapters, opt.init(adapters), batch)
    compiled = jax.jit(step).lower(*args).compile()
    frozen_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(task.frozen))
    n = task.num_params
    return {"params": n, "down_bytes": 4 * n, "up_bytes": 4 * n, "local_steps": steps,
            "flops": steps * matmul_flops(step, *args),
            "flops_closed_form": steps * lora_step_flops(task.config, task.lora, B, T),
            "cache_flops_per_example": lower_flops(task.config, task.lora, T) * T,
            "step_peak_bytes": _xla_memory(compiled), "model_bytes": frozen_bytes}


# ------------------------------------------------------------------------------ scoring


@functools.lru_cache(maxsize=8)
def _small_scores(apply):
    """Jitted ``(params, tokens) -> (nll, correct)``: NLL over the full softmax, correctness of the
    argmax over text tokens only (a suggester: (a) trained on UNK would otherwise suggest it)."""
    def fn(params, tokens):
        inputs, targets = M.split_tokens(tokens)
        logits = apply(params, inputs, None)
        text = logits.at[..., :distill.NUM_SPECIAL].set(L.NEG)
        return M.token_nll(logits, targets), M.top1_correct(text, targets)
    return jax.jit(fn)


def _lora_scores(task: L.LoraTask):
    def fn(frozen, adapters, batch):
        logits, targets = task.logits_with(frozen, adapters, batch)
        text = logits.at[..., :distill.NUM_SPECIAL].set(L.NEG)
        return M.token_nll(logits, targets), M.top1_correct(text, targets)
    return jax.jit(fn)


def _summary(nll, correct, tokens, target_bytes, extra=None, common=None) -> dict:
    out = M.byte_level_summary(nll, correct, tokens, target_bytes, extra)
    if common is not None:  # the targets in (a)'s vocabulary: the same positions for every arm
        out["common_accuracy"] = float(np.asarray(correct)[common].mean()) if common.any() else float("nan")
    return out


@dataclasses.dataclass
class Scorer:
    """Evaluates any arm on the shared validation and test examples (module docstring)."""
    data: LlmData
    restriction: object          # (a)'s VocabRestriction
    log_q: np.ndarray            # (a)'s code for UNK targets, over full ids
    batch_size: int

    def __post_init__(self):
        self.small = {n: to_restricted(getattr(self.data, n), self.data.full, self.restriction)
                      for n in ("val", "test")}
        self.extra = {n: M.unk_code_lengths(self.small[n], getattr(self.data, n), self.log_q)
                      for n in ("val", "test")}
        self.common = {n: M.in_vocab_mask(self.small[n][:, 1:]) for n in ("val", "test")}
        self.bytes = {"val": self.data.val_bytes, "test": self.data.test_bytes}
        # length-sorted batches at a few widths pay for their compiles on many examples only
        self.trim = len(self.data.test) > 8 * self.batch_size

    def small_lm(self, task, params, split: str) -> dict:
        nll, correct = M.per_token_scores(lambda b: _small_scores(task.apply)(params, b["tokens"]),
                                          self.small[split], self.batch_size, trim=self.trim)
        return _summary(nll, correct, self.small[split], self.bytes[split], self.extra[split],
                        self.common[split])

    def llm(self, fn, frozen, adapters, split: str, hidden=None) -> dict:
        tokens = getattr(self.data, split)
        feats = None if hidden is None else {"hidden": hidden}
        nll, correct = M.per_token_scores(lambda b: fn(frozen, adapters, b), tokens, self.batch_size, feats,
                                          trim=self.trim)
        return _summary(nll, correct, tokens, self.bytes[split], None, self.common[split])

    def baselines(self, split: str, small_train_tokens) -> dict:
        """The trivial baselines (exact statistics of the private training users): the unigram's
        bits per byte, the most-frequent-token accuracy of each vocabulary and on the common targets."""
        tokens = getattr(self.data, split)
        t = tokens[:, 1:]
        nll = np.where(t != M.PAD, -self.data.unigram[t], 0.0)
        bpb = M.bits_per_byte(nll, self.bytes[split], scored=t != M.PAD)["bits_per_byte"]
        train_full = self.data.train.concat_examples()["tokens"]
        vals, counts = np.unique(train_full[:, 1:][M.in_vocab_mask(train_full[:, 1:])], return_counts=True)
        top = vals[np.argmax(counts)]
        common = self.common[split]
        return {"unigram_bits_per_byte": bpb,
                "most_frequent_accuracy_llm": M.most_frequent_token_accuracy(train_full, tokens),
                "most_frequent_accuracy_small": M.most_frequent_token_accuracy(small_train_tokens, self.small[split]),
                "most_frequent_accuracy_common": float((t[common] == top).mean()) if common.any() else float("nan")}


# ------------------------------------------------------------------------------ run identity


_NOT_IDENTITY = {"arms", "target_bpb", "eval_batch_size"}
_LM_NOT_IDENTITY = {"seeds", "epsilons", "epsilon_server_lrs", "seed", "target_epsilon", "noise_multiplier",
                    "eval_every", "checkpoint_every", "lanes", "reuse_workdir", "train_missing", "rows",
                    "max_eval_examples", "eval_batch_size"}
_LORA_FIELDS = {"rank", "alpha", "targets", "top_layers", "upload_targets", "frozen_dtype", "cache_dtype",
                "lora_examples_per_client", "lora_batch_size", "lora_local_steps", "lora_client_lr",
                "lora_clip_norm", "lora_clip_norms", "lora_server_lrs"}


def run_key(cfg, arm: str, seed: int | None, eps: float | None) -> str:
    """What determines one arm's run: the config fields it reads (the LoRA fields only for the
    LoRA arms; (a)'s server lr at ``eps``), the seed and the epsilon."""
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_IDENTITY | {"lm"}}
    lmf = {k: v for k, v in dataclasses.asdict(cfg.lm).items() if k not in _LM_NOT_IDENTITY}
    if arm == "small_lm":
        fields = {k: v for k, v in fields.items() if k not in _LORA_FIELDS}
        lmf["server_lr"] = public.at_epsilon(cfg.lm, eps).server_lr
    else:
        for name in ("lora_server_lrs", "lora_clip_norms", "lora_clip_norm"):
            fields.pop(name, None)
        fields["lora_server_lr"] = None if eps is None else cfg.lora_server_lr(eps)
        fields["lora_clip"] = None if eps is None else cfg.lora_clip(eps)
    fields.update(lm=lmf, arm=arm, seed=seed, epsilon=None if eps is None else float(eps))
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _read(sub: str, key: str):
    path = os.path.join(sub, "summary.json")
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    if s.get("run_key") != key:
        raise ConfigError(f"{path} is a finished run of another configuration (run key {s.get('run_key')} "
                          f"!= {key}): use another workdir")
    return s


# ------------------------------------------------------------------------------ the arms


def _dp(cfg, fcfg, n, loss_fn):
    """(mechanism, sampler, event, z, epsilon of the event, executed-run epsilon, paper noise) of
    one private arm: `lm.build_algorithm` on the shared schedule."""
    alg, sampler, event, z = lm.build_algorithm(fcfg, n, loss_fn)
    eps = accounting.compute_epsilon(event, fcfg.delta)[0]
    executed = None
    if fcfg.noise_cohort_size is not None:
        executed = accounting.compute_epsilon(algs.privacy_event(alg.dp, sampler, fcfg.rounds, simulated=False),
                                              fcfg.delta)[0]
    pn = lm.paper_noise(fcfg, z, alg, sampler, n)
    return alg, sampler, event, z, eps, executed, pn


def _privacy_fields(eps_label, z, eps, executed, pn) -> dict:
    return {"target_epsilon": eps_label, "noise_multiplier": z, "epsilon": eps, "epsilon_executed_run": executed,
            "paper_noise": None if pn is None else pn.as_dict(), "unit_of_privacy": "user"}


def small_task(cfg, vocab_size: int):
    """(a)'s task (``lm.model_config``'s LM over ``vocab_size`` ids; UNK targets trained unless
    ``train_on_unk=False``) and its model config."""
    model_cfg = lm.model_config(cfg.lm, vocab_size)
    task = make_lm_task(make_lm(model_cfg))
    return (task if cfg.lm.train_on_unk else vocab.unk_free_loss_task(task)), model_cfg


def _run_small(cfg, seed, eps, prepared, scorer, sub, key, progress, log) -> dict:
    t0, c0 = time.time(), time.process_time()
    phases = lm.PhaseTimer()
    task, model_cfg = small_task(cfg, prepared.tokenizer.vocab_size)
    ecfg = public.at_epsilon(cfg.lm, eps)
    fcfg = dataclasses.replace(ecfg, seed=seed, target_epsilon=eps, noise_multiplier=None)
    ids = list(prepared.train.client_ids)
    alg, sampler, event, z, eps_val, executed, pn = _dp(cfg, fcfg, len(ids), task.loss_fn)
    ledger = PrivacyLedger(eps_val * (1 + 1e-6), cfg.lm.delta)
    eval_fn = phases.timed("evaluation", lambda p: scorer.small_lm(task, p, "val"))
    private = PrivateTraining(alg, sampler, prepared.train, ids, rounds=cfg.lm.rounds,
                              batch_size=cfg.lm.batch_size, seed=seed, max_steps=cfg.lm.max_local_steps,
                              eval_fn=eval_fn, eval_every=cfg.lm.eval_every,
                              checkpoint_every=cfg.lm.checkpoint_every, stage="dp-ftrl (small_lm)",
                              progress=progress, log_fn=_log_row(log), lanes=cfg.lm.lanes,
                              batching=cfg.lm.batching)
    spec = public.row_spec("pretrain_distill_long", cfg.lm, seed)
    init = task.init(jax.random.key(seed))
    with phases("public pre-training + DP-FTRL (rounds, compile, checkpoints; without evaluation)",
                exclude=("evaluation",)):
        out = algorithm1(private, task, init, prepared.pool, spec, workdir=sub, ledger=ledger,
                         progress=progress, log=log)
    params = out.result.state.params
    with phases("evaluation"):
        test = scorer.small_lm(task, params, "test")
        val0 = scorer.small_lm(task, init, "val")
    costs = small_lm_costs(cfg, task, model_cfg, params)
    return {"arm": "small_lm", "seed": seed, **_privacy_fields(eps, z, eps_val, executed, pn),
            "server_lr": ecfg.server_lr, "client_lr": cfg.lm.client_lr, "clip_norm": cfg.lm.clip_norm,
            "rounds": cfg.lm.rounds, "test": test, "val_round0": val0,
            "val_curve": report.metric_curve(out.workdir, "eval_bits_per_byte"),
            "val_accuracy_curve": report.metric_curve(out.workdir, "eval_accuracy"),
            "public": out.public, "costs": costs, "ledger": out.result.ledger.report() if out.result.ledger else None,
            "phase_seconds": phases.as_dict(), "wall_clock_s": time.time() - t0,
            "cpu_s": time.process_time() - c0, "run_key": key, **report.git_state()}


def _log_row(log):
    def row(r):
        if "eval_bits_per_byte" in r:
            log(f"  round {r['round']:4d}: val bits/byte {r['eval_bits_per_byte']:.4f}, "
                f"accuracy {r['eval_accuracy']:.4f}")
    return row


def _lora_train_dataset(data: LlmData, hidden) -> FederatedDataset:
    arrays = {"tokens": data.train.concat_examples()["tokens"]}
    if hidden is not None:
        arrays["hidden"] = hidden
    offsets = np.concatenate([[0], np.cumsum([data.train.num_examples(c) for c in data.train.client_ids])])
    return FederatedDataset(list(data.train.client_ids), arrays, offsets, batch_size=data.train.batch_size,
                            name="llm-train")


def _run_lora(cfg, arm, seed, eps, teacher, data, scorer, lora_cfg, sub, key, progress, log) -> dict:
    t0, c0 = time.time(), time.process_time()
    phases = lm.PhaseTimer()
    with phases("frozen model (dequantized weights, split)"):
        task = L.student_vocab_task(teacher, data.full, lora_cfg)
    cached = lora_cfg.adapted(task.config.n_layers) < task.config.n_layers
    with phases("cache pass (lower blocks, once per example; read back from disk when cached)"):
        hid = {n: (hidden_cache(task, t, cfg.cache_dtype, teacher.fingerprint, log=log) if cached else None)
               for n, t in (("train", data.train.concat_examples()["tokens"]), ("val", data.val),
                            ("test", data.test))}
    train_ds = _lora_train_dataset(data, hid["train"])
    fcfg = dataclasses.replace(public.at_epsilon(cfg.lm, eps), seed=seed, target_epsilon=eps, noise_multiplier=None,
                               server_lr=cfg.lora_server_lr(eps), client_lr=cfg.lora_client_lr,
                               clip_norm=cfg.lora_clip(eps), batch_size=cfg.lora_batch_size,
                               max_examples_per_client=cfg.lora_examples_per_client,
                               max_local_steps=cfg.lora_local_steps)
    ids = list(train_ds.client_ids)
    _, sampler, event, z, eps_val, executed, pn = _dp(cfg, fcfg, len(ids), task.as_lm_task().loss_fn)
    placeholder = lm.build_algorithm(fcfg, len(ids), task.as_lm_task().loss_fn)[0]
    alg = build_frozen_algorithm(lambda fz: lambda a, b, r: task.loss_with(fz, a, b, r), task.frozen,
                                 optax.sgd(cfg.lora_client_lr),
                                 algs.server_optimizer(fcfg.server_optimizer, fcfg.server_lr,
                                                       momentum=fcfg.server_momentum),
                                 placeholder.dp, placeholder.expected_cohort_size)
    ledger = PrivacyLedger(eps_val * (1 + 1e-6), cfg.lm.delta)
    scores = _lora_scores(task)
    eval_fn = phases.timed("evaluation", lambda p: _eval_row(scorer.llm(scores, task.frozen, p, "val", hid["val"])))
    adapters = task.init(jax.random.key(seed))
    fingerprint = {"lora": dataclasses.asdict(lora_cfg), "server_lr": fcfg.server_lr, "client_lr": fcfg.client_lr,
                   "clip_norm": fcfg.clip_norm, "teacher": teacher.fingerprint}
    with phases("training (rounds, compile, checkpoints; without evaluation)", exclude=("evaluation",)):
        result = train(alg, adapters, train_ds, ids, sampler, rounds=cfg.lm.rounds, batch_size=cfg.lora_batch_size,
                       seed=seed, workdir=os.path.join(sub, "fl"), max_steps=cfg.lora_local_steps,
                       eval_fn=eval_fn, eval_every=cfg.lm.eval_every, checkpoint_every=cfg.lm.checkpoint_every,
                       ledger=ledger, stage=f"dp-ftrl ({arm})", fingerprint=fingerprint, progress=progress,
                       log_fn=_log_row(log), lanes=cfg.lm.lanes, batching="padded", log=log)
    with phases("evaluation"):
        test = scorer.llm(scores, task.frozen, result.state.params, "test", hid["test"])
        val0 = scorer.llm(scores, task.frozen, adapters, "val", hid["val"])
    costs = lora_costs(cfg, task, adapters)
    return {"arm": arm, "seed": seed, **_privacy_fields(eps, z, eps_val, executed, pn),
            "server_lr": fcfg.server_lr, "client_lr": fcfg.client_lr, "clip_norm": fcfg.clip_norm,
            "rounds": cfg.lm.rounds, "lora": dataclasses.asdict(lora_cfg), "test": test, "val_round0": val0,
            "val_curve": report.metric_curve(os.path.join(sub, "fl"), "eval_bits_per_byte"),
            "val_accuracy_curve": report.metric_curve(os.path.join(sub, "fl"), "eval_accuracy"),
            "costs": costs, "ledger": result.ledger.report() if result.ledger else None,
            "phase_seconds": phases.as_dict(), "wall_clock_s": time.time() - t0,
            "cpu_s": time.process_time() - c0, "run_key": key, **report.git_state()}


def _eval_row(s: dict) -> dict:
    """The loop's eval metrics (logged as ``eval_<name>``)."""
    return {"bits_per_byte": s["bits_per_byte"], "accuracy": s["accuracy"], "loss": s["nll_nats_per_target"]}


def _run_zero_shot(cfg, teacher, data, scorer, key, log) -> dict:
    t0, c0 = time.time(), time.process_time()
    lora_cfg = lora_config(cfg, "lora")
    task = L.student_vocab_task(teacher, data.full, lora_cfg)
    adapters = task.init(jax.random.key(0))  # B = 0: the base model exactly
    hid = {n: hidden_cache(task, getattr(data, n), cfg.cache_dtype, teacher.fingerprint, log=log)
           for n in ("val", "test")}
    scores = _lora_scores(task)
    return {"arm": "zero_shot", "seed": None, "target_epsilon": None, "epsilon": 0.0,
            "test": scorer.llm(scores, task.frozen, adapters, "test", hid["test"]),
            "val": scorer.llm(scores, task.frozen, adapters, "val", hid["val"]),
            "costs": {"params": 0, "down_bytes": 0, "up_bytes": 0, "flops": 0.0,
                      "model_bytes": sum(x.nbytes for x in jax.tree_util.tree_leaves(task.frozen))},
            "wall_clock_s": time.time() - t0, "cpu_s": time.process_time() - c0, "run_key": key,
            **report.git_state()}


def small_restriction(cfg, teacher, public_texts):
    """(a)'s vocabulary: `public.prepare`'s restriction (the ``vocab_kept`` most frequent teacher
    tokens of ``vocab_texts`` public sentences drawn with ``pool_seed``), built without the pool's
    teacher passes (checked equal to prepare's wherever (a) trains)."""
    c = cfg.lm
    if c.vocab_kept is None:
        return distill.VocabRestriction.full(teacher)
    n = len(public_texts)
    rng = np.random.default_rng(c.pool_seed)
    idx = (np.arange(n) if c.vocab_texts is None or c.vocab_texts >= n
           else np.sort(rng.choice(n, c.vocab_texts, replace=False)))
    return vocab.restriction_from_texts(teacher, [public_texts[i] for i in idx], c.vocab_kept)


def run_arms(cfg, workdir: str, *, teacher=None, progress: bool = True, log=print,
             teacher_cache: str | None = None) -> dict:
    """Every (seed, epsilon, arm) of ``cfg`` (module docstring). Returns ``{"runs": [summary],
    "baselines": {...}, "data": {...}, "small_params": int}``. ``teacher_cache``: where (a)'s
    distillation corpus is cached (default: the fedpriv cache's ``teacher_passes``, keyed by
    content and shared by workdirs)."""
    os.makedirs(workdir, exist_ok=True)
    phases = lm.PhaseTimer()  # this invocation's shared work (the arms time their own)
    with phases("load the public LLM (GGUF, dequantized)"):
        teacher = run_teacher(cfg, teacher)
    with phases("data: users in the LLM's tokens, (a)'s vocabulary, byte accounting, baselines"):
        data = prepare_llm_data(cfg, teacher, progress)
        public_texts = lm.load_public(cfg.lm, progress=False).texts
        restriction = small_restriction(cfg, teacher, public_texts)
        log_q = unk_log_q(data.full, restriction, teacher, public_texts)
        scorer = Scorer(data, restriction, log_q, cfg.eval_batch_size)
        small_train = to_restricted(data.train.concat_examples()["tokens"], data.full, restriction)
        base = {s: scorer.baselines(s, small_train) for s in ("val", "test")}
    small_params = count_params(jax.eval_shape(small_task(cfg, restriction.student_vocab_size)[0].init,
                                               jax.random.key(0)))
    prepared = None

    def small_data():
        nonlocal prepared
        if prepared is None:  # the public pool's teacher passes (minutes on a CPU): only to train (a)
            cache = teacher_cache or str(resolve_cache_dir() / "teacher_passes")
            with phases("(a)'s data: the public pool's teacher passes (cached), private users in (a)'s ids"):
                prepared = public.prepare(cfg.lm, teacher, cache, progress, log)
            if list(prepared.train.client_ids) != list(data.train.client_ids):  # fail closed: one population
                raise ConfigError("the small LM's and the LLM's training users differ (tokenization dropped users)")
            if not np.array_equal(prepared.tokenizer.restriction.kept_teacher_ids, restriction.kept_teacher_ids):
                raise ConfigError("(a)'s vocabulary differs from public.prepare's: the comparison would misalign")
        return prepared

    runs = []
    if "zero_shot" in cfg.arms:
        sub = os.path.join(workdir, "zero_shot")
        key = run_key(cfg, "zero_shot", None, None)
        s = _read(sub, key)
        if s is None:
            log(f"{ARM_LABELS['zero_shot']}")
            s = _run_zero_shot(cfg, teacher, data, scorer, key, log)
            os.makedirs(sub, exist_ok=True)
            report.save_json(s, os.path.join(sub, "summary.json"))
        runs.append(s)
    llm_config = dataclasses.replace(teacher.config, vocab_size=data.full.student_vocab_size)
    for seed in cfg.lm.seeds:
        for eps in cfg.lm.epsilons:
            for arm in cfg.arms:
                if arm == "zero_shot":
                    continue
                sub = os.path.join(workdir, f"seed{seed}", f"eps{eps:g}", arm)
                key = run_key(cfg, arm, seed, eps)
                s = _read(sub, key)
                if s is None:
                    log(f"[seed {seed}, eps {eps:g}] {ARM_LABELS[arm]}")
                    if arm == "small_lm":
                        s = _run_small(cfg, seed, eps, small_data(), scorer, sub, key, progress, log)
                    else:
                        lcfg = lora_config(cfg, arm, small_params, llm_config)
                        s = _run_lora(cfg, arm, seed, eps, teacher, data, scorer, lcfg, sub, key, progress, log)
                    os.makedirs(sub, exist_ok=True)
                    report.save_json(s, os.path.join(sub, "summary.json"))
                    log(f"  -> test bits/byte {s['test']['bits_per_byte']:.4f}, accuracy "
                        f"{s['test']['accuracy']:.4f} ({s['wall_clock_s']:.0f} s)")
                runs.append(s)
    stats = {**data.stats, "vocab_kept": len(restriction.kept_teacher_ids), "public_pool_sentences": len(public_texts)}
    if prepared is not None:
        stats.update({k: v for k, v in prepared.stats.items() if k in ("num_sequences", "pool_sources")})
    return {"runs": runs, "baselines": base, "data": stats, "small_params": small_params,
            "phase_seconds": phases.as_dict(),
            "unk_rate_small": float(np.mean(~scorer.common["test"][data.test[:, 1:] > M.EOS]))}


# ------------------------------------------------------------------------------ privacy plan


def privacy_plan(cfg) -> PrivacyPlan:
    """Per epsilon, one ledger per (seed, private arm): the arm's DP-FTRL event on the training
    users, the schedule ``cfg.lm``'s (every private arm the same event: (a) with its own
    lr / clip, which the event does not depend on; (b)'s with the LoRA clients' fields). The
    zero-shot arm charges nothing (the public LLM; evaluation only)."""
    n = plans.lm_train_clients(cfg.lm)
    runs = []
    for e in cfg.lm.epsilons:
        base = dataclasses.replace(public.at_epsilon(cfg.lm, e), seed=cfg.lm.seeds[0], target_epsilon=e,
                                   noise_multiplier=None)
        for arm in cfg.arms:
            if arm == "zero_shot":
                continue
            fcfg = base if arm == "small_lm" else dataclasses.replace(
                base, server_lr=cfg.lora_server_lr(e), client_lr=cfg.lora_client_lr, clip_norm=cfg.lora_clip(e),
                batch_size=cfg.lora_batch_size, max_examples_per_client=cfg.lora_examples_per_client,
                max_local_steps=cfg.lora_local_steps)
            sim = " (SIMULATED population's epsilon)" if cfg.lm.simulated_population else ""
            runs.append(plans.lm_run(fcfg, n, f"{arm} DP-FTRL eps~{e:g}{sim}", copies=len(cfg.lm.seeds),
                                     stage=f"dp-ftrl ({arm})"))
    return PrivacyPlan(tuple(runs), notes=("the zero-shot arm releases nothing (the public LLM, evaluated)",))


def epsilon_note(runs) -> list[str]:
    """One line per label epsilon: the epsilons of what ran (simulated, noise-cohort, spent)."""
    out = []
    for e in dict.fromkeys(r["target_epsilon"] for r in runs if r.get("target_epsilon") is not None):
        r = next(x for x in runs if x.get("target_epsilon") == e)
        pn = r.get("paper_noise") or {}
        out.append(f"eps label {e:g}: z = {r['noise_multiplier']:.4g}; "
                   + (f"epsilon {pn['epsilon_simulated']:.3g} SIMULATED for {pn['population']}; " if pn else "")
                   + f"epsilon {r['epsilon']:.3g} of the noise-cohort simulation (the ledger's budget)"
                   + (f"; epsilon {r['epsilon_executed_run']:.3g} SPENT on our users (the run executed)"
                      if r.get("epsilon_executed_run") is not None else "")
                   + " -- the same for every private arm")
    return out
