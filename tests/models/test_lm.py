"""Tests of fedpriv.models.lm: sizes, causality, masking, jit/vmap contract, learning."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.models import lm, metrics

TINY = lm.LMConfig(vocab_size=24, embed_dim=8, hidden_dim=16, num_heads=2, max_len=16)
ARCHS = ["lstm", "transformer"]


def tiny_task(arch, **kw):
    return lm.make_lm_task(lm.make_lm(dataclasses.replace(TINY, arch=arch, **kw)))


class Compiled:
    """A tiny task with its params and jitted functions, shared by a module's tests (compile once)."""

    def __init__(self, arch):
        self.arch = arch
        self.task = tiny_task(arch)
        self.params = jax.jit(self.task.init)(jax.random.key(0))
        self.apply = jax.jit(self.task.apply)
        self._vg = jax.jit(jax.value_and_grad(self.task.loss_fn, has_aux=True))

    def vg(self, params, batch, rng):
        """Jitted value-and-grad of loss_fn; batches always carry 'weight' (default 1) so all
        calls of one shape share one compilation."""
        weight = np.ones(batch["tokens"].shape[:-1], np.float32)
        return self._vg(params, {"weight": weight, **batch}, rng)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request):
    return Compiled(request.param)


def random_tokens(key, batch, length, vocab, min_len=2):
    """int32[batch, length+1]: BOS, random ids in [4, vocab), EOS, PAD; variable lengths."""
    rng = np.random.default_rng(key)
    out = np.zeros((batch, length + 1), np.int32)
    for b in range(batch):
        n = rng.integers(min_len, length)  # number of word ids; EOS fits within length+1
        out[b, 0] = lm.BOS
        out[b, 1:n + 1] = rng.integers(4, vocab, n)
        out[b, n + 1] = lm.EOS
    return out


def test_lstm_parameter_count_stackoverflow():
    """The TFF StackOverflow NWP LSTM: 4,050,748 parameters at vocabulary 10,004 (~4.05M)."""
    task = lm.make_lm_task(lm.make_lm(lm.LMConfig(vocab_size=10_004)))
    shapes = jax.eval_shape(task.init, jax.random.key(0))
    v, e, h = 10_004, 96, 670
    expected = v * e + 4 * h * (e + h + 1) + (h * e + e) + (e * v + v)
    assert expected == 4_050_748
    assert lm.count_params(shapes) == expected


def test_transformer_parameter_count():
    cfg = lm.LMConfig(vocab_size=10_004, arch="transformer")
    shapes = jax.eval_shape(lm.make_lm_task(lm.make_lm(cfg)).init, jax.random.key(0))
    v, e, h = 10_004, 96, 670
    expected = (v * e + (e * h + h)            # embedding, up-projection
                + 4 * (h * h + h) + 2 * h      # attention q/k/v/out + LayerNorm
                + 2 * (h * h) + h + h + 2 * h  # FFN (width 670) + LayerNorm
                + (h * e + e) + (e * v + v))   # down-projection, output layer
    assert lm.count_params(shapes) == expected == 4_760_278
    tied = dataclasses.replace(cfg, tie_embeddings=True)
    shapes = jax.eval_shape(lm.make_lm_task(lm.make_lm(tied)).init, jax.random.key(0))
    assert lm.count_params(shapes) == expected - (e * v + v)


def test_shapes_and_causal(tiny):
    """Logits have shape [B, L, V]; changing token k changes no logits before position k."""
    x = random_tokens(1, 4, 8, TINY.vocab_size, min_len=7)[:, :-1]
    lx = np.asarray(tiny.apply(tiny.params, x))
    assert lx.shape == (4, 8, TINY.vocab_size) and lx.dtype == np.float32
    assert np.all(np.isfinite(lx))
    k = 5
    y = x.copy()
    y[:, k] = (x[:, k] - 4 + 1) % (TINY.vocab_size - 4) + 4
    ly = np.asarray(tiny.apply(tiny.params, y))
    np.testing.assert_array_equal(lx[:, :k], ly[:, :k])
    assert np.abs(lx[:, k] - ly[:, k]).max() > 1e-4


def test_learned_positions():
    task = tiny_task("transformer", positions="learned", max_len=8)
    params = jax.eval_shape(task.init, jax.random.key(0))
    assert params["embed"]["positions"].shape == (8, TINY.embed_dim)
    assert jax.eval_shape(task.apply, params, random_tokens(0, 2, 8, 24)[:, :-1]).shape == (2, 8, 24)
    with pytest.raises(ValueError, match="max_len"):
        jax.eval_shape(task.apply, params, np.full((1, 9), 5, np.int32))


def test_padding_contributes_nothing(tiny):
    """Mask-0 examples contribute nothing, whatever they contain: the loss equals the mean NLL of
    the real examples' non-PAD targets, and loss, sums and gradients do not depend on the padding
    examples' content."""
    tokens = random_tokens(2, 4, 8, TINY.vocab_size)
    mask = np.array([1, 1, 0, 0], np.float32)
    rng = np.random.default_rng(3)
    other = tokens.copy()
    other[2:] = rng.integers(0, TINY.vocab_size, (2, 9))  # different garbage in the padding rows
    key = jax.random.key(0)
    (l1, a1), g1 = tiny.vg(tiny.params, {"tokens": tokens, "mask": mask}, key)
    (l2, a2), g2 = tiny.vg(tiny.params, {"tokens": other, "mask": mask}, key)
    logp = np.asarray(jax.nn.log_softmax(tiny.apply(tiny.params, tokens[:, :-1])))
    tgt = tokens[:2, 1:]
    nll = -np.take_along_axis(logp[:2], tgt[..., None], -1)[..., 0]
    np.testing.assert_allclose(l1, nll[tgt != lm.PAD].mean(), rtol=1e-5)
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    for key_ in metrics.SUM_KEYS:
        np.testing.assert_allclose(a1[key_], a2[key_], rtol=1e-6)
    assert a1["num_tokens"] == np.sum(tgt != lm.PAD) and a1["num_examples"] == 2
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), g1, g2)


def test_loss_is_mean_token_nll_and_weights(tiny):
    tokens = random_tokens(4, 4, 8, TINY.vocab_size)
    batch = {"tokens": tokens, "mask": np.ones(4, np.float32)}
    key = jax.random.key(0)
    (loss, aux), _ = tiny.vg(tiny.params, batch, key)
    logp = jax.nn.log_softmax(tiny.apply(tiny.params, tokens[:, :-1]))
    tgt = tokens[:, 1:]
    nll = -np.take_along_axis(np.asarray(logp), tgt[..., None], -1)[..., 0]
    real = tgt != lm.PAD
    np.testing.assert_allclose(loss, nll[real].mean(), rtol=1e-5)
    # Instance weights (Koga et al. Eq. 2) scale each example's NLL; the denominator stays the count.
    w = np.array([0.5, 2.0, 0.0, 1.0], np.float32)
    (wloss, waux), _ = tiny.vg(tiny.params, {**batch, "weight": w}, key)
    expected = (nll * real * w[:, None]).sum() / real.sum()
    np.testing.assert_allclose(wloss, expected, rtol=1e-5)
    assert waux["num_tokens"] == aux["num_tokens"]
    (ones, _), _ = tiny.vg(tiny.params, {**batch, "weight": np.ones(4, np.float32)}, key)
    np.testing.assert_allclose(ones, loss, rtol=1e-6)
    # All examples masked: loss 0 (no NaN), so a fully padded client is a no-op.
    (zero, zaux), zgrad = tiny.vg(tiny.params, {**batch, "mask": np.zeros(4, np.float32)}, key)
    assert zero == 0.0 and zaux["num_tokens"] == 0.0
    assert all(np.all(g == 0) for g in jax.tree.leaves(zgrad))


def test_jit_vmap_over_clients_equals_loop(tiny):
    clients, b, length = 3, 4, 8
    tokens = random_tokens(5, clients * b, length, TINY.vocab_size).reshape(clients, b, length + 1)
    mask = np.array([[1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]], np.float32)
    rngs = jax.random.split(jax.random.key(5), clients)
    vg = jax.value_and_grad(tiny.task.loss_fn, has_aux=True)
    (vl, vaux), vgrad = jax.jit(jax.vmap(vg, in_axes=(None, 0, 0)))(
        tiny.params, {"tokens": tokens, "mask": mask}, rngs)  # no 'weight': the unweighted path
    for c in range(clients):
        (l, aux), g = tiny.vg(tiny.params, {"tokens": tokens[c], "mask": mask[c]}, rngs[c])
        np.testing.assert_allclose(vl[c], l, rtol=1e-5, atol=1e-7)
        for key in metrics.SUM_KEYS:
            np.testing.assert_allclose(vaux[key][c], aux[key], rtol=1e-5)
        jax.tree.map(lambda a, b_, c=c: np.testing.assert_allclose(a[c], b_, rtol=1e-4, atol=1e-6),
                     vgrad, g)


def test_dropout_uses_rng():
    """With dropout (embeddings, attention, FFN, head), `apply` and so `loss_fn` are stochastic
    given an rng and deterministic without one. Random NumPy parameters: no init compilation."""
    task = tiny_task("transformer", dropout_rate=0.5)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: rng.normal(0, 0.3, s.shape).astype(np.float32),
                          jax.eval_shape(task.init, jax.random.key(0)))
    apply = jax.jit(task.apply)
    x = random_tokens(1, 4, 8, TINY.vocab_size, min_len=7)[:, :-1]
    l1 = np.asarray(apply(params, x, None, jax.random.key(1)))
    l2 = np.asarray(apply(params, x, None, jax.random.key(2)))
    assert np.abs(l1 - l2).max() > 1e-4
    np.testing.assert_array_equal(apply(params, x), apply(params, x))


def test_adam_learns_repetitive_corpus(tiny):
    """A few Adam steps on a tiny repetitive corpus: loss falls from ~log V to near 0."""
    # Two deterministic "sentences", repeated: every next token but the first word is determined
    # by the prefix.
    sents = [[lm.BOS, 4, 5, 6, 7, 8, lm.EOS, 0, 0], [lm.BOS, 9, 10, 11, 12, lm.EOS, 0, 0, 0]]
    batch = {"tokens": np.array(sents * 2, np.int32), "mask": np.ones(4, np.float32)}
    params = tiny.params
    opt = optax.adam(2e-2)
    state = opt.init(params)

    @jax.jit
    def update(params, state, grads):
        upd, state = opt.update(grads, state, params)
        return optax.apply_updates(params, upd), state

    key = jax.random.key(8)
    (first, _), _ = tiny.vg(params, batch, key)
    for i in range(120):
        (_, _), grads = tiny.vg(params, batch, jax.random.fold_in(key, i))
        params, state = update(params, state, grads)
    (_, aux), _ = tiny.vg(params, batch, key)
    final = metrics.summarize(aux)
    assert first > 0.8 * np.log(TINY.vocab_size)
    # The first word after BOS is a coin flip between 4 and 9 (2 of the 11 targets of a pair), so
    # the optimum is 2 log(2)/11 ~ 0.126 nats, and accuracy 8/9 of the in-vocabulary targets.
    assert final["loss"] < 0.25, final
    assert final["accuracy"] >= 8 / 9 - 1e-6, final


def test_config_validation():
    with pytest.raises(ValueError):
        lm.LMConfig(arch="gru")
    with pytest.raises(ValueError):
        lm.LMConfig(arch="transformer", hidden_dim=670, num_heads=4)
    with pytest.raises(ValueError):
        lm.LMConfig(vocab_size=3)
    with pytest.raises(ValueError):
        lm.LMConfig(positions="rotary")


def test_lstm_recurrence_custom_vjp_equals_autodiff_of_the_scan():
    """The hand-written LSTM backward pass (one dW_h matmul) must equal autodiff of the plain
    recurrence, values and gradients, under jit."""
    from fedpriv.models.lm import lstm_recurrence

    def reference(gx, w):
        z = jnp.zeros((gx.shape[1], w.shape[0]))

        def step(carry, g_t):
            h, c = carry
            i, f, gg, o = jnp.split(g_t + h @ w, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(gg)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h
        return jax.lax.scan(step, (z, z), gx)[1]

    k = jax.random.split(jax.random.key(3), 3)
    gx = jax.random.normal(k[0], (7, 3, 20))
    w = 0.5 * jax.random.normal(k[1], (5, 20))
    ct = jax.random.normal(k[2], (7, 3, 5))
    np.testing.assert_allclose(np.asarray(jax.jit(lstm_recurrence)(gx, w)), np.asarray(reference(gx, w)),
                               rtol=1e-6, atol=1e-6)
    g_ref = jax.grad(lambda a, b: jnp.sum(reference(a, b) * ct), (0, 1))(gx, w)
    g_new = jax.jit(jax.grad(lambda a, b: jnp.sum(lstm_recurrence(a, b) * ct), (0, 1)))(gx, w)
    for a, b in zip(g_ref, g_new):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
