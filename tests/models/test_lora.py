"""LoRA on the Flax Llama (fedpriv.models.lora) and its federated algorithm (fedpriv.fl.frozen):
zero-initialised adapters are the base model logit for logit; the cache of the frozen lower
blocks changes nothing; the trainable pytree, the gradients and the engine's update are the
adapters' alone; each client's clipped update is within C on the adapter pytree and replacing
one client moves the pre-noise sum by at most 2C; the frozen weights are an argument of the
compiled round, never a constant in it. A tiny random Llama (3 blocks, d = 32), never the 135M
teacher."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.data.federated import FederatedDataset
from fedpriv.dp.clipping import global_norm
from fedpriv.fl import algorithms as algs
from fedpriv.fl.cohort import build_cohort
from fedpriv.fl.frozen import build_frozen_algorithm
from fedpriv.models import llama, lora as L, metrics

CFG = llama.LlamaConfig(vocab_size=40, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=48,
                        rope_base=1e4)


def _params():
    return llama.init_params(jax.random.key(0), CFG, 0.1)


def _tokens(n=6, width=9, seed=1, vocab=CFG.vocab_size):
    """int32[n, width] project-convention examples: BOS, ids >= 4, EOS where it fits, PAD."""
    rng = np.random.default_rng(seed)
    tok = np.zeros((n, width), np.int32)
    for i, m in enumerate(rng.integers(2, width + 1, n)):
        tok[i, 0] = metrics.BOS
        tok[i, 1:m] = rng.integers(4, vocab, m - 1)
        if m < width:
            tok[i, m] = metrics.EOS
    return tok


@pytest.mark.parametrize("top", [None, 1, 2])
def test_zero_adapters_give_the_base_models_logits_exactly(top):
    p = _params()
    lc = L.LoraConfig(rank=4, targets=("wq", "wv", "wo", "w_up", "w_down"), top_layers=top)
    task = L.make_lora_task(p, CFG, lc)
    adapters = task.init(jax.random.key(3))
    assert all(float(jnp.abs(a["a"]).max()) > 0 and float(jnp.abs(a["b"]).max()) == 0 for a in adapters.values())
    tok = jnp.asarray(_tokens()[:, :-1])
    mask = (tok != metrics.PAD).astype(jnp.float32)
    base = jax.jit(llama.forward, static_argnums=1)(p, CFG, tok, mask)
    ours = jax.jit(L.lora_forward, static_argnums=(2, 3))(adapters, task.frozen, task.config, lc, tok, mask)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(base))
    # ... and non-zero adapters move them (the adapters are wired in)
    moved = jax.tree_util.tree_map(lambda x: x + 0.5, adapters)
    assert float(jnp.abs(L.lora_forward(moved, task.frozen, task.config, lc, tok, mask) - base).max()) > 1e-3


def test_student_vocabulary_remap_is_the_base_softmax_over_the_kept_tokens():
    """Slot j uses base row vocab_map[j]; never-target slots get no probability; the rest of the
    logits are the base model's, exactly."""
    p = _params()
    kept = np.arange(5, CFG.vocab_size)                 # base ids 0..4: "control" tokens, dropped
    s2t = np.concatenate([[-1, -1, 0, 0], kept])        # PAD, UNK, BOS=doc token, EOS=doc token
    never = np.zeros(len(s2t), bool)
    never[[metrics.PAD, metrics.UNK, metrics.BOS]] = True
    lc = L.LoraConfig(rank=2, top_layers=1)
    task = L.make_lora_task(p, CFG, lc, vocab_map=s2t, never_target=never)
    assert task.config.vocab_size == len(s2t)
    base_tok = np.array([[0, 7, 12, 30, 5]], np.int32)
    ours_tok = np.array([[metrics.BOS, 7 - 5 + 4, 12 - 5 + 4, 30 - 5 + 4, 0 + 4]], np.int32)
    base = llama.forward(p, CFG, jnp.asarray(base_tok))
    ours = L.lora_forward(task.init(jax.random.key(0)), task.frozen, task.config, lc, jnp.asarray(ours_tok))
    np.testing.assert_array_equal(np.asarray(ours[..., 4:]), np.asarray(base[..., kept]))
    np.testing.assert_array_equal(np.asarray(ours[..., metrics.EOS]), np.asarray(base[..., 0]))
    prob = jax.nn.softmax(ours, -1)
    assert float(prob[..., [metrics.PAD, metrics.UNK, metrics.BOS]].max()) == 0.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_cached_lower_blocks_give_the_same_loss_and_gradients(dtype):
    p = _params()
    task = L.make_lora_task(p, CFG, L.LoraConfig(rank=4, top_layers=1))
    ad = jax.tree_util.tree_map(lambda x: x + 0.1, task.init(jax.random.key(3)))
    tok = _tokens(n=8, width=11)
    batch = {"tokens": jnp.asarray(tok), "mask": jnp.ones((8,), jnp.float32)}
    hidden = L.cache_hidden(task, tok, batch_size=4, dtype=dtype)
    assert hidden.shape == (8, 10, CFG.dim) and hidden.dtype == jnp.dtype(dtype)
    grad = jax.jit(jax.value_and_grad(task.loss_with, argnums=1, has_aux=True))
    (l0, s0), g0 = grad(task.frozen, ad, batch)
    (l1, s1), g1 = grad(task.frozen, ad, dict(batch, hidden=jnp.asarray(hidden)))
    tol = 1e-5 if dtype == "float32" else 2e-2  # float32: summation order only (trimmed widths)
    np.testing.assert_allclose(float(l1), float(l0), rtol=tol)
    assert float(s1["num_tokens"]) == float(s0["num_tokens"]) > 0
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=50 * tol,
                                                                   atol=tol), g1, g0)


def test_the_trainable_pytree_and_its_gradients_are_the_adapters_only():
    p = _params()
    lc = L.LoraConfig(rank=3, targets=("wq", "wk", "w_gate"), top_layers=2)
    task = L.make_lora_task(p, CFG, lc)
    ad = task.init(jax.random.key(0))
    assert set(ad) == {"wq", "wk", "w_gate"}
    assert ad["wq"]["a"].shape == (2, CFG.dim, 3) and ad["w_gate"]["b"].shape == (2, 3, CFG.ffn_dim)
    assert L.num_adapter_params(CFG, lc) == sum(x.size for x in jax.tree_util.tree_leaves(ad)) == task.num_params
    batch = {"tokens": jnp.asarray(_tokens()), "mask": jnp.ones((6,), jnp.float32)}
    g = jax.jit(jax.grad(lambda a: task.as_lm_task().loss_fn(a, batch, None)[0]))(ad)
    assert jax.tree_util.tree_structure(g) == jax.tree_util.tree_structure(ad)
    # B = 0 at init: the loss moves with every B (and not yet with A, whose gradient is A^T-free)
    assert all(float(jnp.abs(v["b"]).max()) > 0 for v in g.values())
    with pytest.raises(ValueError, match="targets"):
        L.LoraConfig(targets=("wq", "embed"))
    with pytest.raises(ValueError, match="exceeds"):
        L.init_adapters(jax.random.key(0), CFG, L.LoraConfig(top_layers=4))


def _dataset(n_clients=5, per_client=6, seed=0):
    rng = np.random.default_rng(seed)
    toks = np.concatenate([_tokens(per_client, 9, int(rng.integers(1 << 30))) for _ in range(n_clients)])
    return FederatedDataset([f"c{i}" for i in range(n_clients)], {"tokens": toks},
                            np.arange(n_clients + 1) * per_client)


def _alg(task, dp, m, lr=0.5):
    return build_frozen_algorithm(lambda fz: lambda a, b, r: task.loss_with(fz, a, b, r), task.frozen,
                                  optax.sgd(lr), optax.sgd(1.0), dp, m)


def test_the_frozen_round_equals_the_closure_round_and_embeds_no_weights():
    p = _params()
    task = L.make_lora_task(p, CFG, L.LoraConfig(rank=4, top_layers=2))
    data = _dataset()
    ids = list(data.client_ids)
    cohort = build_cohort(data, ids, 3, capacity=5)
    dp = algs.DPConfig(clip_norm=0.05, noise_multiplier=1.0, mechanism="gaussian")
    ours = _alg(task, dp, 5)
    ref = algs.build_algorithm(task.as_lm_task().loss_fn, optax.sgd(0.5), optax.sgd(1.0), dp, 5)
    ad = task.init(jax.random.key(1))
    s_ours, m_ours = ours.apply(ours.init(ad, jax.random.key(2)), cohort.batches, cohort.client_mask,
                                jax.random.key(3))
    s_ref, m_ref = ref.apply(ref.init(ad, jax.random.key(2)), cohort.batches, cohort.client_mask, jax.random.key(3))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6,
                                                                   atol=1e-7), s_ours.params, s_ref.params)
    assert float(m_ours["num_clients"]) == 5 and float(m_ours["frac_clipped"]) == 1.0
    # the frozen weights are an argument of the executable, not constants in its program
    frozen_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(task.frozen))
    hlo = ours.apply.func.lower(task.frozen, ours.init(ad, jax.random.key(2)), cohort.batches,
                                cohort.client_mask, jax.random.key(3)).as_text()
    closed = jax.jit(ref.apply).lower(ref.init(ad, jax.random.key(2)), cohort.batches, cohort.client_mask,
                                      jax.random.key(3)).as_text()
    assert len(closed) > len(hlo) + frozen_bytes  # the closure embeds them (as text: > 1 char per byte)


def test_each_clients_update_is_clipped_on_the_adapters_and_one_client_moves_the_sum_by_at_most_2c():
    """The engine's sensitivity holds unchanged on the adapter pytree: every client's delta is
    clipped to C (all clip here), so the noise-free sum moves by <= 2C when one client is
    replaced (by one with huge, adversarial updates) and <= C when one is removed."""
    p = _params()
    task = L.make_lora_task(p, CFG, L.LoraConfig(rank=4, targets=("wq", "wv", "w_down"), top_layers=2))
    clip = 0.02
    dp = algs.DPConfig(clip_norm=clip, noise_multiplier=0.0, mechanism="gaussian")
    data = _dataset(6, 6, seed=2)
    adv_tok = np.tile(_tokens(1, 9, 99), (6, 1))
    data_adv = FederatedDataset([*data.client_ids, "adv"],
                                {"tokens": np.concatenate([data._arrays["tokens"], adv_tok])},
                                np.arange(len(data) + 2) * 6)
    ids = list(data.client_ids)
    m = 6.0
    ad = jax.tree_util.tree_map(lambda x: x + 0.05, task.init(jax.random.key(0)))

    alg = _alg(task, dp, m)  # one compiled round for the three cohorts (same shapes)

    def noise_free_sum(dataset, members):
        cohort = build_cohort(dataset, members, 3, capacity=6)
        state, met = alg.apply(alg.init(ad, jax.random.key(0)), cohort.batches, cohort.client_mask,
                               jax.random.key(5))
        # server SGD at lr 1 on -sum/m: params_new - params = sum / m
        total = jax.tree_util.tree_map(lambda a, b: (a - b) * m, state.params, ad)
        assert jax.tree_util.tree_structure(total) == jax.tree_util.tree_structure(ad)
        return total, met

    s0, met0 = noise_free_sum(data, ids)
    assert float(met0["frac_clipped"]) == 1.0 and float(met0["mean_update_norm"]) > clip
    assert float(global_norm(s0)) <= len(ids) * clip * (1 + 1e-5)
    s_swap, _ = noise_free_sum(data_adv, ids[:-1] + ["adv"])
    s_drop, _ = noise_free_sum(data, ids[:-1])
    for other, bound in ((s_swap, 2 * clip), (s_drop, clip)):
        diff = float(global_norm(jax.tree_util.tree_map(jnp.subtract, s0, other)))
        assert 0.5 * clip < diff <= bound * (1 + 1e-5), (diff, bound)
