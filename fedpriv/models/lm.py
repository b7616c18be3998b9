"""On-device next-token language models (LSTM and one-layer transformer) and their FL task.

Models (Wang et al. 2023, "Can Public LLMs Help Private Cross-device FL?", §2 and App. B.2: "one-layer
LSTM and transformer. Both ... hidden size of 670 and embedding size of 96"):

* ``LSTMLM`` — the TFF StackOverflow next-word-prediction model (Reddi et al. 2021; Kairouz et al.
  2021): embedding 96 → LSTM 670 → dense projection 96 → dense to the vocabulary (untied, with
  bias). The LSTM is the standard one (Hochreiter & Schmidhuber 1997), per step
      ``[i, f, g, o] = x_t W_x + h_{t−1} W_h + b``, ``c_t = σ(f) c_{t−1} + σ(i) tanh(g)``,
      ``h_t = σ(o) tanh(c_t)``,
  with one bias per gate (Keras layout; the forget-gate bias starts at 1, Keras' ``unit_forget_bias``).
  The input projection ``x W_x`` is one matmul over all steps, the recurrence is a ``lax.scan``.
  At vocabulary 10,004 (10K words + PAD/UNK/BOS/EOS) it has 4,050,748 parameters
  (960,384 embedding + 2,055,560 LSTM + 64,416 projection + 970,388 output).
* ``TransformerLM`` — the one-layer causal transformer of the same lineage (the fedopt-guide
  StackOverflow transformer used by Wang et al. 2021/2023): token embedding E=96 scaled by √E, plus
  **fixed sinusoidal positions** (Vaswani et al. 2017, §3.5; ``positions='learned'`` gives a
  learned ``[max_len, E]`` table instead), dense up-projection to the model width H=670
  (``hidden_dim``), ``num_layers`` post-LayerNorm blocks (causal multi-head self-attention with
  ``num_heads`` heads, default 10 so the head size is 67, and a ReLU FFN of width ``ffn_dim``,
  default H), dense down-projection to E, then the output layer. "Hidden size 670" is read as the
  model width; the FFN width defaults to the same number. The output layer is untied by default
  (like the LSTM); ``tie_embeddings=True`` reuses the embedding matrix (no output bias), as the
  fedopt-guide model does. At vocabulary 10,004 it has 4,760,278 parameters (3,789,890 tied).

Task (the FL engine's model contract, see ``make_lm_task``): a batch is ``{'tokens': int32[B, L+1],
'mask': float32[B]}`` (+ optional ``'weight': float32[B]``, ``'domain': int32[B]``); ``loss_fn(params,
batch, rng) -> (loss, aux)`` returns the mean next-token NLL over real targets and a dict of metric
sums (``fedpriv.models.metrics.lm_sums``). All functions are pure and ``jit``/``vmap``-able.
A *packed* batch (``fedpriv.models.bucketing.pack_sentences``) is ``{'inputs', 'targets',
'segments', 'positions': int32[R, L], 'mask': float32[R]}`` (+ ``'weight': float32[R, L]``): the
same sentences end to end in R rows; ``mask`` counts each row's examples. The loss being a mean
over all real target tokens of the batch, it equals the padded batch's up to float summation order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedpriv.models import metrics
from fedpriv.models.metrics import BOS, EOS, PAD, UNK  # re-exported conventions
from fedpriv.registry import MODELS

Params = Any

STACKOVERFLOW_VOCAB_SIZE = 10_004  # 10K words + PAD, UNK(OOV), BOS, EOS


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Size configuration of an on-device LM.

    Attributes:
      vocab_size: V, including the 4 special tokens (PAD=0, UNK=1, BOS=2, EOS=3).
      arch: a registered architecture (``fedpriv.registry.MODELS``): ``'lstm'``, ``'transformer'``, ...
      embed_dim: token embedding size E (also the width of the pre-output projection).
      hidden_dim: LSTM state size / transformer model width H.
      num_layers: stacked LSTM layers or transformer blocks.
      num_heads: attention heads (transformer); must divide ``hidden_dim``.
      ffn_dim: transformer FFN width (``None`` means ``hidden_dim``).
      max_len: longest input length L (enforced only for learned positions).
      positions: ``'sinusoidal'`` (fixed) or ``'learned'`` (transformer only).
      tie_embeddings: output logits ``= x Eᵀ`` (no bias) instead of an untied dense layer.
      dropout_rate: dropout on embeddings/activations in training (``loss_fn``'s rng drives it);
        0 by default, as in the DP-FL setups of the papers.
    """

    vocab_size: int = STACKOVERFLOW_VOCAB_SIZE
    arch: str = "lstm"
    embed_dim: int = 96
    hidden_dim: int = 670
    num_layers: int = 1
    num_heads: int = 10
    ffn_dim: int | None = None
    max_len: int = 64
    positions: str = "sinusoidal"
    tie_embeddings: bool = False
    dropout_rate: float = 0.0

    def __post_init__(self):
        MODELS.check(self.arch)  # a registered architecture (or a plugin's), else fails closed
        if self.vocab_size <= max(PAD, UNK, BOS, EOS):
            raise ValueError(f"vocab_size must exceed the 4 special tokens, got {self.vocab_size}")
        for name in ("embed_dim", "hidden_dim", "num_layers", "num_heads", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.arch == "transformer" and self.hidden_dim % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide hidden_dim={self.hidden_dim}")
        if self.positions not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {self.positions!r}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {self.dropout_rate}")

    @property
    def ffn_width(self) -> int:
        return self.hidden_dim if self.ffn_dim is None else self.ffn_dim


# ----------------------------------------------------------------------------------------------
# Building blocks (also used by fedpriv.models.domain_lm)
# ----------------------------------------------------------------------------------------------

def _forget_bias_init(hidden: int) -> Callable:
    """Bias init for the gate layout [i, f, g, o]: 1 on the forget gate, 0 elsewhere."""
    def init(key, shape, dtype=jnp.float32):
        del key
        return jnp.zeros(shape, dtype).at[hidden:2 * hidden].set(1.0)
    return init


class LSTMLayer(nn.Module):
    """One LSTM layer over time, ``float[B, L, D] -> float[B, L, H]``, zero initial state.

    Parameters: ``kernel_x [D, 4H]``, ``kernel_h [H, 4H]``, ``bias [4H]`` (gates i, f, g, o).
    """

    hidden_dim: int

    @nn.compact
    def __call__(self, x: jax.Array, keep: jax.Array | None = None) -> jax.Array:
        """``keep: float[B, L]`` (packed rows): 0 where a new sentence starts, which resets the
        state to zero before that step (``lstm_recurrence_reset``)."""
        h_dim = self.hidden_dim
        w_x = self.param("kernel_x", nn.initializers.glorot_uniform(), (x.shape[-1], 4 * h_dim))
        w_h = self.param("kernel_h", nn.initializers.orthogonal(), (h_dim, 4 * h_dim))
        b = self.param("bias", _forget_bias_init(h_dim), (4 * h_dim,))
        batch, length = x.shape[0], x.shape[1]
        # time-major input contributions [L, B, 4H], as one plain [L*B, D] x [D, 4H] matmul
        gx = (jnp.swapaxes(x, 0, 1).reshape((-1, x.shape[-1])) @ w_x).reshape((length, batch, -1)) + b

        if keep is None:
            return jnp.swapaxes(lstm_recurrence(gx, w_h.astype(gx.dtype)), 0, 1)
        keep = jnp.swapaxes(keep, 0, 1).astype(gx.dtype)
        return jnp.swapaxes(lstm_recurrence_reset(gx, w_h.astype(gx.dtype), keep), 0, 1)


def _lstm_forward(gx, w_h, keep=None):
    """The recurrence over time-major gate inputs ``gx [L, B, 4H]``: ``hs [L, B, H]`` and the
    residuals the backward pass needs (activated gates, cell states, hidden states). ``keep
    [L, B]`` (packed rows): ``(h, c) <- keep_t (h, c)`` before step ``t`` (the residuals hold
    the reset states)."""
    h_dim = w_h.shape[0]
    zeros = jnp.zeros(gx.shape[1:2] + (h_dim,), gx.dtype)

    def step(carry, xs):
        h, c = carry
        if keep is None:
            g_t = xs
        else:
            g_t, k_t = xs
            h, c = h * k_t[:, None], c * k_t[:, None]
        i, f, gg, o = jnp.split(g_t + h @ w_h, 4, axis=-1)
        i, f, gg, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(gg), jax.nn.sigmoid(o)
        c_new = f * c + i * gg
        tc = jnp.tanh(c_new)
        h_new = o * tc
        return (h_new, c_new), (h_new, (i, f, gg, o, c, tc, h))

    _, (hs, res) = jax.lax.scan(step, (zeros, zeros), gx if keep is None else (gx, keep))
    return hs, res


def _lstm_backward(res, w_h, dhs, keep=None):
    """``(dgx, dW_h)`` from the forward residuals; with ``keep``, the gradients carried to the
    previous step are multiplied by ``keep_t`` (the reset's transpose)."""
    i, f, gg, o, c_prev, tc, h_prev = res

    def step(carry, xs):
        dh_next, dc_next = carry
        dh_out, i, f, gg, o, c_prev, tc = xs[:7]
        dh = dh_out + dh_next
        dc = dh * o * (1.0 - tc * tc) + dc_next
        dg = jnp.concatenate([dc * gg * i * (1.0 - i), dc * c_prev * f * (1.0 - f),
                              dc * i * (1.0 - gg * gg), dh * tc * o * (1.0 - o)], axis=-1)
        if keep is None:
            return (dg @ w_h.T, dc * f), dg
        return ((dg @ w_h.T) * xs[7][:, None], (dc * f) * xs[7][:, None]), dg

    zeros = jnp.zeros(dhs.shape[1:], dhs.dtype)
    xs = (dhs, i, f, gg, o, c_prev, tc) + (() if keep is None else (keep,))
    _, dgx = jax.lax.scan(step, (zeros, zeros), xs, reverse=True)
    hp = h_prev.reshape((-1, h_prev.shape[-1]))
    dw_h = hp.T @ dgx.reshape((-1, dgx.shape[-1]))
    return dgx, dw_h.astype(w_h.dtype)


@jax.custom_vjp
def lstm_recurrence(gx: jax.Array, w_h: jax.Array) -> jax.Array:
    """LSTM recurrence ``h_t = LSTM(gx_t + h_{t-1} W_h)``; ``gx: [L, B, 4H]`` (input projection
    plus bias, gates i, f, g, o), ``w_h: [H, 4H]`` -> ``hs: [L, B, H]``.

    Its hand-written VJP runs the reverse recurrence for the gate gradients only and forms
    ``dW_h = sum_t h_{t-1}^T dG_t`` as ONE ``[H, L*B] x [L*B, 4H]`` matmul after the loop, instead
    of the ``L`` rank-B updates of a ``[H, 4H]`` accumulator that autodiff of ``lax.scan`` does
    (same math; the test checks it against autodiff)."""
    return _lstm_forward(gx, w_h)[0]


def _lstm_fwd(gx, w_h):
    hs, res = _lstm_forward(gx, w_h)
    return hs, (res, w_h)


def _lstm_bwd(saved, dhs):
    res, w_h = saved
    return _lstm_backward(res, w_h, dhs)


lstm_recurrence.defvjp(_lstm_fwd, _lstm_bwd)


@jax.custom_vjp
def lstm_recurrence_reset(gx: jax.Array, w_h: jax.Array, keep: jax.Array) -> jax.Array:
    """``lstm_recurrence`` over packed rows: ``keep: float[L, B]`` is 0 at each sentence start
    (the state is reset to zero there, so each sentence runs as if alone in its row) and 1
    elsewhere; ``gx [L, B, 4H]``, ``w_h [H, 4H]`` -> ``hs [L, B, H]``. The same hand-written
    VJP; ``keep`` gets a zero cotangent."""
    return _lstm_forward(gx, w_h, keep)[0]


def _lstm_reset_fwd(gx, w_h, keep):
    hs, res = _lstm_forward(gx, w_h, keep)
    return hs, (res, w_h, keep)


def _lstm_reset_bwd(saved, dhs):
    res, w_h, keep = saved
    return _lstm_backward(res, w_h, dhs, keep) + (jnp.zeros_like(keep),)


lstm_recurrence_reset.defvjp(_lstm_reset_fwd, _lstm_reset_bwd)


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
    """Vaswani et al. (2017) §3.5: ``PE[p, 2i] = sin(p / 10000^{2i/d})``, ``PE[p, 2i+1] = cos(...)``.

    Returns ``float32[length, dim]``.
    """
    pos = jnp.arange(length, dtype=jnp.float32)[:, None]
    i = jnp.arange(dim)[None, :]
    angle = pos / jnp.power(10000.0, (2 * (i // 2)).astype(jnp.float32) / dim)
    return jnp.where(i % 2 == 0, jnp.sin(angle), jnp.cos(angle))


class CausalSelfAttentionSublayer(nn.Module):
    """Post-LN causal multi-head self-attention sublayer: ``LN(x + MHA(x, causal))``, ``[B, L, H]``."""

    num_heads: int
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool,
                 segments: jax.Array | None = None) -> jax.Array:
        """``segments: int[B, L]`` (packed rows): attend only within the same segment too."""
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))  # [B, 1, L, L]
        if segments is not None:  # block-diagonal causal: each sentence sees only itself
            mask = nn.combine_masks(mask, nn.make_attention_mask(segments, segments, jnp.equal))
        y = nn.MultiHeadDotProductAttention(
            num_heads=self.num_heads, dropout_rate=self.dropout_rate, name="attention")(
                x, x, mask=mask, deterministic=deterministic)
        y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
        return nn.LayerNorm(epsilon=1e-6, name="ln")(x + y)


class FeedForwardSublayer(nn.Module):
    """Post-LN position-wise FFN sublayer: ``LN(x + W2 relu(W1 x + b1) + b2)``, ``[B, L, H]``."""

    ffn_dim: int
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        y = nn.Dense(self.ffn_dim, name="dense_in")(x)
        y = nn.Dense(x.shape[-1], name="dense_out")(nn.relu(y))
        y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
        return nn.LayerNorm(epsilon=1e-6, name="ln")(x + y)


class OutputHead(nn.Module):
    """Projection to ``embed_dim`` then logits: ``float[B, L, D] -> float32[B, L, V]``.

    With ``embedding`` given (tied), logits are ``z Eᵀ``; otherwise a dense layer with bias.
    """

    vocab_size: int
    embed_dim: int
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, h: jax.Array, deterministic: bool,
                 embedding: nn.Embed | None = None) -> jax.Array:
        lead = h.shape[:-1]
        h = h.reshape((-1, h.shape[-1]))  # [B*L, D]: every dot a plain (batched) matmul
        z = nn.Dense(self.embed_dim, name="projection")(h)
        z = nn.Dropout(self.dropout_rate)(z, deterministic=deterministic)
        logits = embedding.attend(z) if embedding is not None else nn.Dense(self.vocab_size, name="logits")(z)
        return logits.reshape(lead + (logits.shape[-1],))


def _embed(config: LMConfig, name: str = "embedding") -> nn.Embed:
    return nn.Embed(config.vocab_size, config.embed_dim,
                    embedding_init=nn.initializers.normal(stddev=1.0 / math.sqrt(config.embed_dim)),
                    name=name)


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------

class LSTMLM(nn.Module):
    """Embedding E → ``num_layers`` × LSTM H → dense E → dense V. ``int[B, L] -> float32[B, L, V]``.

    Packed rows (``fedpriv.models.bucketing.pack_sentences``): ``segments, positions: int[B, L]``;
    the state is reset where ``positions == 0`` (``segments`` is not needed)."""

    config: LMConfig

    @nn.compact
    def __call__(self, tokens: jax.Array, *, deterministic: bool = True,
                 segments: jax.Array | None = None, positions: jax.Array | None = None) -> jax.Array:
        cfg = self.config
        emb = _embed(cfg)
        h = nn.Dropout(cfg.dropout_rate)(emb(tokens), deterministic=deterministic)
        keep = None if positions is None else (positions != 0)
        for layer in range(cfg.num_layers):
            h = LSTMLayer(cfg.hidden_dim, name=f"lstm_{layer}")(h, keep)
        return OutputHead(cfg.vocab_size, cfg.embed_dim, cfg.dropout_rate, name="head")(
            h, deterministic, emb if cfg.tie_embeddings else None)


class TransformerEmbed(nn.Module):
    """Token embedding ×√E + positions, dense up to H. ``int[B, L] -> float[B, L, H]``; also
    returns the embedding module (for tied outputs)."""

    config: LMConfig

    @nn.compact
    def __call__(self, tokens: jax.Array, deterministic: bool, positions: jax.Array | None = None):
        """``positions: int[B, L]`` (packed rows: each sentence's positions restart at 0)
        index the position table instead of ``0 .. L-1``."""
        cfg = self.config
        length = tokens.shape[-1]
        emb = _embed(cfg)
        x = emb(tokens) * math.sqrt(cfg.embed_dim)
        if cfg.positions == "learned":
            if length > cfg.max_len:
                raise ValueError(f"sequence length {length} exceeds max_len={cfg.max_len}")
            table = self.param("positions", nn.initializers.normal(stddev=0.02),
                               (cfg.max_len, cfg.embed_dim))
            x = x + (table[:length] if positions is None else table[positions])
        elif positions is None:
            x = x + sinusoidal_positions(length, cfg.embed_dim)
        else:
            x = x + sinusoidal_positions(length, cfg.embed_dim)[positions]
        x = nn.Dense(cfg.hidden_dim, name="embed_proj")(x)
        return nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic), emb


class TransformerLM(nn.Module):
    """One (or ``num_layers``) post-LN causal transformer block(s) between E-dim embeddings and
    the output head. ``int[B, L] -> float32[B, L, V]``.

    Packed rows (``fedpriv.models.bucketing.pack_sentences``): ``segments, positions: int[B, L]``;
    attention is causal within each segment and positions restart at each sentence."""

    config: LMConfig

    @nn.compact
    def __call__(self, tokens: jax.Array, *, deterministic: bool = True,
                 segments: jax.Array | None = None, positions: jax.Array | None = None) -> jax.Array:
        cfg = self.config
        x, emb = TransformerEmbed(cfg, name="embed")(tokens, deterministic, positions)
        for layer in range(cfg.num_layers):
            x = CausalSelfAttentionSublayer(cfg.num_heads, cfg.dropout_rate,
                                            name=f"attn_{layer}")(x, deterministic, segments)
            x = FeedForwardSublayer(cfg.ffn_width, cfg.dropout_rate,
                                    name=f"ffn_{layer}")(x, deterministic)
        return OutputHead(cfg.vocab_size, cfg.embed_dim, cfg.dropout_rate, name="head")(
            x, deterministic, emb if cfg.tie_embeddings else None)


def make_lm(config: LMConfig) -> nn.Module:
    """The Flax module of ``config.arch``, an architecture of ``fedpriv.registry.MODELS``
    ("lstm", "transformer", or a researcher's: ``factory(LMConfig) -> nn.Module`` whose
    ``__call__(tokens int[B, L], *, deterministic, segments=None, positions=None)`` returns
    ``float32[B, L, V]``); an unknown arch fails closed, listing the registered ones."""
    return MODELS.get(config.arch)(config)


# ----------------------------------------------------------------------------------------------
# Task: the FL engine's model contract
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LMTask:
    """Pure functions of an LM (all jit/vmap-able).

    Attributes:
      init: ``init(rng) -> params`` (a plain pytree).
      apply: ``apply(params, tokens_in int[B, L], domain int[B] | None = None, rng=None,
        segments=None, positions=None) -> logits float32[B, L, V]``; deterministic unless ``rng``
        is given (dropout). ``domain`` is required by domain-adaptive models and ignored by the
        others; ``segments, positions: int[B, L]`` for packed rows (module docstring).
      loss_fn: ``loss_fn(params, batch, rng) -> (loss, aux)``: ``loss`` = Σ weighted NLL / number of
        real (non-PAD, mask=1) target tokens (0 when there are none); ``aux`` = metric sums
        ``loss_sum, num_tokens, num_correct, num_acc_tokens, num_examples`` (accuracy is
        ``num_correct / num_acc_tokens``; perplexity ``exp(loss_sum / num_tokens)``).
      eval_fn: ``eval_fn(params, batch) -> sums`` as ``aux`` but deterministic and unweighted.
      uses_domain: whether batches must carry ``'domain'``.
    """

    init: Callable[[jax.Array], Params]
    apply: Callable[..., jax.Array]
    loss_fn: Callable[[Params, dict, jax.Array], tuple[jax.Array, dict]]
    eval_fn: Callable[[Params, dict], dict]
    uses_domain: bool = False


def make_lm_task(model: nn.Module) -> LMTask:
    """Wrap a Flax LM into the engine's ``LMTask`` contract.

    ``model`` is called as ``model.apply(variables, tokens_in, deterministic=...)`` or, if it has
    ``uses_domain = True`` (``fedpriv.models.domain_lm``), as
    ``model.apply(variables, tokens_in, domain, deterministic=...)``.
    """
    uses_domain = bool(getattr(model, "uses_domain", False))

    def _call(params, tokens_in, domain, rng, packing=None):
        deterministic = rng is None
        rngs = None if deterministic else {"dropout": rng}
        args = (tokens_in,)
        if uses_domain:
            if domain is None:
                raise ValueError(f"{type(model).__name__} needs a 'domain' array")
            if packing:
                raise ValueError(f"{type(model).__name__} does not take packed rows (per-example "
                                 "'domain'); use another batching")
            args = (tokens_in, jnp.asarray(domain, jnp.int32))
        return model.apply({"params": params}, *args, deterministic=deterministic, rngs=rngs,
                           **(packing or {}))

    def init(rng: jax.Array) -> Params:
        tokens = jnp.full((1, 2), BOS, jnp.int32)
        args = (tokens, jnp.zeros((1,), jnp.int32)) if uses_domain else (tokens,)
        return model.init(rng, *args, deterministic=True)["params"]

    def apply(params, tokens_in, domain=None, rng=None, segments=None, positions=None):
        packing = None if segments is None else {"segments": segments, "positions": positions}
        return _call(params, tokens_in, domain, rng, packing)

    def _sums(params, batch, rng, use_weight):
        inputs, targets, packing, row_mask = batch_view(batch)
        logits = _call(params, inputs, batch.get("domain"), rng, packing or None)
        return view_sums(batch, logits, targets, row_mask, batch.get("weight") if use_weight else None)

    def loss_fn(params, batch, rng):
        sums = _sums(params, batch, rng, use_weight=True)
        loss = sums["loss_sum"] / jnp.maximum(sums["num_tokens"], 1.0)
        return loss, sums

    def eval_fn(params, batch):
        return _sums(params, batch, None, use_weight=False)

    return LMTask(init=jax.jit(init), apply=apply, loss_fn=loss_fn, eval_fn=eval_fn,
                  uses_domain=uses_domain)


def batch_view(batch) -> tuple[jax.Array, jax.Array, dict, jax.Array | None]:
    """``(inputs[B, L], targets[B, L], packing, row_mask)`` of a padded or packed LM batch (module
    docstring): ``packing`` is ``{}`` or ``{'segments', 'positions'}`` (the ``apply`` keywords),
    ``row_mask`` the padded batch's ``mask`` (None for packed rows: PAD targets already mask).
    A loss written over this view works under every ``batching`` of the engine."""
    if "segments" in batch:
        return (batch["inputs"], batch["targets"],
                {"segments": batch["segments"], "positions": batch["positions"]}, None)
    inputs, targets = metrics.split_tokens(batch["tokens"])
    return inputs, targets, {}, batch.get("mask")


def view_sums(batch, logits, targets, row_mask, weight=None) -> dict:
    """``metrics.lm_sums`` of a :func:`batch_view`; on packed rows ``num_examples`` counts the
    examples (``batch['mask']``: examples per row), not the rows."""
    sums = metrics.lm_sums(logits, targets, row_mask, weight)
    return dict(sums, num_examples=jnp.sum(batch["mask"])) if "segments" in batch else sums


def count_params(params: Params) -> int:
    """Total number of scalars in a parameter pytree (works on ``jax.eval_shape`` outputs)."""
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(params)))
