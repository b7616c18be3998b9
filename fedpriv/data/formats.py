"""Loaders of the papers' original data formats (Wang et al. 2023, §2), for users who have it:
the TFF StackOverflow SQLite file (:func:`load_stackoverflow_sqlite`), JSONL files keyed by user
(:func:`load_jsonl`) and directories of per-user text files (:func:`load_text_dir`).

Parsing, capping and caching are shared with the other loaders (:mod:`fedpriv.data.parsing`).
"""

from __future__ import annotations

import collections
import lzma
import os
import pathlib
import shutil
import sqlite3
from typing import Any

from tqdm.auto import tqdm

from fedpriv.data import cache as cache_lib, parsing
from fedpriv.data.errors import (
    CacheError,
    ConfigError,
    EmptyCorpusError,
    MalformedDataError,
)
from fedpriv.data.parsing import (
    Parsed,
    duplicate_keys,
    is_client_id,
    load_federated,
    loader_settings,
)
from fedpriv.data.sources import require_dir, require_file
from fedpriv.data.text import FederatedText, normalize_whitespace

__all__ = ["load_stackoverflow_sqlite", "load_jsonl", "load_text_dir"]


def _decompress_lzma(path: pathlib.Path, cache_dir) -> pathlib.Path:
    """``x.sqlite.lzma`` -> a decompressed copy in the cache dir (keyed by content hash)."""
    digest = cache_lib.file_digest(path)[:24]
    out = cache_lib.resolve_cache_dir(cache_dir) / "sqlite" / f"{path.stem}-{digest}"
    if not out.exists():
        try:
            with lzma.open(path, "rb") as fin, cache_lib.atomic_file(out) as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        except (lzma.LZMAError, EOFError) as e:  # EOFError: a truncated stream
            raise MalformedDataError(f"{path} is not a valid .lzma file: {e}") from e
        except OSError as e:  # the copy must exist to be read: no bypass
            if e.filename is not None and os.fspath(e.filename) == os.fspath(path):
                raise  # the source itself (not the cache)
            raise CacheError(f"cannot write the decompressed copy of {path} to the cache {out.parent} "
                             f"({e.strerror or e}); set {cache_lib.ENV_VAR} to a writable directory "
                             "with room for it") from e
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
    A ``client_id`` that is not valid UTF-8 text (invalid bytes, a BLOB, a number) or is empty /
    whitespace-only makes its record malformed: ids are never decoded with replacement
    characters, and blank ids never form one client ``''`` -- either would merge users.
    """
    src = require_file(path, "StackOverflow SQLite file")
    db = _decompress_lzma(src, cache_dir) if src.suffix == ".lzma" else src

    def parse(progress: bool) -> Parsed:
        out = Parsed()
        try:
            with parsing.connect_ro(db) as con:
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
                    if not is_client_id(cid):  # not text, or blank: names nobody
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

    return load_federated(f"stackoverflow_{split}", [db],
                          {"split": split, "field": field, "max_clients": max_clients}, parse,
                          **loader_settings(locals()))


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
      :class:`MalformedDataError` (they may be two users);
    - an empty or whitespace-only id (``""``, ``" "``) is malformed, like ``null``: it names
      nobody, and all such records would otherwise become one client ``''``;
    - a record with the user key (or the text key) twice is malformed: ``json`` would keep the
      last value silently, and which user wrote the record is then ambiguous.

    Lines that are not JSON objects (or nest too deeply to parse), lack a key or have a
    non-string text are malformed; whitespace-only texts are filtered. So ``stats.records ==
    examples + malformed + filtered`` before capping. ``user_key == text_key`` is refused with
    :class:`~fedpriv.data.errors.ConfigError`.
    """
    for k, v in (("user_key", user_key), ("text_key", text_key)):
        if not isinstance(v, str) or not v:
            raise ConfigError(f"load_jsonl: {k} must be a non-empty string, got {v!r}")
    if user_key == text_key:
        raise ConfigError(f"load_jsonl: user_key and text_key are both {user_key!r}; the id and "
                          "the text must come from different keys")
    src = require_file(path, "JSONL file")

    def parse(progress: bool) -> Parsed:
        return _parse_jsonl(src, user_key, text_key, progress)

    return load_federated("jsonl", [src], {"user_key": user_key, "text_key": text_key}, parse,
                          **loader_settings(locals()))


def _parse_jsonl(src, user_key: str, text_key: str, progress: bool) -> Parsed:
    """``load_jsonl``'s parse (its docstring says what is malformed, filtered or refused)."""
    out = Parsed()
    invalid_utf8 = duplicated = 0
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
                rec = parsing.loads_json(raw.decode("utf-8"))
            except UnicodeDecodeError:
                invalid_utf8 += 1
                out.malformed += 1
                continue
            except ValueError:
                out.malformed += 1
                continue
            uid, text, dup = _jsonl_record(rec, user_key, text_key)
            duplicated += dup
            if uid is None:
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
    if duplicated:
        out.extra["duplicate_key_lines"] = duplicated
    return out



def _jsonl_record(rec, user_key: str, text_key: str):
    """``(user id, text, 1 if a key is duplicated else 0)`` of a parsed line; id ``None``: the
    record is malformed (not an object, a duplicated key, an id that is neither a string nor an
    integer, or a text that is not a string)."""
    if not isinstance(rec, dict) or {user_key, text_key} & duplicate_keys(rec):
        return None, None, int(isinstance(rec, dict))
    uid, text = rec.get(user_key), rec.get(text_key)
    if (not (is_client_id(uid) or (isinstance(uid, int) and not isinstance(uid, bool)))
            or not parsing.is_text(text)):
        return None, None, 0
    return uid, text, 0


def load_text_dir(directory: str | os.PathLike, *, pattern: str = "*.txt",
                  max_examples_per_client: int | None = None, min_examples_per_client: int = 1,
                  seed: int = 0, cache_dir: str | os.PathLike | None = None,
                  use_cache: bool = True, progress: bool = True,
                  max_malformed: int | None = None) -> FederatedText:
    """Federated text from a directory of plain-text files, one file per user: client id = file
    name without extension, one example per non-blank line. A file that is not valid UTF-8, or
    whose name is not (so its client id would hold raw bytes) or is blank (``" .txt"``), is
    counted as one malformed record (and skipped). Two files with the same client id (``alice.txt``,
    ``alice.md``) are refused
    with :class:`MalformedDataError` rather than merged."""
    d = require_dir(directory, "text directory")
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

    def parse(progress: bool) -> Parsed:
        out = Parsed()
        for p in tqdm(files, desc=f"{d.name}", disable=not progress, leave=False):
            if not is_client_id(p.stem):  # an undecodable or blank file name
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
            # lines end at "\n" only (read_text already turned "\r\n" / "\r" into "\n"):
            # str.splitlines would also split on U+2028, U+0085, form feeds ... inside a line
            for line in content.split("\n"):
                if not line.strip():
                    continue
                out.records += 1
                out.clients[p.stem].append(normalize_whitespace(line))
        return out

    return load_federated("text_dir", files, {"pattern": pattern,
                                              "names": [p.name for p in files]}, parse,
                          **loader_settings(locals()))
