"""Loaders of original-format data (TFF StackOverflow SQLite, JSONL, per-user text files) on
tiny fixtures in exactly those formats."""

import lzma
import pathlib
import sqlite3

import pytest

from fedpriv.data import (
    EmptyClientError,
    EmptyCorpusError,
    MalformedDataError,
    MissingResourceError,
    WordTokenizer,
    load_chitchat,
    load_jsonl,
    load_stackoverflow_sqlite,
    load_text_dir,
)

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "data"

# TFF's schema (tensorflow_federated sql_client_data / stackoverflow.sqlite.lzma).
_SCHEMA = """
CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL,
                       serialized_example_proto BLOB NOT NULL);
CREATE INDEX idx_examples_client_id ON examples (client_id);
CREATE INDEX idx_examples_client_id_split ON examples (split_name, client_id);
CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name TEXT NOT NULL,
                              num_examples INTEGER NOT NULL);
CREATE INDEX idx_metadata_client_id ON client_metadata (client_id);
"""


def _so_example(tokens: str, title: str = "a title", kind: str = "question") -> bytes:
    """A serialized tf.train.Example with StackOverflow's features."""
    from tensorflow_datasets.proto import tf_example_pb2, tf_feature_pb2

    def b(v: str):
        return tf_feature_pb2.Feature(bytes_list=tf_feature_pb2.BytesList(value=[v.encode()]))

    feats = {"tokens": b(tokens), "title": b(title), "tags": b("python|numpy"),
             "type": b(kind), "creation_date": b("2010-01-01 00:00:00.0+00:00"),
             "score": tf_feature_pb2.Feature(int64_list=tf_feature_pb2.Int64List(value=[3]))}
    return tf_example_pb2.Example(
        features=tf_feature_pb2.Features(feature=feats)).SerializeToString()


@pytest.fixture(scope="module")
def so_sqlite(tmp_path_factory):
    path = tmp_path_factory.mktemp("so") / "stackoverflow.sqlite"
    rows = [
        ("train", "00000001", _so_example("how do i sort a list in python ?")),
        ("train", "00000001", _so_example("use sorted ( ) .", kind="answer")),
        ("train", "00000002", _so_example("what is a numpy array ?")),
        ("train", "00000002", b"\x08\x96\x01garbage-not-an-example"),          # malformed
        ("train", "00000003", _so_example("   ")),                             # filtered
        ("heldout", "00000004", _so_example("held out sentence .")),
        ("test", "00000005", _so_example("test sentence one .")),
        ("test", "00000005", _so_example("test sentence two .")),
    ]
    with sqlite3.connect(path) as con:
        con.executescript(_SCHEMA)
        con.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
        meta = {}
        for split, cid, _ in rows:
            meta[(cid, split)] = meta.get((cid, split), 0) + 1
        con.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)",
                        [(c, s, n) for (c, s), n in meta.items()])
    return path


def test_stackoverflow_sqlite(so_sqlite):
    train = load_stackoverflow_sqlite(so_sqlite, "train", progress=False, use_cache=False)
    assert train.client_ids == ("00000001", "00000002")
    assert train["00000001"] == ["how do i sort a list in python ?", "use sorted ( ) ."]
    st = train.stats
    assert (st.records, st.malformed, st.filtered) == (5, 1, 1)
    assert train.dropped == {"00000003": train.dropped["00000003"]}
    with pytest.raises(EmptyClientError, match="00000003"):
        train["00000003"]
    test = load_stackoverflow_sqlite(so_sqlite, "test", progress=False, use_cache=False)
    assert test["00000005"] == ["test sentence one .", "test sentence two ."]
    held = load_stackoverflow_sqlite(so_sqlite, "heldout", progress=False, field="title",
                                     use_cache=False)
    assert held["00000004"] == ["a title"]
    first = load_stackoverflow_sqlite(so_sqlite, "train", max_clients=1, progress=False,
                                      use_cache=False)
    assert first.client_ids == ("00000001",)
    with pytest.raises(MalformedDataError, match="malformed"):
        load_stackoverflow_sqlite(so_sqlite, "train", max_malformed=0, progress=False,
                                  use_cache=False)
    with pytest.raises(EmptyCorpusError):
        load_stackoverflow_sqlite(so_sqlite, "no_such_split", progress=False, use_cache=False)


def test_stackoverflow_lzma_and_cache(so_sqlite, tmp_path):
    xz = tmp_path / "stackoverflow.sqlite.lzma"
    xz.write_bytes(lzma.compress(so_sqlite.read_bytes(), format=lzma.FORMAT_ALONE))
    a = load_stackoverflow_sqlite(xz, progress=False, cache_dir=tmp_path / "c")
    b = load_stackoverflow_sqlite(xz, progress=False, cache_dir=tmp_path / "c")
    assert not a.stats.cache_hit and b.stats.cache_hit and dict(a) == dict(b)
    # The word-level vocabulary of the user data (StackOverflow's tokens are space-separated).
    tok = WordTokenizer.fit(a.texts(), k=5)
    assert tok.vocab_size == 9 and tok.words[0] == "?"


def test_stackoverflow_not_tff(tmp_path):
    bad = tmp_path / "other.sqlite"
    with sqlite3.connect(bad) as con:
        con.execute("CREATE TABLE foo (x)")
    with pytest.raises(MalformedDataError, match="examples"):
        load_stackoverflow_sqlite(bad, use_cache=False, progress=False)
    with pytest.raises(MissingResourceError):
        load_stackoverflow_sqlite(tmp_path / "missing.sqlite")


def test_jsonl_fixture():
    c = load_jsonl(FIXTURES / "users.jsonl", use_cache=False, progress=False)
    assert c.client_ids == ("42", "alice", "bob", "dave")
    assert c["alice"] == ["Hello there, how are you?", "I am going to the market today."]
    assert (c.stats.records, c.stats.malformed, c.stats.filtered) == (9, 3, 1)
    assert c.total_examples == 5


def test_jsonl_cap_is_seeded_and_cached(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("".join(f'{{"user": "u{i % 2}", "text": "line {i}"}}\n' for i in range(40)))
    a = load_jsonl(path, max_examples_per_client=5, seed=1, progress=False)
    b = load_jsonl(path, max_examples_per_client=5, seed=1, progress=False)
    c = load_jsonl(path, max_examples_per_client=5, seed=2, progress=False)
    assert b.stats.cache_hit and not c.stats.cache_hit
    assert dict(a) == dict(b) and dict(a) != dict(c)
    assert a.stats.capped == 30 and all(len(v) == 5 for v in a.values())
    # Kept examples stay in file order.
    nums = [int(t.split()[1]) for t in a["u0"]]
    assert nums == sorted(nums)
    # A changed file is a new cache key.
    path.write_text(path.read_text() + '{"user": "u9", "text": "new"}\n')
    d = load_jsonl(path, max_examples_per_client=5, seed=1, progress=False)
    assert not d.stats.cache_hit and "u9" in d


def test_jsonl_min_examples_and_custom_keys(tmp_path):
    path = tmp_path / "k.jsonl"
    path.write_text('{"uid": 1, "body": "a"}\n{"uid": 1, "body": "b"}\n{"uid": 2, "body": "c"}\n')
    c = load_jsonl(path, user_key="uid", text_key="body", min_examples_per_client=2,
                   use_cache=False, progress=False)
    assert c.client_ids == ("1",) and "2" in c.dropped
    with pytest.raises(EmptyClientError, match="'2'.*min_examples_per_client"):
        c["2"]


def test_text_dir_fixture():
    c = load_text_dir(FIXTURES / "user_texts", use_cache=False, progress=False)
    assert c.client_ids == ("erin", "frank")
    assert c["erin"] == ["first line of erin", "second line of erin"]
    with pytest.raises(EmptyClientError, match="gina"):
        c["gina"]
    with pytest.raises(KeyError):
        c["nobody"]


def test_text_dir_errors(tmp_path):
    with pytest.raises(MissingResourceError):
        load_text_dir(tmp_path / "nope")
    with pytest.raises(EmptyCorpusError, match="no files"):
        load_text_dir(tmp_path)
    (tmp_path / "x.txt").write_bytes(b"\xff\xfe\xfa not utf-8")
    (tmp_path / "y.txt").write_text("ok\n")
    c = load_text_dir(tmp_path, use_cache=False, progress=False)
    assert c.client_ids == ("y",) and c.stats.malformed == 1


def test_chitchat_malformed_fixture():
    c = load_chitchat(path=FIXTURES / "chitchat_malformed.json", use_cache=False, progress=False)
    assert c.client_ids == ("u1", "u2")
    assert c["u2"] == ["fine thanks", "bye"]
    st = c.stats
    assert (st.records, st.malformed, st.filtered, st.examples) == (9, 4, 1, 4)
    with pytest.raises(MalformedDataError):
        load_chitchat(path=FIXTURES / "chitchat_malformed.json", max_malformed=3,
                      use_cache=False, progress=False)


def test_all_malformed_is_empty_corpus(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n{}\n")
    with pytest.raises(EmptyCorpusError, match="2 malformed"):
        load_jsonl(path, use_cache=False, progress=False)
