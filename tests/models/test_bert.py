"""The Flax all-MiniLM-L6-v2 embedder on a fixed sentence set (no torch reference needed).

Reference cosines: the paraphrase-mining example of sentence-transformers, whose printed output
(4 decimals) was produced with all-MiniLM-L6-v2 ("The new movie is awesome" / "... so great":
0.8939, ...).  Matching all ten pairs to 1e-3 checks the weights, tokenizer, GELU, post-LN,
masked mean pooling and normalisation end to end.
"""

import shutil

import numpy as np
import pytest

from fedpriv.models import bert

SENTENCES = [
    "The cat sits outside",
    "A man is playing guitar",
    "I love pasta",
    "The new movie is awesome",
    "The cat plays in the garden",
    "A woman watches TV",
    "The new movie is so great",
    "Do you like pizza?",
]
# (i, j, cosine) as printed by sentence-transformers' paraphrase_mining example.
REFERENCE = [
    (3, 6, 0.8939),
    (0, 4, 0.6788),
    (2, 7, 0.5096),
    (2, 6, 0.2560),
    (2, 3, 0.2440),
    (1, 4, 0.2105),
    (3, 7, 0.1969),
    (6, 7, 0.1692),
    (0, 5, 0.1310),
    (4, 7, 0.0900),
]


@pytest.fixture(scope="module")
def embedder():
    return bert.load_embedder()


def test_reference_cosines(embedder):
    v = embedder.embed(SENTENCES, batch_size=8, progress=False)
    assert v.shape == (8, 384) and v.dtype == np.float32
    for i, j, ref in REFERENCE:
        assert abs(float(v[i] @ v[j]) - ref) < 1e-3, (SENTENCES[i], SENTENCES[j])


def test_properties(embedder):
    food, bread, movie = (
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The new movie is awesome.",
    )
    sents = [food, bread, movie, food, "Hello", "x " * 400]  # last one is truncated at 256
    v = embedder.embed(sents, batch_size=8, progress=False)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert np.all(np.isfinite(v))
    np.testing.assert_array_equal(v[0], v[3])  # same sentence, same call
    # measured: 0.755 (paraphrase) vs -0.046 (unrelated)
    assert v[0] @ v[1] > 0.7
    assert v[0] @ v[2] < 0.1
    # order, batch size and bucket composition do not change a sentence's vector
    w = embedder.embed(sents[-2::-1], batch_size=3, progress=False)[::-1]
    np.testing.assert_allclose(v[:-1], w, atol=2e-5)
    assert embedder.embed([], progress=False).shape == (0, 384)
    with pytest.raises(TypeError):
        embedder.embed("not a list")


def test_missing_package_names_make_setup():
    with pytest.raises(FileNotFoundError, match="make setup"):
        bert.find_model_dir("no_such_embedder_package_xyz")


def test_vocab_txt_tokenizer_matches_tokenizer_json(tmp_path):
    src = bert.find_model_dir()
    shutil.copy(src / "vocab.txt", tmp_path / "vocab.txt")
    from_vocab = bert.load_tokenizer(tmp_path, 256)
    from_json = bert.load_tokenizer(src, 256)
    for s in SENTENCES + ["Héllo, WORLD!! unbelievably-tokenised text 123"]:
        assert from_vocab.encode(s).ids == from_json.encode(s).ids


def test_pipeline_config_is_checked(tmp_path):
    bert.check_pipeline_config(bert.find_model_dir())  # the shipped one: mean pooling
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        '{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}')
    with pytest.raises(ValueError, match="mean pooling"):
        bert.check_pipeline_config(tmp_path)
