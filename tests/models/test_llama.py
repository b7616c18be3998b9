"""Tests for the teacher LLM (fedpriv.models.llama, .gguf, .bucketing): parity on the real packaged GGUF, tokenizer,
bucketed batching, and the rotary-permutation bookkeeping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.models import bucketing, gguf, llama
from tests import oracles

PARITY_SENTENCE = "The capital of France is Paris. It is known for the Eiffel Tower and"
# Perplexity of PARITY_SENTENCE without BOS (its 16 tokens, 15 of them scored): 7.696 measured.
PARITY_PPL = 7.7

TINY = llama.LlamaConfig(vocab_size=50, dim=16, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn_dim=24, rope_base=1e4, norm_eps=1e-5)


@pytest.fixture(scope="session")
def teacher():
    # No skip: `make setup` installs the teacher, so a missing file is a broken set-up (the
    # error names `make setup`).
    return gguf.cached_teacher()


def test_config_from_gguf_metadata(teacher):
    c = teacher.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim) == (30, 576, 9, 3, 1536)
    assert c.vocab_size == 49152 and c.rope_base == 1e5 and c.tie_embeddings
    assert teacher.params["layers"]["wq"].shape == (30, 576, 576)
    assert teacher.params["layers"]["wk"].shape == (30, 576, 192)
    assert teacher.params["layers"]["w_down"].shape == (30, 1536, 576)
    assert len(teacher.fingerprint) == 64


def test_perplexity_parity_without_bos(teacher):
    ppl = llama.perplexity(teacher, PARITY_SENTENCE, add_bos=False)
    assert abs(ppl - PARITY_PPL) < 0.1, ppl
    # Scoring the first token too (after <|endoftext|>) is a different quantity, but sane.
    assert 3.0 < llama.perplexity(teacher, PARITY_SENTENCE, add_bos=True) < 12.0


@pytest.mark.parametrize("text", [
    "The capital of France is Paris.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Zürich — naïve café 😀 日本語",
    "in 2023 there were 1,234,567 users; x=3.14",
    "don't won't it's",
])
def test_tokenizer_round_trip(teacher, text):
    ids = teacher.encode(text)
    assert ids and all(0 <= i < teacher.config.vocab_size for i in ids)
    assert teacher.decode(ids) == text


def test_tokenizer_known_properties(teacher):
    tok = teacher.tokenizer
    assert teacher.encode("2023") == [tok.token_to_id(d) for d in "2023"]  # digits split
    assert teacher.encode("<|endoftext|>") == [0]  # control tokens matched verbatim
    assert teacher.encode(" Paris") == [tok.token_to_id("ĠParis")]
    assert teacher.bos_id == teacher.eos_id == 0
    assert set(range(17)) <= set(teacher.special_ids)


def test_real_teacher_batched_equals_single(teacher):
    texts = [PARITY_SENTENCE, "Hello world.", "A cat sat on the mat and"]
    batched = llama.sequence_logprob(teacher, texts, batch_size=3, add_bos=False, progress=False)
    single = [llama.sequence_logprob(teacher, [t], batch_size=1, add_bos=False,
                                     progress=False)[0] for t in texts]
    np.testing.assert_allclose(batched, single, rtol=1e-4, atol=1e-4)


def test_bucketed_forward_equals_unbatched():
    params = llama.init_params(jax.random.key(0), TINY, 0.3)
    teacher = llama.Teacher(params=params, config=TINY, tokenizer=None,
                            fingerprint=oracles.params_fingerprint(params), bos_id=0, eos_id=0)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, TINY.vocab_size, size=n).tolist() for n in (3, 9, 2)]

    def fn(ids, mask):
        return oracles.teacher_logits(teacher, ids, mask)

    outs = bucketing.map_bucketed(fn, seqs, batch_size=2, buckets=(4, 8), progress=False)
    alone = [np.asarray(oracles.teacher_logits(teacher, np.asarray([s], np.int32)))[0]
             for s in seqs]
    for s, out, ref in zip(seqs, outs, alone):
        assert out.shape == (len(s), TINY.vocab_size)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)

    lp = llama.sequence_logprob(teacher, seqs, batch_size=2, add_bos=False, progress=False)
    for s, ref, got in zip(seqs, alone, lp):
        logp = np.asarray(jax.nn.log_softmax(ref[:-1], axis=-1))
        np.testing.assert_allclose(got, np.mean([logp[i, t] for i, t in enumerate(s[1:])]),
                                   rtol=1e-5)


def test_flax_module_is_the_same_model():
    params = llama.init_params(jax.random.key(1), TINY, 0.3)
    module = llama.LlamaLM(TINY)
    ids = jnp.asarray([[3, 7, 1, 0], [5, 5, 2, 9]], jnp.int32)
    shapes = jax.eval_shape(module.init, jax.random.key(0), ids)["params"]
    assert jax.tree.map(lambda a: a.shape, shapes) == jax.tree.map(lambda a: a.shape, params)
    got = jax.jit(module.apply)({"params": params}, ids)
    np.testing.assert_allclose(got, llama._forward_jit(params, TINY, ids), rtol=1e-5, atol=1e-6)


def test_bucket_length():
    assert bucketing.bucket_length(1, (4, 8)) == 4
    assert bucketing.bucket_length(8, (4, 8)) == 8
    assert bucketing.bucket_length(9, (4, 8)) == 16
    with pytest.raises(ValueError):
        bucketing.bucket_length(0)


def test_unpermute_inverts_llama_cpp_permutation_and_preserves_attention():
    rng = np.random.default_rng(1)
    n_heads, head_dim, d = 3, 8, 5
    w_ref = rng.normal(size=(n_heads * head_dim, d))
    # llama.cpp's converter: reference (rotate-half) rows -> interleaved-pair rows.
    w_gguf = w_ref.reshape(n_heads, 2, head_dim // 2, d).swapaxes(1, 2).reshape(w_ref.shape)
    np.testing.assert_array_equal(gguf._unpermute_rope_rows(w_gguf, n_heads), w_ref)

    # Rotate-half RoPE on the reference rows == interleaved RoPE on the GGUF rows, up to the
    # same permutation of each head's coordinates (so q·k is unchanged).
    x = rng.normal(size=(1, 6, d))
    cos, sin = llama._rope_tables(6, head_dim, 1e4)
    q_ref = np.asarray(llama._apply_rope(jnp.asarray((x @ w_ref.T).reshape(1, 6, n_heads,
                                                                           head_dim)), cos, sin))
    q_gg = (x @ w_gguf.T).reshape(1, 6, n_heads, head_dim // 2, 2)
    theta = np.arange(6)[:, None] * 1e4 ** (-np.arange(0, head_dim, 2) / head_dim)
    c, s = np.cos(theta)[None, :, None], np.sin(theta)[None, :, None]
    q_int = np.stack([q_gg[..., 0] * c - q_gg[..., 1] * s,
                      q_gg[..., 0] * s + q_gg[..., 1] * c], -1).reshape(1, 6, n_heads, head_dim)
    perm = np.arange(head_dim).reshape(2, head_dim // 2).T.reshape(-1)
    np.testing.assert_allclose(q_int, q_ref[..., perm], rtol=1e-5, atol=1e-5)


def test_missing_teacher_file_names_make_setup():
    with pytest.raises(FileNotFoundError, match="make setup"):
        gguf.find_teacher_gguf(package="no_such_package_fedpriv")
    with pytest.raises(FileNotFoundError, match="make setup"):
        gguf.load_teacher("/nonexistent/teacher.gguf")


def test_parsed_gguf_is_cached_by_file_contents(tmp_path, monkeypatch):
    """load_gguf's on-disk cache: a hit returns the parse bit for bit without parsing again; a
    changed file, an incomplete entry (no JSON) and an unwritable cache all parse again."""
    calls = []
    params = {"embed": np.arange(16, dtype=np.float32).reshape(4, 4) / 7,
              "final_norm": np.float32([1.5, -2.25, 1e-8, 0.0]),
              "layers": {"wq": np.full((2, 4, 4), np.float32(1 / 3)), "attn_norm": np.ones((2, 4), np.float32)}}
    config = llama.LlamaConfig(vocab_size=4, dim=4, n_layers=2, n_heads=1, n_kv_heads=1, ffn_dim=5,
                         norm_eps=9.999999747378752e-06)
    meta = {"tokens": ["a", "Ġb", "<|x|>", "\u00e9"], "merges": ["a b"], "token_types": [1, 1, 3, 1],
            "pre": "smollm", "model": "gpt2", "bos_id": 1, "eos_id": 2, "unk_id": None, "add_bos": False}

    def parse(path):
        calls.append(path)
        return params, config, meta
    monkeypatch.setattr(gguf, "_parse_gguf", parse)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"one")
    cache = tmp_path / "cache"
    first = gguf.load_gguf(f, cache_dir=cache)
    again = gguf.load_gguf(f, cache_dir=cache)
    assert len(calls) == 1
    assert again[1] == config and again[2] == meta
    flat = lambda p: jax.tree_util.tree_leaves_with_path(p)  # noqa: E731
    assert [k for k, _ in flat(again[0])] == [k for k, _ in flat(params)]
    for (_, a), (_, b) in zip(flat(again[0]), flat(params)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert first[0] is params
    f.write_bytes(b"two")  # another file: parsed again
    gguf.load_gguf(f, cache_dir=cache)
    assert len(calls) == 2
    for j in (cache / "gguf").glob("*.json"):  # an entry without its JSON is incomplete
        j.unlink()
    gguf.load_gguf(f, cache_dir=cache)
    assert len(calls) == 3
    gguf.load_gguf(f, cache_dir=cache)
    assert len(calls) == 3  # the entry was written again: a hit
    for z in (cache / "gguf").glob("*.npz"):  # truncated arrays (BadZipFile): parsed again, no error
        z.write_bytes(z.read_bytes()[: z.stat().st_size // 2])
    assert gguf.load_gguf(f, cache_dir=cache)[1] == config
    assert len(calls) == 4
    blocked = tmp_path / "afile"
    blocked.write_text("")
    for _ in range(2):  # an unwritable cache is bypassed: parsed every time, never an error
        assert gguf.load_gguf(f, cache_dir=blocked)[1] == config
    assert len(calls) == 6
