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
