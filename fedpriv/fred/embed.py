"""FreD's datasets and their embedding (Hou et al. 2023 §4.1 analogue at small scale).

Private users: chitchat senders. Candidate public datasets, ``num_sentences`` each:
(a) chitchat-like: messages of *other* senders (disjoint users), (b) Wikipedia: sentences of
gensim's shortened English Wikipedia dump, (c) Simpsons: lines of popquotes' Simpsons library.
The embedder is all-MiniLM-L6-v2 (:mod:`fedpriv.models.bert`, 384-d unit-norm rows).
"""
from __future__ import annotations

import json
import pathlib
import time
from typing import Mapping, Sequence

import numpy as np

from fedpriv import data as loaders
from fedpriv.data.text import split_client_ids

HELD_OUT = "chitchat (held-out senders)"


def sample_texts(texts: Sequence[str], n: int, rng: np.random.Generator) -> list[str]:
    """``n`` of ``texts`` without replacement, in their original order (all if fewer)."""
    texts = list(texts)
    if len(texts) <= n:
        return texts
    return [texts[i] for i in np.sort(rng.choice(len(texts), size=n, replace=False))]


def candidate_datasets(held_out: Sequence[str], num_sentences: int, rng: np.random.Generator,
                       progress: bool = False) -> dict[str, list[str]]:
    """The three candidate public datasets, ``num_sentences`` each, drawn from ``rng`` in this
    order: held-out chitchat senders' messages (``held_out``), Wikipedia, Simpsons."""
    wiki = loaders.load_public_pool(sources=("wikipedia",), progress=progress).texts
    simpsons = loaders.load_simpsons(progress=progress)
    return {
        HELD_OUT: sample_texts(held_out, num_sentences, rng),
        "wikipedia": sample_texts(wiki, num_sentences, rng),
        "simpsons": sample_texts([t for c in simpsons.client_ids for t in simpsons[c]],
                                 num_sentences, rng),
    }


def table_datasets(num_sentences: int, max_per_user: int, seed: int, progress: bool = False):
    """FreD table's data: a random half of the chitchat senders are the private users (each
    keeps at most ``max_per_user`` random messages); the other half's messages are candidate
    (a). Returns ``(private: {sender: [str]}, candidates: {name: [str]})``."""
    rng = np.random.default_rng(seed)
    chat = loaders.load_chitchat(max_examples_per_client=None, progress=progress)
    priv_ids, held_ids = split_client_ids(chat.client_ids, (0.5, 0.5), seed=seed)
    private = {cid: sample_texts(chat[cid], max_per_user, rng) for cid in priv_ids}
    held = [t for cid in held_ids for t in chat[cid]]
    return private, candidate_datasets(held, num_sentences, rng, progress)


def _warm_up(embedder, sentences: Sequence[str], batch_size: int) -> None:
    """Compile every (batch, bucket) shape ``embed(sentences)`` will use: one sentence per
    bucket (batches are padded to ``batch_size``), so the timed pass measures throughput only."""
    by_bucket = {}
    for s, ids in zip(sentences, embedder.tokenize(sentences)):
        bucket = next((b for b in embedder.buckets if len(ids) <= b), embedder.buckets[-1])
        by_bucket.setdefault(bucket, s)
    embedder.embed(list(by_bucket.values()), batch_size=batch_size, progress=False)


def embed_all(embedder, private: Mapping[str, Sequence[str]],
              candidates: Mapping[str, Sequence[str]], batch_size: int,
              cache: str | pathlib.Path | None = None, progress: bool = True):
    """Embed every private user's and candidate's sentences in one pass.

    Args:
      embedder: a :class:`fedpriv.models.bert.Embedder`.
      private: user -> sentences; candidates: name -> sentences.
      cache: ``.npz`` path; if it exists its embeddings are returned (the caller keys the path
        by what was embedded), else it is written.
    Returns:
      ``(private: {user: float32[n_u, 384]}, candidates: {name: float32[n_c, 384]},
      throughput in sentences/s)``.
    """
    cache = pathlib.Path(cache) if cache is not None else None
    if cache is not None and cache.exists():
        z = np.load(cache, allow_pickle=False)
        meta = json.loads(str(z["meta"]))
        priv = {cid: z[f"p{i}"] for i, cid in enumerate(meta["private"])}
        cand = {name: z[f"c{i}"] for i, name in enumerate(meta["candidates"])}
        return priv, cand, meta["throughput"]
    flat = [t for cid in private for t in private[cid]]
    for name in candidates:
        flat += candidates[name]
    _warm_up(embedder, flat, batch_size)
    t0 = time.perf_counter()
    vecs = embedder.embed(flat, batch_size=batch_size, progress=progress)
    throughput = len(flat) / (time.perf_counter() - t0)
    priv, cand, k = {}, {}, 0
    for cid in private:
        priv[cid] = vecs[k : k + len(private[cid])]
        k += len(private[cid])
    for name in candidates:
        cand[name] = vecs[k : k + len(candidates[name])]
        k += len(candidates[name])
    if cache is not None:
        meta = {"private": list(priv), "candidates": list(cand), "throughput": throughput,
                "sentences": len(flat)}
        arrays = {f"p{i}": v for i, v in enumerate(priv.values())}
        arrays.update({f"c{i}": v for i, v in enumerate(cand.values())})
        np.savez(cache, meta=json.dumps(meta), **arrays)
    return priv, cand, throughput


def table_declared_counts(max_per_user: int) -> dict[str, int]:
    """The FreD table's declared denominators (``fedpriv.fred.compare.table_rows``'s
    ``n_public``), from public facts alone: ``user`` = the private half of chitchat's published
    sender count (``fedpriv.data.populations.CORPUS_CLIENTS``, split as :func:`table_datasets`
    splits it); ``sample`` = that times ``max_per_user``, the most sentences the protocol
    collects. Under add/remove the exact counts are private; a sender with fewer than
    ``max_per_user`` messages makes the sample-level estimate a fixed-denominator one, scaled by
    (sentences used) / (declared)."""
    from fedpriv.data.populations import corpus_clients, split_sizes
    users = split_sizes(corpus_clients("chitchat"), (0.5, 0.5))[0]
    return {"user": users, "sample": users * int(max_per_user)}
