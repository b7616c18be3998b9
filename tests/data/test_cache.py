"""Cache files are written atomically under a unique temporary name per writer."""

import os

import pytest

from fedpriv.data import cache as cache_lib


def test_two_writers_of_one_entry_do_not_share_a_temporary_file(tmp_path):
    path = tmp_path / "tokenizers" / "spm-x.model"
    with cache_lib.atomic_file(path) as a:
        with cache_lib.atomic_file(path) as b:  # a second writer while the first is open
            assert a.name != b.name and os.path.dirname(a.name) == str(path.parent)
            a.write(b"first " * 1000)
            b.write(b"second")
        assert path.read_bytes() == b"second"  # b's complete write, untouched by a
    assert path.read_bytes() == b"first " * 1000  # then a's complete write: last one wins
    assert sorted(p.name for p in path.parent.iterdir()) == ["spm-x.model"]


def test_a_failed_write_leaves_no_temporary_file_and_keeps_the_old_entry(tmp_path):
    path = tmp_path / "entry.json"
    cache_lib.write_json_atomic(path, {"a": 1})
    with pytest.raises(RuntimeError):
        with cache_lib.atomic_file(path) as f:
            f.write(b"half")
            raise RuntimeError("disk full")
    assert cache_lib.read_json(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]
