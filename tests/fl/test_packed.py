"""Packed-lane cohort execution: equals the padded path, pays only for real steps, bounded shapes."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedpriv.fl.aggregate import packed_sum
from fedpriv.fl.algorithms import DPConfig, build_algorithm, dp_fedavg, server_optimizer
from fedpriv.fl.client import make_local_step
from fedpriv.fl.cohort import assign_lanes, build_cohort, pack_cohort
from fedpriv.fl.execution import CohortExecutor, balanced_lanes, lpt_depth
from fedpriv.fl.samplers import PoissonSampler
from tests.fl.helpers import init_params, loss_fn, make_dataset
from tests.oracles import cohort_sum, make_client_update

B = 4


def lognormal_dataset(num_clients, seed=0, dim=5):
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(2.5, 1.0, num_clients)), 1, 120).astype(int)
    w = rng.normal(size=(dim,))
    data = {}
    for i, n in enumerate(sizes):
        x = rng.normal(size=(n, dim)).astype(np.float32)
        data[f"c{i:03d}"] = {"x": x, "y": (x @ w).astype(np.float32)}
    return data


@pytest.mark.parametrize("lanes,epochs,weighting,first", [
    (1, 1, "uniform", False), (3, 1, "num_examples", False), (1, 2, "num_examples", False),
    (4, 2, "uniform", False), (1, 1, "num_examples", True), (3, 2, "uniform", True)])
def test_packed_sum_equals_padded_cohort_sum(lanes, epochs, weighting, first):
    data = lognormal_dataset(11, seed=lanes + epochs)
    ids = list(data)[:9]
    params = {"w": jnp.full((5,), 0.3), "b": jnp.asarray(-0.2)}
    rng = jax.random.key(7)
    padded = build_cohort(data, ids, B, capacity=12, max_steps=8, rng=np.random.default_rng(3))
    ref_fn = jax.jit(lambda b, m, c: cohort_sum(make_client_update(loss_fn, optax.sgd(0.05), epochs),
                                                params, b, m, rng, c, weighting, 20.0))
    norms = np.asarray(ref_fn(padded.batches, padded.client_mask, jnp.inf)[1]["norms"])[:9]
    clip = float(np.median(norms))  # clipping active for about half the clients
    ref, ref_stats = ref_fn(padded.batches, padded.client_mask, clip)
    packed = pack_cohort(data, ids, B, lanes=lanes, capacity=12, max_steps=8, local_epochs=epochs,
                         rng=np.random.default_rng(3), first_steps=first)
    if first and epochs == 1:
        assert 0 < float(packed.first.single.sum()) < 9  # some clients have only their first step
    opt = optax.sgd(0.05)
    got, stats = jax.jit(lambda ln, f: packed_sum(make_local_step(loss_fn, opt), opt.init, params, ln, 12,
                                                  rng, clip, weighting, 20.0, first=f))(packed.lanes, packed.first)
    for k in ref:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), rtol=1e-5, atol=1e-6)
    assert 0 < float(stats["num_clipped"]) < 9  # clipping is active for some clients only
    for k in ("weight_sum", "norm_sum", "num_clipped", "num_nonfinite", "num_clients"):
        np.testing.assert_allclose(float(stats[k]), float(ref_stats[k]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(stats["norms"])[:9], np.asarray(ref_stats["norms"])[:9], rtol=1e-5)
    np.testing.assert_allclose(float(stats["aux"]["num_tokens"]), float(ref_stats["aux"]["num_tokens"]))


def test_one_lane_executes_exactly_the_real_steps():
    data = lognormal_dataset(40, seed=1)
    ids = list(data)
    steps = [-(-len(data[c]["y"]) // B) for c in ids]
    packed = pack_cohort(data, ids, B, lanes=1)
    assert packed.real_steps == sum(steps) == packed.executed_steps
    padded = build_cohort(data, ids, B, capacity=40)
    assert padded.batches["mask"].shape[1] * 40 > 2 * sum(steps)  # what padding would have cost
    assert packed.lanes.src.shape[1] & (packed.lanes.src.shape[1] - 1) == 0  # power-of-two depth


def test_lpt_lanes_are_balanced_within_one_client():
    rng = np.random.default_rng(0)
    steps = [int(s) for s in np.clip(np.round(rng.lognormal(1.0, 1.0, 100)), 1, 16)]
    for lanes in (2, 4, 8):
        members = assign_lanes(steps, lanes)
        assert sorted(i for m in members for i in m) == list(range(100))
        loads = [sum(steps[i] for i in m) for m in members]
        assert max(loads) - min(loads) <= max(steps)
    w = balanced_lanes(steps)
    assert w & (w - 1) == 0 and w <= sum(steps) // max(steps)


def test_lpt_depth_matches_assign_lanes():
    rng = np.random.default_rng(1)
    for lanes in (1, 3, 8, 64):
        steps = [int(s) for s in np.clip(np.round(rng.lognormal(1.5, 1.0, 50)), 1, 16)]
        loads = [sum(steps[i] for i in m) for m in assign_lanes(steps, lanes)]
        assert lpt_depth(steps, lanes) == max(loads)


def test_equal_clients_get_one_lane_each_when_that_executes_fewer_steps():
    """100 clients of 16 steps: 64 balanced lanes would run 2 clients on 36 lanes (depth 32:
    2048 executed for 1600 real, the 1.28 measured on an H100); one client per lane runs
    exactly the real steps. Log-normal cohorts keep the power-of-two balanced count."""
    steps = [16] * 100
    assert balanced_lanes(steps) == 64                       # without the capacity candidate
    assert balanced_lanes(steps, capacity=100) == 100
    assert balanced_lanes(steps, capacity=100, max_lanes=64) == 64   # memory cap wins
    assert balanced_lanes(steps, multiple=8, capacity=100) == 104    # device multiple
    rng = np.random.default_rng(0)
    logn = [int(s) for s in np.clip(np.round(rng.lognormal(1.0, 1.0, 100)), 1, 16)]
    w = balanced_lanes(logn, capacity=100)
    assert w & (w - 1) == 0 and w == balanced_lanes(logn)
    data = {f"c{i}": {"x": np.zeros((16 * B, 3), np.float32), "y": np.zeros(16 * B, np.float32)}
            for i in range(100)}
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=1.0,
                    noise_multiplier=1.0, expected_cohort_size=100)
    packed = CohortExecutor(alg, data, batch_size=B, capacity=100, lanes="balanced").pack(list(data))
    assert packed.executed_steps == packed.real_steps == 1600


def _executor(data, z, cohort=6):
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=1.0,
                    noise_multiplier=z, expected_cohort_size=cohort)
    return alg, CohortExecutor(alg, data, batch_size=B, capacity=16, variable_cohort=True, lanes=1)


def test_empty_cohort_releases_the_noisy_zero_sum():
    """A Poisson round that samples nobody must still release sum + noise (what is accounted)."""
    dim = 4000
    data = make_dataset(num_clients=4, dim=dim)
    z, m = 2.0, 6
    alg, ex = _executor(data, z, m)
    state = alg.init(init_params(dim), jax.random.key(0))
    packed = ex.pack([])
    assert packed.real_steps == 0
    new, metrics = ex.run(state, packed, jax.random.key(1))
    assert float(metrics["num_clients"]) == 0
    moved = np.asarray(new.params["w"] - state.params["w"])
    assert abs(moved.std() / (z * 1.0 / m) - 1) < 0.05  # noise std z C / m per coordinate
    alg0, ex0 = _executor(data, 0.0, m)
    s0 = alg0.init(init_params(dim), jax.random.key(0))
    n0, _ = ex0.run(s0, ex0.pack([]), jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(n0.params["w"]), np.asarray(s0.params["w"]))


def test_compiled_shapes_stay_bounded_over_variable_cohorts():
    data = lognormal_dataset(200, seed=2)
    ids = list(data)
    sampler = PoissonSampler(200, 0.04, seed=0)
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=1.0,
                    noise_multiplier=0.5, expected_cohort_size=sampler.expected_cohort_size)
    ex = CohortExecutor(alg, data, batch_size=B, capacity=sampler.max_cohort_size,
                        variable_cohort=True, lanes=1)
    state = alg.init(init_params(), jax.random.key(0))
    shapes = set()
    for r in range(30):
        packed = ex.pack([ids[i] for i in sampler.sample(r)])
        shapes.add((packed.lanes.src.shape, packed.capacity))
        state, _ = ex.run(state, packed, jax.random.key(r))
    depths = {s[0][1] for s in shapes}
    assert all(d & (d - 1) == 0 for d in depths)
    assert all(c & (c - 1) == 0 or c == sampler.max_cohort_size for _, c in shapes)
    assert alg.apply._cache_size() == len(shapes) <= 12
    assert ex.executed_steps == ex.real_steps > 0


def test_bf16_client_compute_keeps_float32_sums_and_tracks_float32():
    data = lognormal_dataset(12, seed=4)
    ids = list(data)[:8]
    kw = dict(clip_norm=1.0, noise_multiplier=0.0, expected_cohort_size=8)
    ref = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), **kw)
    half = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), compute_dtype=jnp.bfloat16, **kw)
    packed = pack_cohort(data, ids, B)
    outs = []
    for alg in (ref, half):
        st = alg.init(init_params(), jax.random.key(0))
        st, _ = alg.apply(st, packed.lanes, packed.client_mask, jax.random.key(1))
        outs.append(st.params)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(outs[1]))
    moved = np.asarray(outs[0]["w"])
    np.testing.assert_allclose(np.asarray(outs[1]["w"]), moved, rtol=0.05, atol=0.02 * np.abs(moved).max())
    assert not np.array_equal(np.asarray(outs[1]["w"]), moved)  # bf16 really ran


# ----------------------------------------------------------------------------- length-aware batches
def _lm_clients(num_clients, seed=0, vocab=40, width=21):
    """LM clients whose sentences have client-specific typical lengths (some clients short, some
    long, a few full width), so trimmed batches take several widths."""
    rng = np.random.default_rng(seed)
    data = {}
    for i in range(num_clients):
        n = int(rng.integers(3, 23))
        typical = int(rng.integers(3, width + 1))
        tok = np.zeros((n, width), np.int32)
        for j in range(n):
            k = int(np.clip(rng.integers(typical - 2, typical + 3), 2, width))
            tok[j, :k] = np.concatenate([[2], rng.integers(4, vocab, k - 2), [3]])
        data[f"u{i:02d}"] = {"tokens": tok}
    return data


def _tiny_lm():
    from fedpriv.models.lm import LMConfig, make_lm, make_lm_task
    task = make_lm_task(make_lm(LMConfig(vocab_size=40, embed_dim=8, hidden_dim=12)))
    return task, task.init(jax.random.key(0))


def test_trimmed_lanes_equal_padded_and_run_fewer_positions():
    """batching='trimmed': the same batches cut to their bucket width give the padded path's
    clipped sum, statistics and metrics up to float order, on fewer executed positions."""
    task, params = _tiny_lm()
    data = _lm_clients(10, seed=1)
    ids = list(data)[:8]
    opt = optax.sgd(0.5)
    run = jax.jit(lambda ln, c: packed_sum(make_local_step(task.loss_fn, opt), opt.init, params, ln, 8,
                                           jax.random.key(3), c))
    packs = {b: pack_cohort(data, ids, B, capacity=8, max_steps=4, rng=np.random.default_rng(5), batching=b)
             for b in ("padded", "trimmed")}
    norms = np.asarray(run(packs["padded"].lanes, jnp.inf)[1]["norms"])
    clip = float(np.median(norms))
    (ref, rs), (got, gs) = (run(packs[b].lanes, clip) for b in ("padded", "trimmed"))
    assert len(set(np.asarray(packs["trimmed"].lanes.bucket).ravel().tolist())) >= 3  # widths used
    scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree_util.tree_leaves(ref))
    for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5 * scale)
    for k in ("weight_sum", "norm_sum", "num_clipped", "num_clients"):
        np.testing.assert_allclose(float(gs[k]), float(rs[k]), rtol=1e-5)
    for k in ("loss_sum", "num_tokens", "num_correct"):
        np.testing.assert_allclose(float(gs["aux"][k]), float(rs["aux"][k]), rtol=1e-5)
    p, t = packs["padded"], packs["trimmed"]
    assert p.real_positions == t.real_positions == int(rs["aux"]["num_tokens"])
    assert p.executed_positions == p.real_steps * B * 20 and t.executed_positions < p.executed_positions


def test_sorted_batches_keep_each_clients_examples_and_sort_within_batches():
    """batching='sorted': each client keeps the examples the padded path keeps (same shuffle,
    same max_steps cut, same example counts and steps), batched by length; less padding."""
    from fedpriv.models.bucketing import row_lengths
    data = _lm_clients(12, seed=2)
    ids = list(data)[:9]
    kw = dict(capacity=9, max_steps=2, rng=None)
    packs = {b: pack_cohort(data, ids, B, **dict(kw, rng=np.random.default_rng(4)), batching=b)
             for b in ("padded", "trimmed", "sorted")}
    p, s = packs["padded"].lanes, packs["sorted"].lanes
    np.testing.assert_array_equal(np.asarray(p.num_examples), np.asarray(s.num_examples))
    np.testing.assert_array_equal(np.asarray(p.length), np.asarray(s.length))
    np.testing.assert_array_equal(np.asarray(p.slot), np.asarray(s.slot))
    for lane in range(p.length.shape[0]):
        for slot in range(9):  # the client's data rows: the same multiset of real examples
            rows = sorted(set(np.asarray(p.src[lane])[(np.asarray(p.slot[lane]) == slot)
                                                     & (np.arange(p.src.shape[1]) < p.length[lane])].tolist()))
            if not rows:
                continue
            def real(lanes):
                tok = np.asarray(lanes.data["tokens"][lane])[rows].reshape(-1, 21)
                return tok[np.asarray(lanes.data["mask"][lane])[rows].reshape(-1) > 0]
            a, b = real(p), real(s)
            assert sorted(map(tuple, a.tolist())) == sorted(map(tuple, b.tolist()))
            # sorted: every batch's rows are one contiguous run of the client's sorted lengths
            batches = [row_lengths(np.asarray(s.data["tokens"][lane][r])[np.asarray(s.data["mask"][lane][r]) > 0])
                       for r in rows]
            spans = sorted((x.min(), x.max()) for x in batches)
            assert all(hi <= lo2 for (_, hi), (lo2, _) in zip(spans, spans[1:]))
    pos = {b: packs[b].executed_positions for b in packs}
    assert pos["sorted"] < pos["trimmed"] <= pos["padded"]
    assert len({packs[b].real_positions for b in packs}) == 1


def test_batching_options_are_checked():
    data = _lm_clients(4)
    with pytest.raises(ValueError, match="batching"):
        pack_cohort(data, list(data), B, batching="pack")
    alg = dp_fedavg(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), clip_norm=1.0,
                    noise_multiplier=0.0, expected_cohort_size=4)
    for b in ("trimmed", "packed"):
        with pytest.raises(ValueError, match="one sequential lane"):
            CohortExecutor(alg, data, batch_size=B, capacity=4, lanes=2, batching=b)
    with pytest.raises(ValueError, match="per-example scalar"):
        pack_cohort({k: dict(v, extra=np.zeros((len(v["tokens"]), 2))) for k, v in data.items()},
                    list(data), B, batching="packed")
    with pytest.raises(ValueError, match="batching"):
        CohortExecutor(alg, data, batch_size=B, capacity=4, batching="sort")
    # "auto" (the LM configs' default): packed on one lane, padded on vmapped lanes
    assert CohortExecutor(alg, data, batch_size=B, capacity=4, lanes=1, batching="auto").batching == "packed"
    assert CohortExecutor(alg, data, batch_size=B, capacity=4, lanes=2, batching="auto").batching == "padded"
    # vmapped lanes keep the full width (lax.switch under vmap would run every width)
    packed = pack_cohort(data, list(data), B, lanes=2, batching="sorted")
    assert packed.lanes.bucket is None and packed.lanes.widths == ()


def test_packed_round_equals_padded_with_bounded_row_counts():
    """batching='packed': a full DP-FedAvg round (engine: packing, lane, clipping, noise, server
    update) gives the padded path's parameters and metrics up to float order, on fewer executed
    positions; each step runs on one of at most 8 row counts (compiled bodies). (Both models'
    packed losses and gradients: tests/models/test_length_buckets.py.)"""
    from fedpriv.models.bucketing import count_buckets
    task, params = _tiny_lm()
    data = _lm_clients(12, seed=3)
    alg = dp_fedavg(task.loss_fn, optax.sgd(0.5), server_optimizer("sgd", 1.0), clip_norm=0.3,
                    noise_multiplier=1.0, expected_cohort_size=8)
    runs = {}
    for batching in ("padded", "packed"):
        ex = CohortExecutor(alg, data, batch_size=B, capacity=8, max_steps=4, lanes=1, batching=batching)
        packed = ex.pack(list(data)[:8], rng=np.random.default_rng(7))
        state, m = ex.run(alg.init(params, jax.random.key(1)), packed, jax.random.key(2))
        runs[batching] = (state, m, ex, packed)
    (ps, pm, pe, _), (qs, qm, qe, packed) = runs["padded"], runs["packed"]
    scale = max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree_util.tree_leaves(ps.params),
                                                                 jax.tree_util.tree_leaves(params)))
    for a, c in zip(jax.tree_util.tree_leaves(ps.params), jax.tree_util.tree_leaves(qs.params)):
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-5, atol=1e-5 * scale)
    assert 0 < float(pm["frac_clipped"]) < 1  # clipping active, not for every client
    for k in ("frac_clipped", "num_clients", "num_tokens", "num_correct", "num_examples"):
        assert float(qm[k]) == float(pm[k]), k
    np.testing.assert_allclose(float(qm["loss_sum"]), float(pm["loss_sum"]), rtol=1e-5)
    assert qe.executed_steps == qe.real_steps == pe.real_steps == pe.executed_steps
    assert qe.real_positions == pe.real_positions and qe.executed_positions < 0.75 * pe.executed_positions
    lanes = packed.lanes  # the bound: every step's rows fit its bucket, at most 8 row counts
    assert lanes.widths == count_buckets(B, 8) and len(lanes.widths) <= 8 and lanes.trim_axis == 0
    used = (np.asarray(lanes.data["mask"]) > 0).sum(-1)[0]                  # rows in use per data step
    width = np.asarray(lanes.widths)[np.asarray(lanes.bucket)[0]]
    assert np.all(used <= width) and len(set(width[used > 0].tolist())) >= 2


def test_unk_free_loss_takes_packed_batches():
    """The public-training student's loss (UNK targets untrained, `unk_free_loss_task`) gives the
    same loss and gradient on a packed batch as on its padded batch, and still drops UNK targets
    (it differs from the plain loss): the loss wrappers read batches through `lm.batch_view`."""
    from fedpriv.models.bucketing import pack_sentences
    from fedpriv.models.metrics import UNK
    from fedpriv.public.vocab import unk_free_loss_task
    task, params = _tiny_lm()
    free = unk_free_loss_task(task)
    tok = np.concatenate([_lm_clients(1, seed=5)["u00"]["tokens"][:6]] * 2)[:8]
    tok[:, 2] = np.where(tok[:, 2] > 3, UNK, tok[:, 2])  # some UNK targets
    mask = np.array([1, 1, 1, 1, 1, 1, 0, 1], np.float32)
    padded = {"tokens": jnp.asarray(tok), "mask": jnp.asarray(mask)}
    packed = {k: jnp.asarray(v) for k, v in pack_sentences(tok, mask, 0)[0].items()}
    rng = jax.random.key(0)
    for fn in (free.loss_fn, task.loss_fn):
        (la, sa), ga = jax.value_and_grad(fn, has_aux=True)(params, padded, rng)
        (lb, sb), gb = jax.value_and_grad(fn, has_aux=True)(params, packed, rng)
        np.testing.assert_allclose(float(lb), float(la), rtol=1e-5)
        for k in ("num_tokens", "num_examples"):
            assert float(sb[k]) == float(sa[k]), k
        for a, b in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
    tokens = {name: float(t.loss_fn(params, packed, rng)[1]["num_tokens"])
              for name, t in (("free", free), ("plain", task))}
    assert tokens["free"] < tokens["plain"]


# ----------------------------------------------------------------------------- issue 54: the clip on every path
_CLIP, _E = 0.5, 3
# (lanes, batched first steps, batching, lane chunk): one sequential lane (the CPU path), vmapped
# lanes, vmapped lanes in chunks, batched first steps (clients whose only step is the first are
# finished there), packed rows (sentences end to end), and the padded cohort's one lane per client
PATHS = [(1, False, "padded", None), (3, False, "padded", None), (4, False, "padded", 2),
         (1, True, "padded", None), (3, True, "padded", None), (1, False, "packed", None),
         (1, True, "packed", None), ("padded_cohort", False, "padded", None)]


def _marked_clients(sizes, width=6, seed=0):
    """Client i's sentences are all made of token ``i + 1`` (PAD = 0), of random lengths 2..width."""
    rng = np.random.default_rng(seed)
    data = {}
    for i, n in enumerate(sizes):
        tok = np.zeros((n, width), np.int32)
        for j in range(n):
            tok[j, :int(rng.integers(2, width + 1))] = i + 1
        data[f"m{i}"] = {"tokens": tok}
    return data


def _marking_loss(params, batch, rng):
    """``-100 sum_{real target positions} sum_e w[input token, e]``, padded (``tokens``, ``mask``)
    or packed (``inputs``, ``segments``) batches: the gradient touches only the rows of the
    tokens seen, so one SGD step at lr 1 moves client i's row ``i + 1`` only, by ``100 x``
    (its token count): a delta of norm >= 100 sqrt(E), far above the clip."""
    if "tokens" in batch:
        inputs = batch["tokens"][:, :-1]
        real = (batch["tokens"][:, 1:] > 0) * batch["mask"][:, None]
    else:
        inputs, real = batch["inputs"], (batch["segments"] > 0).astype(jnp.float32)
    score = jnp.sum(params["w"][inputs], axis=-1)
    return -100.0 * jnp.sum(real * score), {"num_tokens": jnp.sum(real)}


@pytest.mark.parametrize("lanes,first,batching,chunk", PATHS,
                         ids=[f"{p[0]}lanes-first{int(p[1])}-{p[2]}-chunk{p[3]}" for p in PATHS])
def test_every_delta_that_reaches_the_sum_is_within_the_clip(lanes, first, batching, chunk):
    """On every execution path of the engine's round (the one ``apply`` on ``cohort.pack_cohort``
    lanes, or on a padded cohort), each client's contribution
    to the released sum has norm <= C. Client i's delta lives in row ``i + 1`` of the model only
    (``_marking_loss``) and is >= 340 C before clipping, so the sum (noise 0: the server step
    is the sum over m) shows every client's contribution on its own: each has norm C up to
    float32 rounding, for one-step clients (finished by the batched first steps) and multi-step
    ones, on one lane, vmapped lanes, lane chunks and packed rows; nothing else moves."""
    sizes = [1, 2, 3, 5, 8, 1, 4]                         # batch 2: clients 0, 1, 5 take one step
    k, data = len(sizes), _marked_clients(sizes)
    ids = list(data)
    alg = build_algorithm(_marking_loss, optax.sgd(1.0), server_optimizer("sgd", 1.0),
                          DPConfig(clip_norm=_CLIP, noise_multiplier=0.0), expected_cohort_size=k,
                          chunk_size=chunk)
    params = {"w": jnp.zeros((k + 3, _E), jnp.float32)}
    state = alg.init(params, jax.random.key(0))
    if lanes == "padded_cohort":
        cohort = build_cohort(data, ids, 2, capacity=8)
        new, metrics = alg.apply(state, cohort.batches, cohort.client_mask, jax.random.key(1))
    else:
        packed = pack_cohort(data, ids, 2, lanes=lanes, capacity=8, first_steps=first,
                             batching=batching)
        assert (packed.first is not None) == first
        if first:
            assert float(packed.first.single.sum()) == 3
        new, metrics = alg.apply(state, packed.lanes, packed.client_mask, jax.random.key(1), packed.first)
    contrib = np.asarray(new.params["w"], np.float64) * k     # the sum (server lr 1, over m = k)
    norms = np.linalg.norm(contrib, axis=1)
    assert float(metrics["num_clients"]) == k and float(metrics["frac_clipped"]) == 1.0
    assert float(metrics["mean_update_norm"]) > 340 * _CLIP
    np.testing.assert_allclose(norms[1:k + 1], _CLIP, rtol=1e-5, err_msg="a client's contribution "
                               "to the sum is not its delta clipped to C")
    assert norms[0] == 0 and np.all(norms[k + 1:] == 0)
