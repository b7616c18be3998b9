"""LoRA adapters on the public LLM (Hu et al. 2022, "LoRA: Low-Rank Adaptation of Large Language
Models", Eq. 3) as an on-device model for DP federated fine-tuning (issue 53).

A frozen weight ``W [d_in, d_out]`` of the Flax Llama (`fedpriv.models.llama`, stored ``(in,
out)``: activations multiply on the left) is used as

    x W  +  (alpha / r) · (x A) B,       A [d_in, r],  B [r, d_out]

with only ``A`` and ``B`` trained. ``B`` starts at zero (Hu et al. §4.1), so at initialisation
the adapted model *is* the base model, logit for logit (`tests/models/test_lora.py`); ``A``
starts uniform in ``±1/sqrt(d_in)`` (the bound of PEFT's ``kaiming_uniform(a=√5)``).

**Trainable pytree = the adapters only.** ``init_adapters`` returns ``{target: {"a": float32[k,
d_in, r], "b": float32[k, r, d_out]}}`` for the ``targets`` (any of ``TARGETS``: the attention
projections ``wq, wk, wv, wo`` and the SwiGLU weights ``w_gate, w_up, w_down``) of the top ``k``
blocks (``top_layers``; None = every block). That is the ``params`` the FL engine trains, clips,
noises and uploads: its clipped-sum sensitivity is the adapters' (`fedpriv.fl.algorithms`); the
frozen weights are never a leaf of it.

**The frozen model** (`FrozenLlama`, a dict pytree) is the teacher's params, dequantized once,
split at block ``N - k``: ``lower`` (blocks ``0..N-k-1``, no adapters) and ``upper`` (the
adapted blocks), the tied embedding (optionally remapped to a student vocabulary,
`frozen_from_teacher`), the final norm and a head bias (``-1e30`` on vocabulary slots that are
never a target, 0 elsewhere). Frozen weights may be stored in bfloat16 (``frozen_dtype``); the
forward pass upcasts them and computes in float32.

**Top-k layers and the cache** (issue 53 item 4). The lower blocks never change, so their output
for a client example, ``lower_hidden(frozen, tokens) -> float[B, L, d]``, is computed once and
cached (exact: ``upper_logits(adapters, frozen, lower_hidden(...))`` is ``lora_forward``, the
same operations in the same order); a round then costs the top ``k`` blocks and the head alone.
A batch that carries ``'hidden'`` (the cached output for its ``tokens[:, :-1]``) skips the lower
blocks; one without computes them.

**Task** (`LoraTask`): the engine's model contract with the frozen weights as an *explicit*
argument — ``loss_with(frozen, adapters, batch, rng)``, ``eval_with``, ``scores_with`` — so a
jitted round can take them as an argument instead of embedding ~10^8 floats as constants in the
compiled program (`fedpriv.fl.frozen`); ``as_lm_task()`` closes over ``self.frozen`` for the
``loss_fn(params, batch, rng)`` contract (eager use, tests). Batches follow the project's id
convention (``fedpriv.models.metrics``: PAD/UNK/BOS/EOS = 0/1/2/3); the loss is
``metrics.lm_sums``' mean next-token NLL.

Shapes: N = n_layers, k = adapted (top) blocks, d = dim, r = rank, V = vocabulary, B = batch,
L = positions.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.models import bucketing, llama, metrics
from fedpriv.models.lm import LMTask

TARGETS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
FROZEN_DTYPES = ("float32", "bfloat16")
NEG = -1e30  # the head bias of a vocabulary slot that is never a target (finite: no inf - inf)

Adapters = Any
FrozenLlama = dict


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """LoRA hyper-parameters (hashable; static under ``jit``).

    Attributes:
      rank: r.
      alpha: the update is scaled by ``alpha / r`` (Hu et al. §4.1).
      targets: which weights of each adapted block get adapters (a subset of ``TARGETS``).
      top_layers: adapters on the top k blocks only (None: on every block); the lower blocks are
        frozen and their outputs cacheable.
      frozen_dtype: storage dtype of the frozen weights ("float32" or "bfloat16"); compute is
        float32 either way.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple = ("wq", "wv")
    top_layers: int | None = None
    frozen_dtype: str = "float32"

    def __post_init__(self):
        if not isinstance(self.rank, (int, np.integer)) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"LoRA alpha must be a positive number, got {self.alpha!r}")
        targets = tuple(self.targets)
        if not targets or set(targets) - set(TARGETS) or len(set(targets)) != len(targets):
            raise ValueError(f"LoRA targets must be distinct names from {TARGETS}, got {self.targets!r}")
        object.__setattr__(self, "targets", tuple(t for t in TARGETS if t in targets))  # canonical order
        if self.top_layers is not None and (isinstance(self.top_layers, bool) or self.top_layers < 1):
            raise ValueError(f"top_layers must be >= 1 or None (every block), got {self.top_layers!r}")
        if self.frozen_dtype not in FROZEN_DTYPES:
            raise ValueError(f"frozen_dtype must be one of {FROZEN_DTYPES}, got {self.frozen_dtype!r}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def adapted(self, n_layers: int) -> int:
        """k: the number of adapted (top) blocks of an ``n_layers``-block model."""
        if self.top_layers is None:
            return n_layers
        if self.top_layers > n_layers:
            raise ValueError(f"top_layers={self.top_layers} exceeds the model's {n_layers} blocks")
        return int(self.top_layers)


def target_shapes(config: llama.LlamaConfig) -> dict[str, tuple[int, int]]:
    """``{target: (d_in, d_out)}`` of one block's weights (``llama.init_params`` layout)."""
    c = config
    hq, hkv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    return {"wq": (c.dim, hq), "wk": (c.dim, hkv), "wv": (c.dim, hkv), "wo": (hq, c.dim),
            "w_gate": (c.dim, c.ffn_dim), "w_up": (c.dim, c.ffn_dim), "w_down": (c.ffn_dim, c.dim)}


def num_adapter_params(config: llama.LlamaConfig, lora: LoraConfig) -> int:
    """Trainable scalars: ``k · Σ_targets r (d_in + d_out)`` (what a client uploads per round)."""
    shapes = target_shapes(config)
    return lora.adapted(config.n_layers) * sum(lora.rank * sum(shapes[t]) for t in lora.targets)


def init_adapters(key: jax.Array, config: llama.LlamaConfig, lora: LoraConfig) -> dict:
    """Adapters ``{target: {"a": float32[k, d_in, r], "b": float32[k, r, d_out]}}``: A uniform in
    ``±1/sqrt(d_in)``, B zero (the adapted model starts as the base model)."""
    k = lora.adapted(config.n_layers)
    shapes = target_shapes(config)
    out = {}
    for i, t in enumerate(lora.targets):
        d_in, d_out = shapes[t]
        bound = 1.0 / math.sqrt(d_in)
        a = jax.random.uniform(jax.random.fold_in(key, i), (k, d_in, lora.rank), jnp.float32, -bound, bound)
        out[t] = {"a": a, "b": jnp.zeros((k, lora.rank, d_out), jnp.float32)}
    return out


# ----------------------------------------------------------------------------------------------
# The frozen model
# ----------------------------------------------------------------------------------------------


def frozen_from_teacher(params: dict, config: llama.LlamaConfig, lora: LoraConfig,
                        vocab_map: np.ndarray | None = None,
                        never_target: np.ndarray | None = None) -> tuple[FrozenLlama, llama.LlamaConfig]:
    """Split a Llama's params (``llama.init_params`` / ``gguf.load_gguf`` layout) into the frozen
    model, once. Returns ``(frozen, config)`` (``config.vocab_size`` the new vocabulary's).

    Args:
      params: the base model (float32; tied embeddings: ``lm_head`` is not supported).
      vocab_map: optional ``int[V']``: new vocabulary slot j is the base model's token
        ``vocab_map[j]`` (its embedding row, used as input embedding and tied output row); a
        negative entry is a slot with no base token (row 0 is used, the slot never predicted).
        E.g. ``distill.VocabRestriction.student_to_teacher``: the project's PAD/UNK/BOS/EOS
        convention over the teacher's tokens.
      never_target: optional ``bool[V']``: slots never predicted (head bias ``NEG``; e.g. PAD,
        UNK and BOS, whose rows duplicate or lack a base token), besides the negative entries of
        ``vocab_map``.
    """
    if not config.tie_embeddings or "lm_head" in params:
        raise ValueError("frozen_from_teacher supports tied embeddings only (SmolLM2's layout)")
    dtype = jnp.dtype(lora.frozen_dtype)
    embed = jnp.asarray(params["embed"], jnp.float32)
    vocab = config.vocab_size
    bias = np.zeros((vocab,), np.float32)
    if vocab_map is not None:
        vocab_map = np.asarray(vocab_map, np.int64)
        if vocab_map.ndim != 1 or vocab_map.max(initial=-1) >= config.vocab_size:
            raise ValueError(f"vocab_map must be int[V'] of base token ids < {config.vocab_size}")
        embed = embed[np.maximum(vocab_map, 0)]
        vocab = len(vocab_map)
        bias = np.where(vocab_map < 0, NEG, 0.0).astype(np.float32)
    if never_target is not None:
        never_target = np.asarray(never_target, bool)
        if never_target.shape != (vocab,):
            raise ValueError(f"never_target must be bool[{vocab}], got shape {never_target.shape}")
        bias = np.where(never_target, NEG, bias).astype(np.float32)
    n = config.n_layers
    k = lora.adapted(n)
    layers = params["layers"]
    cast = lambda tree: jax.tree_util.tree_map(lambda w: jnp.asarray(w).astype(dtype), tree)  # noqa: E731
    frozen = {"embed": embed.astype(dtype), "head_bias": jnp.asarray(bias),
              "final_norm": jnp.asarray(params["final_norm"], jnp.float32),
              "lower": cast({name: w[: n - k] for name, w in layers.items()}),
              "upper": cast({name: w[n - k:] for name, w in layers.items()})}
    return frozen, dataclasses.replace(config, vocab_size=int(vocab))


def _f32(w):
    return w.astype(jnp.float32)


def _block(c: llama.LlamaConfig, x, p, ad, scaling, cos, sin, allowed):
    """One pre-RMSNorm Llama block (`llama.forward`'s, operation for operation) on ``x [B, L, d]``
    with optional adapters ``ad`` ({target: {"a": [d_in, r], "b": [r, d_out]}}) of this block."""
    bsz, length = x.shape[:2]
    rep = c.n_heads // c.n_kv_heads
    scale = 1.0 / math.sqrt(c.head_dim)

    def proj(h, name):
        y = h @ _f32(p[name])
        if ad is not None and name in ad:
            y = y + ((h @ ad[name]["a"]) @ ad[name]["b"]) * scaling
        return y

    h = llama._rms_norm(x, _f32(p["attn_norm"]), c.norm_eps)
    q = proj(h, "wq").reshape(bsz, length, c.n_heads, c.head_dim)
    k = proj(h, "wk").reshape(bsz, length, c.n_kv_heads, c.head_dim)
    v = proj(h, "wv").reshape(bsz, length, c.n_kv_heads, c.head_dim)
    q, k = llama._apply_rope(q, cos, sin), llama._apply_rope(k, cos, sin)
    q = q.reshape(bsz, length, c.n_kv_heads, rep, c.head_dim)
    scores = jnp.einsum("bqgrd,bkgd->bgrqk", q, k) * scale
    scores = jnp.where(allowed[:, None, None], scores, llama._NEG_INF)
    attn = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bgrqk,bkgd->bqgrd", attn, v).reshape(bsz, length, -1)
    x = x + proj(out, "wo")
    h = llama._rms_norm(x, _f32(p["ffn_norm"]), c.norm_eps)
    return x + proj(jax.nn.silu(proj(h, "w_gate")) * proj(h, "w_up"), "w_down")


def _attention_setup(config, token_mask):
    bsz, length = token_mask.shape
    key_ok = token_mask.astype(bool)
    causal = jnp.tril(jnp.ones((length, length), bool))
    allowed = causal[None, :, :] & key_ok[:, None, :]
    cos, sin = llama._rope_tables(length, config.head_dim, config.rope_base)
    return allowed, cos, sin


def _num_layers(tree) -> int:
    return int(jax.tree_util.tree_leaves(tree)[0].shape[0])


def lower_hidden(frozen: FrozenLlama, config: llama.LlamaConfig, token_ids: jax.Array,
                 mask: jax.Array | None = None) -> jax.Array:
    """The cacheable part: embedding and the frozen lower blocks.

    Args:
      token_ids: int32[B, L] (right-padded); mask: float/bool[B, L], 1 for real tokens.
    Returns:
      float32[B, L, d], the residual stream entering block N - k.
    """
    if mask is None:
        mask = jnp.ones(token_ids.shape, jnp.float32)
    x = _f32(frozen["embed"][token_ids])
    if _num_layers(frozen["lower"]) == 0:
        return x
    allowed, cos, sin = _attention_setup(config, mask)

    def body(x, p):
        return _block(config, x, p, None, 0.0, cos, sin, allowed), None

    x, _ = jax.lax.scan(body, x, frozen["lower"])
    return x


def upper_logits(adapters: Adapters, frozen: FrozenLlama, config: llama.LlamaConfig,
                 lora: LoraConfig, hidden: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """The adapted top blocks, the final norm and the tied head.

    Args:
      adapters: `init_adapters`' pytree (k blocks).
      hidden: float[B, L, d], `lower_hidden` of the same tokens (any float dtype: upcast).
      mask: float/bool[B, L], 1 for real tokens.
    Returns:
      logits float32[B, L, V]; logits[b, i] is the distribution of token i+1.
    """
    x = hidden.astype(jnp.float32)
    if mask is None:
        mask = jnp.ones(x.shape[:2], jnp.float32)
    allowed, cos, sin = _attention_setup(config, mask)

    def body(x, pa):
        p, ad = pa
        return _block(config, x, p, ad, lora.scaling, cos, sin, allowed), None

    x, _ = jax.lax.scan(body, x, (frozen["upper"], adapters))
    x = llama._rms_norm(x, frozen["final_norm"], config.norm_eps)
    return jnp.einsum("bld,vd->blv", x, _f32(frozen["embed"])) + frozen["head_bias"]


def lora_forward(adapters: Adapters, frozen: FrozenLlama, config: llama.LlamaConfig,
                 lora: LoraConfig, token_ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """The adapted model: ``upper_logits(adapters, frozen, lower_hidden(frozen, tokens))``,
    float32[B, L, V] logits of int32[B, L] tokens."""
    return upper_logits(adapters, frozen, config, lora, lower_hidden(frozen, config, token_ids, mask), mask)


# ----------------------------------------------------------------------------------------------
# The task (the engine's model contract, frozen weights explicit)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoraTask:
    """The LoRA model's pure functions; ``frozen`` is an explicit argument of each (module
    docstring). A batch is ``{'tokens': int32[B, L+1], 'mask': float32[B]}`` (project ids) and
    optionally ``'hidden': float[B, L, d]`` (the cached `lower_hidden` of ``tokens[:, :-1]``).

    Attributes:
      frozen: the `FrozenLlama` (its arrays: pass them to the ``*_with`` functions).
      config: the `llama.LlamaConfig` over the task's vocabulary (static).
      lora: the `LoraConfig` (static).
    """

    frozen: FrozenLlama
    config: llama.LlamaConfig
    lora: LoraConfig

    def init(self, key: jax.Array) -> Adapters:
        return init_adapters(key, self.config, self.lora)

    @property
    def num_params(self) -> int:
        return num_adapter_params(self.config, self.lora)

    def logits_with(self, frozen, adapters, batch) -> tuple[jax.Array, jax.Array]:
        """``(logits float32[B, L, V], targets int32[B, L])`` of a batch."""
        inputs, targets = metrics.split_tokens(batch["tokens"])
        mask = (inputs != metrics.PAD).astype(jnp.float32)
        hidden = batch.get("hidden")
        if hidden is None:
            hidden = lower_hidden(frozen, self.config, inputs, mask)
        return upper_logits(adapters, frozen, self.config, self.lora, hidden, mask), targets

    def loss_with(self, frozen, adapters, batch, rng=None):
        """``(mean next-token NLL over real targets, metrics.lm_sums)``; ``rng`` unused."""
        del rng
        logits, targets = self.logits_with(frozen, adapters, batch)
        sums = metrics.lm_sums(logits, targets, batch.get("mask"))
        return sums["loss_sum"] / jnp.maximum(sums["num_tokens"], 1.0), sums

    def eval_with(self, frozen, adapters, batch) -> dict:
        return self.loss_with(frozen, adapters, batch)[1]

    def scores_with(self, frozen, adapters, batch) -> tuple[jax.Array, jax.Array]:
        """Per position: ``(nll float32[B, L] in nats, correct bool[B, L])`` (top-1 = target)."""
        logits, targets = self.logits_with(frozen, adapters, batch)
        return metrics.token_nll(logits, targets), metrics.top1_correct(logits, targets)

    def as_lm_task(self, frozen=None):
        """An `fedpriv.models.lm.LMTask` closing over ``frozen`` (default ``self.frozen``): the
        plain ``loss_fn(params, batch, rng)`` contract. Under ``jit`` the closed-over arrays are
        embedded in the program: for the engine use `fedpriv.fl.frozen`."""
        fz = self.frozen if frozen is None else frozen

        def apply(params, tokens_in, domain=None, rng=None, segments=None, positions=None):
            if segments is not None:
                raise ValueError("the LoRA task does not take packed rows (use batching='padded')")
            mask = (tokens_in != metrics.PAD).astype(jnp.float32)
            return lora_forward(params, fz, self.config, self.lora, tokens_in, mask)

        return LMTask(init=self.init, apply=apply,
                      loss_fn=lambda params, batch, rng: self.loss_with(fz, params, batch, rng),
                      eval_fn=lambda params, batch: self.eval_with(fz, params, batch))


def make_lora_task(params: dict, config: llama.LlamaConfig, lora: LoraConfig,
                   vocab_map=None, never_target=None) -> LoraTask:
    """`LoraTask` of a base Llama (``frozen_from_teacher``'s arguments)."""
    frozen, cfg = frozen_from_teacher(params, config, lora, vocab_map, never_target)
    return LoraTask(frozen, cfg, lora)


def student_vocab_task(teacher: llama.Teacher, restriction, lora: LoraConfig) -> LoraTask:
    """The teacher as an LM over a `fedpriv.public.distill.VocabRestriction`'s student ids (the
    project's PAD/UNK/BOS/EOS convention; ``VocabRestriction.full`` keeps every non-control
    teacher token): slot j uses teacher row ``student_to_teacher[j]``; PAD, UNK and BOS are never
    predicted (BOS shares the teacher's document token with EOS, which keeps it). The softmax is
    then the teacher's over the kept tokens and EOS, renormalised (the control tokens' mass is
    dropped: they never occur in text)."""
    s2t = np.asarray(restriction.student_to_teacher, np.int64)
    never = np.zeros(len(s2t), bool)
    never[[metrics.PAD, metrics.UNK, metrics.BOS]] = True
    return make_lora_task(teacher.params, teacher.config, lora, vocab_map=s2t, never_target=never)


def cache_hidden(task: LoraTask, tokens: np.ndarray, batch_size: int = 64,
                 dtype: str = "float32") -> np.ndarray:
    """`lower_hidden` of every example's inputs: ``float[N, L, d]`` for ``tokens int[N, L+1]``.

    Computed once per example in length-sorted batches (each cut to the smallest of a few widths
    holding its longest row: causal attention makes positions past a row's length irrelevant to
    the real ones, so the output equals the full-width pass on real positions; positions past
    the batch width stay 0 and are never read for a real target). ``dtype``: storage ("float32",
    exact; "bfloat16" halves the memory: measure what it moves).
    """
    tokens = np.asarray(tokens, np.int32)
    n, full = tokens.shape
    d = task.config.dim
    out = np.zeros((n, full - 1, d), jnp.dtype(dtype))
    if n == 0:
        return out
    fn = _lower_jit(task.config)
    widths = bucketing.width_buckets(full - 1)
    lengths = bucketing.row_lengths(tokens[:, :-1], metrics.PAD)
    for rows, width in bucketing.length_sorted_batches(lengths, batch_size, widths):
        tok = np.zeros((batch_size, width), np.int32)
        tok[: len(rows)] = tokens[rows, :width]
        h = fn(task.frozen, jnp.asarray(tok), jnp.asarray((tok != metrics.PAD).astype(np.float32)))
        out[rows, :width] = np.asarray(h[: len(rows)]).astype(out.dtype)
    return out


_LOWER_JITS: dict = {}


def _lower_jit(config):
    if config not in _LOWER_JITS:
        _LOWER_JITS[config] = jax.jit(lambda frozen, tok, mask: lower_hidden(frozen, config, tok, mask))
    return _LOWER_JITS[config]
