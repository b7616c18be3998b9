"""The KV-cache sampler equals teacher forcing: every logit it samples from is the logit
`llama.forward` gives the same (unpadded) sequence, for left-padded prompts of mixed lengths."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedpriv.models import generate as G, llama

CFG = llama.LlamaConfig(vocab_size=61, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48)


@pytest.fixture(scope="module")
def teacher():
    params = llama.init_params(jax.random.key(0), CFG, 0.3)
    return llama.Teacher(params=params, config=CFG, tokenizer=None, fingerprint="t", bos_id=0,
                         eos_id=1)


def _prompts():
    rng = np.random.default_rng(0)
    return [list(rng.integers(2, CFG.vocab_size, n)) for n in (3, 7, 1, 12)]


@pytest.mark.parametrize("prefix,pad", [(None, 0), ([5, 9, 11, 2, 7], 0), ([1, 1, 5, 9, 11, 2, 7], 2)])
def test_cached_logits_equal_teacher_forcing(teacher, prefix, pad):
    prompts, max_new = _prompts(), 6
    ids, mask = G._left_pad(prompts, 16, teacher.eos_id)
    toks, lens, logits = G.generate_batch(
        teacher.params, CFG, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(3),
        max_new=max_new, temperature=1.0, return_logits=True,
        prefix=None if prefix is None else jnp.asarray(prefix, jnp.int32), prefix_pad=pad)
    toks, logits = np.asarray(toks), np.asarray(logits)
    assert (np.asarray(lens) == max_new).all()  # no stop ids: every row runs to max_new
    for r, p in enumerate(prompts):
        p = (prefix or [])[pad:] + p  # the shared prefix (without its padding) comes first
        seq = np.asarray(p + toks[r].tolist(), np.int32)[None]
        ref = np.asarray(llama.forward(teacher.params, CFG, jnp.asarray(seq)))[0]
        want = ref[len(p) - 1: len(p) - 1 + max_new]
        np.testing.assert_allclose(logits[r], want, rtol=1e-4, atol=1e-4)


def test_greedy_equals_the_nocache_reference_and_stops(teacher):
    prompts = _prompts()
    key = jax.random.key(1)
    ref = G.generate_nocache(teacher, prompts, key, max_new=5, temperature=0.0, batch_size=2)
    got = G.generate(teacher, prompts, key, max_new=5, temperature=0.0, batch_size=2, stop_ids=())
    assert got == ref
    # a stop id ends a row (kept), the rest of the row is dropped
    stop = ref[0][2]
    cut = G.generate(teacher, prompts, key, max_new=5, temperature=0.0, batch_size=2,
                     stop_ids=(stop,))
    for r, c in zip(ref, cut):
        n = r.index(stop) + 1 if stop in r else len(r)
        assert c == r[:n]


def test_sampling_follows_keys_and_top_k(teacher):
    prompts = _prompts()
    a = G.generate(teacher, prompts, jax.random.key(5), max_new=8, top_k=3, stop_ids=())
    b = G.generate(teacher, prompts, jax.random.key(5), max_new=8, top_k=3, stop_ids=())
    c = G.generate(teacher, prompts, jax.random.key(6), max_new=8, top_k=3, stop_ids=())
    assert a == b and a != c
    # top-1 sampling is greedy
    g = G.generate(teacher, prompts, jax.random.key(5), max_new=8, temperature=0.0, stop_ids=())
    assert G.generate(teacher, prompts, jax.random.key(9), max_new=8, top_k=1, stop_ids=()) == g


def test_kth_largest_is_top_ks_kth_value_and_sampling_is_unchanged(teacher):
    """The bisection that replaced ``lax.top_k`` in `_sample` gives the value top_k gives (and
    so the same mask) on rows with ties, infinities, signed zeros and any magnitude, for every
    k; sampling with it draws the tokens the top_k threshold draws."""
    rng = np.random.default_rng(0)
    kth = jax.jit(G.kth_largest)  # one shape, k traced: one compile
    for trial in range(120):
        x = (rng.normal(size=(4, 199)) * 10.0 ** rng.uniform(-40, 30)).astype(np.float32)
        if trial % 3 == 0:
            x = np.round(x)  # ties
        x[rng.random(x.shape) < (0.2 if trial % 5 == 0 else 0)] = -np.inf
        if trial % 7 == 0:
            x[rng.random(x.shape) < 0.3], x[rng.random(x.shape) < 0.3] = 0.0, -0.0
        k = int(rng.integers(1, 200))
        want = np.sort(x, axis=1)[:, -k:][:, :1]  # what lax.top_k(x, k)[0][:, -1:] holds
        got = np.asarray(kth(jnp.asarray(x), k))
        np.testing.assert_array_equal(got, want)  # equal values (0.0 == -0.0: the same mask)
        assert ((x < got) == (x < want)).all()
    x = jnp.asarray(rng.normal(size=(3, 50)), jnp.float32)
    np.testing.assert_array_equal(G.kth_largest(x, 7), jax.lax.top_k(x, 7)[0][:, -1:])
    logits = jnp.asarray(rng.normal(size=(6, CFG.vocab_size)).astype(np.float32))

    def by_top_k(lg, key, temperature, k):  # the sampler as it was, with lax.top_k
        lg = lg / temperature
        lg = jnp.where(lg < jax.lax.top_k(lg, k)[0][:, -1:], llama._NEG_INF, lg)
        return jax.random.categorical(key, lg, axis=-1).astype(jnp.int32)

    for s in range(20):
        key = jax.random.key(s)
        assert (np.asarray(G._sample(logits, key, 0.7, 5)) == np.asarray(by_top_k(logits, key, 0.7, 5))).all()


def test_bad_prompts_are_refused(teacher):
    with pytest.raises(ValueError, match="prompt 0 has 0 tokens"):
        G.generate(teacher, [[]], jax.random.key(0), max_new=2)
