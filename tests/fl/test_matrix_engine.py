"""Matrix-factorization DP-FTRL in the engine: CyclicSampler, fail-closed accounting, the
ledger-charged train loop and its bit-identical resume."""
import dataclasses

import dp_accounting as dpa
import jax
import numpy as np
import optax
import pytest

from fedpriv.dp import matrix as M
from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.dp.ledger import PrivacyLedger, event_to_json
from fedpriv.fl.algorithms import (DPConfig, MatrixDPConfig, build_algorithm, privacy_event,
                                   server_optimizer)
from fedpriv.fl.loop import train
from fedpriv.fl.participation import CyclicSampler
from fedpriv.fl.samplers import PoissonSampler, ShuffledPassSampler, UniformSampler
from tests.fl.helpers import init_params, loss_fn, make_dataset

N, COHORT = 24, 4  # CyclicSampler: 6 groups -> min-separation 6


def _dp(mechanism, z=1.0, **kw):
    base = dict(banded=dict(bands=3, min_separation=6), blt=dict(blt_buffers=3, mf_rounds=12,
                                                                 min_separation=6))[mechanism]
    base.update(kw)
    return MatrixDPConfig(clip_norm=0.5, noise_multiplier=z, mechanism=mechanism, **base)


def test_cyclic_sampler_guarantees_its_min_separation():
    s = CyclicSampler(N, COHORT, seed=3)
    assert s.min_separation == 6 and s.max_participations(13) == 3
    seen = {}
    for t in range(30):
        cohort = s.sample(t)
        assert len(cohort) == COHORT and np.array_equal(cohort, s.sample(t))  # pure in (seed, t)
        for c in cohort:
            seen.setdefault(int(c), []).append(t)
    assert len(seen) == N
    assert all(np.all(np.diff(ts) == 6) for ts in seen.values())
    assert max(len(ts) for ts in seen.values()) == s.max_participations(30)


@pytest.mark.parametrize("mechanism", ["banded", "blt"])
def test_privacy_event_is_the_gaussian_at_z_over_the_strategy_sensitivity(mechanism):
    dp, s = _dp(mechanism, z=2.0), CyclicSampler(N, COHORT)
    ev = privacy_event(dp, s, 13)
    strategy = M.strategy_for(mechanism, dp.bands, dp.blt_buffers, dp.mf_rounds)
    sens = strategy.sensitivity(13, 6, 3)
    assert isinstance(ev, dpa.GaussianDpEvent) and ev.noise_multiplier == pytest.approx(2.0 / sens)
    assert sens > strategy.sensitivity(13, 6, 1)  # three participations cost more than one
    # adaptive clipping's fresh count is composed once per participation
    ad = _dp(mechanism, adaptive=AdaptiveClipping(initial_clip=0.5, count_stddev=2.0))
    ev = privacy_event(ad, s, 13)
    assert isinstance(ev, dpa.ComposedDpEvent) and ev.events[1].count == 3


@pytest.mark.parametrize("sampler", [ShuffledPassSampler(N, COHORT), PoissonSampler(N, 0.2),
                                     UniformSampler(N, COHORT), CyclicSampler(N, 6)])
def test_a_sampler_without_the_min_separation_is_refused(sampler):
    # shuffled passes can serve a client in the last round of one epoch and the first of the
    # next (separation 1); Poisson/uniform guarantee nothing; CyclicSampler(24, 6) only 4 < 6
    with pytest.raises(M.MinSeparationError):
        privacy_event(_dp("banded"), sampler, 12)


def test_matrix_mechanisms_need_a_matrix_config_and_plain_fingerprints_are_unchanged():
    with pytest.raises(ValueError, match="needs a MatrixDPConfig"):
        DPConfig(clip_norm=0.5, noise_multiplier=1.0, mechanism="banded")
    with pytest.raises(ValueError, match="needs a DPConfig"):
        MatrixDPConfig(clip_norm=0.5, noise_multiplier=1.0, mechanism="tree", min_separation=1)
    # resumes of runs recorded before matrix mechanisms existed still match their fingerprint
    assert [f.name for f in dataclasses.fields(DPConfig)] == [
        "clip_norm", "noise_multiplier", "mechanism", "restart_every", "noise_cohort_size",
        "weighting", "weight_cap", "adaptive"]


def test_a_banded_config_needs_min_separation_at_least_its_bands():
    with pytest.raises(ValueError, match="min_separation >= 3"):
        MatrixDPConfig(clip_norm=0.5, noise_multiplier=1.0, mechanism="banded", bands=3, min_separation=2)
    with pytest.raises(ValueError, match="mf_rounds"):
        MatrixDPConfig(clip_norm=0.5, noise_multiplier=1.0, mechanism="blt", min_separation=2)


@pytest.mark.parametrize("mechanism", ["banded", "blt"])
def test_train_charges_the_ledger_and_resumes_bit_identically(mechanism, tmp_path):
    data = make_dataset(num_clients=N, seed=2)
    ids = list(data)
    s = CyclicSampler(N, COHORT, seed=1)
    alg = build_algorithm(loss_fn, optax.sgd(0.05), server_optimizer("sgdm", 1.0),
                          _dp(mechanism), expected_cohort_size=COHORT)
    kw = dict(batch_size=4, seed=1, max_steps=3, progress=False, log=None)
    full = PrivacyLedger(1e6, 1e-6)
    ref = train(alg, init_params(), data, ids, s, rounds=8, ledger=full,
                workdir=str(tmp_path / "full"), **kw)
    assert event_to_json(full.entry("fl-training").event) == event_to_json(privacy_event(alg.dp, s, 8))
    assert full.entry("fl-training").details["mechanism"] == mechanism
    wd = str(tmp_path / "split")
    part = train(alg, init_params(), data, ids, s, rounds=8, ledger=PrivacyLedger(1e6, 1e-6),
                 workdir=wd, stop_after=3, **kw)
    assert int(part.state.round) == 3 and int(part.state.noise_state.step) == 3
    res = train(alg, init_params(), data, ids, s, rounds=8, ledger=PrivacyLedger(1e6, 1e-6),
                workdir=wd, **kw)
    assert res.resumed_from == 3
    for a, b in zip(jax.tree_util.tree_leaves((ref.state.params, ref.state.noise_state.buffers)),
                    jax.tree_util.tree_leaves((res.state.params, res.state.noise_state.buffers))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the noise really is there (a noise-free run ends elsewhere)
    free = build_algorithm(loss_fn, optax.sgd(0.05), server_optimizer("sgdm", 1.0),
                           _dp(mechanism, z=0.0), expected_cohort_size=COHORT)
    plain = train(free, init_params(), data, ids, s, rounds=8, workdir=str(tmp_path / "free"), **kw)
    assert not np.allclose(np.asarray(plain.state.params["w"]), np.asarray(ref.state.params["w"]))
