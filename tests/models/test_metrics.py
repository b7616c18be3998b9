"""Tests of fedpriv.models.metrics: accuracy rules, perplexity, batched evaluation."""

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.models import lm, metrics
from fedpriv.models.metrics import BOS, EOS, PAD, UNK


def logits_for(pred, vocab):
    """float32[..., V] logits whose argmax is ``pred``."""
    return jax.nn.one_hot(np.asarray(pred), vocab) * 5.0


def test_accuracy_exclusion_rules():
    """PAD/UNK/BOS/EOS targets are not counted; predicting a special token is wrong; mask-0
    examples count nowhere."""
    targets = np.array([[5, UNK, 6, BOS, 7, EOS, PAD],
                        [5, 6, 7, 5, 6, 7, 5]], np.int32)
    pred = np.array([[5, UNK, 4, BOS, UNK, EOS, PAD],   # 5 right; 6 wrong; 7 wrong (UNK predicted)
                     [5, 6, 7, 5, 6, 7, 5]], np.int32)  # all right, but a padding example
    sums = jax.jit(metrics.lm_sums)(logits_for(pred, 8), targets, np.array([1.0, 0.0], np.float32))
    assert sums["num_acc_tokens"] == 3
    assert sums["num_correct"] == 1
    assert sums["num_tokens"] == 6  # the loss still counts UNK, BOS and EOS targets, not PAD
    assert sums["num_examples"] == 1
    assert metrics.summarize(sums)["accuracy"] == pytest.approx(1 / 3)
    np.testing.assert_array_equal(metrics.in_vocab_mask(targets[0]),
                                  [True, False, True, False, True, False, False])


def test_perplexity_hand_case():
    """Target probabilities 1/2 and 1/4: mean NLL = 1.5 ln 2, perplexity = 2^1.5."""
    p1 = np.array([0.1, 0.1, 0.1, 0.1, 0.5, 0.1])
    p2 = np.array([0.15, 0.15, 0.15, 0.15, 0.15, 0.25])
    logits = np.log(np.stack([p1, p2, p1]))[None].astype(np.float32)  # [1, 3, 6]
    targets = np.array([[4, 5, PAD]], np.int32)
    sums = metrics.lm_sums(logits, targets)
    np.testing.assert_allclose(sums["loss_sum"], np.log(2) + np.log(4), rtol=1e-6)
    out = metrics.summarize(sums)
    assert out["num_tokens"] == 2
    np.testing.assert_allclose(out["loss"], 1.5 * np.log(2), rtol=1e-6)
    np.testing.assert_allclose(out["perplexity"], 2 ** 1.5, rtol=1e-6)
    assert metrics.perplexity(3 * np.log(5.0), 3) == pytest.approx(5.0)
    assert np.isnan(metrics.perplexity(1.0, 0))
    # Instance weights scale the loss sum only; weight 1 equals no weight.
    w = metrics.lm_sums(logits, targets, weight=np.array([2.0], np.float32))
    np.testing.assert_allclose(w["loss_sum"], 2 * sums["loss_sum"], rtol=1e-6)
    ones = metrics.lm_sums(logits, targets, weight=np.ones(1, np.float32))
    assert all(ones[k] == sums[k] for k in metrics.SUM_KEYS)


def test_summarize_empty_is_nan():
    out = metrics.summarize({k: 0.0 for k in metrics.SUM_KEYS})
    assert np.isnan(out["loss"]) and np.isnan(out["accuracy"]) and np.isnan(out["perplexity"])


class Bigram(nn.Module):
    """Toy LM (logits = a learned table row of the current token): cheap to compile, enough to
    test the batching of `evaluate`/`sequence_logprob` (the real LMs are tested in test_lm.py)."""

    vocab: int

    @nn.compact
    def __call__(self, tokens, *, deterministic=True):
        return nn.Embed(self.vocab, self.vocab, embedding_init=nn.initializers.normal(1.0))(tokens)


class DomainBigram(nn.Module):
    """Toy domain-conditioned LM: one bigram table per domain."""

    vocab: int
    uses_domain: ClassVar[bool] = True

    @nn.compact
    def __call__(self, tokens, domain, *, deterministic=True):
        tables = self.param("tables", nn.initializers.normal(1.0), (2, self.vocab, self.vocab))
        return tables[domain[:, None], tokens]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    n, width = 7, 9
    tokens = np.zeros((n, width), np.int32)
    for i in range(n):
        k = rng.integers(1, width - 1)
        tokens[i, 0], tokens[i, 1:k + 1], tokens[i, k + 1] = BOS, rng.integers(1, 20, k), EOS
    return tokens, rng.integers(0, 2, n).astype(np.int32)


def _bigram_task(with_domain: bool, seed: int, domain):
    """(task, params, domain or None) of a bigram LM, with a domain input if ``with_domain``."""
    task = lm.make_lm_task(DomainBigram(20) if with_domain else Bigram(20))
    return task, task.init(jax.random.key(seed)), domain if with_domain else None


@pytest.mark.parametrize("with_domain", [False, True])
def test_evaluate_matches_unbatched_reference(data, with_domain):
    """N=7 with batch_size=3: length-trimmed batches compile at most one shape per width bucket
    (one without trimming), padded last batch, same sums as one big batch."""
    from fedpriv.models.bucketing import width_buckets
    tokens, domain = data
    task, params, dom = _bigram_task(with_domain, 0, domain)
    untrimmed = metrics.evaluate(task, params, tokens, batch_size=3, domain=dom, trim=False)
    assert metrics._jit(task.eval_fn)._cache_size() == 1
    out = metrics.evaluate(task, params, tokens, batch_size=3, domain=dom)
    assert metrics._jit(task.eval_fn)._cache_size() <= 1 + len(width_buckets(tokens.shape[1]))
    for key in ("loss", "perplexity", "accuracy", "num_tokens"):
        np.testing.assert_allclose(out[key], untrimmed[key], rtol=1e-6)
    batch = {"tokens": tokens, "mask": np.ones(7, np.float32)}
    if with_domain:
        batch["domain"] = domain
    ref = metrics.summarize(jax.jit(task.eval_fn)(params, batch))
    for key in ("loss", "perplexity", "accuracy", "num_tokens"):
        np.testing.assert_allclose(out[key], ref[key], rtol=1e-5)
    assert out["num_tokens"] == np.sum(tokens[:, 1:] != PAD)
    assert out["num_examples"] == 7
    with pytest.raises(ValueError):
        metrics.evaluate(task, params, tokens[:, :1], batch_size=3)
    with pytest.raises(ValueError):
        metrics.evaluate(task, params, tokens, batch_size=0)


@pytest.mark.parametrize("with_domain", [False, True])
def test_sequence_logprob(data, with_domain):
    tokens, domain = data
    task, params, dom = _bigram_task(with_domain, 1, domain)
    out = metrics.sequence_logprob(task, params, tokens, batch_size=3, domain=dom)
    assert out.shape == (7,) and out.dtype == np.float32
    logp = np.asarray(jax.nn.log_softmax(task.apply(params, tokens[:, :-1], dom)))
    tgt = tokens[:, 1:]
    tok_lp = np.take_along_axis(logp, tgt[..., None], -1)[..., 0]
    ref = [tok_lp[i][tgt[i] != PAD].mean() for i in range(7)]
    np.testing.assert_allclose(out, ref, rtol=1e-5)


def test_most_frequent_token_accuracy():
    train = np.array([[BOS, UNK, UNK, UNK, UNK, EOS],   # UNK is most frequent but never predicted
                      [BOS, 5, 5, 6, EOS, PAD]])
    evals = np.array([[BOS, 5, 7, 5, UNK, EOS, PAD]])   # in-vocabulary targets: 5, 7, 5
    assert metrics.most_frequent_token_accuracy(train, evals) == pytest.approx(2 / 3)
    per_client = [train[:1], train[1:, :4]]  # a list of per-client arrays of different widths
    assert metrics.most_frequent_token_accuracy(per_client, [evals]) == pytest.approx(2 / 3)
    assert np.isnan(metrics.most_frequent_token_accuracy(train, np.array([[BOS, EOS, PAD]])))


def test_split_and_nll_shapes():
    tokens = jnp.array([[BOS, 5, EOS, PAD]])
    x, y = metrics.split_tokens(tokens)
    np.testing.assert_array_equal(x, [[BOS, 5, EOS]])
    np.testing.assert_array_equal(y, [[5, EOS, PAD]])
    nll = metrics.token_nll(jnp.zeros((1, 3, 10)), y)
    np.testing.assert_allclose(nll, np.full((1, 3), np.log(10)), rtol=1e-6)


def test_predictions_oov_accuracy_and_word_to_token_conversion():
    """Wang et al. Figure 1's accuracies: with OOV, an UNK target is right iff UNK is predicted;
    a word model's in-vocabulary accuracy converted to tokens weighs each word by its pieces."""
    import types

    from fedpriv.data.tokenizers import WordTokenizer
    from fedpriv.models.metrics import accuracy_with_oov, predict_next
    from fedpriv.recipes.lm import tokenizer_accuracies
    wt = WordTokenizer.fit(["aa b", "aa b"], k=2)          # ids 4, 5 = the two words
    a, b = wt.encode(["aa"])[0][0], wt.encode(["b"])[0][0]
    nxt = np.zeros(wt.vocab_size, np.int32)                # "model": predicts a fixed next id
    nxt[2], nxt[a], nxt[1] = a, 1, b                       # BOS->a, a->UNK, UNK->b
    apply = lambda p, x, d=None: jax.nn.one_hot(p[x], wt.vocab_size) * 10.0
    task = types.SimpleNamespace(apply=apply)
    tokens = np.array([[2, a, b, 3, 0], [2, a, 1, 3, 0]], np.int32)  # BOS a b EOS / BOS a UNK EOS
    preds = predict_next(task, jnp.asarray(nxt), tokens, batch_size=4)
    assert preds.shape == (2, 4) and preds[0, 0] == a and preds[1, 1] == 1
    # scored targets: a, b (row 0), a, UNK (row 1): right = a, a, UNK -> 3/4
    assert accuracy_with_oov(tokens, preds) == pytest.approx(3 / 4)
    sp = types.SimpleNamespace(encode=lambda words: [[7] * len(w) for w in words])  # "aa" -> 2 pieces
    acc = tokenizer_accuracies(task, jnp.asarray(nxt), tokens, wt, 4, sp)
    # in-vocabulary: a (2 pieces, right) x2, b (1 piece, wrong) -> 4/5 tokens; words 2/3
    assert acc["token_accuracy"] == pytest.approx(4 / 5) and acc["word_accuracy"] == pytest.approx(2 / 3)
    assert acc["token_accuracy_with_oov"] == pytest.approx((4 + 1) / (5 + 1))
    assert acc["accuracy_with_oov"] == pytest.approx(3 / 4)


# ------------------------------------------------ top-1 accuracy without the argmax (issue 27)
def _tied_logits(seed, shape=(64, 7, 12)):
    """Integer-valued logits from {-inf, -2, ..., 2}: most rows hold several equal maxima."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 3, size=shape).astype(np.float32)
    x[x == -3] = -np.inf
    return x, rng.integers(0, shape[-1], size=shape[:-1])


def test_top1_correct_is_the_argmax_test_with_ties():
    for seed in range(5):
        logits, targets = _tied_logits(seed)
        want = np.argmax(logits, axis=-1) == targets  # numpy: the first maximum
        got = np.asarray(jax.jit(metrics.top1_correct)(logits, targets))
        np.testing.assert_array_equal(got, want)
        assert want.any() and (~want).any()
    # the data catches the naive form (target logit == row max), which counts every tie as right
    logits, targets = _tied_logits(0)
    naive = np.take_along_axis(logits, targets[..., None], -1)[..., 0] == logits.max(-1)
    assert (naive != (np.argmax(logits, -1) == targets)).sum() > 10


def test_top1_correct_on_float_logits_and_all_minus_inf_rows():
    x = np.array(jax.random.normal(jax.random.key(0), (4, 5, 300)))
    t = np.array(jax.random.randint(jax.random.key(1), (4, 5), 0, 300))
    t[0, :] = np.argmax(x[0], -1)  # some hits
    np.testing.assert_array_equal(np.asarray(metrics.top1_correct(x, t)), np.argmax(x, -1) == t)
    x[1, 2, :] = -np.inf  # argmax is 0: only a target 0 would be right
    t[1, 2] = 5
    assert not bool(metrics.top1_correct(x, t)[1, 2])


def test_lm_sums_counts_the_argmax_accuracy_on_tied_logits():
    """lm_sums' num_correct = #(argmax == target) over in-vocabulary targets of real examples, on
    logits full of ties (f32 and bf16: the first maximum wins, as numpy's argmax)."""
    logits, targets = _tied_logits(7, shape=(16, 9, 12))
    targets = targets.astype(np.int32)
    mask = (np.arange(16) % 5 != 0).astype(np.float32)
    counted = np.asarray(metrics.in_vocab_mask(targets)) & (mask[:, None] > 0)
    for dtype in (jnp.float32, jnp.bfloat16):
        z = jnp.asarray(logits, dtype)
        want = ((np.argmax(np.asarray(z, np.float32), -1) == targets) & counted).sum()
        sums = jax.jit(metrics.lm_sums)(z, targets, mask)
        assert float(sums["num_correct"]) == want > 0
        assert float(sums["num_acc_tokens"]) == counted.sum()
