"""Domain-adaptive on-device LMs: the DSDSR and DEMix baselines of Koga et al. (2023), Table 1.

Koga et al. ("Population Expansion for Training Language Models with Private Federated Learning",
§4.2) train on clients of a large source domain S and a small target domain T together and compare
their instance-weighting/pretraining schemes with two domain-adaptive architectures, trained with
cohort size C on S ∪ T. Both models here read ``batch['domain']`` (``int32[B]``, 0 = S, 1 = T; more
domains are allowed via ``num_domains``) and satisfy the same ``LMTask`` contract as the plain LMs
(``fedpriv.models.lm.make_lm_task``), so the FL engine trains them unchanged. Sizes come from the
same ``LMConfig`` (embedding 96, hidden 670 by default).

**DSDSR** (Morioka et al., ICASSP 2018, "LM domain adaptation via RNNs with domain-shared and
domain-specific representations"): the model has *domain-shared* and *domain-specific* word
embeddings and contextual (recurrent) features, so commonalities and discrepancies between domains
are learned by separate parameters (Koga et al. §2: "domain-specific and domain-shared
representations ... learned separately"). Our instantiation for an example x of domain d:
    ``h^sh = LSTM_sh(E_sh x)``,  ``h^sp = LSTM_d(E_d x)``,
    ``logits = W_V (W_E [h^sh ; h^sp] + b_E) + b_V``,
i.e. the output layer sees the concatenation of the shared and the example's own domain-specific
representation (widths ``embed_dim``/``hidden_dim`` for the shared stream and
``specific_embed_dim``/``specific_hidden_dim`` for each domain stream, defaulting to the same sizes).
Only the architecture is reproduced (Koga et al. describe the baseline by its architecture): the
shared and specific streams are trained jointly with the plain LM loss, no auxiliary losses.

**DEMix** (Gururangan et al., NAACL 2022, "DEMix layers: disentangling domains for modular language
modeling"): every feed-forward layer of a transformer is replaced by a *DEMix layer*, a set of
domain-expert FFNs ``FFN_1 … FFN_D``; during training (and evaluation on a known domain) each
example is routed deterministically to the expert of its domain, all other parameters are shared.
Here the block output is ``LN(x + FFN_d(x))`` with a shared residual/LayerNorm and expert
``FFN_d(x) = W2_d relu(W1_d x + b1_d) + b2_d`` of width ``ffn_dim`` (default ``hidden_dim``).
Backbone: ``config.arch='transformer'`` replaces the FFN of each transformer block of
``fedpriv.models.lm.TransformerLM``; ``config.arch='lstm'`` (the default, matching the LSTM LMs of
Koga et al.) follows every LSTM layer with a DEMix FFN sublayer (LSTM → DEMix layer → projection →
vocabulary). The paper's inference-time mixture of experts for *unknown* domains (posterior-weighted
ensembling) is not needed here: evaluation is always on a known domain (T).

Routing is exact: each domain's stream/expert is computed for the whole batch and selected per
example with ``where``, so an example's output and gradients depend only on the shared parameters
and its own domain's parameters (a domain id outside ``[0, num_domains)`` gets a zero
domain-specific contribution). This costs ``num_domains`` × the domain-specific compute, which is
cheap for the two domains of Koga et al. Both models are larger than the plain LM (more parameters
to communicate), as Koga et al. note in §4.3.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedpriv.models import lm
from fedpriv.models.lm import LMConfig, LMTask


def _route(per_domain: list[jax.Array], domain: jax.Array) -> jax.Array:
    """Select each example's domain output.

    Args:
      per_domain: ``num_domains`` arrays ``float[B, ...]`` (domain d's output for every example).
      domain: ``int[B]``.
    Returns:
      ``float[B, ...]`` with row b taken from ``per_domain[domain[b]]`` (zeros if out of range).
    """
    out = jnp.zeros_like(per_domain[0])
    for d, y in enumerate(per_domain):
        sel = (domain == d).reshape((-1,) + (1,) * (y.ndim - 1))
        out = jnp.where(sel, y, out)
    return out


class _DomainLM(nn.Module):
    """What both domain LMs take: the LM config, the number of domains (checked >= 1 when
    called) and ``uses_domain`` (their ``__call__`` takes ``domain int[B]``)."""
    config: LMConfig
    num_domains: int = 2
    uses_domain: ClassVar[bool] = True

    def _setup_call(self) -> LMConfig:
        if self.num_domains < 1:
            raise ValueError(f"num_domains must be >= 1, got {self.num_domains}")
        return self.config


class DSDSRLM(_DomainLM):
    """Domain-shared + domain-specific LSTM LM (Morioka et al. 2018).

    ``__call__(tokens int[B, L], domain int[B]) -> logits float32[B, L, V]``. Parameters:
    ``shared_embedding``, ``shared_lstm_{l}``, ``specific_{d}`` (embedding + LSTM of domain d),
    ``head`` (projection of the concatenation to ``embed_dim``, then the vocabulary layer).
    """

    specific_embed_dim: int | None = None
    specific_hidden_dim: int | None = None

    @nn.compact
    def __call__(self, tokens: jax.Array, domain: jax.Array, *,
                 deterministic: bool = True) -> jax.Array:
        cfg = self._setup_call()
        drop = nn.Dropout(cfg.dropout_rate)
        emb = lm._embed(cfg, name="shared_embedding")
        h_sh = drop(emb(tokens), deterministic=deterministic)
        for layer in range(cfg.num_layers):
            h_sh = lm.LSTMLayer(cfg.hidden_dim, name=f"shared_lstm_{layer}")(h_sh)
        sp_cfg = dataclasses.replace(
            cfg, embed_dim=self.specific_embed_dim or cfg.embed_dim,
            hidden_dim=self.specific_hidden_dim or cfg.hidden_dim)
        streams = [_SpecificLSTM(sp_cfg, name=f"specific_{d}")(tokens, deterministic)
                   for d in range(self.num_domains)]
        h = jnp.concatenate([h_sh, _route(streams, domain)], axis=-1)
        return lm.OutputHead(cfg.vocab_size, cfg.embed_dim, cfg.dropout_rate, name="head")(
            h, deterministic, emb if cfg.tie_embeddings else None)


class _SpecificLSTM(nn.Module):
    """One domain's embedding + LSTM stack: ``int[B, L] -> float[B, L, H_sp]``."""

    config: LMConfig

    @nn.compact
    def __call__(self, tokens: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        h = nn.Dropout(cfg.dropout_rate)(lm._embed(cfg)(tokens), deterministic=deterministic)
        for layer in range(cfg.num_layers):
            h = lm.LSTMLayer(cfg.hidden_dim, name=f"lstm_{layer}")(h)
        return h


class _ExpertFFN(nn.Module):
    """``W2 relu(W1 x + b1) + b2``: ``float[B, L, H] -> float[B, L, H]``."""

    ffn_dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        y = nn.relu(nn.Dense(self.ffn_dim, name="dense_in")(x))
        return nn.Dense(x.shape[-1], name="dense_out")(y)


class DEMixSublayer(nn.Module):
    """DEMix layer (Gururangan et al. 2022, §2): ``LN(x + FFN_{domain}(x))``, experts ``expert_{d}``.

    ``__call__(x float[B, L, H], domain int[B]) -> float[B, L, H]``.
    """

    ffn_dim: int
    num_domains: int
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, domain: jax.Array, deterministic: bool) -> jax.Array:
        experts = [_ExpertFFN(self.ffn_dim, name=f"expert_{d}")(x) for d in range(self.num_domains)]
        y = nn.Dropout(self.dropout_rate)(_route(experts, domain), deterministic=deterministic)
        return nn.LayerNorm(epsilon=1e-6, name="ln")(x + y)


class DEMixLM(_DomainLM):
    """LM whose feed-forward layers are DEMix domain-expert layers (Gururangan et al. 2022).

    ``config.arch='transformer'``: embed → [causal attention → DEMix FFN] × num_layers → head.
    ``config.arch='lstm'``: embed → [LSTM → DEMix FFN] × num_layers → head.
    ``__call__(tokens int[B, L], domain int[B]) -> logits float32[B, L, V]``.
    """

    @nn.compact
    def __call__(self, tokens: jax.Array, domain: jax.Array, *,
                 deterministic: bool = True) -> jax.Array:
        cfg = self._setup_call()
        if cfg.arch == "transformer":
            x, emb = lm.TransformerEmbed(cfg, name="embed")(tokens, deterministic)
        else:
            emb = lm._embed(cfg)
            x = nn.Dropout(cfg.dropout_rate)(emb(tokens), deterministic=deterministic)
        for layer in range(cfg.num_layers):
            if cfg.arch == "transformer":
                x = lm.CausalSelfAttentionSublayer(cfg.num_heads, cfg.dropout_rate,
                                                   name=f"attn_{layer}")(x, deterministic)
            else:
                x = lm.LSTMLayer(cfg.hidden_dim, name=f"lstm_{layer}")(x)
            x = DEMixSublayer(cfg.ffn_width, self.num_domains, cfg.dropout_rate,
                              name=f"demix_{layer}")(x, domain, deterministic)
        return lm.OutputHead(cfg.vocab_size, cfg.embed_dim, cfg.dropout_rate, name="head")(
            x, deterministic, emb if cfg.tie_embeddings else None)


def make_dsdsr_task(config: LMConfig, num_domains: int = 2, specific_embed_dim: int | None = None,
                    specific_hidden_dim: int | None = None) -> LMTask:
    """``LMTask`` of a DSDSR LSTM LM (``config.arch`` must be ``'lstm'``); batches need ``'domain'``."""
    if config.arch != "lstm":
        raise ValueError("DSDSR is an LSTM model; use LMConfig(arch='lstm')")
    return lm.make_lm_task(DSDSRLM(config, num_domains, specific_embed_dim, specific_hidden_dim))


def make_demix_task(config: LMConfig, num_domains: int = 2) -> LMTask:
    """``LMTask`` of a DEMix LM on the ``config.arch`` backbone; batches need ``'domain'``."""
    return lm.make_lm_task(DEMixLM(config, num_domains))
