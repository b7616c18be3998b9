"""Tests for fedpriv/expansion (Koga et al. 2023: unigrams, Eq. 3 weights, datasets, Table 1,
Prop. 3.1 latency)."""

import math
from collections.abc import Mapping

import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event

from configs.population_expansion import SCHEMES_BY_NAME, TOTAL_BUDGET, TRAINING_SCHEMES
from fedpriv import expansion
from fedpriv.data.federated import FederatedDataset
from fedpriv.dp import geometric

PAD, UNK, BOS, EOS = 0, 1, 2, 3


# ------------------------------------------------------------------------------ helpers


class FakeLedger:
    """Same `spend` signature as fedpriv.dp.ledger's ledger; records calls, optionally refuses."""

    def __init__(self, refuse: Exception | None = None):
        self.calls = []
        self.refuse = refuse

    def spend(self, name, event, populations):
        self.calls.append((name, event, populations))
        if self.refuse is not None:
            raise self.refuse


class Untouchable(Mapping):
    """A client mapping that fails the test if anything reads it."""

    def __getitem__(self, key):
        raise AssertionError("private data was read")

    def __iter__(self):
        raise AssertionError("private data was read")

    def __len__(self):
        raise AssertionError("private data was read")


def rows(*seqs, length=11):
    """int32[n, length] LM rows: BOS + ids, padded with PAD."""
    out = np.zeros((len(seqs), length), np.int32)
    for i, s in enumerate(seqs):
        r = [BOS, *s][:length]
        out[i, : len(r)] = r
    return out


def random_user(rng, n, vocab, length=11):
    x = rng.integers(4, vocab, size=(n, length)).astype(np.int32)
    x[:, 0] = BOS
    return x


# ------------------------------------------------------------------------------ unigrams


def test_user_contribution_bounded_by_50():
    rng = np.random.default_rng(0)
    assert expansion.unigram_sensitivity() == 50
    heavy = random_user(rng, 100, 40)  # 100 sequences of 10 non-PAD targets
    c = expansion.bounded_user_counts(heavy, 40, np.random.default_rng(1))
    assert c.dtype == np.int64 and c.shape == (40,)
    assert c.sum() == 50 and c[PAD] == 0 and c[BOS] == 0
    # Longer rows: still at most 10 tokens per sequence.
    long = random_user(rng, 100, 40, length=31)
    assert expansion.bounded_user_counts(long, 40, rng).sum() == 50
    # Rows with PAD: only non-PAD targets count; an all-PAD row is never chosen.
    r = rows([5, 6, EOS], [], [7, UNK, 8, EOS])
    c = expansion.bounded_user_counts(r, 10, rng)
    np.testing.assert_array_equal(c, np.bincount([5, 6, EOS, 7, UNK, 8, EOS], minlength=10))
    # Removing a user moves the summed count vector by at most 50 in L1. (Same seed on both
    # sides, and only one user has > 5 rows, so no other user's row choice is re-randomised.)
    users = {f"u{i:02d}": random_user(rng, int(rng.integers(1, 6)), 40) for i in range(20)}
    users["heavy"] = heavy
    full = expansion.unigram_counts(users, 40, np.random.default_rng(5))
    for drop in ("heavy", "u03", "u19"):
        rest = {k: v for k, v in users.items() if k != drop}
        part = expansion.unigram_counts(rest, 40, np.random.default_rng(5))
        diff = full - part
        assert np.all(diff >= 0) and 0 < diff.sum() <= 50
    with pytest.raises(ValueError):
        expansion.bounded_user_counts(rows([45]), 40, rng)


def test_unigram_counts_example_domain_filter():
    rng = np.random.default_rng(0)
    client = {"tokens": rows([4, 4], [5]), "domain": np.array([expansion.SOURCE, expansion.TARGET], np.int8)}
    c = expansion.unigram_counts({"c": client}, 8, rng, example_domain=expansion.TARGET)
    np.testing.assert_array_equal(c, np.bincount([5], minlength=8))
    c = expansion.unigram_counts({"c": client}, 8, rng)
    np.testing.assert_array_equal(c, np.bincount([4, 4, 5], minlength=8))


def test_normalise_counts():
    u = expansion.normalise_counts(np.array([-3, 0, 5, 10]), smoothing=1.0)
    np.testing.assert_allclose(u, np.array([1, 1, 6, 11]) / 19)
    u = expansion.normalise_counts(np.array([7, 0, 5, 10]), smoothing=0.5, zero_ids=(0,))
    np.testing.assert_allclose(u, np.array([0.5, 0.5, 5.5, 10.5]) / 17)
    assert np.all(expansion.normalise_counts(np.full(5, -100)) == 0.2)
    with pytest.raises(ValueError):
        expansion.normalise_counts(np.array([1, 2]), smoothing=0.0)


def test_private_unigrams_noise_free_limit_and_ledger_event():
    rng = np.random.default_rng(3)
    users = {i: random_user(rng, 8, 12) for i in range(30)}
    ledger = FakeLedger()
    # eps = 1e6: a = exp(-2e4) = 0, so the Geometric noise is exactly 0.
    u = expansion.private_unigram_frequencies(users, 12, 1e6, np.random.default_rng(9),
                                       population="T", ledger=ledger)
    counts = expansion.unigram_counts(users, 12, np.random.default_rng(9))
    counts[[PAD, BOS]] = 0
    np.testing.assert_allclose(u, (counts + 1.0) / (counts.sum() + 12.0), rtol=1e-12)
    assert u.dtype == np.float64 and math.isclose(u.sum(), 1.0) and np.all(u > 0)
    (name, event, pops), = ledger.calls
    assert pops == ("T",) and "T" in name
    assert isinstance(event, dp_event.DiscreteLaplaceDpEvent)
    assert event.sensitivity == 50 and math.isclose(geometric.geometric_epsilon(event), 1e6)


def test_private_unigrams_paper_budget_is_noisy_but_valid():
    rng = np.random.default_rng(4)
    users = {i: random_user(rng, 10, 50) for i in range(200)}
    ledger = FakeLedger()
    u = expansion.private_unigram_frequencies(users, 50, 0.8, rng, population="S", ledger=ledger)
    assert np.all(u > 0) and math.isclose(u.sum(), 1.0)
    assert u[PAD] == u[BOS] == u.min()  # floor only
    event = ledger.calls[0][1]
    assert math.isclose(event.noise_parameter, 0.8 / 50)


def test_ledger_is_charged_before_data_is_read():
    class Refused(Exception):
        pass

    ledger = FakeLedger(refuse=Refused("budget exceeded"))
    with pytest.raises(Refused):
        expansion.private_unigram_frequencies(Untouchable(), 20, 0.8, np.random.default_rng(0),
                                       population="T", ledger=ledger)
    assert len(ledger.calls) == 1
    # The project's ledger: a budget below eps0 refuses before the data is read ...
    from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger

    small = PrivacyLedger(0.5, 1e-6)
    with pytest.raises(PrivacyBudgetExceeded):
        expansion.private_unigram_frequencies(Untouchable(), 20, 0.8, np.random.default_rng(0),
                                       population="T", ledger=small)
    assert small.entries == []
    # ... and u_hat_S, u_hat_T on disjoint populations compose in parallel: 0.8, not 1.6.
    led = PrivacyLedger(2.0, 1e-6)
    rng = np.random.default_rng(1)
    users = {i: random_user(rng, 3, 20) for i in range(10)}
    for pop in ("S", "T"):
        expansion.private_unigram_frequencies(users, 20, 0.8, rng, population=pop, ledger=led)
    assert [e.populations for e in led.entries] == [("S",), ("T",)]
    assert abs(led.spent() - 0.8) < 1e-3


def test_words_nobody_typed_are_noised_like_every_word_of_the_vocabulary():
    """Issue 54: the release covers the whole public vocabulary, so which words the users typed
    (the support) is not released: a word nobody typed gets the same two-sided Geometric noise
    as any other, clipped at 0 -- above the floor with probability P(G >= 1) = a / (1 + a), and
    mean E[max(G, 0)] = a / ((1 + a)(1 - a)) (a = exp(-eps0 / 50)); only PAD and BOS, zero
    whatever the data, get the floor. The released clipped counts are read back exactly from
    u_hat: ``max(c, 0) = u / u[PAD] - 1`` (u[PAD] = floor = 1 / normaliser)."""
    vocab, eps0 = 400, 0.8
    rng = np.random.default_rng(5)
    users = {i: rows(*[[4, 5, 6, EOS]] * 3) for i in range(40)}  # everyone types 4, 5, 6, EOS
    u = expansion.private_unigram_frequencies(users, vocab, eps0, rng, population="T")
    released = u / u[PAD] - 1.0
    assert u[PAD] == u[BOS] and released[PAD] == released[BOS] == 0
    untyped = np.setdiff1d(np.arange(vocab), [PAD, BOS, EOS, 4, 5, 6])
    a = geometric.geometric_alpha(eps0, 50)
    n = len(untyped)
    p_above = a / (1 + a)
    frac = float(np.mean(released[untyped] > 0.5))
    assert abs(frac - p_above) < 4 * math.sqrt(p_above * (1 - p_above) / n), (frac, p_above)
    mean = a / ((1 + a) * (1 - a))
    sd = math.sqrt(a / (1 - a) ** 2 - mean ** 2)  # E[max(G, 0)^2] = E[G^2] / 2 = a / (1 - a)^2
    assert abs(float(np.mean(released[untyped])) - mean) < 5 * sd / math.sqrt(n)
    np.testing.assert_allclose(released, np.round(released), atol=1e-6)  # integer counts


# ------------------------------------------------------------------------------ weights


# Tiny vocabulary: PAD UNK BOS EOS a=4 b=5.
U_T = np.array([0.1, 0.1, 0.1, 0.2, 0.4, 0.1])
U_S = np.array([0.1, 0.1, 0.1, 0.1, 0.1, 0.5])


def test_weights_hand_computed():
    a, b = 4, 5
    x = rows([a, b, EOS], [b, b], [a], [], length=5)
    # x0: p_T = .4*.1*.2 = .008, p_S = .1*.5*.1 = .005 -> w = .008/(.1*.008 + .9*.005) = 80/53
    # x1: p_T = .01, p_S = .25 -> w = .01/(.001 + .225) = 5/113
    # x2: p_T = .4, p_S = .1 -> w = .4/(.04 + .09) = 40/13
    # x3: no counted token -> p = 1 in both -> w = 1
    np.testing.assert_allclose(expansion.sequence_log_density(x, U_T),
                               np.log([0.008, 0.01, 0.4, 1.0]), rtol=1e-12)
    dom = np.full(4, expansion.SOURCE)
    w = expansion.importance_weights(x, dom, U_S, U_T, 0.1)
    assert w.dtype == np.float32 and w.shape == (4,)
    np.testing.assert_allclose(w, [80 / 53, 5 / 113, 40 / 13, 1.0], rtol=1e-6)
    assert np.all(w <= 1 / 0.1)
    # Target-domain examples: exactly 1 (Eq. 3 with pi = T), whatever the densities.
    wt = expansion.importance_weights(x, np.full(4, expansion.TARGET), U_S, U_T, 0.1)
    assert np.all(wt == 1.0)
    log_w = expansion.relative_log_weights(np.log([0.008, 0.3]), np.log([0.008, 0.3]), 0.1)
    np.testing.assert_allclose(np.exp(log_w), 1.0, rtol=1e-15)
    # alpha = 1: everything weighs 1.
    assert np.all(expansion.importance_weights(x, dom, U_S, U_T, 1.0) == 1.0)
    # Bounding.
    np.testing.assert_allclose(expansion.bound_weights(w, 0.1, mode="scale"),
                               0.1 * np.array([80 / 53, 5 / 113, 40 / 13, 1.0]), rtol=1e-6)
    np.testing.assert_allclose(expansion.bound_weights(w, 0.1, mode="clip", w_max=2.0),
                               [80 / 53, 5 / 113, 2.0, 1.0], rtol=1e-6)
    with pytest.raises(ValueError):
        expansion.bound_weights(w, 0.1, mode="clip")
    with pytest.raises(ValueError):
        expansion.importance_weights(x, dom, U_S, U_T, 0.0)


def test_weights_log_space_stable_for_long_sequences():
    # log-densities around -1000 (p underflows to 0 in float64): naive Eq. 3 gives 0/0.
    lt = np.array([-1000.0, -1000.0, -5000.0, -1000.0])
    lo = np.array([-1005.0, -995.0, -5000.0, -3000.0])
    w = np.exp(expansion.relative_log_weights(lt, lo, 0.1))
    expect = 1 / (0.1 + 0.9 * np.exp(lo - lt))
    np.testing.assert_allclose(w, expect, rtol=1e-12)
    assert np.all(np.isfinite(w)) and np.all(w <= 10.0 + 1e-12) and np.all(w >= 0)
    assert math.isclose(w[3], 10.0, rel_tol=1e-12)  # p_S << p_T: w -> 1/alpha
    # The same through tokens: 2000-token rows.
    # Mostly UNK (same probability under both), a few a/b tokens: log p ~ -4600, moderate ratio.
    toks = np.full((3, 2001), UNK, np.int32)
    toks[:, 0] = BOS
    toks[0, 1:4] = [4, 4, 5]
    toks[1, 1:3] = [5, 4]
    toks[2, -1] = 4
    lt = expansion.sequence_log_density(toks, U_T)
    ls = expansion.sequence_log_density(toks, U_S)
    assert np.all(lt < -1000) and np.all(np.exp(lt) == 0)
    w = expansion.importance_weights(toks, np.zeros(3, int), U_S, U_T, 0.1)
    np.testing.assert_allclose(w, 1 / (0.1 + 0.9 * np.exp(ls - lt)), rtol=1e-5)
    assert np.all(np.isfinite(w)) and np.all(w > 0.01)


def test_add_importance_weights_does_not_mutate():
    client = {"tokens": rows([4, 5], [5, 5], length=5),
              "domain": np.array([expansion.SOURCE, expansion.TARGET], np.int8)}
    out = expansion.add_importance_weights({"c": client}, U_S, U_T, 0.1)
    assert "weight" not in client
    w = out["c"]["weight"]
    assert w.dtype == np.float32 and w.shape == (2,) and w[1] == 1.0
    # x0: p_T = .04, p_S = .05 -> w = .04/(.004 + .045) = 40/49
    assert math.isclose(float(w[0]), 40 / 49, rel_tol=1e-6)


# ------------------------------------------------------------------------------ datasets


def test_assemble_domain_dataset_strings_and_split():
    src = {f"s{i:03d}": [f"source text {i}", "more"] for i in range(50)}
    tgt = {f"t{i:03d}": [f"target text {i}"] for i in range(10)}
    src["both"] = ["typed by both"]
    tgt["both"] = ["spoken by both", "again"]
    src["empty"] = []
    ds = expansion.assemble_domain_dataset(src, tgt, seed=0)
    assert ds.population["both"] == expansion.TARGET and ds.population["s000"] == expansion.SOURCE
    assert "empty" not in ds.population
    # Stratified 6:2:2: 50 S -> 30/10/10, 11 T -> 7/2/2 (largest remainder).
    assert [ds.num_clients(s, expansion.SOURCE) for s in ("train", "val", "test")] == [30, 10, 10]
    assert [ds.num_clients(s, expansion.TARGET) for s in ("train", "val", "test")] == [7, 2, 2]
    assert math.isclose(ds.alpha, 7 / 37)
    ids = [set(ds.split(s)) for s in ("train", "val", "test")]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert set.union(*ids) == set(ds.population)
    for split in ("train", "val", "test"):
        if "both" in ds.split(split):
            ex = ds.split(split)["both"]
            assert ex["texts"] == ["typed by both", "spoken by both", "again"]
            np.testing.assert_array_equal(ex["domain"], [0, 1, 1])
            assert ex["domain"].dtype == np.int32
    # Same seed -> same split; another seed -> another split.
    ds2 = expansion.assemble_domain_dataset(src, tgt, seed=0)
    assert list(ds2.train) == list(ds.train)
    assert set(expansion.assemble_domain_dataset(src, tgt, seed=1).train) != set(ds.train)
    # Overlap modes.
    ds_t = expansion.assemble_domain_dataset(src, tgt, seed=0, overlap="target_examples")
    ex = next(ds_t.split(s)["both"] for s in ("train", "val", "test") if "both" in ds_t.split(s))
    assert ex["texts"] == ["spoken by both", "again"] and np.all(ex["domain"] == 1)
    ds_d = expansion.assemble_domain_dataset(src, tgt, seed=0, overlap="drop")
    assert "both" not in ds_d.population and len(ds_d.population) == 60
    with pytest.raises(ValueError):
        expansion.assemble_domain_dataset(src, tgt, seed=0, overlap="split")
    with pytest.raises(ValueError):
        expansion.assemble_domain_dataset(src, {}, seed=0)


def test_assemble_domain_dataset_tokens_and_select():
    rng = np.random.default_rng(0)
    src = {f"s{i}": random_user(rng, 3, 20) for i in range(20)}
    tgt = {f"t{i}": random_user(rng, 2, 20) for i in range(5)}
    tgt["s0"] = random_user(rng, 1, 20)  # s0 also has target data
    ds = expansion.assemble_domain_dataset(src, tgt, seed=3)
    assert isinstance(ds.train, FederatedDataset)
    assert all(ds.train[c]["domain"].dtype == np.int32 for c in ds.train)
    allc = {**ds.train, **ds.val, **ds.test}
    assert allc["s0"]["tokens"].shape == (4, 11) and allc["s0"]["tokens"].dtype == np.int32
    np.testing.assert_array_equal(allc["s0"]["domain"], [0, 0, 0, 1])
    assert ds.population["s0"] == expansion.TARGET
    t_only = expansion.select_clients(allc, ds.population, (expansion.TARGET,), (expansion.TARGET,))
    assert set(t_only) == {"s0"} | {f"t{i}" for i in range(5)}
    assert t_only["s0"]["tokens"].shape == (1, 11) and np.all(t_only["s0"]["domain"] == 1)
    s_only = expansion.select_clients(allc, ds.population, (expansion.SOURCE,), (expansion.SOURCE,))
    assert "s0" not in s_only and len(s_only) == 19  # disjoint populations
    weighted = expansion.add_importance_weights(allc, np.full(20, 0.05), np.full(20, 0.05), ds.alpha)
    assert all(np.all(v["weight"] == 1.0) for v in weighted.values())  # equal densities -> w = 1
    # FederatedDataset in -> FederatedDataset out.
    sel = ds.clients("train", (expansion.SOURCE, expansion.TARGET), (expansion.TARGET,))
    assert isinstance(sel, FederatedDataset) and all(np.all(sel[c]["domain"] == 1) for c in sel)
    w = expansion.add_importance_weights(ds.train, np.full(20, 0.05), np.full(20, 0.05), ds.alpha)
    assert isinstance(w, FederatedDataset) and set(w.array_keys) == {"tokens", "domain", "weight"}


def test_chunk_sentence_app_a():
    r = expansion.chunk_sentence([10, 11, 12], seq_len=2)
    np.testing.assert_array_equal(r, [[BOS, 10, 11], [11, 12, EOS]])
    r = expansion.chunk_sentence(list(range(4, 24)), seq_len=10)  # 20 words + EOS = 21 targets
    assert r.shape == (3, 11)
    targets = r[:, 1:][r[:, 1:] != PAD]
    np.testing.assert_array_equal(targets, [*range(4, 24), EOS])  # each token a target once
    np.testing.assert_array_equal(r[2], [23, EOS] + [PAD] * 9)


def test_end_to_end_strings_to_weighted_clients():
    """Strings -> split -> vocabulary from T-train (App. A) -> App. A rows -> private unigrams
    on S and T (real ledger, parallel composition) -> Eq. 3 weights on the IW clients."""
    from fedpriv.data.tokenizers import WordTokenizer
    from fedpriv.dp.ledger import PrivacyLedger

    rng = np.random.default_rng(0)
    s_words = ["buy", "stock", "moon", "hold", "the", "a"]
    t_words = ["president", "vote", "news", "the", "a", "today"]
    sent = lambda ws, n: " ".join(rng.choice(ws, size=n))
    src = {f"s{i}": [sent(s_words, int(rng.integers(3, 25))) for _ in range(4)] for i in range(40)}
    tgt = {f"t{i}": [sent(t_words, int(rng.integers(3, 25))) for _ in range(4)] for i in range(10)}
    tgt["s1"] = ["vote today"]  # s1 also has target data -> T-client
    ds = expansion.assemble_domain_dataset(src, tgt, seed=0)
    tok = WordTokenizer.fit(ds.texts("train", expansion.TARGET), k=10_000)
    assert "stock" not in tok.words and "vote" in tok.words  # S-only words -> UNK
    enc = expansion.encode_domain_dataset(ds, tok, max_tokens_per_client=30)
    assert enc.train.seq_len == 10 and math.isclose(enc.alpha, ds.alpha)
    for c in enc.train:
        ex = enc.train[c]
        assert len(ex["domain"]) == len(ex["tokens"])
        n_targets = np.sum(ex["tokens"][:, 1:] != PAD) - np.sum(ex["tokens"][:, 1:] == EOS)
        assert n_targets <= 30
    s1 = next(enc.split(n)["s1"] for n in ("train", "val", "test") if "s1" in enc.split(n))
    assert s1["domain"][0] == expansion.TARGET or expansion.TARGET in s1["domain"]  # T text kept under the cap
    ledger = PrivacyLedger(2.0, 1e-6)
    V = tok.vocab_size
    u_s, u_t = expansion.domain_unigram_frequencies(enc, V, 0.8, rng, ledger=ledger)
    assert [e.populations for e in ledger.entries] == [("S",), ("T",)]
    assert abs(ledger.spent() - 0.8) < 1e-3
    stage = SCHEMES_BY_NAME["IW"].stages[0]
    assert stage.weighted
    iw = expansion.add_importance_weights(stage.clients(enc, "train"), u_s, u_t, enc.alpha)
    assert set(iw) == set(enc.train)
    ft = SCHEMES_BY_NAME["PT"].stages[1].clients(enc)
    assert all(enc.population[c] == expansion.TARGET and np.all(ft[c]["domain"] == 1) for c in ft)
    for c in iw:
        w, dom = iw[c]["weight"], iw[c]["domain"]
        assert w.dtype == np.float32 and np.all(w[dom == expansion.TARGET] == 1.0)
        assert np.all((w > 0) & (w <= 1 / enc.alpha + 1e-5))


# ------------------------------------------------------------------------------ Table 1


def test_training_schemes_table():
    names = [s.name for s in TRAINING_SCHEMES]
    assert names == ["T w. alpha*C", "T w. C", "S u T", "DSDSR", "DEMix", "IW", "PT", "IWPT"]
    by = SCHEMES_BY_NAME
    assert by["T w. alpha*C"].stages[0].cohort_size(5000, 0.1) == 500
    assert by["T w. alpha*C"].stages[0].cohort_size(400, 0.1) == 40
    assert by["T w. C"].stages[0].cohort_size(5000, 0.1) == 5000
    assert by["DSDSR"].model == "dsdsr" and by["DEMix"].model == "demix"
    assert by["IW"].weighted and by["IWPT"].weighted and not by["PT"].weighted
    assert by["PT"].stage_rounds(2000) == (1000, 1000) and by["IW"].stage_rounds(2000) == (2000,)
    pt = by["PT"]
    assert pt.stages[0].population_labels == ("S",) and pt.stages[1].population_labels == ("T",)
    assert pt.stages[1].cohort_size(5000, 0.1) == 500
    # Every scheme spends at most (2, 1e-6) per user of each population; PT and IWPT reach it on
    # S and on T separately (parallel composition over disjoint populations).
    for s in TRAINING_SCHEMES:
        for pop, (eps, delta) in s.per_population_budget().items():
            assert eps <= 2.0 + 1e-12 and delta <= 1e-6 * (1 + 1e-12), (s.name, pop)
    assert by["PT"].per_population_budget() == {"S": (2.0, 1e-6), "T": (2.0, 1e-6)}
    iw = by["IW"].privacy_plan({expansion.SOURCE: "chitchat", expansion.TARGET: "simpsons"})
    assert [(p.epsilon, p.delta, p.populations) for p in iw] == [
        (0.8, 0.0, ("chitchat",)), (0.8, 0.0, ("simpsons",)), (1.2, 1e-6, ("chitchat", "simpsons"))]
    eps, delta = by["IWPT"].per_population_budget()["T"]
    assert math.isclose(eps, 2.0) and delta == 1e-6
    with pytest.raises(ValueError):
        expansion.Stage((0,), (0,), "2C", False, 1.0, (1.0, 0.0))
    md = expansion.schemes_markdown(TRAINING_SCHEMES)
    assert len(md.splitlines()) == 2 + 8
    assert "S[S] 5000/400 x 1000 weighted @ (1.2, 1e-06); then T[T] 500/40 x 1000" in md


# ------------------------------------------------------------------------------ latency


def _grid():
    for N in (100, 1000, 10_000, 100_000):
        for C in sorted({1, 10, N // 10, N // 2, N}):
            for p in (0.0, 0.1, 0.5, 0.9, 1.0):
                for q in sorted({C / N, min(1.0, 2 * C / N), 1.0}):
                    npq = N * p * q
                    if abs(npq - round(npq)) < 1e-9 and abs(N * p - round(N * p)) < 1e-9:
                        yield N, C, p, q


def test_latency_exact_within_bounds_over_grid():
    n = 0
    for N, C, p, q in _grid():
        for lam in (0.5, 2.0):
            lo = expansion.latency_lower_bound(N, C, p, q, lam)
            ex = expansion.expected_latency(N, C, p, q, lam)
            up = expansion.latency_upper_bound(N, C, lam)
            tight = expansion.latency_upper_bound_tight(N, C, p, q, lam)
            assert q >= C / N - 1e-15
            assert lo <= ex * (1 + 1e-12) and ex <= tight * (1 + 1e-12), (N, C, p, q)
            assert tight <= up * (1 + 1e-12), (N, C, p, q)
            # The paper's closed forms, where Np and Npq are integers.
            assert math.isclose(lo, max(0.0, (C - N * p * q) / (N * (1 - p) + 1)) / lam,
                                rel_tol=1e-9, abs_tol=1e-15)
            n += 1
    assert n > 100


def test_latency_exact_matches_high_precision_harmonic_sums():
    mpmath.mp.dps = 40
    for m, k in [(1, 1), (10, 3), (5000, 4097), (5000, 4096), (10**6, 10**6), (10**9, 10**6),
                 (10**9, 10**9 - 3), (10**7, 5), (10**5, 50_000)]:
        exact = float(mpmath.harmonic(m) - mpmath.harmonic(m - k))
        assert math.isclose(expansion.expected_kth_arrival(m, k, 1.0), exact, rel_tol=1e-14)
        assert math.isclose(expansion.expected_kth_arrival(m, k, 4.0), exact / 4, rel_tol=1e-14)
    # Small case by hand: m = 3, k = 2: 1/3 + 1/2.
    assert math.isclose(expansion.expected_kth_arrival(3, 2, 1.0), 1 / 3 + 1 / 2)


@pytest.mark.parametrize("N,C,p,q,lam,method", [
    (1000, 100, 0.5, 0.11, 1.0, "clocks"),
    (10_000, 1000, 0.5, 0.11, 2.0, "clocks"),
    (2000, 1000, 0.2, 0.5, 0.5, "clocks"),  # k close to m
    (1_000_000, 5000, 0.5, 0.0055, 1.0, "order_statistic"),
    (10_000, 1000, 0.5, 0.11, 2.0, "order_statistic"),
])
def test_latency_monte_carlo_matches_exact(N, C, p, q, lam, method):
    rng = np.random.default_rng(2023)
    est = expansion.simulate_latency(N, C, p, q, lam, rng, trials=2000, method=method)
    exact = expansion.expected_latency(N, C, p, q, lam)
    assert est.trials == 2000 and est.stderr > 0
    assert abs(est.mean - exact) < 4 * est.stderr, (est, exact)


def test_latency_no_wait_and_never():
    # k <= 0: enough devices available already.
    assert expansion.latency_counts(1000, 100, 0.5, 0.5) == (500, -150)
    assert expansion.expected_latency(1000, 100, 0.5, 0.5, 1.0) == 0.0
    assert expansion.latency_lower_bound(1000, 100, 0.5, 0.5, 1.0) == 0.0
    assert expansion.simulate_latency(1000, 100, 0.5, 0.5, 1.0, np.random.default_rng(0), 10).mean == 0.0
    # k > m (q < C/N and few unavailable devices): the cohort never fills.
    assert expansion.latency_counts(100, 90, 0.5, 0.1) == (50, 85)
    assert expansion.expected_latency(100, 90, 0.5, 0.1, 1.0) == math.inf
    est = expansion.simulate_latency(100, 90, 0.5, 0.1, 1.0, np.random.default_rng(0), 10)
    assert est.mean == math.inf
    assert expansion.latency_upper_bound(100, 100, 1.0) == math.inf


@pytest.mark.parametrize("args,exc", [
    ((100, 101, 0.5, 0.5, 1.0), ValueError),  # C > N
    ((100, 0, 0.5, 0.5, 1.0), ValueError),  # C <= 0
    ((100, -5, 0.5, 0.5, 1.0), ValueError),
    ((0, 0, 0.5, 0.5, 1.0), ValueError),
    ((100, 10, -0.1, 0.5, 1.0), ValueError),  # p not in [0, 1]
    ((100, 10, 1.1, 0.5, 1.0), ValueError),
    ((100, 10, 0.5, 0.0, 1.0), ValueError),  # q not in (0, 1]
    ((100, 10, 0.5, 1.5, 1.0), ValueError),
    ((100, 10, 0.5, 0.5, 0.0), ValueError),  # lambda <= 0
    ((100, 10, 0.5, 0.5, -1.0), ValueError),
    ((100, 10, 0.5, 0.5, math.inf), ValueError),
    ((100.0, 10, 0.5, 0.5, 1.0), TypeError),  # non-integer counts
    ((100, 10.5, 0.5, 0.5, 1.0), TypeError),
    ((100, True, 0.5, 0.5, 1.0), TypeError),
])
def test_latency_errors(args, exc):
    with pytest.raises(exc):
        expansion.expected_latency(*args)
    with pytest.raises(exc):
        expansion.latency_lower_bound(*args)
    with pytest.raises(exc):
        expansion.simulate_latency(*args, np.random.default_rng(0), 10)


def test_latency_simulator_arguments():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        expansion.simulate_kth_arrival(10, 3, 1.0, rng, 10, method="exact")
    with pytest.raises(ValueError):
        expansion.simulate_kth_arrival(50_000_000, 3, 1.0, rng, 10)  # too many clocks
    est = expansion.simulate_kth_arrival(50_000_000, 3, 1.0, rng, 4000, method="order_statistic")
    assert abs(est.mean - expansion.expected_kth_arrival(50_000_000, 3, 1.0)) < 4 * est.stderr
    with pytest.raises(ValueError):
        expansion.simulate_kth_arrival(-1, 3, 1.0, rng, 10)
    with pytest.raises(ValueError):
        expansion.simulate_kth_arrival(10, 3, 1.0, rng, 0)  # trials must be positive


def test_latency_accepts_numpy_integers():
    assert expansion.expected_latency(np.int64(1000), np.int32(100), 0.5, 0.11, 1.0) > 0


def test_latency_figure_smoke(tmp_path):
    from experiments import latency_figure

    out = latency_figure.main(["--config", "configs/latency_figure.py:smoke",
                               "--workdir", str(tmp_path)])
    for name in ("latency.csv", "latency.md", "latency.png", "latency_curve.csv", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0
    for r in out["table"]:
        assert r["lower"] <= r["exact"] <= r["upper_tight"] <= r["upper"] * (1 + 1e-12)
        assert abs(r["z"]) < 6
    assert all(r["lower"] <= r["exact"] <= r["upper"] for r in out["curves"])


def test_domain_unigrams_count_own_population_only_and_charge_first(monkeypatch):
    rng = np.random.default_rng(0)
    src = {"s0": rows([4, 4]), "s1": rows([5]), "both": rows([6, 6, 6])}
    tgt = {"t0": rows([7]), "both": rows([8])}
    ds = expansion.assemble_domain_dataset(src, tgt, seed=0, fractions=(1.0, 0.0, 0.0))
    u_s, u_t = expansion.domain_unigram_frequencies(ds, 10, 1e6, rng, smoothing=1.0)
    # No noise at eps = 1e6: u_S has the S-clients' tokens 4, 4, 5 (not the T-client's 6s).
    cs = np.bincount([4, 4, 5], minlength=10).astype(float)
    ct = np.bincount([7, 8], minlength=10).astype(float)
    np.testing.assert_allclose(u_s, (cs + 1) / (cs.sum() + 10))
    np.testing.assert_allclose(u_t, (ct + 1) / (ct.sum() + 10))

    def boom(*a, **k):
        raise AssertionError("private data was read")

    monkeypatch.setattr(expansion.DomainDataset, "clients", boom)
    with pytest.raises(RuntimeError):
        expansion.domain_unigram_frequencies(ds, 10, 0.8, rng, ledger=FakeLedger(RuntimeError("no")))


def test_table1_budget_split_through_the_real_ledger():
    """Each scheme's plan, with training events calibrated by the project's accountant, fits the
    (2, 1e-6) budget per user; PT/IWPT spend on S and T in parallel, and nothing more fits."""
    from functools import lru_cache

    import dp_accounting

    from fedpriv.dp import accounting
    from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger

    @lru_cache(maxsize=None)
    def training_event(eps, delta):
        # Stand-in for the engine's DP-FedAvg event (20 Gaussian sums; closed-form RDP, fast).
        make = lambda z: dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(z), 20)
        return make(accounting.calibrate_noise_multiplier(make, eps, delta, accountant="rdp"))

    for name in ("T w. C", "IW", "PT", "IWPT"):
        scheme = SCHEMES_BY_NAME[name]
        led = PrivacyLedger(*TOTAL_BUDGET, accountant="rdp")
        for sp in scheme.privacy_plan():
            event = (geometric.geometric_dp_event(sp.epsilon, expansion.unigram_sensitivity())
                     if sp.delta == 0 else training_event(sp.epsilon, sp.delta))
            led.spend(sp.name, event, sp.populations)
        by_pop = led.epsilon_by_population()
        assert all(1.99 < e <= 2.0 * (1 + 1e-9) for e in by_pop.values()), (name, by_pop)
        assert set(by_pop) == ({"T"} if name == "T w. C" else {"S", "T"})
        with pytest.raises(PrivacyBudgetExceeded):
            led.spend("one more", geometric.geometric_dp_event(0.1, 50), ("T",))
