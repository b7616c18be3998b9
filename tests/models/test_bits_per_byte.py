"""Bits per byte (fedpriv.models.metrics, issue 53) against closed forms: a uniform model over a
byte-level vocabulary of n symbols gives log2(n); a hand-computed two-example case with EOS,
PAD, truncation and a UNK target charged its public code length; the unigram baseline; the
byte accounting of the teacher's byte-level BPE equals the UTF-8 length of real messages."""
import math

import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.models import metrics as M
from fedpriv.models.lm import LMConfig, make_lm, make_lm_task


def _byte_examples(texts, seq_len):
    """Byte-level ids: PAD/UNK/BOS/EOS then byte b -> 4 + b; BOS, bytes, EOS if it fits."""
    tok = np.zeros((len(texts), seq_len + 1), np.int32)
    for i, t in enumerate(texts):
        b = list(t.encode("utf-8"))[:seq_len]
        tok[i, 0] = M.BOS
        tok[i, 1:len(b) + 1] = np.asarray(b) + 4
        if len(b) < seq_len:
            tok[i, len(b) + 1] = M.EOS
    return tok


def test_a_uniform_model_over_a_byte_vocabulary_gives_log2_n_bits_per_byte():
    tok = _byte_examples(["héllo wörld", "ok", "a much longer message, truncated"], 16)
    token_bytes = np.r_[np.zeros(4, np.int32), np.ones(256, np.int32)]
    nb = M.target_byte_counts(tok, token_bytes)
    n = 257  # the 256 bytes and EOS: every target the model can be asked for, each one byte
    nll = np.where(tok[:, 1:] != M.PAD, math.log(n), 0.0)
    out = M.bits_per_byte(nll, nb)
    assert out["bits_per_byte"] == pytest.approx(math.log2(n), rel=1e-12)
    # bytes: the UTF-8 bytes each example keeps, + 1 per EOS target (the third is truncated)
    assert out["bytes"] == len("héllo wörld".encode()) + 1 + 2 + 1 + 16
    # the same through a model: logits all equal over the 257 real symbols (PAD/UNK/BOS -inf)
    logits = np.zeros(tok[:, :-1].shape + (260,), np.float32)
    logits[..., [M.PAD, M.UNK, M.BOS]] = -1e30
    nll2 = np.asarray(M.token_nll(jnp.asarray(logits), jnp.asarray(tok[:, 1:])))
    assert M.bits_per_byte(nll2, nb, scored=tok[:, 1:] != M.PAD)["bits_per_byte"] == pytest.approx(
        math.log2(n), rel=1e-6)


def test_a_hand_computed_case_with_eos_pad_and_a_unk_target():
    """Restricted vocabulary {PAD, UNK, BOS, EOS, 'a'(4), 'bc'(5)}; the full vocabulary adds
    'xyz'(6) and 'q'(7), folded into UNK with q(xyz | UNK) = 1/4. Example 1: BOS a xyz EOS;
    example 2: BOS bc (truncated, no EOS)."""
    full = np.array([[M.BOS, 4, 6, M.EOS], [M.BOS, 5, M.PAD, M.PAD]], np.int32)
    restricted = np.array([[M.BOS, 4, M.UNK, M.EOS], [M.BOS, 5, M.PAD, M.PAD]], np.int32)
    token_bytes = np.array([0, 0, 0, 0, 1, 2, 3, 1])
    nb = M.target_byte_counts(full, token_bytes)
    np.testing.assert_array_equal(nb, [[1, 3, 1], [2, 0, 0]])
    # model probabilities of the targets: p(a)=1/2, p(UNK)=1/8, p(EOS)=1/4; p(bc)=1/16
    p = np.array([[1 / 2, 1 / 8, 1 / 4], [1 / 16, 1, 1]])
    nll = -np.log(p) * (restricted[:, 1:] != M.PAD)
    log_q = np.full(8, -np.inf)
    log_q[6], log_q[7] = np.log(1 / 4), np.log(3 / 4)
    extra = M.unk_code_lengths(restricted, full, log_q)
    np.testing.assert_allclose(extra, [[0, np.log(4), 0], [0, 0, 0]])
    out = M.bits_per_byte(nll, nb, extra)
    bits = 1 + 3 + 2 + 4 + 2  # a, UNK, EOS, bc, and log2(4) for xyz given UNK
    assert out["bits"] == pytest.approx(bits) and out["bytes"] == 7
    assert out["bits_per_byte"] == pytest.approx(bits / 7)
    assert out["targets"] == 4
    with pytest.raises(ValueError, match="UNK/BOS"):
        M.target_byte_counts(restricted, token_bytes)       # bytes are counted on full ids
    with pytest.raises(ValueError, match="aligned"):
        M.unk_code_lengths(restricted[:, :3], full[:, :3] * 0, log_q)
    with pytest.raises(ValueError, match="cover"):
        M.unk_code_lengths(restricted, full, np.full(8, -np.inf))


def test_the_unigram_baseline_in_bits_per_byte():
    train = np.array([[M.BOS, 4, 4, 5, M.EOS], [M.BOS, 4, M.EOS, M.PAD, M.PAD]], np.int32)
    lp = M.unigram_log_probs(train, 6, smoothing=0.5)
    # counts: EOS 2, id4 3, id5 1 (+0.5 each over the 3 possible targets); PAD/UNK/BOS never
    want = np.array([0, 0, 0, 2.5, 3.5, 1.5]) / 7.5
    np.testing.assert_allclose(np.exp(lp), want)
    test = np.array([[M.BOS, 5, 4, M.EOS]], np.int32)
    nll = -lp[test[:, 1:]]
    out = M.bits_per_byte(nll, M.target_byte_counts(test, np.array([0, 0, 0, 0, 1, 1])))
    assert out["bits_per_byte"] == pytest.approx(-(np.log2(1.5 / 7.5) + np.log2(3.5 / 7.5) + np.log2(2.5 / 7.5)) / 3)


def test_per_token_scores_are_in_input_order_and_zero_at_pad():
    cfg = LMConfig(vocab_size=30, embed_dim=8, hidden_dim=16, max_len=10)
    task = make_lm_task(make_lm(cfg))
    import jax
    params = task.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    tok = np.zeros((7, 9), np.int32)
    for i, n in enumerate(rng.integers(2, 9, 7)):
        tok[i, 0], tok[i, 1:n] = M.BOS, rng.integers(4, 30, n - 1)
    nll, correct = M.per_token_scores(M.task_scores(task, params), tok, batch_size=3)
    logits = task.apply(params, jnp.asarray(tok[:, :-1]))
    want = np.asarray(M.token_nll(logits, jnp.asarray(tok[:, 1:]))) * (tok[:, 1:] != M.PAD)
    np.testing.assert_allclose(nll, want, rtol=1e-5, atol=1e-6)
    summary = M.byte_level_summary(nll, correct, tok, (tok[:, 1:] != M.PAD).astype(float))
    ev = M.evaluate(task, params, tok, batch_size=3)
    assert summary["accuracy"] == pytest.approx(ev["accuracy"])
    assert summary["nll_nats_per_target"] == pytest.approx(ev["loss"], rel=1e-5)


def test_the_teachers_byte_level_bpe_accounts_for_every_byte_of_real_messages():
    from fedpriv.data import load_chitchat
    from fedpriv.models import gguf
    teacher = gguf.cached_teacher()
    tk = teacher.tokenizer
    strings = [tk.id_to_token(i) for i in range(teacher.config.vocab_size)]
    tb = M.byte_level_token_bytes(strings, teacher.special_ids)
    chat = load_chitchat(progress=False)
    msgs = [m for cid in chat.client_ids[:40] for m in chat[cid]][:2000] + ["naïve café 😀 — ok"]
    for m, e in zip(msgs, tk.encode_batch(msgs, add_special_tokens=False)):
        assert int(tb[e.ids].sum()) == len(m.encode("utf-8")), m
    with pytest.raises(ValueError, match="byte-level"):
        M.byte_level_token_bytes(["ab", "a b"])  # a raw space is not a byte-level character
