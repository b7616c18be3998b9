"""The public pool (Wang et al. 2023, §3.2) and the public SentencePiece tokenizer trained on it.

The paper uses C4 as public data; it cannot be downloaded here, so (docs/design.md §4, "Real data and
models available offline") :func:`load_public_pool` stands in for it: Wikipedia, Lee news and
film quote sentences, every sentence with a ``source`` label. :func:`public_sentencepiece`
trains (and caches) the project's public sub-word tokenizer on it (§3.1).

Parsing and caching are shared with the federated loaders (:mod:`fedpriv.data.parsing`).
"""

from __future__ import annotations

import bz2
import os
import re
import sqlite3
import time
from collections.abc import Sequence

from tqdm.auto import tqdm

from fedpriv.data import sources as _src
from fedpriv.data.errors import EmptyCorpusError, MalformedDataError, logger
from fedpriv.data.parsing import QUOTE_LINE, connect_ro, corpus_cache_path, read_cached, store, strip_directions
from fedpriv.data.text import PublicCorpus, split_sentences
from fedpriv.data.tokenizers import SentencePieceTokenizer, train_sentencepiece

__all__ = ["PUBLIC_SOURCES", "load_public_pool", "public_sentencepiece"]

PUBLIC_SOURCES = ("wikipedia", "lee_news", "film_quotes")

_WIKI_LINE_SKIP = re.compile(r"^\s*(?:[*#|{}!:;]|=|thumb\b|File:|Image:|Category:)")


def _wiki_sentences(text: str) -> list[str]:
    from gensim.corpora.wikicorpus import filter_wiki  # heavy import, only when parsing

    plain = filter_wiki(text)
    plain = plain.replace("'''", "").replace("''", "")
    out: list[str] = []
    for para in re.split(r"\n\s*\n", plain):
        lines = [ln for ln in para.split("\n") if ln.strip() and not _WIKI_LINE_SKIP.match(ln)]
        if lines:
            out.extend(split_sentences(" ".join(lines)))
    return out


def _sentence_ok(s: str, min_words: int, max_words: int) -> bool:
    n = len(s.split())
    return min_words <= n <= max_words and sum(c.isalpha() for c in s) >= 0.5 * len(s.replace(" ", ""))


def _wikipedia_docs(path, counts: dict, progress: bool):
    """``(title, sentences)`` of gensim's Wikipedia excerpt (redirects counted as filtered)."""
    from gensim.corpora.wikicorpus import extract_pages

    with bz2.BZ2File(path) as f:
        for title, wikitext, _pid in tqdm(extract_pages(f), desc="wikipedia pages",
                                           disable=not progress, leave=False):
            counts["records"] += 1
            if not isinstance(wikitext, str):
                counts["malformed"] += 1
                continue
            if wikitext.lstrip()[:9].upper() == "#REDIRECT":
                counts["filtered"] += 1
                continue
            yield str(title), _wiki_sentences(wikitext)


def _lee_docs(path, counts: dict, progress: bool):
    """``(article<i>, sentences)`` of gensim's Lee background corpus (one article per line)."""
    raw = path.read_bytes()
    try:
        doc = raw.decode("utf-8")
    except UnicodeDecodeError:
        doc = raw.decode("latin-1")
    for i, line in enumerate(doc.splitlines()):
        if not line.strip():
            continue
        counts["records"] += 1
        yield f"article{i:04d}", split_sentences(line)


def _film_docs(path, counts: dict, progress: bool):
    """``(library, sentences)`` of popquotes' non-Simpsons quotes (speakers and stage
    directions removed)."""
    try:
        with connect_ro(path) as con:
            rows = con.execute("SELECT library, quote FROM quotes "
                               "WHERE library != 'simpsons' ORDER BY quoteid").fetchall()
    except sqlite3.Error as e:
        raise MalformedDataError(f"public_pool: cannot read popquotes {path}: {e}") from e
    for library, quote in rows:
        counts["records"] += 1
        if not isinstance(quote, str):
            counts["malformed"] += 1
            continue
        for part in quote.split("<x>"):
            m = QUOTE_LINE.match(part)
            body = m.group(2) if m else part
            yield str(library), split_sentences(strip_directions(body))


_READERS = {"wikipedia": _wikipedia_docs, "lee_news": _lee_docs, "film_quotes": _film_docs}


def load_public_pool(*, sources: Sequence[str] = PUBLIC_SOURCES, min_words: int = 3,
                     max_words: int = 100, cache_dir: str | os.PathLike | None = None,
                     use_cache: bool = True, progress: bool = True) -> PublicCorpus:
    """The public pool (stand-in for the paper's public C4 corpus, §3.2): sentences with a
    ``source`` label, from

    - ``'wikipedia'``: gensim's shortened English Wikipedia dump (articles via
      ``gensim.corpora.wikicorpus.extract_pages`` + ``filter_wiki``; redirects, headings, lists
      and tables dropped; split into sentences);
    - ``'lee_news'``: gensim's Lee background news corpus (one article per line), in sentences;
    - ``'film_quotes'``: popquotes' non-Simpsons libraries (films/TV/R quotes; the
      ``Speaker:`` prefix and stage directions removed), in sentences. The Simpsons library is
      excluded: it is a private/target corpus here, and public and private data must not
      overlap (Wang et al. App. B.1).

    Sentences with fewer than ``min_words`` or more than ``max_words`` whitespace words, or
    mostly non-letters, are filtered. ``sources`` selects a subset of :data:`PUBLIC_SOURCES`.
    """
    unknown = set(sources) - set(PUBLIC_SOURCES)
    if unknown or not sources:
        raise ValueError(f"sources must be a non-empty subset of {PUBLIC_SOURCES}, got {sources}")
    t0 = time.perf_counter()
    paths = {"wikipedia": _src.wikipedia_excerpt_path, "lee_news": _src.lee_background_path,
             "film_quotes": _src.popquotes_path}
    src_paths = [paths[s]() for s in PUBLIC_SOURCES if s in sources]
    srcs = [s for s in PUBLIC_SOURCES if s in sources]
    options = {"sources": srcs, "min_words": min_words, "max_words": max_words}
    name = "public_pool"
    cpath = None
    if use_cache:
        cpath = corpus_cache_path(name, src_paths, options, cache_dir)
        pool = read_cached(cpath, t0, lambda hit, stats: PublicCorpus(
            hit["texts"], hit["sources"], hit["doc_ids"], stats=stats, name=name))
        if pool is not None:
            logger.info(pool.stats.log_line())
            return pool

    texts: list[str] = []
    labels: list[str] = []
    docs: list[str] = []
    counts = {"records": 0, "malformed": 0, "filtered": 0}
    per_source: dict[str, int] = {}
    for label, path in zip(srcs, src_paths):
        for doc, sentences in _READERS[label](path, counts, progress):
            for s in sentences:
                if _sentence_ok(s, min_words, max_words):
                    texts.append(s)
                    labels.append(label)
                    docs.append(f"{label}/{doc}")
                    per_source[label] = per_source.get(label, 0) + 1
                else:
                    counts["filtered"] += 1
    records, malformed, filtered = counts["records"], counts["malformed"], counts["filtered"]
    if not texts:
        raise EmptyCorpusError(f"{name}: no sentences left from {srcs} after filtering")
    stats_d = dict(name=name, source=", ".join(map(str, src_paths)), records=records,
                   malformed=malformed, filtered=filtered, capped=0, clients=0,
                   examples=len(texts), dropped_clients=0, extra={"per_source": per_source})
    stats = store(cpath, {"texts": texts, "sources": labels, "doc_ids": docs}, stats_d, t0)
    logger.info(stats.log_line())
    return PublicCorpus(texts, labels, docs, stats=stats, name=name)


def public_sentencepiece(vocab_size: int = 8000, *, sources: Sequence[str] | None = None,
                         cache_dir: str | os.PathLike | None = None, progress: bool = False
                         ) -> SentencePieceTokenizer:
    """The public SentencePiece tokenizer of this project: trained on the public pool
    (:func:`load_public_pool`, ~25K sentences / ~0.6M words), cached.

    Wang et al. use LaMDA's 32K SentencePiece model; our pool is small, so 8K is the default and
    32K stops at ~31K pieces (``hard_vocab_limit=False``; check ``vocab_size``). Training takes
    ~10 s the first time, then the cached model file is loaded.
    """
    pool = load_public_pool(sources=tuple(sources or PUBLIC_SOURCES), cache_dir=cache_dir,
                            progress=progress)
    return train_sentencepiece(pool.texts, vocab_size, cache_dir=cache_dir)
