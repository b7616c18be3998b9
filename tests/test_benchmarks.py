"""benchmarks.ceiling's "accuracy by argmax" engine path computes what the engine computes
(``argmax_loss`` gives the loss, gradient and metric sums of ``task.loss_fn``, whose accuracy is
``fedpriv.models.metrics.top1_correct``, on padded and packed batches); benchmarks.profile_phases'
buckets partition a profile; benchmarks.regeneration counts a run store's runs once;
benchmarks.mutate applies mutants to a scratch copy and classifies them (on a toy repository)."""
import os
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import mutate
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


def test_mutate_applies_each_mutant_to_a_scratch_copy_and_classifies_it(tmp_path):
    """benchmarks.mutate (issue 54) on a toy repository: a mutant the toy's test notices is
    killed, an equivalent one survives, a ``find`` that is not unique, a duplicated id and a
    malformed entry are invalid; the mutants are applied to the committed tree (an uncommitted
    edit of the working tree is neither used nor touched), and the report says 1 of 2."""
    repo = tmp_path / "toy"
    (repo / "toy").mkdir(parents=True)
    (repo / "toy" / "__init__.py").write_text("")
    calc = repo / "toy" / "calc.py"
    calc.write_text("def add(a, b):\n    return a + b\n\n\ndef double(x):\n    return x + x  # twice\n")
    (repo / "test_calc.py").write_text("from toy.calc import add, double\n\n\ndef test_add():\n"
                                       "    assert add(2, 3) == 5 and double(4) == 8\n")
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "toy"], check=True)
    calc.write_text(calc.read_text().replace("a + b", "b + a"))   # uncommitted
    lst = tmp_path / "toy.toml"
    entry = ('[[mutant]]\nid = "{id}"\nclass = "c"\nfile = "toy/calc.py"\nfind = "{find}"\n'
             'replace = "{replace}"\ntests = ["test_calc.py"]\nwhy = "w"\n\n')
    lst.write_text(entry.format(id="sub", find="a + b", replace="a - b")
                   + entry.format(id="equivalent", find="x + x", replace="2 * x")
                   + entry.format(id="twice", find="return", replace="return -")
                   + entry.format(id="dup", find="a + b", replace="a * b")
                   + entry.format(id="dup", find="x + x", replace="x * x")
                   + '[[mutant]]\nid = "no-tests"\nclass = "c"\nfile = "toy/calc.py"\nfind = "x"\n'
                     'replace = "y"\nwhy = "w"\n')
    mutants = mutate.load_lists([str(lst)])
    outcomes, meta = mutate.run(mutants, timeout=120, log=lambda *_: None, repo=str(repo))
    assert [(o.id, o.status) for o in outcomes] == [
        ("sub", "killed"), ("equivalent", "survived"), ("twice", "invalid"), ("dup", "invalid"),
        ("dup", "invalid"), ("no-tests", "invalid")]
    assert "test_add" in outcomes[0].detail and "2 times in toy/calc.py" in outcomes[2].detail
    assert "used 2 times" in outcomes[3].detail and "tests" in outcomes[5].detail
    assert list(meta["baseline"].values()) and all(v["status"] == "passed" for v in meta["baseline"].values())
    assert "b + a" in calc.read_text()                              # the working tree is untouched
    report = mutate.to_json(mutants, outcomes, meta, {"equivalent": "2 * x == x + x"})
    assert report["summary"]["kill_rate"] == 0.5 and report["summary"]["invalid"] == 4
    md = mutate.to_markdown(report)
    assert "50.0 % killed" in md and "2 * x == x + x" in md
