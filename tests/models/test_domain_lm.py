"""Tests of fedpriv.models.domain_lm: DSDSR and DEMix routing, the LMTask contract, learning."""

import jax
import numpy as np
import optax
import pytest

from fedpriv.models import domain_lm, lm, metrics
from fedpriv.models.metrics import BOS, EOS

TINY = lm.LMConfig(vocab_size=16, embed_dim=8, hidden_dim=16, num_heads=2)
# Which parameter subtree belongs to domain d, per model.
DOMAIN_PARAMS = {
    "dsdsr": lambda params, d: params[f"specific_{d}"],
    "demix": lambda params, d: params["demix_0"][f"expert_{d}"],
}


def make_task(kind, config=TINY):
    if kind == "dsdsr":
        return domain_lm.make_dsdsr_task(config, specific_embed_dim=4, specific_hidden_dim=8)
    return domain_lm.make_demix_task(config)


def cheap_init(task, seed=0):
    """Parameters with the shapes of ``task.init`` (traced by ``eval_shape``) but NumPy values —
    biases 0, LayerNorm scales 1, other weights N(0, 1/fan_in) — so tests skip compiling the
    initializers (the real initializers run in test_lm.py)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(task.init, jax.random.key(seed))

    def leaf(path, s):
        name = path[-1].key
        if name == "bias":
            return np.zeros(s.shape, np.float32)
        if name == "scale":
            return np.ones(s.shape, np.float32)
        return (rng.standard_normal(s.shape) / np.sqrt(s.shape[0])).astype(np.float32)

    return jax.tree_util.tree_map_with_path(leaf, shapes)


class Compiled:
    def __init__(self, kind):
        self.kind = kind
        self.task = make_task(kind)
        self.params = cheap_init(self.task)
        self.apply = jax.jit(self.task.apply)
        self.vg = jax.jit(jax.value_and_grad(self.task.loss_fn, has_aux=True))


@pytest.fixture(scope="module", params=["dsdsr", "demix"])
def model(request):
    return Compiled(request.param)


def tokens_batch(seed, batch=4, length=8, vocab=TINY.vocab_size):
    rng = np.random.default_rng(seed)
    out = np.zeros((batch, length + 1), np.int32)
    for b in range(batch):
        n = rng.integers(3, length)
        out[b, 0], out[b, 1:n + 1], out[b, n + 1] = BOS, rng.integers(4, vocab, n), EOS
    return out


def perturb(tree, scale=0.5, seed=0):
    """Add N(0, scale²) noise to every leaf (NumPy, so no per-shape compilation)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: (np.asarray(x) + scale * rng.standard_normal(x.shape)).astype(np.float32), tree)


def replace_domain_params(kind, params, d, new):
    params = jax.tree.map(lambda x: x, params)  # shallow copy of the nested dicts
    if kind == "dsdsr":
        params[f"specific_{d}"] = new
    else:
        params["demix_0"] = {**params["demix_0"], f"expert_{d}": new}
    return params


def test_parameter_counts_paper_sizes():
    """Both baselines are larger than the 4,050,748-parameter LSTM (Koga et al. §4.3)."""
    cfg = lm.LMConfig(vocab_size=10_004)
    count = lambda task: lm.count_params(jax.eval_shape(task.init, jax.random.key(0)))
    v, e, h = 10_004, 96, 670
    emb, lstm = v * e, 4 * h * (e + h + 1)
    out = e * v + v
    assert count(domain_lm.make_dsdsr_task(cfg)) == (
        3 * (emb + lstm) + (2 * h * e + e) + out) == 10_146_956
    assert count(domain_lm.make_demix_task(cfg)) == (
        emb + lstm + 2 * (2 * h * h + h + h) + 2 * h + (h * e + e) + out) == 5_850_368


def test_routing_and_causality(model):
    """Changing domain 1's parameters leaves domain-0 outputs bit-identical and vice versa;
    shared parameters affect both; future tokens do not affect past logits."""
    x = tokens_batch(1)[:, :-1]
    dom = np.array([0, 1, 0, 1], np.int32)
    base = np.asarray(model.apply(model.params, x, dom))
    assert base.shape == (4, 8, TINY.vocab_size)
    get = DOMAIN_PARAMS[model.kind]
    for d in (0, 1):
        new = replace_domain_params(model.kind, model.params, d, perturb(get(model.params, d)))
        out = np.asarray(model.apply(new, x, dom))
        np.testing.assert_array_equal(out[dom != d], base[dom != d])
        assert np.abs(out[dom == d] - base[dom == d]).max() > 1e-3
    shared = dict(model.params, head=perturb(model.params["head"]))
    out = np.asarray(model.apply(shared, x, dom))
    assert all(np.abs(out[b] - base[b]).max() > 1e-3 for b in range(4))
    # Swapping an example's domain changes its output (it is really conditioned on the domain).
    swapped = np.asarray(model.apply(model.params, x, 1 - dom))
    assert np.abs(swapped - base).max() > 1e-4
    y = x.copy()
    y[:, 5] = (x[:, 5] - 3) % (TINY.vocab_size - 4) + 4
    np.testing.assert_array_equal(np.asarray(model.apply(model.params, y, dom))[:, :5], base[:, :5])


def test_other_domain_gets_no_gradient(model):
    batch = {"tokens": tokens_batch(2), "mask": np.ones(4, np.float32),
             "domain": np.zeros(4, np.int32)}
    (loss, aux), grads = model.vg(model.params, batch, jax.random.key(0))
    get = DOMAIN_PARAMS[model.kind]
    assert all(np.all(g == 0) for g in jax.tree.leaves(get(grads, 1)))
    assert any(np.any(g != 0) for g in jax.tree.leaves(get(grads, 0)))
    assert np.isfinite(loss) and aux["num_tokens"] > 0


def test_jit_vmap_over_clients_equals_loop(model):
    clients = 3
    tokens = np.stack([tokens_batch(10 + c) for c in range(clients)])
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
    domain = np.array([[0] * 4, [1] * 4, [1, 0, 1, 0]], np.int32)
    rngs = jax.random.split(jax.random.key(3), clients)
    # Values and metric sums only: gradients under vmap are checked for the plain LMs in
    # test_lm.py (same engine path); this keeps the compile time of the test suite down.
    vl, vaux = jax.jit(jax.vmap(model.task.loss_fn, in_axes=(None, 0, 0)))(
        model.params, {"tokens": tokens, "mask": mask, "domain": domain}, rngs)
    for c in range(clients):
        batch = {"tokens": tokens[c], "mask": mask[c], "domain": domain[c]}
        (l, aux), _ = model.vg(model.params, batch, rngs[c])
        np.testing.assert_allclose(vl[c], l, rtol=1e-5, atol=1e-7)
        for key in metrics.SUM_KEYS:
            np.testing.assert_allclose(vaux[key][c], aux[key], rtol=1e-5)


def test_learns_domain_dependent_continuation(model):
    """Same prefix, domain-dependent last word: a domain model reaches accuracy 1, which a plain
    LM cannot (it would be a coin flip on the last word: at most 2/3 of the counted targets)."""
    sents = np.array([[BOS, 4, 5, 6, EOS, 0, 0, 0, 0],
                      [BOS, 4, 5, 7, EOS, 0, 0, 0, 0]] * 2, np.int32)
    dom = np.array([0, 1, 0, 1], np.int32)
    batch = {"tokens": sents, "mask": np.ones(4, np.float32), "domain": dom}
    opt = optax.adam(3e-2)
    params, state = model.params, opt.init(model.params)

    @jax.jit
    def update(params, state, grads):
        upd, state = opt.update(grads, state, params)
        return optax.apply_updates(params, upd), state

    key = jax.random.key(4)
    for i in range(80):
        _, grads = model.vg(params, batch, jax.random.fold_in(key, i))
        params, state = update(params, state, grads)
    (_, aux), _ = model.vg(params, batch, key)
    out = metrics.summarize(aux)
    assert out["accuracy"] == 1.0, out
    assert out["loss"] < 0.1, out
    with pytest.raises(ValueError, match="domain"):
        jax.eval_shape(model.task.loss_fn, params, {"tokens": sents, "mask": batch["mask"]}, key)


def test_demix_transformer_routing():
    cfg = lm.LMConfig(vocab_size=16, arch="transformer", embed_dim=8, hidden_dim=16, num_heads=2)
    task = domain_lm.make_demix_task(cfg)
    params = cheap_init(task)
    assert "attn_0" in params and set(params["demix_0"]) == {"expert_0", "expert_1", "ln"}
    apply = jax.jit(task.apply)
    x, dom = tokens_batch(5)[:, :-1], np.array([0, 1, 1, 0], np.int32)
    base = np.asarray(apply(params, x, dom))
    new = dict(params, demix_0={**params["demix_0"],
                                "expert_1": perturb(params["demix_0"]["expert_1"])})
    out = np.asarray(apply(new, x, dom))
    np.testing.assert_array_equal(out[dom == 0], base[dom == 0])
    assert np.abs(out[dom == 1] - base[dom == 1]).max() > 1e-3


def test_dsdsr_requires_lstm():
    with pytest.raises(ValueError, match="LSTM"):
        domain_lm.make_dsdsr_task(lm.LMConfig(arch="transformer"))
