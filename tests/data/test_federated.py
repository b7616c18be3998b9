"""FederatedDataset: layout, caps, BOS/EOS placement, splits, errors; on real chitchat."""

import numpy as np
import pytest

from fedpriv.data import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    EmptyClientError,
    EmptyCorpusError,
    FederatedDataset,
    FederatedText,
    VocabularyMismatchError,
    WordTokenizer,
    encode_examples,
)


def test_encode_examples_bos_eos_pad_truncate():
    out = encode_examples([[5, 6], [7] * 4, [8] * 9, [9] * 3], seq_len=4)
    assert out.dtype == np.int32 and out.shape == (4, 5)
    np.testing.assert_array_equal(out[0], [BOS_ID, 5, 6, EOS_ID, PAD_ID])
    np.testing.assert_array_equal(out[1], [BOS_ID, 7, 7, 7, 7])   # exactly L ids: no EOS
    np.testing.assert_array_equal(out[2], [BOS_ID, 8, 8, 8, 8])   # truncated
    np.testing.assert_array_equal(out[3], [BOS_ID, 9, 9, 9, EOS_ID])
    with pytest.raises(ValueError):
        encode_examples([[1]], seq_len=0)


@pytest.fixture(scope="module")
def toy():
    text = FederatedText({
        "ann": ["the cat sat", "the dog ran far away"] * 3,
        "bob": ["a b c d e f g h i j k l m n o p q r s t u v w x y z"],
        "cy": ["...", "the end"],
        "dee": ["?"],                # tokenizes to one punctuation id
    })
    tok = WordTokenizer.fit(text.texts(), k=12)
    return text, tok


def test_from_text_layout(toy):
    text, tok = toy
    ds = FederatedDataset.from_text(text, tok, seq_len=6, max_examples_per_client=4)
    assert ds.client_ids == ("ann", "bob", "cy", "dee") and len(ds) == 4
    for cid in ds.client_ids:
        t = ds[cid]["tokens"]
        assert t.dtype == np.int32 and t.shape == (ds.num_examples(cid), 7)
        assert (t[:, 0] == BOS_ID).all()
        assert not t.flags.writeable
        for row in t:
            real = row[row != PAD_ID]
            assert (row[len(real):] == PAD_ID).all()            # padding only at the end
            assert (EOS_ID not in real[:-1]) and (BOS_ID not in real[1:])
    assert ds.num_examples("ann") == 4                          # capped (6 -> 4)
    assert ds["bob"]["tokens"][0, -1] != EOS_ID                 # 26 words > L: no EOS
    np.testing.assert_array_equal(ds["ann"]["tokens"][0, :5],
                                  [BOS_ID, *tok.encode(["the cat sat"])[0], EOS_ID])
    assert (ds["bob"]["tokens"] == UNK_ID).sum() > 0            # OOV letters
    assert ds.info["capped_examples"] == 2 and ds.info["truncated_examples"] == 1
    assert ds.vocab_size == tok.vocab_size and ds.seq_len == 6 and ds.batch_size == 16
    assert ds.num_batches("ann") == 1 and ds.num_batches("ann", batch_size=3) == 2
    s = ds.stats()
    assert s["clients"] == 4 and s["examples"] == 8
    assert s["examples_per_client"]["max"] == 4 and s["examples_per_client"]["min"] == 1
    assert s["tokens"] == ds.total_tokens == int(((ds.concat_examples()["tokens"] > EOS_ID)
                                                  | (ds.concat_examples()["tokens"] == UNK_ID)).sum())


def test_random_cap_is_seeded(toy):
    text, tok = toy
    a = FederatedDataset.from_text(text, tok, max_examples_per_client=3, seed=0)
    b = FederatedDataset.from_text(text, tok, max_examples_per_client=3, seed=0)
    np.testing.assert_array_equal(a["ann"]["tokens"], b["ann"]["tokens"])
    assert a.cap(2, seed=1).num_examples("ann") == 2
    np.testing.assert_array_equal(a.cap(2)["ann"]["tokens"], a["ann"]["tokens"][:2])


def test_empty_clients_dropped_and_named():
    tok = WordTokenizer(["hi"])
    text = FederatedText({"a": ["hi"], "b": ["   "]}, name="t")   # "b" has no words at all
    ds = FederatedDataset.from_text(text, tok)
    assert ds.client_ids == ("a",) and "b" not in ds
    with pytest.raises(EmptyClientError, match="'b'.*after tokenization"):
        ds["b"]
    with pytest.raises(EmptyClientError, match="'b'"):
        ds.num_examples("b")
    with pytest.raises(KeyError, match="unknown client"):
        ds["zzz"]
    with pytest.raises(EmptyCorpusError, match="no client"):
        FederatedDataset.from_text(FederatedText({"b": ["   "]}), tok)
    with pytest.raises(EmptyCorpusError):
        FederatedDataset(["x"], {"tokens": np.zeros((0, 3), np.int32)}, [0, 0])


def test_constructor_validation_and_vocab_mismatch():
    t = np.array([[2, 5, 3], [2, 9, 3], [2, 4, 3]], np.int32)
    ds = FederatedDataset(["p", "q", "r"], {"tokens": t}, [0, 2, 2, 3], vocab_size=10)
    assert ds.client_ids == ("p", "r") and "q" in ds.dropped
    np.testing.assert_array_equal(ds["r"]["tokens"], t[2:])
    with pytest.raises(VocabularyMismatchError, match="9 is outside"):
        FederatedDataset(["p"], {"tokens": t}, [0, 3], vocab_size=9)
    with pytest.raises(VocabularyMismatchError):
        ds.check_vocab(6)
    with pytest.raises(ValueError, match="offsets"):
        FederatedDataset(["p"], {"tokens": t}, [0, 2])
    with pytest.raises(ValueError, match="leading"):
        FederatedDataset(["p"], {"tokens": t, "w": np.ones(2)}, [0, 3])


def test_from_clients_extra_keys_concat_and_save(tmp_path):
    clients = {"u1": {"x": np.arange(6).reshape(3, 2), "y": np.array([0, 1, 0])},
               "u2": {"x": np.arange(4).reshape(2, 2) + 10, "y": np.array([1, 1])}}
    ds = FederatedDataset.from_clients(clients)
    np.testing.assert_array_equal(ds["u2"]["x"], clients["u2"]["x"])
    cat = ds.concat_examples(["u2", "u1"])
    assert cat["x"].shape == (5, 2) and cat["y"].tolist() == [1, 1, 0, 1, 0]
    assert ds.concat_examples()["x"].flags.writeable        # a copy, safe to modify
    path = ds.save(tmp_path / "ds.npz")
    back = FederatedDataset.load(path)
    assert back.client_ids == ds.client_ids
    np.testing.assert_array_equal(back["u1"]["x"], ds["u1"]["x"])


def test_real_chitchat_dataset(chitchat, chitchat_word10k):
    corpus, _ = chitchat
    tok = chitchat_word10k
    ds = corpus.to_dataset(tok)                              # paper caps: 256 / L=20 / B=16
    s = ds.stats()
    assert 1_200 <= s["clients"] <= len(corpus) and not ds.dropped
    assert s["examples_per_client"]["max"] == 256 and s["examples_per_client"]["min"] >= 1
    assert ds.seq_len == 20 and ds.batch_size == 16
    t = ds.concat_examples()["tokens"]
    assert t.shape == (s["examples"], 21) and (t[:, 0] == BOS_ID).all()
    assert int(t.max()) < tok.vocab_size
    # every row has EOS unless it is full-length
    has_eos = (t == EOS_ID).any(axis=1)
    full = t[:, -1] != PAD_ID
    assert (has_eos | full).all()
    tr, va, te = ds.split_by_client((0.8, 0.1, 0.1), seed=0)
    tr2, va2, te2 = ds.split_by_client((0.8, 0.1, 0.1), seed=0)
    assert tr.client_ids == tr2.client_ids and va.client_ids == va2.client_ids
    assert set(tr.client_ids).isdisjoint(va.client_ids) and set(va.client_ids).isdisjoint(te.client_ids)
    assert len(tr) + len(va) + len(te) == len(ds)
    assert tr.total_examples + va.total_examples + te.total_examples == ds.total_examples
    assert ds.split_by_client((0.8, 0.1, 0.1), seed=1)[1].client_ids != va.client_ids
