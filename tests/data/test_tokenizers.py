"""Tokenizers (Wang et al. §3.1): SentencePiece on the public pool, word-level top-k, the
word -> token accuracy conversion."""

import numpy as np
import pytest

from fedpriv.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    EmptyCorpusError,
    MissingResourceError,
    SentencePieceTokenizer,
    Tokenizer,
    VocabularyMismatchError,
    WordTokenizer,
    load_tokenizer,
    split_words,
    train_sentencepiece,
    word_to_token_accuracy,
)


def test_sentencepiece_specials_roundtrip_and_save(small_sp, tmp_path):
    sp = small_sp
    assert isinstance(sp, Tokenizer)
    assert (sp.pad_id, sp.unk_id, sp.bos_id, sp.eos_id) == (0, 1, 2, 3)
    assert sp.id_to_piece(PAD_ID) == "<pad>" and sp.id_to_piece(EOS_ID) == "</s>"
    assert sp.vocab_size == 2000
    texts = ["The history of the city began in 1850.", "It was a quiet day."]
    ids = sp.encode(texts)
    assert all(ids) and all(0 < i < sp.vocab_size for seq in ids for i in seq)
    assert not any(i in (PAD_ID, BOS_ID, EOS_ID) for seq in ids for i in seq)
    assert sp.decode(ids) == texts
    assert sp.decode([[BOS_ID, *ids[1], EOS_ID, PAD_ID]]) == [texts[1]]
    path = sp.save(tmp_path / "sp.model")
    back = SentencePieceTokenizer.load(path)
    assert back.encode(texts) == ids and back.vocab_size == sp.vocab_size
    assert load_tokenizer(path).encode(texts) == ids
    with pytest.raises(TypeError):
        sp.encode("a single string")
    with pytest.raises(VocabularyMismatchError, match="outside"):
        sp.decode([[sp.vocab_size]])


def test_sentencepiece_training_is_cached(public_pool, small_sp, fedpriv_cache):
    pool, _ = public_pool
    again = train_sentencepiece(pool.texts[::8][:3000], vocab_size=2000)  # same inputs: cache
    assert again.model_proto == small_sp.model_proto
    assert list((fedpriv_cache / "tokenizers").glob("spm-*.model"))
    with pytest.raises(EmptyCorpusError):
        train_sentencepiece(["", "  "], vocab_size=100)
    with pytest.raises(MissingResourceError):
        SentencePieceTokenizer.load(fedpriv_cache / "missing.model")


def test_split_words():
    assert split_words("Don't panic, Mr. Smith!") == ["don't", "panic", ",", "mr", ".", "smith", "!"]
    assert split_words("C3PO's 2 cents…", lowercase=False) == ["C3PO's", "2", "cents", "…"]
    assert split_words("   ") == []


def test_word_tokenizer_topk_oov_and_save(tmp_path):
    texts = ["the cat sat on the mat", "the dog sat", "a cat!"]
    tok = WordTokenizer.fit(texts, k=3)
    assert tok.words == ["the", "cat", "sat"]        # counts 3, 2, 2; ties alphabetical
    assert tok.vocab_size == 7
    assert tok.encode(["The cat ate the fish"]) == [[4, 5, UNK_ID, 4, UNK_ID]]
    assert tok.decode([[BOS_ID, 4, 5, UNK_ID, EOS_ID, PAD_ID]]) == ["the cat <unk>"]
    assert tok.oov_rate(["the zebra"]) == 0.5
    back = WordTokenizer.load(tok.save(tmp_path / "w.json"))
    assert back.words == tok.words and load_tokenizer(tmp_path / "w.json").vocab_size == 7
    with pytest.raises(VocabularyMismatchError):
        tok.decode([[7]])
    with pytest.raises(EmptyCorpusError):
        WordTokenizer.fit(["", "  "])
    big = WordTokenizer.fit(texts, k=10_000)
    assert big.vocab_size == 4 + 8                  # fewer distinct words than k


def test_word_tokenizer_real_chitchat_10k(chitchat, chitchat_word10k):
    corpus, _ = chitchat
    tok = chitchat_word10k
    assert tok.vocab_size == 10_004                 # as the StackOverflow NWP vocabulary
    assert set(tok.words[:5]) >= {"i", "."}
    assert 0.0 < tok.oov_rate(corpus.texts()[:5000]) < 0.05


def test_word_to_token_accuracy_hand_computed():
    class ThreeCharPieces:
        """Splits every word into pieces of 3 characters: 'a'->1, 'cats'->2, 'elephant'->3."""

        def encode(self, words):
            return [list(range((len(w) + 2) // 3)) for w in words]

    words = ["a", "cats", "elephant", "dog"]
    correct = [True, False, True, False]
    # tokens per word: 1, 2, 3, 1 -> correct tokens 1 + 3 = 4 of 7.
    r = word_to_token_accuracy(correct, words, ThreeCharPieces())
    assert (r.correct_tokens, r.total_tokens) == (4, 7)
    assert r.accuracy == pytest.approx(4 / 7) and r.word_accuracy == 0.5 and r.words == 4
    # Excluding the OOV word "elephant": 1 of 4 tokens.
    r = word_to_token_accuracy(correct, words, ThreeCharPieces(), mask=[1, 1, 0, 1])
    assert (r.correct_tokens, r.total_tokens) == (1, 4) and r.word_accuracy == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        word_to_token_accuracy([True], words, ThreeCharPieces())


def test_word_to_token_accuracy_with_sentencepiece(small_sp):
    words = split_words("the government announced a comprehensive reform")
    n = small_sp.tokens_per_word(words)
    assert (n >= 1).all() and n.sum() > len(words)   # some words need several pieces
    correct = np.array([True, False, True, True, False, True])
    r = word_to_token_accuracy(correct, words, small_sp)
    assert r.total_tokens == n.sum() and r.correct_tokens == n[correct].sum()
    assert word_to_token_accuracy(np.ones(6, bool), words, small_sp).accuracy == 1.0


def test_word_ids_to_token_accuracy_hand_computed():
    class ThreeCharPieces:
        def encode(self, words):
            return [list(range((len(w) + 2) // 3)) for w in words]

    word = WordTokenizer(["a", "cats", "elephant"])          # ids 4, 5, 6; pieces 1, 2, 3
    from fedpriv.data import tokens_per_vocab_word, word_ids_to_token_accuracy
    np.testing.assert_array_equal(tokens_per_vocab_word(word, ThreeCharPieces()),
                                  [0, 0, 0, 0, 1, 2, 3])
    targets = np.array([[4, 5, 6, UNK_ID, EOS_ID, PAD_ID],
                        [6, 6, 5, EOS_ID, PAD_ID, PAD_ID]])
    preds = np.array([[4, 4, 6, UNK_ID, EOS_ID, 9],           # UNK/EOS/PAD never count
                      [6, 5, 5, EOS_ID, 0, 0]])
    # scored targets: 4(1,ok) 5(2,x) 6(3,ok) | 6(3,ok) 6(3,x) 5(2,ok) -> 1+3+3+2 = 9 of 14
    r = word_ids_to_token_accuracy(targets, preds, word, ThreeCharPieces())
    assert (r.correct_tokens, r.total_tokens, r.words) == (9, 14, 6)
    assert r.accuracy == pytest.approx(9 / 14) and r.word_accuracy == pytest.approx(4 / 6)
    with pytest.raises(VocabularyMismatchError):
        word_ids_to_token_accuracy(np.array([[7]]), np.array([[7]]), word, ThreeCharPieces())


def test_public_sentencepiece_on_a_source_subset(public_pool):
    from fedpriv.data import public_sentencepiece
    sp = public_sentencepiece(1000, sources=["film_quotes"])
    assert sp.vocab_size == 1000 and sp.decode(sp.encode(["What do you love?"])) == [
        "What do you love?"]
