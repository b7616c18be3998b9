"""Tests for fedpriv.public.distill: top-k corpus on disk + cache, vocabulary restriction, and
the sparse top-k KD loss L_pub = L_LM + β·CE(z_S/t, z_T/t)."""

import json
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.models import bucketing, llama, metrics
from fedpriv.public import distill
from tests import oracles

TINY = llama.LlamaConfig(vocab_size=40, dim=16, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn_dim=24, rope_base=1e4)


@pytest.fixture(scope="module")
def tiny_teacher():
    params = llama.init_params(jax.random.key(3), TINY, 0.5)
    return llama.Teacher(params=params, config=TINY, tokenizer=None,
                         fingerprint=oracles.params_fingerprint(params), bos_id=0, eos_id=0,
                         special_ids=(0, 1))


def _sequences(teacher, n=7, seq_len=6, seed=0):
    rng = np.random.default_rng(seed)
    raw = [rng.integers(2, TINY.vocab_size, size=rng.integers(0, 9)).tolist() for _ in range(n)]
    return distill.prepare_sequences(teacher, raw, seq_len=seq_len)


# ----------------------------------------------------------------------------------------------
# (a) corpus
# ----------------------------------------------------------------------------------------------


def test_prepare_sequences_bos_truncation_eos(tiny_teacher):
    seqs = distill.prepare_sequences(tiny_teacher, [[5, 6], list(range(2, 12)), []], seq_len=4)
    assert seqs == [[0, 5, 6, 0], [0, 2, 3, 4, 5], [0, 0]]
    with pytest.raises(ValueError):
        distill.prepare_sequences(tiny_teacher, [[]], seq_len=4, append_eos=False)


def test_corpus_matches_teacher_round_trips_and_caches(tiny_teacher, tmp_path, monkeypatch):
    seq_len, k = 6, 5
    seqs = _sequences(tiny_teacher, seq_len=seq_len)
    corpus = distill.build_topk_corpus(tiny_teacher, seqs, cache_dir=tmp_path, k=k,
                                       seq_len=seq_len, batch_size=4, shard_size=3,
                                       logits_dtype="float32", progress=False)
    assert not corpus.from_cache
    assert corpus.token_ids.shape == (7, seq_len + 1) and corpus.topk_ids.shape == (7, seq_len, k)
    assert corpus.token_ids.dtype == np.int32 and corpus.topk_ids.dtype == np.int32

    # Against the teacher run on the whole padded array at once.
    ids = corpus.token_ids
    mask = (np.arange(seq_len + 1)[None] < corpus.lengths[:, None]).astype(np.float32)
    logits = np.asarray(oracles.teacher_logits(tiny_teacher, ids, mask))[:, :-1]
    pos = corpus.position_mask()
    ref_ids = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
    ref_vals = np.take_along_axis(logits, ref_ids, -1)
    np.testing.assert_array_equal(corpus.topk_ids[pos], ref_ids[pos])
    np.testing.assert_allclose(corpus.topk_logits[pos], ref_vals[pos], rtol=1e-5, atol=1e-5)
    lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    np.testing.assert_allclose(corpus.logsumexp[pos], lse[pos], rtol=1e-5)
    assert (corpus.topk_ids[~pos] == 0).all() and (corpus.topk_logits[~pos] == 0).all()

    manifest = json.loads((corpus.path / "manifest.json").read_text())
    assert manifest["k"] == k and manifest["seq_len"] == seq_len
    assert manifest["teacher"]["sha256"] == tiny_teacher.fingerprint
    assert manifest["teacher"]["vocab_size"] == TINY.vocab_size
    assert manifest["temperature"] == 1.0 and len(manifest["shards"]) == 3

    loaded = distill.load_topk_corpus(corpus.path)
    for name in ("token_ids", "lengths", "topk_ids", "topk_logits", "logsumexp"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(corpus, name))

    # Cache hit: the teacher is not run again.
    def boom(*a, **kw):
        raise AssertionError("teacher ran on a cache hit")

    monkeypatch.setattr(bucketing, "map_bucketed", boom)
    again = distill.build_topk_corpus(tiny_teacher, seqs, cache_dir=tmp_path, k=k,
                                      seq_len=seq_len, batch_size=4, shard_size=3,
                                      logits_dtype="float32", progress=False)
    assert again.from_cache and again.path == corpus.path
    np.testing.assert_array_equal(again.topk_ids, corpus.topk_ids)
    # A different k is a different corpus (would need the teacher).
    with pytest.raises(AssertionError, match="cache hit"):
        distill.build_topk_corpus(tiny_teacher, seqs, cache_dir=tmp_path, k=k - 1,
                                  seq_len=seq_len, logits_dtype="float32", progress=False)

    # Resume: an interrupted build (last shard and manifest missing) recomputes only that shard.
    partial = corpus.path.with_name(corpus.path.name + ".partial")
    os.replace(corpus.path, partial)
    (partial / "manifest.json").unlink()
    (partial / "shard-00002.npz").unlink()
    monkeypatch.undo()
    calls = []
    real = bucketing.map_bucketed
    monkeypatch.setattr(bucketing, "map_bucketed",
                        lambda fn, s, **kw: calls.append(len(s)) or real(fn, s, **kw))
    resumed = distill.build_topk_corpus(tiny_teacher, seqs, cache_dir=tmp_path, k=k,
                                        seq_len=seq_len, batch_size=4, shard_size=3,
                                        logits_dtype="float32", progress=False)
    assert calls == [1]
    np.testing.assert_array_equal(resumed.topk_ids, corpus.topk_ids)


# ----------------------------------------------------------------------------------------------
# (b) vocabulary restriction
# ----------------------------------------------------------------------------------------------


def _hand_corpus(tmp_path, token_ids, lengths, topk_ids, topk_logits, logsumexp):
    return distill.TopKCorpus(
        token_ids=np.asarray(token_ids, np.int32), lengths=np.asarray(lengths, np.int32),
        topk_ids=np.asarray(topk_ids, np.int32), topk_logits=np.asarray(topk_logits, np.float32),
        logsumexp=np.asarray(logsumexp, np.float32), manifest={}, path=tmp_path)


def test_restriction_keeps_most_frequent_and_maps_both_ways(tiny_teacher):
    seqs = [[0, 7, 7, 7, 5, 5, 9, 1, 0], [0, 9, 5, 12, 0]]  # counts: 7:3, 5:3, 9:2, 12:1
    r = distill.build_vocab_restriction(seqs, 3, tiny_teacher)
    np.testing.assert_array_equal(r.kept_teacher_ids, [5, 7, 9])  # tie 5/7 -> smaller id first
    assert r.student_vocab_size == 7
    np.testing.assert_array_equal(r.to_student([5, 7, 9, 12, 1, 0]), [4, 5, 6, 1, 1, 3])
    np.testing.assert_array_equal(r.to_teacher([0, 1, 2, 3, 4, 5, 6]), [-1, -1, 0, 0, 5, 7, 9])
    kept = r.kept_teacher_ids
    np.testing.assert_array_equal(r.to_teacher(r.to_student(kept)), kept)
    # Small data: never-seen tokens are not kept.
    assert distill.build_vocab_restriction(seqs, 100, tiny_teacher).student_vocab_size == 4 + 4
    full = distill.VocabRestriction.full(tiny_teacher)
    assert full.student_vocab_size == 4 + TINY.vocab_size - 2


def test_restricted_topk_renormalises_over_kept_ids(tiny_teacher, tmp_path):
    r = distill.VocabRestriction.from_kept([10, 12], TINY.vocab_size, 0, 0)
    ids, logits = distill.restrict_topk(np.array([[10, 11, 12], [11, 13, 1]]),
                                        np.array([[2.0, 1.0, 0.0], [3.0, 2.0, 1.0]]), r)
    np.testing.assert_array_equal(ids, [[4, 0, 5], [0, 0, 0]])
    p = np.asarray(distill.sparse_teacher_probs(jnp.asarray(logits), 1.0))
    e = math.exp(2.0) + 1.0
    np.testing.assert_allclose(p[0], [math.exp(2.0) / e, 0.0, 1.0 / e], rtol=1e-6)
    np.testing.assert_array_equal(p[1], 0.0)  # whole top-k dropped: no teacher

    # Corpus: BOS at 0, then tokens 10, 11(dropped -> UNK), EOS, PAD.
    corpus = _hand_corpus(
        tmp_path, token_ids=[[0, 10, 11, 0, 0]], lengths=[4],
        topk_ids=[[[10, 11], [11, 13], [0, 12], [0, 0]]],
        topk_logits=[[[0.0, 0.0], [1.0, 0.0], [math.log(3.0), 0.0], [0.0, 0.0]]],
        logsumexp=[[math.log(4.0), math.log(4.0), math.log(5.0), 0.0]])
    arrays = distill.corpus_to_student(corpus, r)
    np.testing.assert_array_equal(arrays["tokens"], [[2, 4, 1, 3, 0]])
    np.testing.assert_array_equal(arrays["topk_ids"][0, :3], [[4, 0], [0, 0], [3, 5]])
    assert np.isneginf(arrays["topk_logits"][0, 3]).all()  # padding position

    cost = distill.restriction_cost(corpus, r)
    assert cost["unk_rate"] == pytest.approx(1 / 3)  # targets 10, 11, EOS
    # true mass: pos0 top-k = (1+1)/4, pos1 = (e+1)/4, pos2 = (3+1)/5
    assert cost["topk_mass"] == pytest.approx((0.5 + (math.e + 1) / 4 + 0.8) / 3, rel=1e-5)
    assert cost["lost_mass"] == pytest.approx((0.25 + (math.e + 1) / 4 + 0.0) / 3, rel=1e-5)
    assert cost["lost_topk_share"] == pytest.approx((0.5 + 1.0 + 0.0) / 3, rel=1e-5)
    assert cost["no_teacher_rate"] == pytest.approx(1 / 3)


# ----------------------------------------------------------------------------------------------
# (c) loss
# ----------------------------------------------------------------------------------------------


def _fixed_logits_apply(params, tokens_in):
    """A 'student' whose logits are its parameters: float[B, L, V] regardless of input."""
    return params


def _log_softmax(z):
    z = np.asarray(z, np.float64)
    return z - np.log(np.exp(z - z.max()).sum()) - z.max()


def test_kd_loss_hand_computed():
    z_s = np.array([[[0.0, 1.0, 2.0, 0.5, -1.0]]], np.float32)  # B=1, L=1, V=5
    batch = {"tokens": jnp.array([[2, 4]], jnp.int32), "mask": jnp.ones((1,), jnp.float32),
             "topk_ids": jnp.array([[[4, 2]]], jnp.int32),
             "topk_logits": jnp.array([[[1.0, 0.0]]], jnp.float32)}
    beta, t = 0.3, 2.0
    loss, aux = jax.jit(distill.make_distill_loss(_fixed_logits_apply, beta=beta,
                                                  temperature=t))(jnp.asarray(z_s), batch, None)
    nll = -_log_softmax(z_s[0, 0])[4]
    p = np.exp([0.5, 0.0]) / np.exp([0.5, 0.0]).sum()
    logq = _log_softmax(z_s[0, 0] / t)
    kd = -(p[0] * logq[4] + p[1] * logq[2])
    assert float(aux["loss_sum"]) == pytest.approx(nll, rel=1e-5)
    assert float(aux["kd_sum"]) == pytest.approx(kd, rel=1e-5)
    assert float(loss) == pytest.approx(nll + beta * kd, rel=1e-5)
    assert float(aux["num_tokens"]) == 1.0
    assert float(aux["num_correct"]) == 0.0  # argmax is 2, target 4


def test_kd_with_k_equal_v_and_t1_is_full_cross_entropy():
    rng = np.random.default_rng(0)
    b, l, v = 2, 3, 6
    z_s = rng.normal(size=(b, l, v)).astype(np.float32)
    z_t = rng.normal(size=(b, l, v)).astype(np.float32)
    order = np.argsort(-z_t, -1)
    kd = jax.jit(distill.kd_cross_entropy, static_argnums=3)(jnp.asarray(z_s), jnp.asarray(order),
                                  jnp.asarray(np.take_along_axis(z_t, order, -1)), 1.0)
    full = optax.softmax_cross_entropy(jnp.asarray(z_s), jax.nn.softmax(jnp.asarray(z_t)))
    np.testing.assert_allclose(kd, full, rtol=1e-5, atol=1e-6)


def test_beta_zero_is_lm_loss_and_masking():
    rng = np.random.default_rng(1)
    b, l, v, k = 3, 4, 7, 2
    z_s = jnp.asarray(rng.normal(size=(b, l, v)), jnp.float32)
    tokens = jnp.array([[2, 5, 6, 3, 0], [2, 4, 3, 0, 0], [2, 6, 6, 6, 3]], jnp.int32)
    mask = jnp.array([1.0, 1.0, 0.0])
    batch = {"tokens": tokens, "mask": mask,
             "topk_ids": jnp.asarray(rng.integers(0, v, size=(b, l, k)), jnp.int32),
             "topk_logits": jnp.asarray(rng.normal(size=(b, l, k)), jnp.float32)}
    loss0, aux0 = jax.jit(distill.make_distill_loss(_fixed_logits_apply, beta=0.0,
                                                    temperature=1.0))(z_s, batch, None)
    sums = jax.jit(metrics.lm_sums)(z_s, tokens[:, 1:], mask)
    assert float(aux0["num_tokens"]) == 3 + 2  # non-PAD targets of real rows
    np.testing.assert_allclose(loss0, sums["loss_sum"] / sums["num_tokens"], rtol=1e-6)

    # Changing anything at PAD targets or masked rows leaves the loss unchanged.
    loss_fn = jax.jit(distill.make_distill_loss(_fixed_logits_apply, beta=0.5, temperature=2.0))
    loss1, aux1 = loss_fn(z_s, batch, None)
    ignored = np.zeros((b, l), bool)
    ignored[0, 3] = ignored[1, 2:] = True
    ignored[2] = True
    noise = jnp.asarray(rng.normal(size=(b, l, v)) * 5 * ignored[..., None], jnp.float32)
    batch2 = dict(batch, topk_logits=jnp.where(ignored[..., None], -jnp.inf,
                                               batch["topk_logits"]))
    loss2, aux2 = loss_fn(z_s + noise, batch2, None)
    np.testing.assert_allclose(loss2, loss1, rtol=1e-6)
    np.testing.assert_allclose(aux2["kd_sum"], aux1["kd_sum"], rtol=1e-6)
    with pytest.raises(ValueError):
        distill.make_distill_loss(_fixed_logits_apply, beta=0.1, temperature=0.0)


class _TinyStudent(nn.Module):
    vocab: int

    @nn.compact
    def __call__(self, tokens):
        h = nn.Embed(self.vocab, 8)(tokens)
        return nn.Dense(self.vocab)(jnp.tanh(nn.Dense(8)(h)))


def test_loss_trains_a_flax_student_toward_the_teacher(tiny_teacher, tmp_path):
    seqs = _sequences(tiny_teacher, n=8, seq_len=6, seed=2)
    corpus = distill.build_topk_corpus(tiny_teacher, seqs, cache_dir=tmp_path, k=5, seq_len=6,
                                       batch_size=4, compress=True, progress=False)
    assert corpus.topk_logits.dtype == np.float16 and corpus.k == 5
    r = distill.build_vocab_restriction(corpus, 12, tiny_teacher)
    arrays = distill.corpus_to_student(corpus, r)
    model = _TinyStudent(r.student_vocab_size)
    params = jax.jit(model.init)(jax.random.key(0), arrays["tokens"][:1, :-1])["params"]
    apply = lambda p, x: model.apply({"params": p}, x)
    loss_fn = distill.make_distill_loss(apply, beta=1.0, temperature=1.0)
    opt = optax.adam(3e-2)

    @jax.jit
    def step(params, opt_state, batch, rng):
        (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng)
        upd, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, loss, aux

    opt_state = opt.init(params)
    batch = next(oracles.student_batches(arrays, 8, np.random.default_rng(0)))
    kd = []
    for i in range(30):
        params, opt_state, loss, aux = step(params, opt_state, batch, jax.random.key(i))
        kd.append(float(aux["kd_sum"] / aux["num_tokens"]))
    assert np.isfinite(kd).all() and kd[-1] < 0.7 * kd[0]
