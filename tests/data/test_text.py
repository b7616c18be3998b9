"""Text-level utilities: sentence splitting, client splits, FederatedText, PublicCorpus."""

import numpy as np
import pytest

from fedpriv.data import (
    EmptyClientError,
    EmptyCorpusError,
    FederatedText,
    PublicCorpus,
    split_client_ids,
    split_sentences,
)


def test_split_sentences():
    assert split_sentences("Hello there. How are you? Fine!  ") == [
        "Hello there.", "How are you?", "Fine!"]
    assert split_sentences('He said "Stop." Then he left.') == ['He said "Stop."', "Then he left."]
    assert split_sentences("Mr. Smith met Dr. Jones in St. Louis. Nice.") == [
        "Mr. Smith met Dr. Jones in St. Louis.", "Nice."]
    assert split_sentences("e.g. this stays whole. 3 cats came.") == [
        "e.g. this stays whole.", "3 cats came."]
    assert split_sentences("   ") == []


def test_split_client_ids_deterministic_and_disjoint():
    ids = [f"c{i:03d}" for i in range(103)]
    a = split_client_ids(ids, (0.8, 0.1, 0.1), seed=7)
    b = split_client_ids(list(reversed(ids)), (0.8, 0.1, 0.1), seed=7)   # order-independent
    c = split_client_ids(ids, (0.8, 0.1, 0.1), seed=8)
    assert a == b and a != c
    assert [len(g) for g in a] == [83, 10, 10]
    assert sorted(sum(a, [])) == ids
    with pytest.raises(ValueError, match="gets no client"):
        split_client_ids(ids[:3], (0.98, 0.01, 0.01), seed=0)
    with pytest.raises(ValueError, match="non-negative"):
        split_client_ids(ids, (1.0, -0.5), seed=0)


def test_federated_text_mapping_and_transforms():
    ft = FederatedText({"b": ["x y", "z"], "a": ["hello"], "c": []}, name="toy")
    assert ft.client_ids == ("a", "b") and len(ft) == 2 and "c" not in ft
    assert ft.dropped == {"c": "no examples after filtering"}
    with pytest.raises(EmptyClientError, match="'c' has no examples"):
        ft["c"]
    with pytest.raises(KeyError):
        ft["zzz"]
    assert ft.num_examples("b") == 2 and ft.total_examples == 3
    assert ft.texts() == ["hello", "x y", "z"]
    np.testing.assert_array_equal(ft.examples_per_client(), [1, 2])
    short = ft.filter(lambda t: len(t) > 1)
    assert short.client_ids == ("a", "b") and short["b"] == ["x y"]
    only_b = ft.filter(lambda t: " " in t)
    assert only_b.client_ids == ("b",) and "a" in only_b.dropped
    capped = FederatedText({"a": [str(i) for i in range(10)]}).cap(3, seed=0)
    assert len(capped["a"]) == 3 and capped["a"] == sorted(capped["a"], key=int)
    assert FederatedText({"a": [str(i) for i in range(10)]}).cap(3)["a"] == ["0", "1", "2"]
    with pytest.raises(EmptyCorpusError):
        FederatedText({"a": []})
    with pytest.raises(EmptyCorpusError):
        ft.filter(lambda t: False)


def test_federated_text_split_by_client():
    ft = FederatedText({f"u{i}": [f"text {i}"] * (i + 1) for i in range(20)})
    tr, va, te = ft.split_by_client((0.6, 0.2, 0.2), seed=3)
    assert (len(tr), len(va), len(te)) == (12, 4, 4)
    assert not set(tr) & set(va) and not set(va) & set(te)
    tr2, _, _ = ft.split_by_client((0.6, 0.2, 0.2), seed=3)
    assert tr.client_ids == tr2.client_ids


def test_public_corpus():
    pc = PublicCorpus(["a b c", "d e f", "g h i"], ["wiki", "news", "wiki"],
                      ["wiki/A", "news/1", "wiki/B"])
    assert len(pc) == 3 and pc[1] == "d e f"
    assert pc.source_counts() == {"wiki": 2, "news": 1}
    assert pc.by_source("wiki") == ["a b c", "g h i"]
    assert pc.as_federated("source")["wiki"] == ["a b c", "g h i"]
    assert pc.as_federated("doc").client_ids == ("news/1", "wiki/A", "wiki/B")
    with pytest.raises(KeyError, match="no source"):
        pc.by_source("reddit")
    with pytest.raises(ValueError):
        PublicCorpus(["a"], [])
    with pytest.raises(EmptyCorpusError):
        PublicCorpus([], [])
