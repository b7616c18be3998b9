"""TFDS builders (array_record, read with as_data_source) on tiny slices, without TensorFlow."""

import sys

import pytest


@pytest.fixture(scope="module")
def tb():
    from fedpriv.data import tfds_builders
    return tfds_builders


def test_simpsons_tiny_builder(tb, simpsons, tmp_path):
    corpus, _ = simpsons
    builder = tb.prepare("fedpriv_simpsons", tmp_path, config="tiny")
    assert "tensorflow" not in sys.modules                    # works without TensorFlow
    assert builder.info.name == "fedpriv_simpsons"
    source = builder.as_data_source()["train"]
    first8 = corpus.client_ids[:8]
    assert len(source) == sum(corpus.num_examples(c) for c in first8)
    rec = source[0]
    assert set(rec) == {"client_id", "text"} and rec["client_id"].decode() == first8[0]
    back = tb.federated_text_from_source(source)
    assert back.client_ids == first8 and all(back[c] == corpus[c] for c in first8)
    # Prepared data is reused: a second builder reads the same files.
    again = tb.prepare("fedpriv_simpsons", tmp_path, config="tiny")
    assert len(again.as_data_source()["train"]) == len(source)


def test_public_pool_tiny_builder_has_sources(tb, public_pool, tmp_path):
    pool, _ = public_pool
    cfg = tb.CorpusConfig(name="two_docs", max_clients=2)
    builder = tb.prepare("fedpriv_public_pool", tmp_path, config=cfg)
    source = builder.as_data_source()["train"]
    docs = sorted(set(pool.doc_ids))[:2]
    expected = [(t, s, d) for t, s, d in zip(pool.texts, pool.sources, pool.doc_ids) if d in docs]
    assert len(source) == len(expected)
    got = [(r["text"].decode(), r["source"].decode(), r["client_id"].decode())
           for r in source.__getitems__(list(range(len(source))))]
    assert got == expected


def test_unknown_builder(tb, tmp_path):
    with pytest.raises(KeyError, match="unknown corpus"):
        tb.prepare("fedpriv_reddit", tmp_path)
