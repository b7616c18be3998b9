"""Text-level federated corpora: client id -> list of strings, and a labelled public pool.

Wang et al. 2023 (§2 "Datasets") train on StackOverflow, "naturally keyed by users": each client
is a user and its examples are that user's sentences. :class:`FederatedText` is that object at
the text level (before tokenization); :class:`PublicCorpus` is the public pool of §3.2/§5 (C4 in
the paper; here Wikipedia, news and film quotes) where every sentence keeps its ``source`` label,
which distribution matching (§5) reports on. :class:`LoadStats` records what a loader parsed,
dropped and counted as malformed.

Splitting into train/validation/test is *by client* (whole users go to one split), with an
explicit seed for a NumPy Generator (:func:`split_client_ids`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from fedpriv.data.errors import EmptyClientError, EmptyCorpusError
from fedpriv.data.federated import FederatedDataset
from fedpriv.data.sampling import cap_examples, split_client_ids

__all__ = [
    "LoadStats",
    "FederatedText",
    "PublicCorpus",
    "split_client_ids",
    "split_sentences",
    "normalize_whitespace",
    "cap_examples",
]

_WS = re.compile(r"\s+")
# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) before whitespace and
# an upper-case letter, digit, quote or bracket. Abbreviations like "Mr." / "e.g." are not split
# when the next word is lower-case; a few common title abbreviations are protected explicitly.
_SENT_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREV = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|Prof|Gen|Col|Lt|Sgt|No|vs|Mt|Inc|Ltd|Co|U\.S)\.$")


def normalize_whitespace(text: str) -> str:
    """Collapse runs of whitespace to one space and strip the ends."""
    return _WS.sub(" ", text).strip()


def split_sentences(text: str) -> list[str]:
    """Split running text into sentences with a simple rule: break after ``.``, ``!`` or ``?``
    (plus closing quotes/brackets) followed by whitespace and a capital letter, digit, quote or
    bracket, except after common title abbreviations (``Mr.``, ``Dr.``, ``St.``, ...).

    Returns the non-empty, whitespace-normalised sentences in order.
    """
    text = normalize_whitespace(text)
    if not text:
        return []
    out: list[str] = []
    start = 0
    for m in _SENT_END.finditer(text):
        candidate = text[start:m.start()].rstrip() + text[m.start():m.end()].strip()
        if _ABBREV.search(text[start:m.start()]):
            continue
        out.append(candidate.strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


@dataclasses.dataclass(frozen=True)
class LoadStats:
    """What a loader did. ``records`` = raw records seen; ``malformed`` = records that could not
    be parsed (counted, never fatal unless nothing is left); ``filtered`` = parsed examples
    removed by the loader's filters; ``capped`` = examples removed by the per-client cap;
    ``dropped_clients`` = clients left with no examples; ``cache_hit`` = served from the disk
    cache; ``seconds`` = wall time of this call."""

    name: str
    source: str
    records: int
    malformed: int
    filtered: int
    capped: int
    clients: int
    examples: int
    dropped_clients: int = 0
    cache_hit: bool = False
    cache_path: str | None = None
    seconds: float = 0.0
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def log_line(self) -> str:
        return (f"[fedpriv.data] {self.name}: {self.clients} clients, {self.examples} examples "
                f"from {self.records} records ({self.malformed} malformed, {self.filtered} "
                f"filtered, {self.capped} capped, {self.dropped_clients} clients dropped); "
                f"{'cache hit' if self.cache_hit else 'parsed'} in {self.seconds:.2f}s")


class FederatedText(Mapping[str, list[str]]):
    """A read-only mapping client id -> list of example strings (text-level federated data).

    Client ids are kept in sorted order (``client_ids``), so iteration is stable. Clients with no
    examples are not stored; asking for one that a filter emptied raises
    :class:`EmptyClientError` naming it (it is recorded in ``dropped``).
    """

    def __init__(self, clients: Mapping[str, Sequence[str]], *, stats: LoadStats | None = None,
                 dropped: Mapping[str, str] | None = None, name: str = "federated_text"):
        dropped = dict(dropped or {})
        kept: dict[str, tuple[str, ...]] = {}
        for cid in sorted(clients):
            ex = tuple(clients[cid])
            if ex:
                kept[str(cid)] = ex
            else:
                dropped.setdefault(str(cid), "no examples after filtering")
        if not kept:
            raise EmptyCorpusError(f"{name}: no client has any example"
                                   + (f" ({len(dropped)} clients dropped)" if dropped else ""))
        self._clients = kept
        self._dropped = dropped
        self.stats = stats
        self.name = name

    # Mapping interface -------------------------------------------------------------------
    def __getitem__(self, client_id: str) -> list[str]:
        try:
            return list(self._clients[client_id])
        except KeyError:
            if client_id in self._dropped:
                raise EmptyClientError(client_id, self._dropped[client_id]) from None
            raise

    def __iter__(self) -> Iterator[str]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)

    def __repr__(self) -> str:
        return (f"FederatedText({self.name!r}, clients={len(self)}, "
                f"examples={self.total_examples})")

    # Properties ---------------------------------------------------------------------------
    @property
    def client_ids(self) -> tuple[str, ...]:
        """Client ids in stable (sorted) order."""
        return tuple(self._clients)

    @property
    def dropped(self) -> dict[str, str]:
        """Clients removed because they had no examples, with the reason."""
        return dict(self._dropped)

    def num_examples(self, client_id: str) -> int:
        return len(self[client_id])

    @property
    def total_examples(self) -> int:
        return sum(len(v) for v in self._clients.values())

    def texts(self, client_ids: Iterable[str] | None = None) -> list[str]:
        """All example strings of ``client_ids`` (default: every client), client by client."""
        ids = self.client_ids if client_ids is None else client_ids
        out: list[str] = []
        for cid in ids:
            out.extend(self[cid])
        return out

    def examples_per_client(self) -> np.ndarray:
        """int64[num_clients]: examples of each client, in ``client_ids`` order."""
        return np.array([len(v) for v in self._clients.values()], dtype=np.int64)

    # Transformations ----------------------------------------------------------------------
    def subset(self, client_ids: Iterable[str], name: str | None = None) -> FederatedText:
        """The corpus restricted to ``client_ids`` (each must exist)."""
        return FederatedText({cid: self[cid] for cid in client_ids}, name=name or self.name)

    def filter(self, keep: Callable[[str], bool], name: str | None = None) -> FederatedText:
        """Keep only examples with ``keep(text)``; clients left empty are dropped (recorded)."""
        return FederatedText({cid: [t for t in ex if keep(t)] for cid, ex in self._clients.items()},
                             dropped=self._dropped, name=name or self.name)

    def cap(self, max_examples_per_client: int, seed: int | None = None) -> FederatedText:
        """At most ``max_examples_per_client`` examples per client: the first ones, or a random
        subset drawn with ``np.random.default_rng(seed)`` when ``seed`` is given."""
        rng = None if seed is None else np.random.default_rng(seed)
        return FederatedText(
            {cid: cap_examples(ex, max_examples_per_client, rng) for cid, ex in self._clients.items()},
            dropped=self._dropped, name=self.name)

    def split_by_client(self, fractions: Sequence[float] = (0.8, 0.1, 0.1), *, seed: int
                        ) -> tuple[FederatedText, ...]:
        """Disjoint corpora, one per fraction, partitioning the *clients* (see
        :func:`split_client_ids`)."""
        groups = split_client_ids(self.client_ids, fractions, seed)
        return tuple(self.subset(g, name=f"{self.name}[{i}]") for i, g in enumerate(groups) if g)

    def to_dataset(self, tokenizer, *, seq_len: int = 20, max_examples_per_client: int | None = 256,
                   batch_size: int = 16, seed: int | None = None):
        """Tokenize into a :class:`~fedpriv.data.federated.FederatedDataset` of
        ``{'tokens': int32[n, seq_len + 1]}`` per client (BOS + ids + EOS, truncated/padded).
        See :meth:`FederatedDataset.from_text`."""
        return FederatedDataset.from_text(self, tokenizer, seq_len=seq_len,
                                          max_examples_per_client=max_examples_per_client,
                                          batch_size=batch_size, seed=seed)


class PublicCorpus(Sequence[str]):
    """The public pool: a sequence of sentences, each with a ``source`` label
    (e.g. ``'wikipedia'``, ``'lee_news'``, ``'film_quotes'``) and the id of the document it
    came from (``doc_ids``; e.g. ``'wikipedia/Autism'``; defaults to the source label)."""

    def __init__(self, texts: Sequence[str], sources: Sequence[str],
                 doc_ids: Sequence[str] | None = None, *,
                 stats: LoadStats | None = None, name: str = "public"):
        if len(texts) != len(sources):
            raise ValueError(f"{len(texts)} texts but {len(sources)} source labels")
        if doc_ids is not None and len(doc_ids) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(doc_ids)} document ids")
        if not texts:
            raise EmptyCorpusError(f"{name}: the public corpus is empty")
        self._texts = tuple(texts)
        self._sources = tuple(sources)
        self._docs = tuple(sources if doc_ids is None else doc_ids)
        self.stats = stats
        self.name = name

    def __getitem__(self, i):  # type: ignore[override]
        return self._texts[i]

    def __len__(self) -> int:
        return len(self._texts)

    def __repr__(self) -> str:
        return f"PublicCorpus({self.name!r}, sentences={len(self)}, sources={self.source_counts()})"

    @property
    def texts(self) -> tuple[str, ...]:
        return self._texts

    @property
    def sources(self) -> tuple[str, ...]:
        """The source label of each sentence (same length as ``texts``)."""
        return self._sources

    @property
    def doc_ids(self) -> tuple[str, ...]:
        """The document id of each sentence (same length as ``texts``)."""
        return self._docs

    def as_federated(self, by: str = "doc") -> FederatedText:
        """The pool as federated text with clients = documents (``by='doc'``) or sources
        (``by='source'``), e.g. to treat public data like a federated dataset (FreD, §5)."""
        if by not in ("doc", "source"):
            raise ValueError(f"by must be 'doc' or 'source', got {by!r}")
        keys = self._docs if by == "doc" else self._sources
        out: dict[str, list[str]] = {}
        for k, t in zip(keys, self._texts):
            out.setdefault(k, []).append(t)
        return FederatedText(out, name=f"{self.name}_by_{by}")

    def source_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self._sources:
            out[s] = out.get(s, 0) + 1
        return out

    def by_source(self, source: str) -> list[str]:
        """All sentences with the given source label."""
        if source not in self.source_counts():
            raise KeyError(f"no source {source!r}; have {sorted(self.source_counts())}")
        return [t for t, s in zip(self._texts, self._sources) if s == source]
