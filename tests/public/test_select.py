"""Tests for fedpriv.public.select (distribution matching, Wang et al. Algorithm 1 / App. D)."""

import numpy as np
import pytest

from fedpriv.public import select
from tests import oracles


def test_score_convention_beta_weights_the_private_model():
    priv = np.array([-1.0, -4.0])
    pub = np.array([-3.0, -2.0])
    np.testing.assert_allclose(select.matching_scores(priv, pub, 0.5), [-2.0, -3.0])  # ĥ
    np.testing.assert_allclose(select.matching_scores(priv, pub, 1.0), priv)  # w/o p_pub
    np.testing.assert_allclose(select.matching_scores(priv, pub, 0.0), pub)
    np.testing.assert_allclose(select.matching_scores(priv, pub, 0.25), 0.75 * pub + 0.25 * priv)
    # β = 0.5 ranks exactly like Algorithm 1's log p_priv + log p_pub.
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    np.testing.assert_array_equal(select.distribution_matching_select(a, b, 0.2, 0.5),
                                  select.select_top_fraction(a + b, 0.2))
    # The unused model's -inf does not leak at the end points.
    assert select.matching_scores([-1.0], [-np.inf], 1.0)[0] == -1.0


def test_selection_recovers_planted_items():
    rng = np.random.default_rng(1)
    n, planted = 1000, rng.choice(1000, size=50, replace=False)
    scores = rng.normal(size=n)
    scores[planted] += 10.0
    top = select.select_top_fraction(scores, 0.05)
    assert len(top) == 50 and set(top) == set(planted)
    assert np.all(np.diff(scores[top]) <= 0)  # best first


def test_private_like_part_recovered_far_above_base_rate():
    # A pool with 10% private-like sequences: a noisy private LM likes them, the public LLM is
    # indifferent; both models share a per-sequence "quality" component.
    rng = np.random.default_rng(2)
    n = 2000
    private_like = rng.random(n) < 0.1
    quality = rng.normal(size=n)
    logp_priv = -5 + 1.5 * private_like + quality + rng.normal(scale=1.0, size=n)
    logp_pub = -4 + quality + rng.normal(scale=0.5, size=n)
    sources = np.where(private_like, "chat", "wiki")
    for beta in (0.5, 1.0):
        sel = select.distribution_matching_select(logp_priv, logp_pub, 0.05, beta)
        shares = select.source_shares(sources, sel)
        assert shares["chat"]["selected_share"] > 3 * shares["chat"]["pool_share"]


def test_q_edge_cases_and_ties():
    s = np.array([1.0, 3.0, 3.0, 2.0, 3.0])
    np.testing.assert_array_equal(select.select_top_fraction(s, 1.0), [1, 2, 4, 3, 0])
    np.testing.assert_array_equal(select.select_top_fraction(s, 0.4), [1, 2])  # tie -> index
    np.testing.assert_array_equal(select.select_top_fraction(s, 1e-6), [1])  # at least one
    np.testing.assert_array_equal(select.select_top_fraction(s, 0.41), [1, 2, 4])  # ceil
    assert len(select.select_top_fraction(np.arange(10.0), 0.3)) == 3  # no float fuzz
    assert select.select_top_fraction([], 0.5).shape == (0,)
    np.testing.assert_array_equal(select.select_top_fraction([0.0, -np.inf, 1.0], 1.0), [2, 0, 1])


@pytest.mark.parametrize("q", [0.0, -0.1, 1.01, float("nan"), 2])
def test_bad_q(q):
    with pytest.raises(ValueError, match="q must be"):
        select.select_top_fraction([1.0, 2.0], q)


def test_bad_inputs():
    with pytest.raises(ValueError, match="NaN"):
        select.select_top_fraction([1.0, float("nan")], 0.5)
    with pytest.raises(ValueError, match=r"\+inf"):
        select.select_top_fraction([1.0, float("inf")], 0.5)
    with pytest.raises(ValueError, match="1-D"):
        select.select_top_fraction(np.zeros((2, 2)), 0.5)
    with pytest.raises(ValueError, match="beta"):
        select.matching_scores([1.0], [1.0], 1.5)
    with pytest.raises(ValueError, match="equal length"):
        select.matching_scores([1.0, 2.0], [1.0], 0.5)


def test_source_shares_report():
    sources = ["a", "b", "b", "c", "b", "a", "c", "c", "c", "c"]
    shares = select.source_shares(sources, [0, 1, 5, 3])
    assert list(shares) == ["a", "b", "c"]
    assert shares["a"] == {"pool_count": 2, "pool_share": 0.2, "selected_count": 2,
                           "selected_share": 0.5, "lift": 2.5}
    assert shares["c"]["pool_share"] == 0.5 and shares["c"]["selected_share"] == 0.25
    table = oracles.format_source_report(shares)
    assert "| a | 2 | 20.0% | 2 | 50.0% | 2.50 |" in table
    with pytest.raises(ValueError, match="duplicates"):
        select.source_shares(sources, [0, 0])
    with pytest.raises(ValueError, match="out of range"):
        select.source_shares(sources, [10])
