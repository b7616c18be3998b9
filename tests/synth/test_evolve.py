"""PrE-Text's loop on a tiny random LLM: the votes steer which samples survive, the ledger is
charged once before any vote, every round is released once, the expansion has its size, and the
generations never reuse the votes' noise keys."""
import jax
import numpy as np
import pytest

from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.samplers import ShuffledPassSampler
from fedpriv.models import llama
from fedpriv.synth import evolve as E, release as R

CFG = llama.LlamaConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=24)
D = 8


class _Tok:  # ids <-> "w<id>" words; id 2 is the end of turn
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids if i > 2)

    def token_to_id(self, s):
        return 2 if s == "<|im_end|>" else None


@pytest.fixture(scope="module")
def teacher():
    params = llama.init_params(jax.random.key(0), CFG, 0.5)
    return llama.Teacher(params=params, config=CFG, tokenizer=_Tok(), fingerprint="t", bos_id=0,
                         eos_id=0)


def _embed(texts):
    """A fixed public embedding: bag of words through a random projection, unit rows."""
    proj = np.random.default_rng(0).normal(size=(CFG.vocab_size, D))
    out = np.zeros((len(texts), D))
    for r, t in enumerate(texts):
        for w in t.split():
            if w.startswith("w"):
                out[r] += proj[int(w[1:])]
    out[~out.any(axis=1)] = 1.0
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def test_allocate_sums_and_follows_votes():
    a = E.allocate(np.array([5.0, -1, 1.0, 0, 2.0]), np.array([0, 4, 2]), 16)
    assert a.sum() == 16 and a[0] > a[1] > a[2] >= 1
    np.testing.assert_array_equal(E.allocate(np.array([-1.0, -2]), np.array([0, 1]), 5), [3, 2])


def test_votes_steer_the_population_and_everything_is_charged_once(teacher):
    s = E.EvolveSettings(num_samples=8, keep_fraction=0.25, expansion=6, max_new=6,
                         batch_size=8, top_k=0)
    prompts = [[3, 4, 5], [6, 7]]
    key = jax.random.key(7)
    # the population a round will see: the same initial samples evolve() draws
    init = E.initial_samples(teacher, prompts, s.num_samples,
                             E.tagged_key(key, E.GENERATE_TAG, "init"), s, {})
    pick = next(i for i, p in enumerate(init) if len(p.ids) >= 3)
    target = _embed([teacher.decode(init[pick].ids)])[0]
    users = [np.repeat(target[None], 5, axis=0) for _ in range(40)]  # every user likes sample `pick`
    ledger = PrivacyLedger(1000.0, 1e-6, neighboring="add_remove")
    plan = R.plan_votes(ledger, ShuffledPassSampler(40, 10, seed=0), 2, 0.05, jax.random.key(1))
    assert len(ledger.report()["entries"]) == 1
    res = E.evolve(teacher, _embed, plan, users, prompts, s, key, log=lambda *_: None)
    assert plan.released == {0, 1} and len(res.history) == 2
    assert init[pick] in res.samples[:2]  # kept with elitism, top-voted first
    assert res.history[0]["votes_max"] > 5  # 10 unit votes on one sample, noise 0.05
    kept = res.history[-1]["kept"]
    assert len(res.samples) <= kept + s.expansion and len(res.samples) >= s.expansion
    assert res.generated_tokens > 0 and set(res.seconds) == {"generate", "embed", "votes"}
    with pytest.raises(ValueError, match="released already"):
        R.release_round(plan, 0, users, _embed(["w3"] * 8))


def test_generation_keys_are_not_vote_keys():
    k = jax.random.key(1)
    gen = {np.asarray(jax.random.key_data(E.tagged_key(k, E.GENERATE_TAG, t))).tobytes()
           for t in ("init", 0, 1)}
    votes = {np.asarray(jax.random.key_data(R.votes_noise_key(k, t))).tobytes() for t in (0, 1)}
    assert not gen & votes
