"""Privacy properties that hold for any input (issue 24, "close the test gaps"; hypothesis):

* the amplified cyclic sampler's accounting (``amplified_banded_event``, Choquette-Choo et al.
  2023, Thm. 4) refuses on its own when a banded strategy has more bands than there are
  groups, and otherwise is exactly ``ceil(T / b)`` Poisson-sampled Gaussians at the multiplier
  over the first column norm of ``C``;
* a user's contribution to the private unigram counts (Koga et al. 2023, Sec. 4.2) never exceeds
  the per-user L1 bound the Geometric noise is calibrated to;
* (issue 54) the adaptive clip count (Andrew et al. 2021) moves by at most its stated
  sensitivity 1/2 when one user is added or removed, whatever the padded slots hold.

(The DDG properties are in tests/dp/test_ddg.py and tests/fl/test_ddg_engine.py; the plans' charges
in tests/experiments/test_plan_charges.py.)
"""
from __future__ import annotations

import math

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.dp.matrix import BandedStrategy, MinSeparationError, toeplitz_matrix
from fedpriv.expansion import unigrams as U
from fedpriv.fl.samplers import AmplifiedCyclicSampler, amplified_banded_event

PROPS = settings(max_examples=60, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(coeffs=st.lists(st.floats(0.01, 2.0), min_size=1, max_size=8),
       groups=st.integers(1, 12), rounds=st.integers(1, 60),
       q=st.floats(0.01, 1.0), z=st.floats(0.1, 20.0))
def test_amplified_banded_accounting_refuses_more_bands_than_groups(coeffs, groups, rounds, q, z):
    """More bands than groups: a client's participations ``groups`` rounds apart fall inside one
    band of ``C``, so Thm. 4 does not apply -- refused by the amplified accounting itself, with
    a one-line error naming bands and groups (not left to a caller's min-separation check).
    Otherwise the event is the theorem's, computed here independently: ``ceil(T / groups)``
    x ``PoissonSampled(q, Gaussian(z / ||C[:, 0]||))``."""
    strategy = BandedStrategy(tuple(coeffs))
    if strategy.bands > groups:
        with pytest.raises(MinSeparationError, match=rf"{strategy.bands}-banded .*groups.*got {groups}") as e:
            amplified_banded_event(strategy, z, rounds, groups, q)
        assert "\n" not in str(e.value)
        return
    event = amplified_banded_event(strategy, z, rounds, groups, q)
    col0 = np.linalg.norm(toeplitz_matrix(tuple(coeffs), rounds)[:, 0])
    want = dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z / col0)), math.ceil(rounds / groups))
    got = event if isinstance(event, dpa.SelfComposedDpEvent) else dpa.SelfComposedDpEvent(event, 1)
    assert got.count == want.count
    assert got.event.sampling_probability == pytest.approx(q, rel=1e-12)
    assert got.event.event.noise_multiplier == pytest.approx(z / col0, rel=1e-9)


def test_the_sampler_and_its_accounting_agree_on_the_separation():
    """The sampler's own guarantee is what the accounting uses: participations exactly
    ``num_groups`` rounds apart (every client in one group), at most ``ceil(T / b)`` of them."""
    s = AmplifiedCyclicSampler(num_clients=40, num_groups=4, sampling_rate=1.0, seed=3)
    seen: dict[int, list[int]] = {}
    for t in range(13):
        for c in s.sample(t):
            seen.setdefault(int(c), []).append(t)
    assert all(np.all(np.diff(ts) == s.min_separation) for ts in seen.values())
    assert max(len(ts) for ts in seen.values()) == s.max_participations(13) == 4
    with pytest.raises(MinSeparationError, match="groups"):
        amplified_banded_event(BandedStrategy((1.0,) * 5), 1.0, 13, s.min_separation, 1.0)


_TOKENS = st.integers(1, 40).flatmap(lambda v: st.tuples(
    st.just(v), hnp.arrays(np.int64, st.tuples(st.integers(0, 14), st.integers(1, 30)),
                           elements=st.integers(0, v - 1))))


@PROPS
@given(vt=_TOKENS, max_sequences=st.integers(1, 7), max_tokens=st.integers(1, 12),
       ignore=st.lists(st.integers(0, 3), max_size=3, unique=True), targets_only=st.booleans(),
       seed=st.integers(0, 2 ** 32 - 1))
def test_a_users_unigram_contribution_is_within_its_bound(vt, max_sequences, max_tokens, ignore,
                                                          targets_only, seed):
    """For any token rows, caps and ignored ids, one user's count vector is a non-negative
    integer vector with L1 norm <= ``unigram_sensitivity(max_sequences, max_tokens)`` (the
    Geometric noise's Delta under add/remove), zero on the ignored ids, and -- when the user has
    at most ``max_sequences`` counted rows, so no row is drawn at random -- exactly the first
    ``max_tokens`` counted targets of each row."""
    vocab, tokens = vt
    c = U.bounded_user_counts(tokens, vocab, np.random.default_rng(seed), max_sequences=max_sequences,
                              max_tokens_per_sequence=max_tokens, ignore_ids=ignore,
                              targets_only=targets_only)
    assert c.shape == (vocab,) and np.issubdtype(c.dtype, np.integer) and np.all(c >= 0)
    assert c.sum() <= U.unigram_sensitivity(max_sequences, max_tokens)
    assert np.all(c[[i for i in ignore if i < vocab]] == 0)
    x = tokens[:, 1:] if targets_only else tokens
    counted = ~np.isin(x, ignore)
    per_row = np.minimum(counted.sum(axis=1), max_tokens)
    assert c.sum() <= per_row.sum()
    if (per_row > 0).sum() <= max_sequences:
        want = np.zeros(vocab, np.int64)
        for row, m in zip(x, counted):
            for tok in row[m][:max_tokens]:
                want[tok] += 1
        np.testing.assert_array_equal(c, want)


_K = 12  # cohort slots (one compiled shape)
_count_update = jax.jit(lambda clip, norms, mask: AdaptiveClipping(count_stddev=0.0).update(
    AdaptiveClipping(count_stddev=0.0).init(jax.random.key(0)).replace(clip_norm=clip),
    norms, mask, 1.0, jnp.int32(0))[1])
_NORM = st.one_of(st.floats(0.0, 10.0, width=32), st.sampled_from([0.0, np.inf, np.nan, 1e30, -1.0]))


def _count(clip, norms, mask) -> float:
    """The centred clip count ``sum_i (1[norm_i <= C] - 1/2)`` the update releases (noise 0,
    public denominator 1: ``unclipped_estimate = count + 1/2``, exact in float32)."""
    return float(_count_update(jnp.float32(clip), jnp.asarray(norms, jnp.float32),
                               jnp.asarray(mask, jnp.float32))) - 0.5


@PROPS
@given(clip=st.floats(0.01, 5.0), norms=st.lists(_NORM, min_size=_K, max_size=_K),
       real=st.lists(st.booleans(), min_size=_K, max_size=_K),
       junk=st.lists(_NORM, min_size=_K, max_size=_K), who=st.integers(0, _K - 1))
def test_the_clip_count_moves_by_at_most_half_when_one_user_is_added_or_removed(clip, norms, real, junk, who):
    """Andrew et al. 2021's clip count, as ``AdaptiveClipping.update`` releases it, has L2
    sensitivity 1/2 under add/remove-one-user (what its event, ``Gaussian(2 sigma_b)``, assumes),
    with padded slots present: (1) the padded slots never count -- whatever norm they hold (0, a
    huge one, inf, NaN), the count is that of the real slots; (2) removing one real user (its
    slot becomes padding) moves the count by exactly 1/2; (3) |count| <= (real users) / 2."""
    mask = np.asarray(real, np.float32)
    c = _count(clip, norms, mask)
    junked = np.where(mask > 0, np.asarray(norms, np.float32), np.asarray(junk, np.float32))
    assert _count(clip, junked, mask) == c
    assert abs(c) <= mask.sum() / 2
    if mask[who] > 0:
        removed = mask.copy()
        removed[who] = 0.0
        assert abs(_count(clip, norms, removed) - c) == 0.5
