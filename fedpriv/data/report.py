"""Corpus statistics of the real corpora (Wang et al. 2023 §2 report theirs for StackOverflow:
342K clients, 135.8M examples; App. B.1).

``python -m fedpriv.data.report [--cache-dir DIR] [--sp-vocab 8000] [--word-k 10000]`` loads
chitchat, Shakespeare, Simpsons and the public pool (timing a cold parse and a cached load),
trains the public SentencePiece tokenizer on the public pool and a word-level top-k tokenizer on
each private corpus, and prints a Markdown table of clients, examples and tokens: over the whole
text (no truncation) and after the papers' caps (256 examples per client, L = 20).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fedpriv.data.corpora import load_chitchat, load_shakespeare, load_simpsons
from fedpriv.data.federated import FederatedDataset
from fedpriv.data.public_pool import load_public_pool
from fedpriv.data.text import FederatedText, PublicCorpus
from fedpriv.data.tokenizers import WordTokenizer, train_sentencepiece

__all__ = ["timed_load", "corpus_row", "main"]


def timed_load(load: Callable[..., Any], **kwargs) -> tuple[Any, float, float]:
    """(corpus, cold seconds, cached seconds): ``load`` once without the cache (a full parse,
    which also writes the cache entry) and once more from the cache."""
    t = time.perf_counter()
    load(progress=False, use_cache=False, **kwargs)
    cold = time.perf_counter() - t
    load(progress=False, **kwargs)           # make sure the cache entry exists
    t = time.perf_counter()
    corpus = load(progress=False, **kwargs)
    return corpus, cold, time.perf_counter() - t


def _tokens(tok, texts) -> int:
    return int(sum(len(x) for x in tok.encode(list(texts))))


def corpus_row(name: str, corpus: FederatedText | PublicCorpus, sp, word_k: int,
               cold: float, cached: float) -> dict[str, Any]:
    """Statistics of one corpus with the SentencePiece tokenizer ``sp`` and a word-level top-
    ``word_k`` tokenizer fitted on the corpus itself."""
    texts = list(corpus.texts) if isinstance(corpus, PublicCorpus) else corpus.texts()
    word = WordTokenizer.fit(texts, k=word_k)
    row: dict[str, Any] = dict(
        corpus=name, clients=len(corpus) if isinstance(corpus, FederatedText) else 0,
        examples=len(texts), sp_tokens=_tokens(sp, texts), word_tokens=_tokens(word, texts),
        word_oov=word.oov_rate(texts), cold_s=cold, cached_s=cached)
    if isinstance(corpus, FederatedText):
        epc = corpus.examples_per_client()
        row["examples_per_client_median"] = float(np.median(epc))
        row["malformed"] = corpus.stats.malformed if corpus.stats else 0
        capped = FederatedDataset.from_text(corpus, sp)
        capped_w = FederatedDataset.from_text(corpus, word)
        row.update(capped_examples=capped.total_examples, capped_sp_tokens=capped.total_tokens,
                   capped_word_tokens=capped_w.total_tokens)
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--sp-vocab", type=int, default=8000)
    p.add_argument("--word-k", type=int, default=10_000)
    args = p.parse_args(argv)
    kw = dict(cache_dir=args.cache_dir)
    pool, pcold, pcached = timed_load(load_public_pool, **kw)
    t = time.perf_counter()
    sp = train_sentencepiece(pool.texts, args.sp_vocab, cache_dir=args.cache_dir)
    print(f"SentencePiece {args.sp_vocab} on the public pool: vocab {sp.vocab_size}, "
          f"{time.perf_counter() - t:.1f}s (cached if trained before)")
    rows = []
    for name, load in [("chitchat", load_chitchat), ("shakespeare", load_shakespeare),
                       ("simpsons", load_simpsons)]:
        corpus, cold, cached = timed_load(load, **kw)
        rows.append(corpus_row(name, corpus, sp, args.word_k, cold, cached))
    rows.append(corpus_row("public_pool", pool, sp, args.word_k, pcold, pcached))
    cols = ["corpus", "clients", "examples", "sp_tokens", "word_tokens", "word_oov",
            "capped_examples", "capped_sp_tokens", "capped_word_tokens", "malformed",
            "cold_s", "cached_s"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        print("| " + " | ".join(cells) + " |")
    print(f"public pool per source: {pool.source_counts()}")
    return rows


if __name__ == "__main__":
    main()
