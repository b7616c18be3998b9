"""The papers' own data on tiny fixtures in their formats, written here (never downloaded):
TFF StackOverflow SQLite, Reddit-style JSONL, a C4-like public text source (TFDS array_record
directory, .txt / .jsonl files) -- read by fedpriv.data.paper_corpora and wired into the LM
recipe (corpus=..., corpus_path, public_pool_path) and the privacy plans' population."""
import json
import sqlite3

import pytest

from experiments import common
from fedpriv.data import paper_corpora as pc
from fedpriv.data.errors import ConfigError, MalformedDataError
from fedpriv.recipes import lm, plans
from tests.data.test_formats import _SCHEMA, _so_example

SENTS = ["The market closed higher on Friday after the report.",
         "Officials said the new rules would take effect next year.",
         "The team won its third game in a row on Sunday night."]


@pytest.fixture(scope="module")
def so_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("so") / "stackoverflow.sqlite"
    rows = [("train", f"{u:08d}", _so_example(f"{SENTS[(u + i) % 3]} user {u}"))
            for u in range(1, 13) for i in range(3)]
    rows += [("heldout", "00000099", _so_example("held out sentence ."))]
    with sqlite3.connect(path) as con:
        con.executescript(_SCHEMA)
        con.executemany("INSERT INTO examples VALUES (?, ?, ?)", rows)
        meta = {}
        for split, cid, _ in rows:
            meta[(cid, split)] = meta.get((cid, split), 0) + 1
        con.executemany("INSERT INTO client_metadata VALUES (?, ?, ?)",
                        [(c, s, n) for (c, s), n in meta.items()])
    return path


@pytest.fixture(scope="module")
def reddit_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("reddit") / "RC_tiny.jsonl"
    recs = [{"author": f"user{u}", "body": f"{SENTS[(u + i) % 3]} comment {i}", "subreddit": "news"}
            for u in range(12) for i in range(3)]
    recs += [{"author": "[deleted]", "body": "gone gone gone"}] * 2
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return path


@pytest.fixture(scope="module")
def public_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("pub")
    (d / "a.txt").write_text(" ".join(SENTS) + "\n\n" + SENTS[0] + "\n")
    (d / "b.jsonl").write_text(json.dumps({"text": SENTS[1] + " " + SENTS[2], "url": "u"}) + "\n")
    return d


def test_stackoverflow_corpus_through_the_recipe_and_the_plan(so_path):
    cfg = common.load_config(f"configs/lm_fl.py:smoke,corpus=stackoverflow,corpus_path={so_path}")
    text = lm.load_corpus(cfg, progress=False)
    assert len(text.client_ids) == 12                       # train split only (heldout excluded)
    assert all(len(text[c]) == 3 for c in text.client_ids)
    # the plan's population is counted in the file: the real population, never a packaged count
    assert plans.corpus_clients("stackoverflow", so_path) == 12 == pc.count_users("stackoverflow", so_path)
    assert plans.lm_train_clients(cfg) == plans.split_sizes(12, cfg.split)[0]
    # Wang et al.'s Table 2 pipeline takes the same file (recipes.public reads lm.load_corpus)
    pt = common.load_config(f"configs/public_training.py:smoke,corpus=stackoverflow,corpus_path={so_path}")
    assert lm.load_corpus(pt, progress=False).client_ids == text.client_ids


def test_path_corpora_need_their_path_and_packaged_ones_refuse_one():
    with pytest.raises(ConfigError, match="needs corpus_path"):
        common.load_config("configs/lm_fl.py:smoke,corpus=stackoverflow")
    with pytest.raises(ConfigError, match="is packaged"):
        common.load_config("configs/lm_fl.py:smoke,corpus_path=/x.sqlite")


def test_reddit_jsonl_users_and_deleted_authors(reddit_path, tmp_path):
    text = pc.load_reddit_jsonl(reddit_path, progress=False)
    assert sorted(text.client_ids) == sorted(f"user{u}" for u in range(12))  # [deleted]: nobody
    assert all(len(text[c]) == 3 for c in text.client_ids)
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps({"author": "a", "body": "x y z", "user": "b", "text": "p q r"}) + "\n")
    with pytest.raises(MalformedDataError, match="author/body"):
        pc.load_reddit_jsonl(both, progress=False)             # ambiguous: refused, not guessed


def test_public_text_files(public_dir):
    pool = pc.load_public_text(public_dir, progress=False)
    assert sorted(set(pool.texts)) == sorted(SENTS)
    assert len(pool) == 6 and set(pool.sources) == {"a.txt", "b.jsonl"}


def test_public_text_tfds_array_record(tmp_path):
    """A C4-like TFDS directory (array_record, features text/url), read without TensorFlow."""
    import tensorflow_datasets as tfds

    class TinyC4(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version("3.1.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "url": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i, s in enumerate(SENTS):
                yield i, {"text": s + " " + s.replace("The", "A"), "url": f"http://x/{i}"}

    b = TinyC4(data_dir=str(tmp_path), file_format="array_record")
    b.download_and_prepare(download_config=tfds.download.DownloadConfig(
        compute_stats=tfds.download.ComputeStatsMode.SKIP))
    pool = pc.load_public_text(tmp_path, progress=False)     # finds the one dataset_info.json
    assert len(pool) == 6 and set(SENTS) <= set(pool.texts)
    assert len(pc.load_public_text(tmp_path, max_documents=1, progress=False)) == 2


def test_recipe_prepares_reddit_with_a_public_text_pool(reddit_path, public_dir):
    cfg = common.load_config(f"configs/lm_fl.py:smoke,corpus=reddit_jsonl,corpus_path={reddit_path},"
                             f"public_pool_path={public_dir},tokenizer=word_public,vocab_size=40")
    prep = lm.prepare_data(cfg, progress=False)
    assert prep.stats["corpus"] == "reddit_jsonl"
    assert prep.stats["train_clients"] + prep.stats["val_clients"] + prep.stats["test_clients"] == 12
    # the vocabulary is the public text's words, not the users'
    words = set(prep.tokenizer._itos)
    assert {"market", "officials"} & words and "comment" not in words
