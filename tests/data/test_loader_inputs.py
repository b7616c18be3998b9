"""Loaders never merge users and never fail with anything but a one-line data error (issue 24,
items 6 and "a property-based fuzzer over the loaders").

* Regression tests for the silent merges: a record with two ``"user"`` (or two text) keys,
  blank ids (``""``, ``" "``) in JSONL, chitchat, StackOverflow SQLite and text directories.
* ``BAD_INPUTS``: one case per bad input of a loader, each with the error class and the
  one-line message it must raise.
* Hypothesis fuzzers over JSONL (records and raw bytes), text directories and the TFF SQLite
  format: every input either loads -- every client id non-blank, valid text, and
  ``records == examples + malformed + filtered`` -- or raises a :class:`DataError` /
  ``ConfigError`` whose message is one line; never another exception. The JSONL fuzzer also
  checks the loaded clients against an independent reading of the generated records.
"""
from __future__ import annotations

import json
import pathlib
import sqlite3
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fedpriv.data import (
    EmptyCorpusError,
    MalformedDataError,
    MissingResourceError,
    load_chitchat,
    load_jsonl,
    load_simpsons,
    load_stackoverflow_sqlite,
    load_text_dir,
)
from fedpriv.data.errors import ConfigError, DataError, PathKindError
from fedpriv.data.text import normalize_whitespace

FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
NO_CACHE = dict(use_cache=False, progress=False)


def _write(path: pathlib.Path, data: bytes | str) -> pathlib.Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _so_example(tokens: str) -> bytes:
    from tensorflow_datasets.proto import tf_example_pb2, tf_feature_pb2
    feat = tf_feature_pb2.Feature(bytes_list=tf_feature_pb2.BytesList(value=[tokens.encode()]))
    return tf_example_pb2.Example(features=tf_feature_pb2.Features(
        feature={"tokens": feat})).SerializeToString()


_SO_SCHEMA = ("CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, "
              "serialized_example_proto BLOB NOT NULL);")


def _so_db(path: pathlib.Path, rows) -> pathlib.Path:
    """A TFF-format SQLite file; ``rows``: (split, client_id, blob); a client id given as
    ``("sql", expr)`` is inserted as that SQL expression (e.g. invalid UTF-8 TEXT)."""
    with sqlite3.connect(path) as con:
        con.executescript(_SO_SCHEMA)
        for split, cid, blob in rows:
            if isinstance(cid, tuple):
                con.execute(f"INSERT INTO examples VALUES (?, {cid[1]}, ?)", (split, blob))
            else:
                con.execute("INSERT INTO examples VALUES (?, ?, ?)", (split, cid, blob))
    return path


def _one_line(e: BaseException) -> str:
    msg = str(e)
    assert msg and "\n" not in msg, f"not a one-line message: {msg!r}"
    return msg


# --------------------------------------------------------------------------------------------
# Regression: silent merges (issue 24 item 6)
# --------------------------------------------------------------------------------------------

def test_jsonl_duplicate_user_key_is_malformed_not_the_last_one(tmp_path):
    """``{"user": "alice", "user": "bob", ...}``: json keeps "bob" silently; which user wrote
    the text is ambiguous, so the record is malformed (also for a doubled text key)."""
    p = _write(tmp_path / "d.jsonl",
               b'{"user": "alice", "user": "bob", "text": "whose is this"}\n'
               b'{"user": "carol", "text": "first", "text": "second"}\n'
               b'{"user": "bob", "text": "bob alone", "meta": 1, "meta": 2}\n')
    c = load_jsonl(p, **NO_CACHE)
    assert dict(c) == {"bob": ["bob alone"]}  # a doubled unrelated key is harmless
    assert (c.stats.records, c.stats.malformed) == (3, 2)
    assert c.stats.extra["duplicate_key_lines"] == 2


@pytest.mark.parametrize("blank", ['""', '" "', '"\\t\\n"', '"\\u00a0"'])
def test_jsonl_blank_user_ids_are_malformed_not_one_client(tmp_path, blank):
    p = _write(tmp_path / "b.jsonl", f'{{"user": {blank}, "text": "secret of one user"}}\n'
                                     f'{{"user": {blank}, "text": "secret of another"}}\n'
                                     '{"user": null, "text": "null id"}\n'
                                     '{"user": "ok", "text": "kept"}\n')
    c = load_jsonl(p, **NO_CACHE)
    assert dict(c) == {"ok": ["kept"]} and c.stats.malformed == 3


def test_jsonl_user_key_equal_to_text_key_is_refused(tmp_path):
    p = _write(tmp_path / "k.jsonl", '{"x": "a"}\n')
    with pytest.raises(ConfigError, match="user_key and text_key are both 'x'"):
        load_jsonl(p, user_key="x", text_key="x", **NO_CACHE)


def test_chitchat_blank_and_doubled_senders_are_malformed(tmp_path):
    raw = ('{"c1": {"messages": [[{"text": "a", "sender": " "}, {"text": "b", "sender": ""},'
           ' {"text": "c", "sender": "u1", "sender": "u2"}, {"text": "d", "sender": "u1"}]]},'
           ' "c2": {"messages": [[{"text": "e", "sender": "u2"}]]},'
           ' "c2": {"messages": [[{"text": "f", "sender": "u3"}]]}}')
    c = load_chitchat(path=_write(tmp_path / "chat.json", raw), **NO_CACHE)
    # the repeated conversation id keeps both conversations (it is not a user id)
    assert dict(c) == {"u1": ["d"], "u2": ["e"], "u3": ["f"]}
    assert (c.stats.records, c.stats.malformed) == (6, 3)
    assert c.stats.extra["conversations"] == 3


def test_stackoverflow_blank_client_ids_are_malformed(tmp_path):
    db = _so_db(tmp_path / "so.sqlite", [("train", "", _so_example("one")),
                                         ("train", "  ", _so_example("two")),
                                         ("train", "u1", _so_example("three"))])
    c = load_stackoverflow_sqlite(db, **NO_CACHE)
    assert dict(c) == {"u1": ["three"]} and c.stats.malformed == 2


def test_text_dir_blank_file_name_is_malformed(tmp_path):
    _write(tmp_path / " .txt", "a line of someone\n")
    _write(tmp_path / "eve.txt", "fine line\n")
    c = load_text_dir(tmp_path, **NO_CACHE)
    assert c.client_ids == ("eve",) and c.stats.malformed == 1


# --------------------------------------------------------------------------------------------
# Bad inputs: each with its expected one-line message
# --------------------------------------------------------------------------------------------

def _jsonl_case(content, **kw):
    return lambda d: load_jsonl(_write(d / "in.jsonl", content), **NO_CACHE, **kw)


def _text_dir_case(files: dict, **kw):
    def run(d):
        sub = d / "users"
        sub.mkdir()
        for name, data in files.items():
            _write(sub / name, data)
        return load_text_dir(sub, **NO_CACHE, **kw)
    return run


def _so_case(rows, split="train", **kw):
    return lambda d: load_stackoverflow_sqlite(_so_db(d / "so.sqlite", rows), split,
                                               **NO_CACHE, **kw)


def _chitchat_case(content, **kw):
    return lambda d: load_chitchat(path=_write(d / "chat.json", content), **NO_CACHE, **kw)


def _simpsons_case(quotes, table=True):
    def run(d):
        db = d / "popquotes.sqlite"
        with sqlite3.connect(db) as con:
            if table:
                con.execute("CREATE TABLE quotes (quoteid INTEGER PRIMARY KEY, library VARCHAR, "
                            "quote TEXT)")
                con.executemany("INSERT INTO quotes (library, quote) VALUES ('simpsons', ?)",
                                [(q,) for q in quotes])
            else:
                con.execute("CREATE TABLE other (x)")
        return load_simpsons(path=db, **NO_CACHE)
    return run


def _dir_as_file(loader):
    def run(d):
        (d / "adir").mkdir()
        return loader(d / "adir")
    return run


_OK = b'{"user": "u", "text": "fine"}\n'
_REC = lambda u, t: json.dumps({"user": u, "text": t}).encode() + b"\n"

BAD_INPUTS = [
    # ---- JSONL
    ("jsonl-missing", lambda d: load_jsonl(d / "nope.jsonl", **NO_CACHE), MissingResourceError,
     r"^JSONL file '.*nope\.jsonl' not found; check the path"),
    ("jsonl-directory", _dir_as_file(lambda p: load_jsonl(p, **NO_CACHE)),
     PathKindError, r"^JSONL file '.*adir' is a directory, not a file"),  # was "not found" (issue 54)
    ("jsonl-empty", _jsonl_case(b""), EmptyCorpusError, r"^jsonl: no examples left .*\(0 records"),
    ("jsonl-blank-lines", _jsonl_case(b"\n  \n\t\n"), EmptyCorpusError, r"\(0 records, 0 malformed"),
    ("jsonl-not-json", _jsonl_case(b"not json\n{\n"), EmptyCorpusError, r"\(2 records, 2 malformed"),
    ("jsonl-arrays", _jsonl_case(b'["u", "t"]\n[1]\n'), EmptyCorpusError, r"2 malformed"),
    ("jsonl-scalars", _jsonl_case(b'1\n"x"\nnull\n'), EmptyCorpusError, r"3 malformed"),
    ("jsonl-null-ids", _jsonl_case(_REC(None, "a") + _REC(None, "b")), EmptyCorpusError,
     r"2 malformed"),
    ("jsonl-empty-ids", _jsonl_case(_REC("", "a") + _REC("", "b")), EmptyCorpusError,
     r"2 malformed"),
    ("jsonl-whitespace-ids", _jsonl_case(_REC(" ", "a") + _REC("\t", "b")), EmptyCorpusError,
     r"2 malformed"),
    ("jsonl-dup-user-key", _jsonl_case(b'{"user": "a", "user": "b", "text": "t"}\n'),
     EmptyCorpusError, r"1 malformed"),
    ("jsonl-dup-text-key", _jsonl_case(b'{"user": "a", "text": "t", "text": "u"}\n'),
     EmptyCorpusError, r"1 malformed"),
    ("jsonl-object-ids", _jsonl_case(_REC({"id": 1}, "a") + _REC([1], "b")), EmptyCorpusError,
     r"2 malformed"),
    ("jsonl-nonstring-text", _jsonl_case(_REC("a", 5) + _REC("a", None) + _REC("a", ["x"])),
     EmptyCorpusError, r"3 malformed"),
    ("jsonl-missing-keys", _jsonl_case(b'{"name": "a", "body": "b"}\n'), EmptyCorpusError,
     r"1 malformed"),
    ("jsonl-whitespace-texts", _jsonl_case(_REC("a", "  ") + _REC("b", "\n")), EmptyCorpusError,
     r"2 filtered"),
    ("jsonl-deep-nesting", _jsonl_case(b"[" * 100_000 + b"]" * 100_000 + b"\n"),
     EmptyCorpusError, r"1 malformed"),
    ("jsonl-invalid-utf8", _jsonl_case(b'{"user": "\xff", "text": "x"}\n'), EmptyCorpusError,
     r"1 malformed"),
    ("jsonl-number-string-collision", _jsonl_case(_REC(3, "a") + _REC("3", "b")),
     MalformedDataError, r"^jsonl: user id '3' appears both as a number and as a string .*lines 1 and 2"),
    ("jsonl-max-malformed", _jsonl_case(_OK + b"garbage\n", max_malformed=0), MalformedDataError,
     r"^jsonl: 1 malformed records out of 2 in .*\(max_malformed=0\)$"),
    ("jsonl-min-examples", _jsonl_case(_OK, min_examples_per_client=2), EmptyCorpusError,
     r"1 clients dropped"),
    ("jsonl-same-keys", _jsonl_case(_OK, user_key="k", text_key="k"), ConfigError,
     r"^load_jsonl: user_key and text_key are both 'k'"),
    ("jsonl-empty-user-key", _jsonl_case(_OK, user_key=""), ConfigError,
     r"^load_jsonl: user_key must be a non-empty string, got ''$"),
    ("jsonl-nonstring-text-key", _jsonl_case(_OK, text_key=None), ConfigError,
     r"^load_jsonl: text_key must be a non-empty string, got None$"),
    # ---- text directories
    ("text_dir-missing", lambda d: load_text_dir(d / "nope", **NO_CACHE), MissingResourceError,
     r"^text directory '.*nope' not found"),
    ("text_dir-a-file", lambda d: load_text_dir(_write(d / "f.txt", "x"), **NO_CACHE),
     PathKindError, r"^text directory '.*f\.txt' is a file, not a directory"),
    ("text_dir-no-files", _text_dir_case({"a.md": "x"}), EmptyCorpusError,
     r"^text_dir: no files matching '\*\.txt' in "),
    ("text_dir-two-files-one-id", _text_dir_case({"al.txt": "x", "al.md": "y"}, pattern="al.*"),
     MalformedDataError, r"^text_dir: client id 'al' would come from 2 files .*al\.md, al\.txt"),
    ("text_dir-empty-files", _text_dir_case({"a.txt": "", "b.txt": "\n \n"}), EmptyCorpusError,
     r"^text_dir: no examples left .*\(0 records"),
    ("text_dir-invalid-utf8", _text_dir_case({"a.txt": b"\xff\xfe", "b.txt": b"caf\xe9"}),
     EmptyCorpusError, r"\(2 records, 2 malformed"),
    ("text_dir-blank-name", _text_dir_case({" .txt": "a line"}), EmptyCorpusError,
     r"\(1 records, 1 malformed"),
    ("text_dir-max-malformed", _text_dir_case({"a.txt": b"\xff", "b.txt": "ok"}, max_malformed=0),
     MalformedDataError, r"^text_dir: 1 malformed records out of 2 .*\(max_malformed=0\)$"),
    # ---- StackOverflow (TFF SQLite)
    ("so-missing", lambda d: load_stackoverflow_sqlite(d / "no.sqlite", **NO_CACHE),
     MissingResourceError, r"^StackOverflow SQLite file '.*no\.sqlite' not found"),
    ("so-not-sqlite", lambda d: load_stackoverflow_sqlite(_write(d / "x.sqlite", b"garbage" * 200),
                                                          **NO_CACHE),
     MalformedDataError, r"^stackoverflow: cannot read .*x\.sqlite: file is not a database"),
    ("so-no-examples-table", lambda d: load_stackoverflow_sqlite(_so_other(d), **NO_CACHE),
     MalformedDataError,
     r"^stackoverflow: .* has no `examples` table \(tables: \['other'\]\); not a TFF SQLite file"),
    ("so-bad-lzma", lambda d: load_stackoverflow_sqlite(_write(d / "s.sqlite.lzma", b"nope"),
                                                        cache_dir=d / "c", **NO_CACHE),
     MalformedDataError, r"^.*s\.sqlite\.lzma is not a valid \.lzma file"),
    ("so-empty-split", _so_case([("train", "u", _so_example("x"))], split="test"),
     EmptyCorpusError, r"^stackoverflow_test: no examples left .*\(0 records"),
    ("so-blank-ids", _so_case([("train", "", _so_example("x")), ("train", " ", _so_example("y"))]),
     EmptyCorpusError, r"\(2 records, 2 malformed"),
    ("so-blob-ids", _so_case([("train", b"u1", _so_example("x")),
                              ("train", b"", _so_example("y"))]),
     EmptyCorpusError, r"\(2 records, 2 malformed"),
    ("so-invalid-utf8-id", _so_case([("train", ("sql", "CAST(x'ff' AS TEXT)"), _so_example("x"))]),
     EmptyCorpusError, r"\(1 records, 1 malformed"),
    ("so-not-examples", _so_case([("train", "u", b"\x08\x96\x01junk"), ("train", "u", b"")]),
     EmptyCorpusError, r"\(2 records, 2 malformed"),
    ("so-max-malformed", _so_case([("train", "u", _so_example("x")), ("train", "", b"")],
                                  max_malformed=0),
     MalformedDataError, r"^stackoverflow_train: 1 malformed records out of 2 .*max_malformed=0"),
    # ---- chitchat (a file in the package's format)
    ("chitchat-missing", lambda d: load_chitchat(path=d / "none.json", **NO_CACHE),
     MissingResourceError, r"^chitchat JSON '.*none\.json' not found"),
    ("chitchat-invalid-utf8", _chitchat_case(b'{"c": "\xff"}'), MalformedDataError,
     r"^chitchat: .*chat\.json is not valid UTF-8 JSON"),
    ("chitchat-not-json", _chitchat_case("{nope"), MalformedDataError,
     r"^chitchat: .*chat\.json is not valid JSON: "),
    ("chitchat-deep-nesting", _chitchat_case("[" * 100_000 + "]" * 100_000), MalformedDataError,
     r"^chitchat: .* is not valid JSON: JSON nested too deeply$"),
    ("chitchat-a-list", _chitchat_case("[]"), MalformedDataError,
     r"^chitchat: .* must hold a JSON object of conversations$"),
    ("chitchat-blank-senders", _chitchat_case(
        '{"c": {"messages": [[{"text": "a", "sender": ""}, {"text": "b", "sender": "  "}]]}}'),
     EmptyCorpusError, r"^chitchat: no examples left .*\(2 records, 2 malformed"),
    ("chitchat-doubled-sender", _chitchat_case(
        '{"c": {"messages": [[{"text": "a", "sender": "x", "sender": "y"}]]}}'),
     EmptyCorpusError, r"\(1 records, 1 malformed"),
    ("chitchat-doubled-messages", _chitchat_case(
        '{"c": {"messages": [[{"text": "a", "sender": "x"}]], "messages": []}}'),
     EmptyCorpusError, r"\(1 records, 1 malformed"),
    # ---- Simpsons (popquotes format)
    ("simpsons-no-table", _simpsons_case([], table=False), MalformedDataError,
     r"^simpsons: cannot read table `quotes` of .*: no such table: quotes$"),
    ("simpsons-no-speakers", _simpsons_case(["no prefix", ": empty speaker", "[x]: y"]),
     EmptyCorpusError, r"^simpsons: no examples left .*\(3 records, 3 malformed"),
    ("simpsons-missing", lambda d: load_simpsons(path=d / "none.sqlite", **NO_CACHE),
     MissingResourceError, r"^popquotes sqlite '.*none\.sqlite' not found"),
]


def _so_other(d: pathlib.Path) -> pathlib.Path:
    db = d / "other.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE other (x)")
    return db


@pytest.mark.parametrize("run, exc, match", [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input(tmp_path, run, exc, match):
    with pytest.raises(exc, match=match) as info:
        run(tmp_path)
    _one_line(info.value)


# --------------------------------------------------------------------------------------------
# Fuzzers
# --------------------------------------------------------------------------------------------

def _check_loaded(c) -> None:
    """Invariants of every successful load (no cap, min_examples_per_client=1)."""
    ids = list(c.client_ids)
    assert len(set(ids)) == len(ids)
    for cid in ids:
        assert isinstance(cid, str) and cid.strip() and cid.encode("utf-8")
        assert c[cid] and all(isinstance(t, str) and t == normalize_whitespace(t) and t
                              for t in c[cid])
    st_ = c.stats
    assert st_.records == st_.examples + st_.malformed + st_.filtered
    assert st_.examples == sum(len(c[cid]) for cid in ids) and st_.capped == 0


_ID = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                st.sampled_from(["", " ", "\t", "\u00a0", "\udc80", "a", "b", "1", "a ", "é"]),
                st.text(max_size=3), st.lists(st.integers(), max_size=1))
_TEXT = st.one_of(st.none(), st.integers(), st.sampled_from(["", "  ", "\udc80 x", "hi  there"]),
                  st.text(max_size=8))
_RECORD = st.tuples(_ID, _TEXT, st.booleans(), st.booleans())   # user, text, dup user, dup text
_LINE = st.one_of(st.tuples(st.just("raw"), st.binary(max_size=30).filter(lambda b: b"\n" not in b)),
                  st.tuples(st.just("rec"), _RECORD))


def _encode_record(user, text, dup_user, dup_text) -> bytes:
    parts = [f'"user": {json.dumps(user)}', f'"text": {json.dumps(text)}']
    if dup_user:
        parts.insert(0, '"user": "someone else"')
    if dup_text:
        parts.append('"text": "another text"')
    return ("{" + ", ".join(parts) + "}").encode("utf-8")


def _valid_text(s) -> bool:
    """A str that encodes as UTF-8 (no lone surrogates)."""
    if not isinstance(s, str):
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@FUZZ
@given(lines=st.lists(_LINE, max_size=12))
def test_fuzz_jsonl(lines):
    """Arbitrary JSONL: loads exactly the valid records' users and texts (an independent
    reading of the generated records), or raises a one-line data error -- nothing else."""
    body, expected, kinds, collision = [], {}, {}, False
    records = 0
    for kind, x in lines:
        raw = x if kind == "raw" else _encode_record(*x)
        body.append(raw)
        if not raw.strip():
            continue
        records += 1
        if kind == "raw":
            continue
        user, text, dup_user, dup_text = x
        ok_id = ((_valid_text(user) and user.strip() != "")
                 or (isinstance(user, int) and not isinstance(user, bool)))
        if dup_user or dup_text or not ok_id or not _valid_text(text):
            continue
        cid = str(user)
        collision |= kinds.setdefault(cid, type(user)) is not type(user)
        if normalize_whitespace(text):
            expected.setdefault(cid, []).append(normalize_whitespace(text))
    with tempfile.TemporaryDirectory() as d:
        p = _write(pathlib.Path(d) / "f.jsonl", b"\n".join(body) + b"\n")
        try:
            c = load_jsonl(p, **NO_CACHE)
        except (DataError, ConfigError) as e:
            _one_line(e)
            raw_lines_ok = any(k == "raw" for k, _ in lines)
            assert collision or not expected or raw_lines_ok, (type(e), str(e))
            if isinstance(e, MalformedDataError):
                assert "appears both as a number and as a string" in str(e)
            return
    _check_loaded(c)
    assert c.stats.records == records
    if not any(k == "raw" for k, _ in lines):  # raw bytes are (almost surely) malformed lines
        assert not collision and dict(c) == expected


_NAME = st.sampled_from(["a", "b", "c d", " ", "\t", "é", "x.y", "-", "_"])


@FUZZ
@given(files=st.dictionaries(_NAME, st.one_of(st.binary(max_size=40), st.text(max_size=40)),
                             max_size=5))
def test_fuzz_text_dir(files):
    with tempfile.TemporaryDirectory() as d:
        for name, data in files.items():
            _write(pathlib.Path(d) / f"{name}.txt", data)
        try:
            c = load_text_dir(d, **NO_CACHE)
        except DataError as e:
            _one_line(e)
            return
    _check_loaded(c)
    assert set(c.client_ids) <= {n for n in files if n.strip()}


_SO_ID = st.one_of(st.sampled_from(["", " ", "u1", "u2", "U1", "u1 "]), st.integers(0, 2),
                   st.binary(max_size=3),
                   st.just(("sql", "CAST(x'ff' AS TEXT)")))
_SO_BLOB = st.one_of(st.binary(max_size=20),
                     st.sampled_from(["q one", "  ", "two words", "x"]).map(_so_example))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.sampled_from(["train", "test"]), _SO_ID, _SO_BLOB), max_size=8))
def test_fuzz_stackoverflow_sqlite(rows):
    with tempfile.TemporaryDirectory() as d:
        db = _so_db(pathlib.Path(d) / "so.sqlite", rows)
        try:
            c = load_stackoverflow_sqlite(db, "train", **NO_CACHE)
        except DataError as e:
            _one_line(e)
            return
    _check_loaded(c)
    assert c.stats.records == sum(1 for r in rows if r[0] == "train")
    # (an integer id becomes TEXT by the column's affinity; a BLOB id stays a BLOB: malformed)
    assert set(c.client_ids) <= {str(r[1]) for r in rows
                                 if isinstance(r[1], (str, int)) and str(r[1]).strip()}
