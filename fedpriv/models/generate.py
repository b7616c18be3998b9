"""Batched sampling from the teacher LLM with a key/value cache (PrE-Text's variation step).

`fedpriv.models.llama.forward` is teacher forcing: every call attends over the whole sequence.
Generating n tokens with it costs n full forwards over a growing buffer (``generate_nocache``,
kept as the reference and the throughput baseline). `generate` instead

1. **prefills** the prompts once (left-padded to a bucket width ``P``; each row's positions
   count only its real tokens, so RoPE sees the same positions as the unpadded prompt) and
   stores every layer's keys and values in a cache ``[n_layers, B, P + max_new, G, h]``;
2. **decodes** one token per step inside a single ``lax.scan``: the new token's query attends
   over the cached keys (pads and future slots masked), its own key/value is written into slot
   ``P + s`` (the same slot for every row: that is what left padding buys), and the next token is
   sampled from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest
   (``temperature = 0``: greedy).

Rows stop at the first of ``stop_ids`` (kept in the output); later positions hold ``pad_id``.
One jit per (batch, prompt bucket, ``max_new``, sampling settings); prompts are grouped by
length so buckets stay tight. Random keys: step ``s`` of a batch samples with
``fold_in(key, s)``; batch ``j`` of a call uses ``fold_in(key, j)`` (the caller's key is the
generation's purpose-tagged key; generations are public post-processing, never private noise).

Shapes: B rows, P prompt width, V vocabulary, N layers, G KV heads, h head dim.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedpriv.models.llama import _NEG_INF, LlamaConfig, _forward_jit, _rms_norm

__all__ = ["generate", "generate_batch", "generate_nocache", "prompt_bucket"]

PROMPT_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 256, 512)


def prompt_bucket(length: int, buckets: Sequence[int] = PROMPT_BUCKETS) -> int:
    """The smallest bucket width holding ``length`` tokens (a multiple of 64 above the last)."""
    for b in buckets:
        if length <= b:
            return b
    return 64 * -(-length // 64)


def _rope(x, pos, base):
    """Rotary embedding of ``x [B, L, heads, h]`` at integer positions ``pos [B, L]``
    (rotate-half layout, as `llama._apply_rope`, but per row)."""
    h = x.shape[-1]
    inv_freq = base ** (-jnp.arange(0, h, 2, dtype=jnp.float32) / h)
    ang = pos.astype(jnp.float32)[..., None] * inv_freq
    ang = jnp.concatenate([ang, ang], axis=-1)[:, :, None, :]
    half = h // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * jnp.cos(ang) + rotated * jnp.sin(ang)


def _attend(c: LlamaConfig, p, x, pos, k_cache, v_cache, allowed):
    """One block on new tokens ``x [B, Lq, d]`` at positions ``pos [B, Lq]`` whose keys/values
    are already written into ``k_cache``/``v_cache [B, S, G, h]``; ``allowed [B, Lq, S]``."""
    bsz, lq, _ = x.shape
    rep = c.n_heads // c.n_kv_heads
    h = _rms_norm(x, p["attn_norm"], c.norm_eps)
    q = _rope((h @ p["wq"]).reshape(bsz, lq, c.n_heads, c.head_dim), pos, c.rope_base)
    q = q.reshape(bsz, lq, c.n_kv_heads, rep, c.head_dim)
    scores = jnp.einsum("bqgrd,bkgd->bgrqk", q, k_cache) / math.sqrt(c.head_dim)
    scores = jnp.where(allowed[:, None, None], scores, _NEG_INF)
    out = jnp.einsum("bgrqk,bkgd->bqgrd", jax.nn.softmax(scores, axis=-1), v_cache)
    x = x + out.reshape(bsz, lq, -1) @ p["wo"]
    h = _rms_norm(x, p["ffn_norm"], c.norm_eps)
    return x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]


def _kv(c: LlamaConfig, p, x, pos):
    """Keys and values ``[B, L, G, h]`` of tokens ``x [B, L, d]`` (RoPE on the keys)."""
    bsz, length, _ = x.shape
    h = _rms_norm(x, p["attn_norm"], c.norm_eps)
    k = _rope((h @ p["wk"]).reshape(bsz, length, c.n_kv_heads, c.head_dim), pos, c.rope_base)
    return k, (h @ p["wv"]).reshape(bsz, length, c.n_kv_heads, c.head_dim)


def _logits(params, c: LlamaConfig, x):
    x = _rms_norm(x, params["final_norm"], c.norm_eps)
    head = params["embed"] if c.tie_embeddings else params["lm_head"]
    return jnp.einsum("bld,vd->blv", x, head)


def kth_largest(x, k: int):
    """``float32 [B, V]`` -> ``[B, 1]``: each row's ``k``-th largest value (ties counted), the
    value ``lax.top_k(x, k)[0][:, -1:]`` holds (a zero's sign aside: the mask ``x < kth`` is the
    same), at a fraction of its cost on CPU, where XLA's TopK sorts every row (measured here:
    8 x 49,152 logits, k 50: ~100 ms a call, 0.16 s of each decoding step of the smoke's
    one-layer teacher; this: 4.5 ms, 60 ms at the test suite's XLA opt level 0). A bisection over
    the 32 bits of the floats' order-preserving ``uint32`` image: bit by bit from the top, the
    largest key ``t`` with at least ``k`` entries ``>= t``, which is the k-th largest key."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    sign = jnp.uint32(0x80000000)
    key = jnp.where(bits >= sign, ~bits, bits | sign)  # negatives reversed below non-negatives

    def take(b, t):
        cand = t | jnp.left_shift(jnp.uint32(1), (31 - b).astype(jnp.uint32))
        return jnp.where((key >= cand[:, None]).sum(axis=-1) >= k, cand, t)

    t = jax.lax.fori_loop(0, 32, take, jnp.zeros(x.shape[:1], jnp.uint32))
    back = jnp.where(t >= sign, t & ~sign, ~t)
    return jax.lax.bitcast_convert_type(back, jnp.float32)[:, None].astype(x.dtype)


def _sample(logits, key, temperature: float, top_k: int):
    """``logits [B, V]`` -> token ids ``[B]``: greedy at temperature 0, else top-k sampling."""
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        logits = jnp.where(logits < kth_largest(logits, top_k), _NEG_INF, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _prefix_cache(params, c, prefix, p_real, bsz, slots, prefix_ok, k_all, v_all):
    """The shared prefix ``int32[P0]`` prefilled once (one row, causal; its first ``P0 - p_real``
    entries padding) and its keys / values broadcast into every row's cache slots ``:P0``."""
    p0 = prefix.shape[0]
    ppos = jnp.maximum(slots[None, :p0] - (p0 - p_real), 0)
    pallowed = ((slots[:p0, None] >= slots[None, :p0]) & prefix_ok[None, :])[None]

    def prefix_layer(x, p):
        k, v = _kv(c, p, x, ppos)
        x = _attend(c, p, x, ppos, k, v, pallowed)
        return x, (jnp.broadcast_to(k, (bsz,) + k.shape[1:]),
                   jnp.broadcast_to(v, (bsz,) + v.shape[1:]))

    x0 = params["embed"][prefix][None].astype(jnp.float32)
    _, (kp, vp) = jax.lax.scan(prefix_layer, x0, params["layers"])
    return k_all.at[:, :, :p0].set(kp), v_all.at[:, :, :p0].set(vp)


def _decode(params, c, key, init, n_real, first_slot, slots, max_new, temperature, top_k, stops,
            pad_id):
    """``max_new`` sampling steps from the prefilled cache (``init = (logits [B, V], k, v,
    valid slots [B, S])``): step s samples with ``fold_in(key, s)`` and writes slot
    ``first_slot + s``. Returns ``(tokens [max_new, B], live [max_new, B], logits [max_new, B, V])``."""
    layers = params["layers"]

    def step(carry, s):
        logits, k_all, v_all, ok, done = carry
        tok = _sample(logits, jax.random.fold_in(key, s), temperature, top_k)
        tok = jnp.where(done, pad_id, tok)
        slot = first_slot + s
        ok = ok.at[:, slot].set(True)
        tpos = (n_real + s)[:, None]
        allowed = ok[:, None, :] & (slots <= slot)[None, None, :]

        def layer(x, inp):
            p, kc, vc = inp
            k, v = _kv(c, p, x, tpos)
            kc = jax.lax.dynamic_update_slice_in_dim(kc, k, slot, axis=1)
            vc = jax.lax.dynamic_update_slice_in_dim(vc, v, slot, axis=1)
            return _attend(c, p, x, tpos, kc, vc, allowed), (kc, vc)

        x = params["embed"][tok][:, None].astype(jnp.float32)
        x, (k_all, v_all) = jax.lax.scan(layer, x, (layers, k_all, v_all))
        new_done = done | jnp.isin(tok, stops)
        return (_logits(params, c, x)[:, 0], k_all, v_all, ok, new_done), (tok, ~done, logits)

    bsz = init[0].shape[0]
    _, out = jax.lax.scan(step, init + (jnp.zeros((bsz,), bool),), jnp.arange(max_new))
    return out


@functools.partial(jax.jit, static_argnames=("config", "max_new", "temperature", "top_k",
                                             "stop_ids", "pad_id", "return_logits"))
def generate_batch(params, config: LlamaConfig, prompt_ids, prompt_mask, key, *, max_new: int,
                   temperature: float = 1.0, top_k: int = 0, stop_ids: tuple = (),
                   pad_id: int = 0, return_logits: bool = False, prefix=None, prefix_pad=0):
    """Sample ``max_new`` tokens after each LEFT-padded prompt with a KV cache.

    Args:
      params, config: the teacher (`llama.init_params` layout).
      prompt_ids: int32[B, P], left-padded; prompt_mask: [B, P], 1 on real tokens (each row has
        at least one).
      key: PRNG key; step s samples with ``fold_in(key, s)``.
      max_new, temperature, top_k, stop_ids, pad_id: static sampling settings (module docstring).
      return_logits: also return the float32[B, max_new, V] logits each token was drawn from.
      prefix: optional int32[P0] shared by every row, before its prompt (e.g. a chat template):
        prefilled once for the batch (cost P0, not B x P0) and its keys/values broadcast.
      prefix_pad: int (traced) leading entries of ``prefix`` that are padding (masked, not
        counted in positions): prefixes of different lengths padded to one bucket share a compile.

    Returns:
      (tokens int32[B, max_new] -- ``pad_id`` after a row's stop token --, lengths int32[B]
      = tokens up to and including the stop token) [, logits].
    """
    c = config
    bsz, plen = prompt_ids.shape
    p0 = 0 if prefix is None else prefix.shape[0]
    total = p0 + plen + max_new
    real = prompt_mask.astype(bool)
    p_real = p0 - jnp.asarray(prefix_pad, jnp.int32)                        # real prefix tokens
    pos = p_real + jnp.maximum(jnp.cumsum(real, axis=1) - 1, 0)             # [B, P]
    n_real = p_real + real.sum(axis=1)                                      # [B]
    layers = params["layers"]
    cache_shape = (c.n_layers, bsz, total, c.n_kv_heads, c.head_dim)
    k_all, v_all = jnp.zeros(cache_shape, jnp.float32), jnp.zeros(cache_shape, jnp.float32)
    slots = jnp.arange(total)
    prefix_ok = slots[:p0] >= p0 - p_real
    slot_ok = jnp.concatenate([jnp.broadcast_to(prefix_ok, (bsz, p0)), real,
                               jnp.zeros((bsz, max_new), bool)], axis=1)     # [B, S]
    if p0:  # the shared prefix: one row, causal, broadcast into every row's cache
        k_all, v_all = _prefix_cache(params, c, prefix, p_real, bsz, slots, prefix_ok, k_all, v_all)
    # the prompts' query slots p0..p0+P attend causally to every valid slot before them
    causal = (p0 + jnp.arange(plen))[:, None] >= slots[None, :]              # [P, S]

    def prefill_layer(x, inp):
        p, kc, vc = inp
        k, v = _kv(c, p, x, pos)
        kc, vc = kc.at[:, p0:p0 + plen].set(k), vc.at[:, p0:p0 + plen].set(v)
        x = _attend(c, p, x, pos, kc, vc, causal[None] & slot_ok[:, None, :])
        return x, (kc, vc)

    x = params["embed"][prompt_ids].astype(jnp.float32)
    x, (k_all, v_all) = jax.lax.scan(prefill_layer, x, (layers, k_all, v_all))
    first_logits = _logits(params, c, x[:, -1:])[:, 0]                       # [B, V]
    stops = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)
    toks, live, logits = _decode(params, c, key, (first_logits, k_all, v_all, slot_ok), n_real,
                                 p0 + plen, slots, max_new, temperature, top_k, stops, pad_id)
    out = (toks.T, live.T.sum(axis=1).astype(jnp.int32))
    return out + (jnp.swapaxes(logits, 0, 1),) if return_logits else out


def _left_pad(prompts: Sequence[Sequence[int]], width: int, pad_id: int):
    ids = np.full((len(prompts), width), pad_id, np.int32)
    mask = np.zeros((len(prompts), width), np.float32)
    for i, p in enumerate(prompts):
        if not 1 <= len(p) <= width:
            raise ValueError(f"prompt {i} has {len(p)} tokens (need 1..{width})")
        ids[i, width - len(p):] = p
        mask[i, width - len(p):] = 1
    return ids, mask


def generate(teacher, prompts: Sequence[Sequence[int]], key, *, max_new: int = 32,
             temperature: float = 1.0, top_k: int = 0, stop_ids: Sequence[int] | None = None,
             batch_size: int = 32, progress: bool = False, stats: dict | None = None,
             prefix: Sequence[int] | None = None) -> list[list[int]]:
    """Continue every prompt (teacher token ids) with up to ``max_new`` sampled tokens.

    Prompts are sorted by length and run ``batch_size`` at a time (a shorter last batch padded
    with copies of its first prompt to the next power of two >= 8, discarded), left-padded to
    `prompt_bucket`. Returns the
    continuations in input order, each ending at its first stop token (included; default:
    the teacher's ``eos_id``). ``stats`` (a dict) gets ``tokens`` (generated, real) and
    ``seconds`` added. ``prefix``: ids shared by every prompt, placed before each (prefilled
    once per batch: `generate_batch`); the prompts may then not be empty either.
    """
    if not prompts:
        return []
    if max_new < 1 or batch_size < 1:
        raise ValueError(f"max_new and batch_size must be >= 1, got {max_new}, {batch_size}")
    stop = tuple(int(i) for i in (stop_ids if stop_ids is not None else (teacher.eos_id,)))
    order = np.argsort([len(p) for p in prompts], kind="stable")
    out: list[list[int] | None] = [None] * len(prompts)
    t0, n_tok = time.perf_counter(), 0
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(prompts), desc="generate", unit="seq", leave=False)
    pre, pre_pad = None, 0
    if prefix:  # left-padded to a bucket: prefixes of similar length share a compile
        pre_ids, _ = _left_pad([list(prefix)], prompt_bucket(len(prefix)), teacher.eos_id)
        pre, pre_pad = jnp.asarray(pre_ids[0]), jnp.int32(pre_ids.shape[1] - len(prefix))
    for j, idx in enumerate(batches):
        # a short batch is padded to the next power of two (>= 8), not to batch_size
        size = min(batch_size, max(8, 1 << (len(idx) - 1).bit_length()))
        rows = [prompts[i] for i in idx] + [prompts[idx[0]]] * (size - len(idx))
        width = prompt_bucket(max(len(r) for r in rows))
        ids, mask = _left_pad(rows, width, teacher.eos_id)
        toks, lens = generate_batch(teacher.params, teacher.config, jnp.asarray(ids),
                                    jnp.asarray(mask), jax.random.fold_in(key, j), max_new=max_new,
                                    temperature=float(temperature), top_k=int(top_k),
                                    stop_ids=stop, pad_id=int(teacher.eos_id),
                                    prefix=pre, prefix_pad=pre_pad)
        toks, lens = np.asarray(toks), np.asarray(lens)
        for r, i in enumerate(idx):
            out[i] = toks[r, : lens[r]].tolist()
            n_tok += int(lens[r])
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    if stats is not None:
        stats["tokens"] = stats.get("tokens", 0) + n_tok
        stats["seconds"] = stats.get("seconds", 0.0) + time.perf_counter() - t0
    return out


def generate_nocache(teacher, prompts: Sequence[Sequence[int]], key, *, max_new: int = 32,
                     temperature: float = 1.0, top_k: int = 0, batch_size: int = 32
                     ) -> list[list[int]]:
    """The reference without a cache: every step runs `llama.forward` over the whole buffer
    (prompt bucket + ``max_new``, one compile) and samples at the current position with the same
    keys as `generate`. No stop tokens (always ``max_new`` tokens). The throughput baseline of
    ``benchmarks.generate``; equal to `generate` up to float summation order."""
    order = np.argsort([len(p) for p in prompts], kind="stable")
    out: list[list[int] | None] = [None] * len(prompts)
    for j, idx in enumerate([order[i:i + batch_size] for i in range(0, len(order), batch_size)]):
        rows = [prompts[i] for i in idx] + [prompts[idx[0]]] * (batch_size - len(idx))
        width = prompt_bucket(max(len(r) for r in rows))
        ids, mask = _left_pad(rows, width, teacher.eos_id)
        # right-align for teacher forcing: real tokens first, then the generated ones
        lens = mask.sum(axis=1).astype(int)
        buf = np.full((len(rows), width + max_new), teacher.eos_id, np.int32)
        for r, row in enumerate(rows):
            buf[r, : lens[r]] = row
        bkey = jax.random.fold_in(key, j)
        for s in range(max_new):
            m = (np.arange(buf.shape[1])[None] < (lens + s)[:, None]).astype(np.float32)
            logits = _forward_jit(teacher.params, teacher.config, jnp.asarray(buf), jnp.asarray(m))
            cur = jnp.asarray(logits)[jnp.arange(len(rows)), lens + s - 1]
            tok = np.asarray(_sample(cur, jax.random.fold_in(bkey, s), float(temperature), int(top_k)))
            buf[np.arange(len(rows)), lens + s] = tok
        for r, i in enumerate(idx):
            out[i] = buf[r, lens[r]: lens[r] + max_new].tolist()
    return out
