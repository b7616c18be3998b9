"""The papers' own corpora, for users who have the files (Wang et al. 2023 §2 / §3.2; Koga et
al. 2023 §4.1; Hou et al. 2023 §4): nothing here downloads anything.

* :func:`load_stackoverflow` -- TFF's StackOverflow SQLite (``stackoverflow.sqlite`` or the
  ``.lzma`` TFF downloads), the private corpus of Wang et al. (342,477 training users):
  ``fedpriv.data.formats.load_stackoverflow_sqlite``, its ``train`` split.
* :func:`load_reddit_jsonl` -- Reddit-style user-keyed JSON lines: pushshift comment dumps
  (``{"author": ..., "body": ...}``) or ``{"user": ..., "text": ...}``
  (``fedpriv.data.formats.load_jsonl``); deleted authors (``[deleted]``) are no user and are
  dropped, never merged into one client.
* :func:`load_public_text` -- a large public text source for the public pool (the paper's
  ``c4/realnewslike``): a TFDS directory prepared with ``file_format="array_record"`` (read with
  ``tfds.builder_from_directory(...).as_data_source()``, no TensorFlow), or local ``.txt``
  (one document per line) / ``.jsonl`` (``{"text": ...}`` per line) files; documents are split
  into sentences with the packaged pool's filters. Returns a :class:`PublicCorpus`.

``fedpriv.recipes.lm`` reads them for ``corpus=stackoverflow`` / ``corpus=reddit_jsonl`` (path in
``corpus_path``) and ``public_pool_path``; ``fedpriv.recipes.plans`` then counts the population
from the file (:func:`count_users`), so the privacy plans compute the paper's epsilon from the
real population.
"""
from __future__ import annotations

import json
import os
import pathlib
import sqlite3

from fedpriv.data.errors import ConfigError, DataError, MalformedDataError
from fedpriv.data.formats import load_jsonl, load_stackoverflow_sqlite
from fedpriv.data.sources import require_file
from fedpriv.data.text import FederatedText, PublicCorpus, split_sentences

__all__ = ["load_stackoverflow", "load_reddit_jsonl", "load_public_text", "count_users",
           "load_path_corpus", "PATH_LOADERS"]

REDDIT_KEYS = (("author", "body"), ("user", "text"))  # pushshift comments | generic
DELETED = ("[deleted]", "[removed]")


def load_stackoverflow(path: str | os.PathLike, *, progress: bool = True, **kw) -> FederatedText:
    """The ``train`` split of TFF's StackOverflow SQLite at ``path`` (client = ``client_id``;
    example = the ``tokens`` feature, TFF's tokenized sentence)."""
    return load_stackoverflow_sqlite(path, "train", progress=progress, **kw)


def _reddit_keys(path: pathlib.Path) -> tuple[str, str]:
    """The (user, text) keys of a Reddit-style JSONL file, from its first record; a record with
    both conventions, or neither, is refused (never guessed)."""
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                raise MalformedDataError(f"{path}: the first record is not JSON") from None
            if not isinstance(rec, dict):
                raise MalformedDataError(f"{path}: the first record is not a JSON object")
            found = [k for k in REDDIT_KEYS if k[0] in rec and k[1] in rec]
            if len(found) != 1:
                raise MalformedDataError(
                    f"{path}: expected Reddit-style records with keys author/body (pushshift) or "
                    f"user/text, got {sorted(rec)[:8]}")
            return found[0]
    raise DataError(f"{path}: no records")


def load_reddit_jsonl(path: str | os.PathLike, *, progress: bool = True, **kw) -> FederatedText:
    """Reddit-style user-keyed JSON lines at ``path``: client = author (or user), example = the
    comment body (or text). Authors ``[deleted]`` / ``[removed]`` are nobody's: dropped."""
    path = require_file(path, "Reddit JSONL file")
    user_key, text_key = _reddit_keys(path)
    text = load_jsonl(path, user_key=user_key, text_key=text_key, progress=progress, **kw)
    gone = [c for c in text.client_ids if c in DELETED]
    if gone:
        keep = [c for c in text.client_ids if c not in DELETED]
        if not keep:
            raise DataError(f"{path}: every record's author is deleted")
        text = text.subset(keep)
    return text


PATH_LOADERS = {"stackoverflow": load_stackoverflow, "reddit_jsonl": load_reddit_jsonl}


def load_path_corpus(corpus: str, path: str | os.PathLike | None, *, progress: bool = True) -> FederatedText:
    """The papers' corpus ``corpus`` (a key of :data:`PATH_LOADERS`) from ``path``."""
    if corpus not in PATH_LOADERS:
        raise ConfigError(f"unknown corpus {corpus!r} read from a path; choose one of {sorted(PATH_LOADERS)}")
    if not path:
        raise ConfigError(f"corpus={corpus} needs corpus_path (the file with the paper's data)")
    return PATH_LOADERS[corpus](path, progress=progress)


def count_users(corpus: str, path: str | os.PathLike) -> int:
    """Training users of the file at ``path`` (what the loader would return, for the privacy
    plans): StackOverflow from TFF's ``client_metadata`` table (train split) when it has one,
    else by loading the corpus."""
    if corpus == "stackoverflow" and str(path).endswith(".sqlite") and os.path.isfile(path):
        try:
            con = sqlite3.connect(f"file:{os.fspath(path)}?mode=ro", uri=True)
            try:
                n = con.execute("SELECT COUNT(DISTINCT client_id) FROM client_metadata "
                                "WHERE split_name = 'train' AND num_examples > 0").fetchone()[0]
            finally:
                con.close()
            if n:
                return int(n)
        except sqlite3.Error:
            pass
    return len(load_path_corpus(corpus, path, progress=False).client_ids)


# ---------------------------------------------------------------------------------- public text

def _tfds_dir(path: pathlib.Path) -> pathlib.Path | None:
    """The TFDS version directory (holding ``dataset_info.json``) at or under ``path``."""
    if (path / "dataset_info.json").is_file():
        return path
    found = sorted(p.parent for p in path.rglob("dataset_info.json"))
    if len(found) > 1:
        raise ConfigError(f"{path} holds {len(found)} TFDS datasets ({', '.join(map(str, found[:3]))}"
                          "...): give the one to read")
    return found[0] if found else None


def _documents(path: pathlib.Path, split: str, max_documents: int | None):
    """(source label, document id, text) of every document at ``path``."""
    d = _tfds_dir(path) if path.is_dir() else None
    if d is not None:
        import tensorflow_datasets as tfds
        builder = tfds.builder_from_directory(os.fspath(d))
        source = builder.as_data_source()[split]
        n = len(source) if max_documents is None else min(len(source), max_documents)
        label = builder.info.full_name
        for start in range(0, n, 4096):
            for i, rec in enumerate(source.__getitems__(list(range(start, min(start + 4096, n))))):
                text = rec["text"]
                yield label, f"{label}/{start + i}", text.decode("utf-8") if isinstance(text, bytes) else str(text)
        return
    files = ([path] if path.is_file() else
             sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl") and p.is_file()))
    if not files:
        raise DataError(f"no TFDS dataset, .txt or .jsonl files at {path}")
    count = 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for j, line in enumerate(fh):
                if max_documents is not None and count >= max_documents:
                    return
                if not line.strip():
                    continue
                if f.suffix == ".jsonl":
                    rec = json.loads(line)
                    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                        raise MalformedDataError(f"{f}:{j + 1}: expected {{\"text\": <string>}}")
                    line = rec["text"]
                count += 1
                yield f.name, f"{f.name}/{j}", line


def load_public_text(path: str | os.PathLike, *, split: str = "train", min_words: int = 3,
                     max_words: int = 100, max_documents: int | None = None,
                     progress: bool = True) -> PublicCorpus:
    """A large public text source as the public pool (the paper's C4 realnewslike): a TFDS
    array_record directory (records with a ``text`` feature, e.g. ``c4/realnewslike/3.1.0``),
    or ``.txt`` / ``.jsonl`` files. Documents are split into sentences and filtered like the
    packaged pool (``min_words`` .. ``max_words`` words, mostly letters)."""
    from fedpriv.data.public_pool import _sentence_ok
    path = pathlib.Path(os.path.expanduser(os.fspath(path)))
    if not path.exists():
        raise DataError(f"public text source not found: {path}")
    texts, sources, docs = [], [], []
    for label, doc, text in _documents(path, split, max_documents):
        for s in split_sentences(text):
            if _sentence_ok(s, min_words, max_words):
                texts.append(s)
                sources.append(label)
                docs.append(doc)
    if progress:
        print(f"public text {path}: {len(texts):,} sentences from {len(set(docs)):,} documents")
    return PublicCorpus(texts, sources, docs, name=f"public text ({path.name})")
