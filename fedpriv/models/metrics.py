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
    from fedpriv.models import bucketing
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
