"""Loaders on the real installed corpora (docs/design.md §4)."""

import pytest

from fedpriv.data import (
    FederatedText,
    PublicCorpus,
    corpora as corpora_mod,
    load_chitchat,
    load_public_pool,
    load_shakespeare,
    load_simpsons,
)


def _assert_clean(corpus: FederatedText):
    assert len(corpus) > 0
    assert list(corpus.client_ids) == sorted(corpus.client_ids)
    for cid in corpus.client_ids:
        ex = corpus[cid]
        assert ex, cid
        assert all(isinstance(t, str) and t and t == t.strip() for t in ex)
    assert corpus.total_examples == int(corpus.examples_per_client().sum())


def test_chitchat_real(chitchat):
    corpus, _ = chitchat
    _assert_clean(corpus)
    st = corpus.stats
    # records/malformed are the parse's counts, kept in the cache entry; whether this load parsed
    # or hit the session cache depends on which test of this xdist worker loaded chitchat first
    assert st.records == 258_145 and st.malformed == 0
    assert 1_200 <= len(corpus) <= 1_315
    # The heavy senders (one has ~25K messages) are capped at 1000 by default.
    assert corpus.examples_per_client().max() == 1000
    assert st.capped > 100_000
    assert 100_000 <= corpus.total_examples <= 258_145


def test_chitchat_cache_hit_does_not_reparse(chitchat, monkeypatch):
    corpus, cold = chitchat

    def boom(*a, **k):
        raise AssertionError("re-parsed despite a cache entry")

    monkeypatch.setattr(corpora_mod, "tqdm", boom)  # only the parser iterates with tqdm
    again = load_chitchat(progress=False)
    assert again.stats.cache_hit
    if not corpus.stats.cache_hit:  # timed against a real parse only
        assert again.stats.seconds < cold
    assert again.client_ids == corpus.client_ids
    assert all(again[c] == corpus[c] for c in corpus.client_ids)
    # Other options -> another cache key -> a parse (which here fails loudly).
    with pytest.raises(AssertionError, match="re-parsed"):
        load_chitchat(progress=False, min_chars=2)


def test_cache_dir_argument(tmp_path):
    a = load_simpsons(progress=False, cache_dir=tmp_path)
    assert not a.stats.cache_hit and a.stats.cache_path.startswith(str(tmp_path))
    b = load_simpsons(progress=False, cache_dir=tmp_path)
    assert b.stats.cache_hit and dict(b) == dict(a)


def test_shakespeare_real(shakespeare):
    corpus, cold = shakespeare
    _assert_clean(corpus)
    plays = {cid.split("/")[0] for cid in corpus.client_ids}
    assert len(plays) == corpus.stats.extra["plays"] >= 35
    assert "sonnets" not in plays and "hamlet" in plays
    assert 1_000 <= len(corpus) <= 2_000           # LEAF has ~1.1K-1.4K (play, role) clients
    assert "hamlet/HAM" in corpus and "lear/LEAR" in corpus
    assert any("To be, or not to be" in t for t in corpus["hamlet/HAM"])
    assert not any("[" in t or "]" in t for t in corpus.texts())  # stage directions removed
    again = load_shakespeare(progress=False)
    assert again.stats.cache_hit and dict(again) == dict(corpus)
    if not corpus.stats.cache_hit:  # the session's first load parsed: the cache hit is faster
        assert again.stats.seconds < cold


def test_simpsons_real(simpsons):
    corpus, cold = simpsons
    _assert_clean(corpus)
    st = corpus.stats
    assert st.records == 37_428
    assert 1_400 <= len(corpus) <= 1_800
    assert corpus.num_examples("Homer") > 5_000
    assert st.malformed < 100            # lines without "Speaker:" are counted, not fatal
    assert st.examples + st.filtered + st.malformed == st.records
    assert not any(t.startswith("Homer:") for t in corpus["Homer"])
    again = load_simpsons(progress=False)
    assert again.stats.cache_hit and dict(again) == dict(corpus)
    if not st.cache_hit:  # another test of this worker may have filled the cache first
        assert again.stats.seconds < cold


def test_public_pool_real(public_pool, simpsons):
    pool, cold = public_pool
    assert isinstance(pool, PublicCorpus)
    counts = pool.source_counts()
    assert set(counts) == {"wikipedia", "lee_news", "film_quotes"}
    assert counts["wikipedia"] > 10_000 and counts["lee_news"] > 1_000 and counts["film_quotes"] > 1_000
    assert len(pool.sources) == len(pool.texts) == len(pool.doc_ids) == len(pool)
    words = {s: sum(len(t.split()) for t in pool.by_source(s)) for s in counts}
    assert 300_000 < words["wikipedia"] < 500_000 and 40_000 < words["lee_news"] <= 60_000
    assert all(3 <= len(t.split()) <= 100 for t in pool.texts)
    assert not any(t.lstrip().upper().startswith("#REDIRECT") for t in pool.texts)
    # Public and private data must not overlap (Wang et al. App. B.1): the Simpsons library of
    # popquotes (a private corpus here) is excluded; long Simpsons lines never show up.
    assert not any(d == "film_quotes/simpsons" for d in pool.doc_ids)
    long_lines = {t for t in simpsons[0].texts() if len(t.split()) >= 12}
    assert not long_lines & set(pool.by_source("film_quotes"))
    assert all(d.startswith(s + "/") for d, s in zip(pool.doc_ids, pool.sources))
    by_doc = pool.as_federated("doc")
    assert by_doc.total_examples == len(pool)
    again = load_public_pool(progress=False)
    assert again.stats.cache_hit
    if not pool.stats.cache_hit:  # timed against a real parse only (see test_chitchat_real)
        assert again.stats.seconds < cold
    assert again.texts == pool.texts and again.sources == pool.sources


def test_public_pool_source_subset(public_pool):
    pool, _ = public_pool
    lee = load_public_pool(progress=False, sources=("lee_news",))
    assert set(lee.sources) == {"lee_news"} and list(lee.texts) == pool.by_source("lee_news")
    with pytest.raises(ValueError, match="subset"):
        load_public_pool(progress=False, sources=("reddit",))
