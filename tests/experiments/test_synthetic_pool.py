"""The committed synthetic public pool is what its sidecar and its FreD summary say it is, the
experiment reads a pool as the public pool reads any text, and refuses a bad --pool (exit 2)."""
import hashlib
import json
import lzma
import os

import pytest

from experiments import synthetic_pool as SP

HERE = os.path.dirname(SP.POOL)


def test_committed_pool_matches_its_sidecar_and_summary():
    with open(SP.POOL, "rb") as f:
        blob = f.read()
    text = lzma.decompress(blob)
    meta = json.load(open(os.path.join(HERE, "smollm2_chat.txt.json")))
    summary = json.load(open(os.path.join(HERE, "synthetic_pool.json")))
    lines = text.decode("utf-8").splitlines()
    assert meta["complete"] and meta["bytes"] == len(text) and meta["written"] == len(lines) >= 100_000
    assert all(line.strip() for line in lines)
    assert summary["stats"]["pool_sha256"] == hashlib.sha256(blob).hexdigest()
    assert summary["stats"]["messages"] == len(lines) and summary["stats"]["sentences"] >= len(lines)


def test_pool_sentences_split_and_filter_like_the_public_pool(tmp_path):
    pool = tmp_path / "p.txt.xz"
    pool.write_bytes(lzma.compress(b"Hi there. How was your weekend, my friend?\nok\n\n12345 678 90 12.\n"))
    sentences, messages = SP.pool_sentences(str(pool), tmp_path)
    assert messages == 3  # the blank line is no message
    assert list(sentences) == ["How was your weekend, my friend?"]  # < 3 words and mostly digits: filtered


@pytest.mark.parametrize("argv", [["--pool", "missing.txt.xz"], ["--pool", __file__], ["--seeds", "0"]])
def test_bad_input_exits_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        SP.main(argv)
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
