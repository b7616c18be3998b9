"""lm_datasets: corpus -> client split -> tokenizer -> FederatedDatasets."""

import pytest

from fedpriv.data import BOS_ID
from fedpriv.data.pipeline import lm_datasets, load_corpus


def test_word_pipeline_on_simpsons(simpsons):
    corpus, _ = simpsons
    data = lm_datasets(corpus, tokenizer="word", vocab_size=1000, seq_len=12,
                       max_examples_per_client=64, seed=3)
    assert data.vocab_size == 1004
    ids = [set(d.client_ids) for d in (data.train, data.validation, data.test)]
    assert not ids[0] & ids[1] and not ids[1] & ids[2] and not ids[0] & ids[2]
    assert sum(map(len, ids)) == len(corpus)
    # The word vocabulary is fitted on the training clients only.
    from fedpriv.data import WordTokenizer
    train_text = corpus.subset(sorted(ids[0]))
    assert data.tokenizer.words == WordTokenizer.fit(train_text.texts(), k=1000).words
    for d in (data.train, data.validation, data.test):
        t = d.concat_examples()["tokens"]
        assert t.shape[1] == 13 and (t[:, 0] == BOS_ID).all() and t.max() < 1004
        assert d.stats()["examples_per_client"]["max"] <= 64
    again = lm_datasets(corpus, tokenizer="word", vocab_size=1000, seq_len=12,
                        max_examples_per_client=64, seed=3)
    assert again.validation.client_ids == data.validation.client_ids
    s = data.summary()
    assert s["train"]["clients"] == len(data.train)


def test_sentencepiece_pipeline_by_name(simpsons, small_sp, monkeypatch):
    from fedpriv.data import pipeline
    monkeypatch.setattr(pipeline, "public_sentencepiece", lambda *a, **k: small_sp)
    data = lm_datasets("simpsons", fractions=(0.5, 0.25, 0.25), seed=0)
    assert data.tokenizer is small_sp and data.train.vocab_size == small_sp.vocab_size
    assert data.train.seq_len == 20 and data.train.batch_size == 16


def test_pipeline_errors(simpsons):
    corpus, _ = simpsons
    with pytest.raises(KeyError, match="unknown corpus"):
        load_corpus("reddit")
    with pytest.raises(ValueError, match="tokenizer"):
        lm_datasets(corpus, tokenizer="bpe")
    with pytest.raises(ValueError, match="fractions"):
        lm_datasets(corpus, fractions=(0.5, 0.5))
