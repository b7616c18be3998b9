"""Session fixtures for tests/data: a private cache dir (via $FEDPRIV_CACHE) and the real corpora,
each loaded once (cold) per session."""

import time

import pytest


@pytest.fixture(scope="session", autouse=True)
def fedpriv_cache(tmp_path_factory):
    """Every test in tests/data uses a fresh cache directory through the env var."""
    d = tmp_path_factory.mktemp("fedpriv_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDPRIV_CACHE", str(d))
        yield d


def _timed(fn, **kw):
    t = time.perf_counter()
    out = fn(progress=False, **kw)
    return out, time.perf_counter() - t


def _loaded(corpus: str):
    """A session fixture named ``corpus``: ``(fedpriv.data.load_<corpus>(), seconds)``."""

    @pytest.fixture(scope="session", name=corpus)
    def fixture(fedpriv_cache):
        import fedpriv.data
        return _timed(getattr(fedpriv.data, f"load_{corpus}"))

    return fixture


chitchat = _loaded("chitchat")
shakespeare = _loaded("shakespeare")
simpsons = _loaded("simpsons")
public_pool = _loaded("public_pool")


@pytest.fixture(scope="session")
def small_sp(public_pool):
    """A small SentencePiece model (vocab 2000) trained on 3,000 public sentences (~3 s;
    unigram training is slower for smaller vocabularies: more pruning rounds)."""
    from fedpriv.data import train_sentencepiece
    pool, _ = public_pool
    return train_sentencepiece(pool.texts[::8][:3000], vocab_size=2000)


@pytest.fixture(scope="session")
def chitchat_word10k(chitchat):
    """The word-level top-10K tokenizer of the (capped) chitchat user data."""
    from fedpriv.data import WordTokenizer
    corpus, _ = chitchat
    return WordTokenizer.fit(corpus.texts(), k=10_000)
