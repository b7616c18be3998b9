"""The data of an LM-FL run (Wang et al. 2023 §2, §3.1): the corpus (a registered packaged corpus,
``fedpriv.registry.CORPORA``, or the papers' own file at ``corpus_path``, ``PATH_CORPORA``), split
by client, the tokenizer (public SentencePiece, public top-k words, or the training users' own
top-k words: non-private, recorded so in the ledger) and the tokenized federated datasets.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from fedpriv.data import WordTokenizer, load_public_pool, paper_corpora, train_sentencepiece
from fedpriv.errors import ConfigError
from fedpriv.registry import CORPORA, PATH_CORPORA, TOKENIZERS, parse_tokenizer

__all__ = ["load_corpus", "load_public", "Prepared", "TOKENIZER_NAMES", "parse_tokenizer",
           "with_tokenizer", "prepare_data"]

TOKENIZER_NAMES = TOKENIZERS


def load_corpus(cfg, progress: bool = True):
    """``cfg.corpus``: a packaged corpus (``fedpriv.registry.CORPORA``) or the papers' own file at
    ``cfg.corpus_path`` (``PATH_CORPORA``: TFF StackOverflow SQLite, Reddit-style JSONL)."""
    if cfg.corpus in PATH_CORPORA:
        return paper_corpora.load_path_corpus(cfg.corpus, getattr(cfg, "corpus_path", None), progress=progress)
    if getattr(cfg, "corpus_path", None):
        raise ConfigError(f"corpus_path is set but corpus={cfg.corpus} is packaged (it reads no path)")
    return CORPORA.get(cfg.corpus)(progress=progress)


def load_public(cfg, progress: bool = True):
    """The public pool: ``cfg.public_pool_path`` (a C4-like TFDS directory or text files,
    ``paper_corpora.load_public_text``) or the packaged pool."""
    path = getattr(cfg, "public_pool_path", None)
    return paper_corpora.load_public_text(path, progress=progress) if path else load_public_pool(progress=progress)


@dataclasses.dataclass
class Prepared:
    train: object          # FederatedDataset
    val: object
    test: object
    tokenizer: object
    stats: dict
    train_text: object = None  # FederatedText of the training users (their raw messages)
    test_text: object = None   # ... and of the test users


def with_tokenizer(cfg, spec: str):
    """``cfg`` (an LM-FL config) with the tokenizer (and vocabulary size) of ``spec``."""
    name, size = parse_tokenizer(spec)
    return dataclasses.replace(cfg, tokenizer=name, vocab_size=size or cfg.vocab_size)


def prepare_data(cfg, progress: bool = True) -> Prepared:
    """Load ``cfg.corpus``, split by client, build the tokenizer, tokenize (Wang et al. §3.1)."""
    text = load_corpus(cfg, progress)
    if cfg.max_clients is not None and cfg.max_clients < len(text):
        ids = np.random.default_rng(cfg.seed).choice(len(text.client_ids), cfg.max_clients, replace=False)
        text = text.subset([text.client_ids[i] for i in sorted(ids)])
    tr, va, te = text.split_by_client(cfg.split, seed=cfg.seed)
    if cfg.tokenizer == "sentencepiece":  # public tokenizer: trained on the public pool only
        tok = train_sentencepiece(load_public(cfg, progress).texts, vocab_size=cfg.vocab_size)
    elif cfg.tokenizer == "word_public":  # top-k words of the public pool
        tok = WordTokenizer.fit(load_public(cfg, progress).texts, k=cfg.vocab_size - 4)
    elif cfg.tokenizer == "word":         # private top-k words of the training users (non-private)
        tok = WordTokenizer.fit(tr.texts(), k=cfg.vocab_size - 4)
    else:
        raise ValueError(f"tokenizer must be one of sentencepiece, word_public, word; got {cfg.tokenizer!r}")
    kw = dict(seq_len=cfg.seq_len, max_examples_per_client=cfg.max_examples_per_client,
              batch_size=cfg.batch_size, seed=cfg.seed)
    train_ds, val_ds, test_ds = (t.to_dataset(tok, **kw) for t in (tr, va, te))
    stats = {"corpus": cfg.corpus, "tokenizer": cfg.tokenizer, "vocab_size": tok.vocab_size,
             "vocabulary_public": cfg.tokenizer != "word",
             **{f"{n}_{k}": v for n, d in (("train", train_ds), ("val", val_ds), ("test", test_ds))
                for k, v in (("clients", len(d)), ("examples", d.total_examples),
                             ("tokens", d.total_tokens))}}
    return Prepared(train_ds, val_ds, test_ds, tok, stats, train_text=tr, test_text=te)
