"""benchmarks.ceiling's "accuracy by argmax" engine path computes what the engine computes
(``argmax_loss`` gives the loss, gradient and metric sums of ``task.loss_fn``, whose accuracy is
``fedpriv.models.metrics.top1_correct``, on padded and packed batches); benchmarks.profile_phases'
buckets partition a profile; benchmarks.regeneration counts a run store's runs once."""
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.ceiling import argmax_loss
from fedpriv.models import bucketing
from fedpriv.models.lm import LMConfig, make_lm, make_lm_task


def test_argmax_loss_equals_the_task_loss_padded_and_packed():
    cfg = LMConfig(vocab_size=50, embed_dim=8, hidden_dim=16, max_len=10)
    task = make_lm_task(make_lm(cfg))
    params = task.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = np.zeros((6, cfg.max_len + 1), np.int32)
    for i, n in enumerate([3, 9, 1, 5, 10, 7]):
        tokens[i, 0], tokens[i, 1:n + 1] = 2, rng.integers(1, cfg.vocab_size, n)
        if n < cfg.max_len:
            tokens[i, n + 1] = 3
    mask = np.array([1, 1, 1, 1, 1, 0], np.float32)
    packed, _ = bucketing.pack_sentences(tokens, mask)
    ours = jax.jit(jax.value_and_grad(argmax_loss(task), has_aux=True))
    theirs = jax.jit(jax.value_and_grad(task.loss_fn, has_aux=True))
    for batch in ({"tokens": tokens, "mask": mask}, packed):
        (l1, a1), g1 = ours(params, batch, None)
        (l2, a2), g2 = theirs(params, batch, None)
        assert float(l1) == float(l2) and set(a1) == set(a2)
        for k in a1:
            assert float(a1[k]) == float(a2[k]), k
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), g1, g2)
    # num_correct must be non-zero for its equality to mean something: a head biased towards
    # token 7, and sentences of 7s with ties against token 9 (equal bias: the first maximum wins)
    bias = params["head"]["logits"]["bias"].at[7].set(50.0).at[9].set(50.0)
    hit = {**params, "head": {**params["head"], "logits": {**params["head"]["logits"], "bias": bias}}}
    sevens = np.where(tokens > 3, np.where(np.arange(tokens.shape[1]) % 2, 7, 9), tokens).astype(np.int32)
    (_, a1), _ = ours(hit, {"tokens": sevens, "mask": mask}, None)
    (_, a2), _ = theirs(hit, {"tokens": sevens, "mask": mask}, None)
    assert float(a1["num_correct"]) == float(a2["num_correct"]) > 0


def test_profile_buckets_cover_the_whole_profile_and_find_the_compile(tmp_path):
    """benchmarks.profile_phases: the buckets partition the profile's self time, and a fresh jit
    compile and a blocking read of its result land in their own buckets."""
    import cProfile
    import pstats

    from benchmarks.profile_phases import BUCKETS, WAIT, buckets_of

    salt = float(time.time_ns() % 1_000_003)  # a program no cache holds (the suite keeps a persistent one)

    def work():
        f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() + salt)
        np.asarray(f(jnp.ones((300, 300))))

    prof = str(tmp_path / "p.prof")
    cProfile.runctx("work()", globals(), {"work": work}, prof)
    got = buckets_of(prof)
    total = sum(v[2] for v in pstats.Stats(prof).stats.values())
    assert set(got) == set(BUCKETS) and abs(sum(got.values()) - total) < 1e-9
    assert got["XLA compile"] > 0 and got[WAIT] >= 0


def test_regeneration_counts_the_runs_a_store_published_module_read(tmp_path):
    import json

    from benchmarks import regeneration

    def run(d, **s):
        os.makedirs(tmp_path / d, exist_ok=True)
        with open(tmp_path / d / "summary.json", "w") as f:
            json.dump(s, f)

    run("store/a", run_key="k1", git_commit="abcdef0123", wall_clock_s=100.0)
    run("store/b/nested", run_key="k2", git_commit="1234567890", wall_clock_s=50.5)
    run("store/c", run_key="k3", git_commit="abcdef0123", wall_clock_s=7.0, reused_from="elsewhere")  # a copy
    run("store/d", wall_clock_s=9.0)  # an experiment's own summary, not a run
    got = regeneration.stored_runs("store", root=str(tmp_path))
    assert got == {"n": 2, "wall_s": 150.5, "commits": ["1234567", "abcdef0"]}
    run("store/e", run_key="k4", git_commit="abcdef0123")  # a run without its wall clock: the sum is unknown
    assert regeneration.stored_runs("store", root=str(tmp_path))["wall_s"] is None
    assert regeneration.stored_runs("missing", root=str(tmp_path)) == {"n": 0, "wall_s": None, "commits": []}
    assert regeneration._store("configs/x.py:small,seeds=0/1,reuse_workdir=store,train_missing=False") == "store"
    assert regeneration._store("configs/x.py:small,seeds=0/1") is None
    table = [{"module": "m", "config": "c", "commit": "abc", "wall_s": 10.0, "cpu_s": 9.0, "source": "summary",
              "store": "store", "stored": {"n": 2, "wall_s": 150.5, "commits": ["abcdef0"]}},
             {"module": "n", "config": "c,reuse_workdir=store", "commit": "abc", "wall_s": 5.0, "cpu_s": 4.0,
              "source": "summary", "store": "store", "stored": {"n": 2, "wall_s": 150.5, "commits": ["abcdef0"]}}]
    md = regeneration.markdown(table)
    assert "2 (abcdef0): 150" in md and "total wall 15 s, CPU 13 s" in md
    assert "1 store(s), each counted once): 2 runs, 150 s" in md  # two modules, one store: not doubled
