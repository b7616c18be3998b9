"""Length-aware batches: widths are bounded, row lengths exact, and a batch cut to its longest row
gives the full-width batch's per-example losses and gradients (LSTM and transformer)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedpriv.models import bucketing
from fedpriv.models.lm import LMConfig, make_lm, make_lm_task
from fedpriv.models.metrics import PAD

T = 21  # L + 1 tokens per row, as the configs' seq_len = 20


@given(width=st.integers(2, 300), n=st.integers(1, 8))
@settings(max_examples=60, deadline=None)
def test_width_buckets_are_bounded_and_cover(width, n):
    w = bucketing.width_buckets(width, n)
    assert 1 <= len(w) <= n and w[-1] == width and min(w) >= 2 and list(w) == sorted(set(w))
    for longest in range(0, width + 1):  # every row length has a bucket, the smallest that holds it
        i = bucketing.bucket_index(longest, w)
        assert w[i] >= longest and (i == 0 or w[i - 1] < longest)


def test_width_bucket_errors():
    with pytest.raises(ValueError):
        bucketing.width_buckets(1)
    with pytest.raises(ValueError):
        bucketing.width_buckets(21, 0)
    with pytest.raises(ValueError):
        bucketing.bucket_index(22, bucketing.width_buckets(21))


def test_row_lengths_include_interior_pads():
    tok = np.array([[2, 5, 3, 0, 0], [2, 0, 7, 0, 0], [0, 0, 0, 0, 0], [2, 4, 4, 4, 3]])
    np.testing.assert_array_equal(bucketing.row_lengths(tok), [3, 3, 0, 5])
    rng = np.random.default_rng(0)
    x = np.where(rng.random((50, 9)) < 0.4, 0, rng.integers(1, 9, (50, 9)))
    ref = [max([j + 1 for j in range(9) if x[i, j] != 0], default=0) for i in range(50)]
    np.testing.assert_array_equal(bucketing.row_lengths(x), ref)


def _rows(rng, n, longest, vocab):
    """``n`` rows BOS words EOS PAD..., of at most ``longest`` tokens, width T."""
    tok = np.zeros((n, T), np.int32)
    for i in range(n):
        k = int(rng.integers(2, longest + 1))
        tok[i, :k] = np.concatenate([[2], rng.integers(4, vocab, k - 2), [3]])
    tok[0, :longest] = np.concatenate([[2], rng.integers(4, vocab, longest - 2), [3]])
    return tok


@pytest.mark.parametrize("arch,positions", [("lstm", "sinusoidal"), ("transformer", "sinusoidal"),
                                            ("transformer", "learned")])
def test_trimmed_batch_equals_padded_losses_and_gradients(arch, positions):
    vocab = 50
    task = make_lm_task(make_lm(LMConfig(vocab_size=vocab, arch=arch, embed_dim=8, hidden_dim=16,
                                         num_heads=2, max_len=T, positions=positions)))
    params = task.init(jax.random.key(1))
    rng = np.random.default_rng(2)
    longest = 9
    tok = _rows(rng, 6, longest, vocab)
    mask = np.array([1, 1, 1, 1, 1, 0], np.float32)
    width = bucketing.width_buckets(T)[bucketing.bucket_index(longest, bucketing.width_buckets(T))]
    assert width < T

    @jax.jit
    def per_example(p, tokens):  # each row alone: its loss and its gradient
        def one(row, m):
            (loss, aux), g = jax.value_and_grad(task.loss_fn, has_aux=True)(
                p, {"tokens": row[None], "mask": m[None]}, None)
            return loss, aux["loss_sum"], g
        return jax.vmap(one)(tokens, jnp.asarray(mask))

    @jax.jit
    def batch_grad(p, tokens):
        return jax.grad(lambda q: task.loss_fn(q, {"tokens": tokens, "mask": jnp.asarray(mask)}, None)[0])(p)

    full, cut = per_example(params, tok), per_example(params, tok[:, :width])
    gf, gc = batch_grad(params, tok), batch_grad(params, tok[:, :width])
    # float32: the same sums in another order (shorter reductions over time / the attention
    # keys): a few ulps of each loss, and of the largest gradient entry (some entries are exactly
    # 0 in exact arithmetic, e.g. the attention key bias, and float noise around it)
    np.testing.assert_allclose(np.asarray(cut[0]), np.asarray(full[0]), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(cut[1]), np.asarray(full[1]), rtol=1e-5)
    for ga, gb in ((full[2], cut[2]), (gf, gc)):
        scale = max(float(np.max(np.abs(np.asarray(a)))) for a in jax.tree.leaves(ga))
        for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5 * scale)
    assert float(jnp.sum(full[1])) > 0  # the rows carry real loss


def test_length_sorted_batches_partition_rows():
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, T + 1, 37)
    widths = bucketing.width_buckets(T)
    seen = []
    for rows, w in bucketing.length_sorted_batches(lengths, 8, widths):
        assert len(rows) <= 8 and w in widths and lengths[rows].max() <= w
        seen.extend(rows.tolist())
    assert sorted(seen) == list(range(37))
    assert list(lengths[seen]) == sorted(lengths)


# ----------------------------------------------------------------------------- packed rows
@given(n=st.integers(1, 300), k=st.integers(1, 12))
@settings(max_examples=60, deadline=None)
def test_count_buckets_are_bounded_and_cover(n, k):
    c = bucketing.count_buckets(n, k)
    assert 1 <= len(c) <= k and c[-1] == n and min(c) >= 1 and list(c) == sorted(set(c))
    for rows in range(1, n + 1):
        assert c[bucketing.bucket_index(rows, c)] >= rows


def _packable_rows(rng, vocab, n=10):
    """``n`` rows of varied lengths (short and long sentences, one truncated at full width, one
    with an interior PAD, one BOS alone: no target) and a mask with one padding example."""
    tok = _rows(rng, n, T, vocab)
    tok[0] = np.concatenate([[2], rng.integers(4, vocab, T - 1)])          # truncated: no EOS
    tok[1, :] = 0
    tok[1, :6] = [2, 5, PAD, 7, 8, 3]                                       # interior PAD target
    tok[2, :] = 0
    tok[2, 0] = 2                                                           # no target at all
    for i in range(3, n):                                                   # mostly short rows
        k = int(rng.integers(2, 8)) if i % 3 else int(rng.integers(8, T))
        tok[i, :] = 0
        tok[i, :k] = np.concatenate([[2], rng.integers(4, vocab, k - 2), [3]])
    mask = np.ones(n, np.float32)
    mask[-1] = 0.0
    return tok, mask


def test_pack_sentences_keeps_every_target_once():
    rng = np.random.default_rng(5)
    tok, mask = _packable_rows(rng, 50, n=16)
    packed, rows = bucketing.pack_sentences(tok, mask, extra={"weight": np.arange(16, dtype=np.float32)})
    L = T - 1
    assert packed["inputs"].shape == (16, L) and 1 < rows < int(mask.sum())
    assert float(packed["mask"].sum()) == mask.sum() and not packed["mask"][rows:].any()
    got = []
    for r in range(16):
        for s in range(1, packed["segments"][r].max(initial=0) + 1):
            at = packed["segments"][r] == s
            np.testing.assert_array_equal(packed["positions"][r][at], np.arange(at.sum()))
            (w,) = set(packed["weight"][r][at].tolist())
            got.append((int(w), tuple(packed["inputs"][r][at]), tuple(packed["targets"][r][at])))
    lens = bucketing.row_lengths(tok)
    want = [(b, tuple(tok[b, :lens[b] - 1]), tuple(tok[b, 1:lens[b]]))
            for b in range(16) if mask[b] and lens[b] > 1]
    assert sorted(got) == sorted(want)


@pytest.mark.parametrize("arch", ["lstm", "transformer"])
def test_packed_batch_equals_padded_losses_and_gradients(arch):
    """Packed rows (several sentences per row, LSTM state / attention reset at each sentence,
    positions restarting) give every example the padded batch's loss and gradient, and the
    batch its loss, gradient and metric sums, up to float summation order."""
    vocab, n = 50, 10
    task = make_lm_task(make_lm(LMConfig(vocab_size=vocab, arch=arch, embed_dim=8, hidden_dim=16,
                                         num_heads=2, max_len=T)))
    params = task.init(jax.random.key(1))
    tok, mask = _packable_rows(np.random.default_rng(2), vocab, n)
    eye = np.eye(n, dtype=np.float32)
    # example b's share of the loss: one-hot instance weights (padded [n], packed per position)
    packs = [bucketing.pack_sentences(tok, mask, extra={"weight": eye[b]}) for b in range(n)]
    rows = packs[0][1]
    assert 1 < rows < int(mask.sum()) - 1  # several sentences share rows
    packed = {k: np.stack([p[k][:rows] for p, _ in packs]) for k in packs[0][0]}
    padded = {"tokens": np.repeat(tok[None], n, 0), "mask": np.repeat(mask[None], n, 0), "weight": eye}

    def per_example(p, batches):
        def one(b):
            (loss, aux), g = jax.value_and_grad(task.loss_fn, has_aux=True)(p, b, None)
            return loss, aux, g
        return jax.vmap(one)(batches)

    def whole(b):  # the whole batch, no weights: the step's loss and gradient
        return {k: v[:1] for k, v in b.items() if k != "weight"}

    # the test has teeth: the same rows read as ONE sentence each (no reset, no segment mask,
    # positions running on) change the losses of the examples not first in their row
    merged = dict(packed, segments=np.minimum(packed["segments"], 1),
                  positions=np.broadcast_to(np.arange(T - 1), packed["positions"].shape))
    ref, got, step_ref, step_got, bad = jax.jit(lambda p: (  # one compiled program
        per_example(p, padded), per_example(p, packed), per_example(p, whole(padded)),
        per_example(p, whole(packed)), per_example(p, merged)[0]))(params)
    # float32: the same terms summed in another order (the batch's token sums, attention over
    # more, exactly-zero-weighted keys, the LSTM's dW_h over more rows): a few ulps of each
    # loss; gradients to 1e-4 relative or 1e-5 of the largest entry (some are 0 in exact math)
    for (lr, ar, gr), (lg, ag, gg) in ((ref, got), (step_ref, step_got)):
        np.testing.assert_allclose(np.asarray(lg), np.asarray(lr), rtol=1e-5, atol=1e-7)
        for k in ("num_tokens", "num_correct", "num_acc_tokens", "num_examples"):
            np.testing.assert_array_equal(np.asarray(ag[k]), np.asarray(ar[k]))
        np.testing.assert_allclose(np.asarray(ag["loss_sum"]), np.asarray(ar["loss_sum"]), rtol=1e-5)
        scale = max(float(np.max(np.abs(np.asarray(a)))) for a in jax.tree.leaves(gr))
        for a, b in zip(jax.tree.leaves(gr), jax.tree.leaves(gg)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5 * scale)
    assert np.count_nonzero(np.asarray(ref[0])) >= 6 and float(step_ref[1]["num_examples"][0]) == n - 1
    # the test has teeth: the same rows read as ONE sentence each (no reset, no segment mask,
    # positions running on) change the losses of the examples not first in their row
    later = np.asarray([(p["segments"][:rows] * p["weight"][:rows]).max() > 1 for p, _ in packs])
    assert later.sum() >= 3
    bad = np.asarray(bad)
    assert np.all(np.abs(bad - np.asarray(ref[0]))[later] > 1e-4 * np.abs(np.asarray(ref[0]))[later])
