"""Next-token LM metrics: loss, in-vocabulary accuracy, perplexity, batched evaluation.

Conventions (project-wide): token ids PAD=0, UNK(OOV)=1, BOS=2, EOS=3. An example is
``tokens: int32[L+1]`` = BOS, ids..., EOS, then PAD; the model reads ``tokens[:-1]`` and predicts
``tokens[1:]``. A batch is ``{'tokens': int32[B, L+1], 'mask': float32[B]}`` (mask 0 marks padding
examples inserted by the FL engine), optionally ``'weight': float32[B]`` and ``'domain': int32[B]``.

Metrics, with t ranging over target positions and b over examples:

* **Loss** (Wang et al. 2023, App. B.2, "standard autoregressive LM loss"): the mean next-token
  negative log-likelihood over real targets,
      ``loss = Σ_{b,t} m_b w_b 1[y_bt ≠ PAD] (−log p(y_bt | y_<t)) / Σ_{b,t} m_b 1[y_bt ≠ PAD]``,
  with ``m_b`` the example mask and ``w_b`` the optional instance weight (Koga et al. 2023, Eq. 2:
  the objective is ``E_{x∼S∪T}[w(x) L(x)]``, so the weights scale the numerator only and the
  denominator is the plain token count — a uniform weight c multiplies the loss by c).
* **In-vocabulary accuracy** (Wang et al. 2023, §2 "Datasets"; cf. the masked accuracies of the
  TFF StackOverflow next-word-prediction task): ``#{argmax p = y} / #{targets}`` where targets
  that are PAD, BOS, EOS or UNK are excluded from numerator and denominator. A prediction of a
  special token is never equal to a counted target, so it is wrong.
* **Perplexity** ``= exp(Σ NLL / Σ tokens)`` over all real (non-PAD) targets, EOS and UNK targets
  included (the usual definition, as in Koga et al. 2023, Table 1).

Everything here that runs per step is a pure JAX function of fixed-shape arrays, so it composes
with ``jax.jit``/``jax.vmap``. Metric *sums* (not means) are returned so the FL engine and
``evaluate`` can add them across steps and clients; means are taken on host in float64.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedpriv.data.tokenizers import BOS_ID as BOS, EOS_ID as EOS, PAD_ID as PAD, SPECIAL_IDS, UNK_ID as UNK
from fedpriv.models import bucketing

SPECIAL_TOKENS = SPECIAL_IDS.as_tuple()  # (PAD, UNK, BOS, EOS)

# Keys of the per-batch sums dict returned by `lm_sums` / a task's `eval_fn` / `loss_fn` aux.
SUM_KEYS = ("loss_sum", "num_tokens", "num_correct", "num_acc_tokens", "num_examples")


def split_tokens(tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``tokens: int[..., L+1]`` -> ``(inputs int[..., L], targets int[..., L])``."""
    return tokens[..., :-1], tokens[..., 1:]


def in_vocab_mask(targets: jax.Array) -> jax.Array:
    """``bool[...]``: True where a target counts for accuracy (not PAD, UNK, BOS or EOS)."""
    return (targets != PAD) & (targets != UNK) & (targets != BOS) & (targets != EOS)


def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-position negative log-likelihood.

    Args:
      logits: ``float[B, L, V]``.
      targets: ``int[B, L]``.
    Returns:
      ``float32[B, L]`` = ``−log softmax(logits)[targets]`` (computed in float32).
    """
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets.astype(jnp.int32))


def lm_sums(logits: jax.Array, targets: jax.Array, example_mask: jax.Array | None = None,
            weight: jax.Array | None = None) -> dict[str, jax.Array]:
    """Metric sums of one batch (all float32 scalars).

    Args:
      logits: ``float[B, L, V]`` next-token logits for the inputs ``tokens[:, :-1]``.
      targets: ``int[B, L]`` = ``tokens[:, 1:]``.
      example_mask: ``float[B]``, 1 for real examples and 0 for padding examples (default all 1).
      weight: optional ``float[B]`` instance weights (or ``float[B, L]`` per position: packed
        rows); they scale ``loss_sum`` only.
    Returns:
      ``loss_sum``: Σ m_b w_b NLL over non-PAD targets; ``num_tokens``: # non-PAD targets of real
      examples (the loss/perplexity denominator); ``num_correct``/``num_acc_tokens``: numerator and
      denominator of in-vocabulary accuracy; ``num_examples``: Σ m_b.
    """
    batch = targets.shape[0]
    ex = jnp.ones((batch,), jnp.float32) if example_mask is None else example_mask.astype(jnp.float32)
    tok = (targets != PAD).astype(jnp.float32) * ex[:, None]
    nll = token_nll(logits, targets)
    # `where`, not a product, so a non-finite NLL at a masked position cannot leak into the sum.
    if weight is None:
        w_tok = tok
    elif weight.ndim == tok.ndim:  # per-position weights (packed rows)
        w_tok = tok * weight.astype(jnp.float32)
    else:
        w_tok = tok * weight.astype(jnp.float32)[:, None]
    loss_sum = jnp.sum(jnp.where(tok > 0, nll * w_tok, 0.0))
    acc_tok = in_vocab_mask(targets).astype(jnp.float32) * ex[:, None]
    correct = top1_correct(logits, targets).astype(jnp.float32) * acc_tok
    return {
        "loss_sum": loss_sum,
        "num_tokens": jnp.sum(tok),
        "num_correct": jnp.sum(correct),
        "num_acc_tokens": jnp.sum(acc_tok),
        "num_examples": jnp.sum(ex),
    }


def top1_correct(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``bool[...]``: ``argmax(logits, -1) == targets`` (the first maximum wins ties), without
    the argmax.

    XLA's CPU backend lowers an argmax to a value-and-index reduction that it does not
    vectorize: over a 10k vocabulary it cost several times the softmax cross entropy itself
    (issue 27; ``python -m benchmarks.ceiling``). The target is the argmax exactly when its logit
    equals the row maximum and every earlier logit is below it, i.e. ``z_y == max_v z_v`` and
    ``max_{v<y} z_v < z_y``: two plain max-reductions. For finite logits this equals the argmax
    test bit for bit, ties included; a row holding a NaN counts as wrong (the argmax would point
    at its first NaN).

    Args:
      logits: ``float[..., V]``.
      targets: ``int[...]`` in ``[0, V)``.
    """
    targets = targets.astype(jnp.int32)
    z = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    earlier = jnp.arange(logits.shape[-1], dtype=jnp.int32) < targets[..., None]
    first = jnp.max(jnp.where(earlier, logits, -jnp.inf), axis=-1)
    return (z == jnp.max(logits, axis=-1)) & (first < z)


def sequence_sums(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-sequence log-probability sums over non-PAD targets.

    Args:
      logits: ``float[B, L, V]``; targets: ``int[B, L]``.
    Returns:
      ``(logprob_sum float32[B], num_tokens float32[B])``.
    """
    tok = (targets != PAD)
    nll = token_nll(logits, targets)
    return (jnp.sum(jnp.where(tok, -nll, 0.0), axis=-1),
            jnp.sum(tok.astype(jnp.float32), axis=-1))


def perplexity(loss_sum: float, num_tokens: float) -> float:
    """``exp(loss_sum / num_tokens)``; ``nan`` when there are no tokens."""
    if num_tokens <= 0:
        return float("nan")
    return float(np.exp(np.float64(loss_sum) / np.float64(num_tokens)))


def summarize(sums: Mapping[str, Any]) -> dict[str, float]:
    """Host-side means of metric sums (e.g. added over steps/clients by the FL engine).

    Returns ``dict(loss, perplexity, accuracy, num_tokens)``: ``loss = loss_sum / num_tokens``,
    ``perplexity = exp(loss)``, ``accuracy = num_correct / num_acc_tokens`` (in-vocabulary).
    Empty denominators give ``nan``.
    """
    s = {k: float(np.asarray(sums[k], np.float64).sum()) for k in
         ("loss_sum", "num_tokens", "num_correct", "num_acc_tokens")}
    n, na = s["num_tokens"], s["num_acc_tokens"]
    return {
        "loss": s["loss_sum"] / n if n > 0 else float("nan"),
        "perplexity": perplexity(s["loss_sum"], n),
        "accuracy": s["num_correct"] / na if na > 0 else float("nan"),
        "num_tokens": n,
    }


@functools.lru_cache(maxsize=64)
def _jit(fn: Callable) -> Callable:
    """One jitted wrapper per function object, so repeated evaluations reuse compilations."""
    return jax.jit(fn)


@functools.lru_cache(maxsize=64)
def _seq_logprob_fn(apply: Callable) -> Callable:
    """Jitted ``(params, tokens[B, L+1], domain) -> (logprob_sum[B], num_tokens[B])``, one per apply."""
    def fn(params, tokens, domain):
        inputs, targets = split_tokens(tokens)
        logits = apply(params, inputs, domain)
        return sequence_sums(logits, targets)
    return jax.jit(fn)


def _padded_batches(n: int, batch_size: int):
    """Yield ``(start, stop)`` of consecutive fixed-size batches covering ``range(n)``."""
    for start in range(0, n, batch_size):
        yield start, min(start + batch_size, n)


def _length_batches(tokens: np.ndarray, domain, batch_size: int, trim: bool):
    """Batches for evaluation: ``(rows, tok int32[B, w], mask float32[B], dom int32[B] or None)``.

    ``trim``: rows sorted by length (stable), cut into batches of ``batch_size`` and each cut to
    the smallest of the ``bucketing.width_buckets(L+1)`` widths (at most 4) holding its longest
    row: one compiled shape per width, no columns that are PAD in every row (exact: causal
    models, PAD targets are not scored). Otherwise consecutive full-width batches (one shape).
    Short batches are padded to ``batch_size`` rows with PAD examples of mask 0.
    """
    n, full = tokens.shape
    if trim and n:
        widths = bucketing.width_buckets(full)
        groups = bucketing.length_sorted_batches(bucketing.row_lengths(tokens, PAD), batch_size, widths)
    else:
        groups = ((np.arange(a, b), full) for a, b in _padded_batches(n, batch_size))
    for rows, width in groups:
        k = len(rows)
        tok = np.zeros((batch_size, width), np.int32)
        tok[:k] = tokens[rows, :width]
        mask = np.zeros((batch_size,), np.float32)
        mask[:k] = 1.0
        dom = None
        if domain is not None:
            dom = np.zeros((batch_size,), np.int32)
            dom[:k] = np.asarray(domain)[rows]
        yield rows, tok, mask, dom


def _check_tokens(tokens: np.ndarray, batch_size: int) -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be int[N, L+1] with L >= 1, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integer, got {tokens.dtype}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return tokens.astype(np.int32)


def evaluate(task, params, tokens: np.ndarray, batch_size: int,
             domain: np.ndarray | None = None, trim: bool = True) -> dict[str, float]:
    """Evaluate an LM task on many examples (e.g. all validation clients' sentences pooled).

    Runs the task's jitted ``eval_fn`` over fixed-size batches of ``batch_size`` examples; the last
    batch is padded with PAD examples of mask 0. With ``trim`` (default) the examples are sorted
    by length and each batch is cut to one of at most 4 widths (``_length_batches``: one
    compiled shape per width; the same sums up to float summation order); without, one full-width
    shape. Per-batch sums are added on host in float64.

    Args:
      task: an ``LMTask`` (``fedpriv.models.lm.make_lm_task`` or the domain builders).
      params: the task's parameter pytree.
      tokens: ``int[N, L+1]`` examples (BOS ... EOS PAD...).
      batch_size: examples per compiled step.
      domain: ``int[N]`` domain ids, required by domain-adaptive tasks, ignored otherwise.
    Returns:
      ``dict(loss, perplexity, accuracy, num_tokens)`` as in `summarize`, plus ``num_examples``.
    """
    tokens = _check_tokens(tokens, batch_size)
    step = _jit(task.eval_fn)
    outs = []
    for _, tok, mask, dom in _length_batches(tokens, domain, batch_size, trim):
        batch = {"tokens": tok, "mask": mask}
        if dom is not None:
            batch["domain"] = dom
        outs.append(step(params, batch))  # dispatched asynchronously; fetched once below
    host = jax.device_get(outs)
    total = {key: sum(float(o[key]) for o in host) for key in SUM_KEYS}
    result = summarize(total)
    result["num_examples"] = total["num_examples"]
    return result


def sequence_logprob(task, params, tokens: np.ndarray, batch_size: int,
                     domain: np.ndarray | None = None, trim: bool = True) -> np.ndarray:
    """Average per-token log-probability of each sequence (Wang et al. 2023, Algorithm 1, line 6).

    ``out[n] = (1/|T_n|) Σ_{t∈T_n} log p(y_nt | y_n,<t)``, with ``T_n`` the non-PAD targets of
    sequence n (EOS and UNK targets included). Sequences without targets get 0.

    Args:
      task: an ``LMTask``; params: its parameters.
      tokens: ``int[N, L+1]``; batch_size: examples per compiled step (last batch padded).
      domain: ``int[N]`` for domain-adaptive tasks.
      trim: length-sorted batches cut to a few widths (as :func:`evaluate`; outputs in input order).
    Returns:
      ``float32[N]``.
    """
    tokens = _check_tokens(tokens, batch_size)
    n = len(tokens)
    step = _seq_logprob_fn(task.apply)
    outs = [(rows, step(params, tok, dom)) for rows, tok, _, dom in
            _length_batches(tokens, domain, batch_size, trim)]
    res = np.zeros((n,), np.float32)
    for rows, (lp, cnt) in outs:
        k = len(rows)
        lp, cnt = np.asarray(lp, np.float64)[:k], np.asarray(cnt, np.float64)[:k]
        res[rows] = np.where(cnt > 0, lp / np.maximum(cnt, 1.0), 0.0)
    return res


@functools.lru_cache(maxsize=64)
def _predict_fn(apply: Callable) -> Callable:
    """Jitted ``(params, tokens[B, L+1], domain) -> argmax ids int32[B, L]``, one per apply."""
    def fn(params, tokens, domain):
        inputs, _ = split_tokens(tokens)
        return jnp.argmax(apply(params, inputs, domain), axis=-1).astype(jnp.int32)
    return jax.jit(fn)


def predict_next(task, params, tokens: np.ndarray, batch_size: int,
                 domain: np.ndarray | None = None, trim: bool = True) -> np.ndarray:
    """Greedy next-token predictions: ``int32[N, L]``, ``out[n, t] = argmax p(. | tokens[n, :t+1])``
    (aligned with the targets ``tokens[:, 1:]``; batches as :func:`evaluate`). With ``trim``,
    positions past the width of a row's batch (their targets are PAD) are PAD."""
    tokens = _check_tokens(tokens, batch_size)
    step = _predict_fn(task.apply)
    out = np.full((len(tokens), tokens.shape[1] - 1), PAD, np.int32)
    outs = [(rows, step(params, tok, dom)) for rows, tok, _, dom in
            _length_batches(tokens, domain, batch_size, trim)]
    for rows, p in outs:
        p = np.asarray(p)
        out[rows, :p.shape[1]] = p[:len(rows)]
    return out


def accuracy_with_oov(tokens: np.ndarray, predictions: np.ndarray) -> float:
    """Next-token accuracy with OOV targets counted (Wang et al. Figure 1, "w/ OOV"): over every
    target that is not PAD, BOS or EOS, an UNK target is right iff UNK is predicted.
    ``tokens``: ``int[N, L+1]``; ``predictions``: ``int[N, L]`` (:func:`predict_next`)."""
    targets = np.asarray(tokens)[:, 1:]
    scored = (targets != PAD) & (targets != BOS) & (targets != EOS)
    n = int(scored.sum())
    return float(((np.asarray(predictions) == targets) & scored).sum() / n) if n else float("nan")


def _in_vocab_targets(tokens) -> np.ndarray:
    """Flat in-vocabulary targets of ``int[N, L+1]`` or of a sequence of such arrays."""
    arrays = [tokens] if isinstance(tokens, np.ndarray) and tokens.ndim == 2 else list(tokens)
    flat = [np.asarray(a)[:, 1:].ravel() for a in arrays if np.asarray(a).size]
    t = np.concatenate(flat) if flat else np.zeros((0,), np.int64)
    return t[in_vocab_mask(t)]


def most_frequent_token_accuracy(train_tokens, eval_tokens) -> float:
    """In-vocabulary accuracy of always predicting the most frequent training target token.

    The constant predictor is the most frequent in-vocabulary (not PAD/UNK/BOS/EOS) target among
    ``train_tokens[:, 1:]`` (predicting a special token would always count as wrong); its accuracy
    is measured on ``eval_tokens[:, 1:]`` with the same exclusion rules as `lm_sums`.

    Args:
      train_tokens: ``int[N, L+1]``, or a sequence of such arrays (e.g. one per client).
      eval_tokens: ``int[M, L'+1]``, or a sequence of such arrays.
    Returns:
      accuracy in [0, 1] (``nan`` if the evaluation set has no in-vocabulary targets).
    """
    tr = _in_vocab_targets(train_tokens)
    ev = _in_vocab_targets(eval_tokens)
    if ev.size == 0:
        return float("nan")
    if tr.size == 0:
        return 0.0
    most = np.bincount(tr).argmax()
    return float(np.mean(ev == most))


# ----------------------------------------------------------------------------------------------
# Bits per byte: a tokenizer-independent metric (issue 53)
# ----------------------------------------------------------------------------------------------
#
# Models with different tokenizers (a small LM over a restricted vocabulary with UNK, the public
# LLM over its full byte-level BPE) are compared by the code length they give the same text:
#
#     bits per byte = ( Σ_t −log2 p(y_t | y_<t)  +  Σ_{t: y_t = UNK} −log2 q(w_t | UNK) )
#                     / Σ_t bytes(y_t)
#
# over the scored targets t of the evaluation examples (every non-PAD target), where
#
# * bytes(y_t) is the number of UTF-8 bytes of text the target token covers: a text token its
#   own bytes (byte-level BPE: one byte per character of the token string, `byte_level_token_bytes`);
#   **EOS counts one byte** (the message boundary, a newline in a byte stream of messages) and
#   its NLL counts; **BOS is never a target** (it is the first input) and covers nothing; an
#   example truncated at ``seq_len`` tokens has no EOS target and covers the bytes of its kept
#   tokens only (the same tokens for every model evaluated on the same examples);
# * an **UNK target** of a restricted-vocabulary model stands for a token w_t outside its
#   vocabulary; UNK alone does not identify the bytes, so the code length adds −log2 q(w_t | UNK)
#   for a fixed, public distribution q over the folded tokens (e.g. their public-pool unigram
#   frequencies, `unk_code_lengths`): ``p(UNK) · q(w | UNK)`` is then a proper distribution over
#   the full vocabulary and the bits per byte a real code length, comparable across tokenizers.
#   A model without UNK targets has no such term.
#
# A uniform model over a byte-level vocabulary of n symbols (each covering one byte, EOS one
# byte) gives log2(n) bits per byte (`tests/models/test_bits_per_byte.py`).

LN2 = float(np.log(2.0))


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte 0..255
    (Radford et al. 2019; the `tokenizers` ByteLevel pre-tokenizer's table), inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def byte_level_token_bytes(token_strings, special_ids=()) -> np.ndarray:
    """``int32[V]``: UTF-8 bytes each token of a byte-level BPE vocabulary decodes to (every
    character of a token string stands for one byte); 0 for ``special_ids`` (control tokens,
    never text). A non-special token with a character outside the byte alphabet raises
    ValueError (the accounting would be wrong)."""
    table = _bytes_to_unicode()
    special = set(int(i) for i in special_ids)
    out = np.zeros((len(token_strings),), np.int32)
    for i, s in enumerate(token_strings):
        if i in special:
            continue
        if any(ch not in table for ch in s):
            raise ValueError(f"token {i} ({s!r}) is not a byte-level BPE string: its bytes are unknown")
        out[i] = len(s)
    return out


def target_byte_counts(tokens: np.ndarray, token_bytes: np.ndarray, eos_bytes: int = 1) -> np.ndarray:
    """``float64[N, L]``: bytes covered by each target ``tokens[:, 1:]`` (project ids of a
    vocabulary with no UNK, e.g. the teacher's full BPE): ``token_bytes[id]`` for a text token,
    ``eos_bytes`` for EOS, 0 for PAD. UNK or BOS targets raise ValueError (their bytes are
    unknown: count them in the full vocabulary and pass the restricted model's UNK cost apart)."""
    t = np.asarray(tokens)[:, 1:]
    bad = (t == UNK) | (t == BOS)
    if bad.any():
        raise ValueError(f"{int(bad.sum())} UNK/BOS targets: bytes are counted on full-vocabulary ids")
    out = np.asarray(token_bytes, np.float64)[t]
    out[t == EOS] = eos_bytes
    out[t == PAD] = 0.0
    return out


def unk_code_lengths(restricted_tokens: np.ndarray, full_tokens: np.ndarray,
                     log_q: np.ndarray) -> np.ndarray:
    """``float64[N, L]`` nats: ``−log q(w_t | UNK)`` at every UNK target of ``restricted_tokens``,
    ``w_t`` the aligned target of ``full_tokens`` (the same examples in full-vocabulary ids), 0
    elsewhere. ``log_q``: ``float[V_full]``, log-probabilities of the folded tokens (finite for
    every token that may be folded). Raises ValueError if the two token arrays are not aligned
    (PAD in one and not the other)."""
    r, f = np.asarray(restricted_tokens)[:, 1:], np.asarray(full_tokens)[:, 1:]
    if r.shape != f.shape or np.any((r == PAD) != (f == PAD)):
        raise ValueError("the restricted and full-vocabulary tokens are not the same examples aligned")
    out = np.zeros(r.shape, np.float64)
    unk = r == UNK
    lq = np.asarray(log_q, np.float64)[f[unk]]
    if not np.all(np.isfinite(lq)):
        raise ValueError("log_q is not finite on a folded target: q must cover every folded token")
    out[unk] = -lq
    return out


def bits_per_byte(nll: np.ndarray, target_bytes: np.ndarray, extra_nats: np.ndarray | None = None,
                  scored: np.ndarray | None = None) -> dict:
    """Bits per byte of per-target NLLs (module section above).

    Args:
      nll: ``float[N, L]`` nats, −log p(target) of each position.
      target_bytes: ``float[N, L]`` bytes each target covers (`target_byte_counts`).
      extra_nats: optional ``float[N, L]`` nats added per target (`unk_code_lengths`).
      scored: ``bool[N, L]`` positions counted (default: ``target_bytes > 0``).
    Returns:
      ``dict(bits_per_byte, bits, bytes, targets)`` (float64 sums; bits_per_byte nan on 0 bytes).
    """
    nll = np.asarray(nll, np.float64)
    nb = np.asarray(target_bytes, np.float64)
    scored = nb > 0 if scored is None else np.asarray(scored, bool)
    nats = np.where(scored, nll, 0.0).sum()
    if extra_nats is not None:
        nats += np.where(scored, np.asarray(extra_nats, np.float64), 0.0).sum()
    nbytes = float(np.where(scored, nb, 0.0).sum())
    bits = float(nats / LN2)
    return {"bits_per_byte": bits / nbytes if nbytes > 0 else float("nan"), "bits": bits,
            "bytes": nbytes, "targets": int(scored.sum())}


def unigram_log_probs(train_tokens, vocab_size: int, smoothing: float = 0.5,
                      never=(PAD, UNK, BOS)) -> np.ndarray:
    """``float64[V]`` log-probabilities of the add-``smoothing`` unigram of the targets of
    ``train_tokens`` (``int[N, L+1]`` or a sequence of such), over every id except ``never``
    (−inf there): the unigram baseline of `bits_per_byte`."""
    arrays = [train_tokens] if isinstance(train_tokens, np.ndarray) and train_tokens.ndim == 2 else list(train_tokens)
    flat = np.concatenate([np.asarray(a)[:, 1:].ravel() for a in arrays if np.asarray(a).size] or
                          [np.zeros((0,), np.int64)])
    counts = np.bincount(flat[flat != PAD].astype(np.int64), minlength=vocab_size).astype(np.float64)
    counts += smoothing
    counts[list(never)] = 0.0
    with np.errstate(divide="ignore"):
        return np.log(counts / counts.sum())


def per_token_scores(score_fn: Callable, tokens: np.ndarray, batch_size: int,
                     features: Mapping[str, np.ndarray] | None = None,
                     trim: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per-target NLL and top-1 correctness of many examples: ``(nll float32[N, L],
    correct bool[N, L])`` in input order (0 / False at PAD targets and past a batch's width).

    ``score_fn(batch) -> (nll float[B, w-1], correct bool[B, w-1])`` on a batch ``{'tokens':
    int32[B, w], 'mask': float32[B], **features}`` (e.g. a jitted
    `fedpriv.models.lora.LoraTask.scores_with` with its arguments bound, or `task_scores`);
    ``features``: per-example arrays ``[N, L, ...]`` aligned with the inputs (e.g. the cached
    lower-block output), sliced to each batch's rows and width. Batches as `evaluate`
    (length-sorted, a few widths, short batches padded with PAD examples of mask 0).
    """
    tokens = _check_tokens(tokens, batch_size)
    n, full = tokens.shape
    nll = np.zeros((n, full - 1), np.float32)
    correct = np.zeros((n, full - 1), bool)
    for rows, tok, mask, _ in _length_batches(tokens, None, batch_size, trim):
        batch = {"tokens": tok, "mask": mask}
        for name, arr in (features or {}).items():
            x = np.zeros((batch_size, tok.shape[1] - 1) + arr.shape[2:], arr.dtype)
            x[: len(rows)] = arr[rows, : tok.shape[1] - 1]
            batch[name] = x
        a, b = score_fn(batch)
        k, w = len(rows), tok.shape[1] - 1
        nll[rows, :w] = np.asarray(a)[:k]
        correct[rows, :w] = np.asarray(b)[:k]
    real = tokens[:, 1:] != PAD
    return np.where(real, nll, 0.0).astype(np.float32), correct & real


@functools.lru_cache(maxsize=64)
def _scores_fn(apply: Callable) -> Callable:
    def fn(params, tokens):
        inputs, targets = split_tokens(tokens)
        logits = apply(params, inputs, None)
        return token_nll(logits, targets), top1_correct(logits, targets)
    return jax.jit(fn)


def task_scores(task, params) -> Callable:
    """`per_token_scores`' ``score_fn`` of an ``LMTask`` (its ``apply``, params an argument)."""
    fn = _scores_fn(task.apply)
    return lambda batch: fn(params, batch["tokens"])


def byte_level_summary(nll: np.ndarray, correct: np.ndarray, tokens: np.ndarray,
                       target_bytes: np.ndarray, extra_nats: np.ndarray | None = None) -> dict:
    """Bits per byte (`bits_per_byte`) and the model's own in-vocabulary next-token accuracy
    (``accuracy``: targets not PAD/UNK/BOS/EOS, as `lm_sums`) of per-target scores
    (`per_token_scores`) of ``tokens int[N, L+1]`` (the model's own ids)."""
    out = bits_per_byte(nll, target_bytes, extra_nats, scored=np.asarray(tokens)[:, 1:] != PAD)
    acc = in_vocab_mask(np.asarray(tokens)[:, 1:])
    out["accuracy"] = float(np.asarray(correct)[acc].mean()) if acc.any() else float("nan")
    out["accuracy_targets"] = int(acc.sum())
    out["nll_nats_per_target"] = float(np.asarray(nll, np.float64)[np.asarray(tokens)[:, 1:] != PAD].mean())
    return out
