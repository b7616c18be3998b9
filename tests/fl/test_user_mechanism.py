"""A new DP mechanism in one file (issue 25 item 1; docs/extending.md, "A mechanism").

Everything about ``UnamplifiedGaussian`` lives in this file; no library file names it. It is
the Gaussian mechanism on the round's cohort sum (McMahan et al. 2018), with its own noise
generator and its own, deliberately conservative accounting: no amplification by sampling is
claimed, so ``rounds`` rounds are ``SelfComposed(GaussianDpEvent(z), rounds)`` — valid under
add/remove for any sampler, since every round is one Gaussian mechanism with L2 sensitivity C
(a user contributes at most one clipped update of norm <= C per round; the engine noises the
sum divided by C, i.e. of sensitivity 1, with std z).

The tests show that ``train`` charges the ledger exactly this mechanism's own event, that the
engine adds the noise it states (the privatizer contract, ``fedpriv.dp.testing``), and that
broken variants (noise reused across rounds; an event that claims more noise than is added) are
caught -- the latter also by ``fedpriv.dp.testing.check_noise_matches_event``, which needs no
statement of the mechanism's covariance: it compares the noise measured against the event.
"""
from __future__ import annotations

import dataclasses

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct

from fedpriv.dp import accounting
from fedpriv.dp.ledger import PrivacyLedger, event_to_json
from fedpriv.dp.mechanisms import DPConfig, GaussianMechanism, UnknownMechanism, get_mechanism, register_mechanism
from fedpriv.dp.testing import (
    CHECKS,
    Case,
    ContractViolation,
    check_mechanism,
    check_noise_matches_event,
    measured_multiplier,
)
from fedpriv.fl.algorithms import build_algorithm, privacy_event, server_optimizer
from fedpriv.fl.loop import train
from fedpriv.fl.samplers import PoissonSampler
from tests.fl.helpers import init_params, loss_fn, make_dataset

N, COHORT, ROUNDS = 24, 6, 4
KW = dict(batch_size=4, seed=1, max_steps=3, progress=False, log=None)


# ----------------------------------------------------------------------------- the mechanism
@struct.dataclass
class StepKey:
    key: jax.Array   # typed PRNG key
    step: jax.Array  # int32: rounds released so far


@dataclasses.dataclass(frozen=True)
class UnamplifiedGaussian(DPConfig):
    """``x_t + N(0, z^2 I)`` on the normalised sum ``x_t`` (a params-shaped pytree, L2
    sensitivity 1), fresh noise from ``fold_in(key, t)`` every round; accounted as ``rounds``
    Gaussian mechanisms at multiplier z, composed, without amplification."""
    mechanism: str = "gaussian_unamplified"

    def privatizer(self, noise_multiplier, key=None):
        def init(params):
            return StepKey(key, jnp.zeros((), jnp.int32))

        def update(updates, state, params=None):
            leaves, treedef = jax.tree_util.tree_flatten(updates)
            keys = jax.random.split(jax.random.fold_in(state.key, state.step), len(leaves))
            noised = [x + noise_multiplier * jax.random.normal(k, x.shape, x.dtype)
                      for k, x in zip(keys, leaves)]
            return jax.tree_util.tree_unflatten(treedef, noised), StepKey(state.key, state.step + 1)
        return optax.GradientTransformation(init, update)

    def release_event(self, sampler, rounds, noise_multiplier, fresh=None):
        per_round = dpa.GaussianDpEvent(noise_multiplier)
        if fresh is not None:  # e.g. an adaptive clip count on the same cohort
            per_round = dpa.ComposedDpEvent([per_round, fresh])
        return dpa.SelfComposedDpEvent(per_round, rounds)


register_mechanism("gaussian_unamplified", UnamplifiedGaussian)


# ----------------------------------------------------------------------------- broken variants
@dataclasses.dataclass(frozen=True)
class ReusesNoise(UnamplifiedGaussian):
    """Broken: the step never advances, so every round adds the same noise."""
    mechanism: str = "reuses_noise"

    def privatizer(self, noise_multiplier, key=None):
        tx = super().privatizer(noise_multiplier, key)
        return optax.GradientTransformation(tx.init, lambda u, s, p=None: (tx.update(u, s)[0], s))


@dataclasses.dataclass(frozen=True)
class UnderReported(UnamplifiedGaussian):
    """Broken: adds half the noise its event (inherited: ``GaussianDpEvent(z)``) states."""
    mechanism: str = "under_reported"

    def privatizer(self, noise_multiplier, key=None):
        return super().privatizer(0.5 * noise_multiplier, key)


def stated_multiplier(mech, z: float) -> float:
    """The per-round Gaussian multiplier the mechanism's own event states at multiplier ``z``."""
    ev = mech.release_event(None, 1, z)
    assert isinstance(ev, dpa.SelfComposedDpEvent) and isinstance(ev.event, dpa.GaussianDpEvent)
    return ev.event.noise_multiplier


def contract_case(mech) -> Case:
    """The mechanism's privatizer under the privatizer contract, at the std its event states."""
    return Case(mech.mechanism, lambda std, key: mech.privatizer(stated_multiplier(mech, std), key),
                np.eye)


def _alg(dp):
    return build_algorithm(loss_fn, optax.sgd(0.05), server_optimizer("sgd", 1.0), dp,
                           expected_cohort_size=COHORT)


# ----------------------------------------------------------------------------- tests
def test_a_config_naming_the_registered_mechanism_builds_it():
    assert get_mechanism("gaussian_unamplified") is UnamplifiedGaussian
    dp = DPConfig(0.5, 1.2, "gaussian_unamplified")
    assert type(dp) is UnamplifiedGaussian and dp == UnamplifiedGaussian(0.5, 1.2)
    assert dp.sensitivity == 0.5 and dp.is_private


def test_train_charges_the_mechanism_s_own_event(tmp_path):
    data = make_dataset(num_clients=N, seed=2)
    s = PoissonSampler(N, COHORT / N, seed=1)
    mech = UnamplifiedGaussian(clip_norm=0.5, noise_multiplier=1.2)
    ledger = PrivacyLedger(1e6, 1e-6)
    res = train(_alg(mech), init_params(), data, list(data), s, rounds=ROUNDS, ledger=ledger,
                workdir=str(tmp_path / "run"), **KW)
    own = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.2), ROUNDS)
    charged = ledger.entry("fl-training").event
    assert event_to_json(charged) == event_to_json(own) == event_to_json(privacy_event(mech, s, ROUNDS))
    eps = accounting.compute_epsilon(own, 1e-6)[0]
    assert ledger.spent() == eps and np.isfinite(eps) and eps > 0
    assert ledger.entry("fl-training").details["mechanism"] == "gaussian_unamplified"
    assert int(res.state.noise_state.step) == ROUNDS
    # the noise is there: the same run without noise ends elsewhere
    free = train(_alg(UnamplifiedGaussian(clip_norm=0.5)), init_params(), data, list(data), s,
                 rounds=ROUNDS, workdir=str(tmp_path / "free"), **KW)
    assert not np.allclose(np.asarray(free.state.params["w"]), np.asarray(res.state.params["w"]))
    # and a resumed run continues its noise stream bit-identically
    wd = str(tmp_path / "split")
    train(_alg(mech), init_params(), data, list(data), s, rounds=ROUNDS, ledger=PrivacyLedger(1e6, 1e-6),
          workdir=wd, stop_after=2, **KW)
    again = train(_alg(mech), init_params(), data, list(data), s, rounds=ROUNDS,
                  ledger=PrivacyLedger(1e6, 1e-6), workdir=wd, **KW)
    assert again.resumed_from == 2
    np.testing.assert_array_equal(np.asarray(again.state.params["w"]), np.asarray(res.state.params["w"]))


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_the_new_mechanism_satisfies_the_privatizer_contract(check):
    CHECKS[check](contract_case(UnamplifiedGaussian(clip_norm=1.0, noise_multiplier=1.0)))


@pytest.mark.parametrize("mech,check,says", [
    (ReusesNoise(clip_norm=1.0, noise_multiplier=1.0), "fresh_noise", "released the same noise"),
    (UnderReported(clip_norm=1.0, noise_multiplier=1.0), "noise_scale", "variance / stated"),
], ids=["reuses_noise", "under_reported"])
def test_broken_mechanisms_are_caught(mech, check, says):
    with pytest.raises(AssertionError, match=says):
        CHECKS[check](contract_case(mech))


def test_unknown_and_conflicting_names_fail_closed():
    with pytest.raises(UnknownMechanism, match="'laplace_gaussian'"):
        DPConfig(0.5, 1.0, "laplace_gaussian")
    register_mechanism("gaussian_unamplified", UnamplifiedGaussian)  # the same class: a no-op
    @dataclasses.dataclass(frozen=True)
    class Impostor(UnamplifiedGaussian):  # another class under the same name
        pass
    with pytest.raises(ValueError, match="already registered"):
        register_mechanism("gaussian_unamplified", Impostor)
    with pytest.raises(ValueError, match="defaults to"):
        register_mechanism("another_name", UnamplifiedGaussian)


def test_lm_configs_check_their_algorithm_s_parts_against_the_registries(monkeypatch):
    from configs.common import ConfigError
    from configs.lm_fl import ALGORITHMS
    from fedpriv.recipes import algorithms as A
    assert A.algorithm_names() == ALGORITHMS  # every config choice is a registered LMAlgorithm
    for name in ALGORITHMS:
        assert A.check_algorithm(name) is A.get_algorithm(name)
    ftrl = A.get_algorithm("dp_ftrl")
    assert (ftrl.mechanism, ftrl.sampler) == ("tree", "shuffled")
    assert get_mechanism(ftrl.mechanism) is get_mechanism("tree")
    monkeypatch.setitem(A.ALGORITHMS._entries, "dp_new", A.LMAlgorithm("not_registered", "poisson"))
    with pytest.raises(ConfigError, match="dp_new.*'not_registered'"):
        A.check_algorithm("dp_new")
    with pytest.raises(ConfigError, match="unknown LM-FL algorithm 'nope'"):
        A.get_algorithm("nope")


def test_a_sampler_outside_the_mechanism_s_neighbouring_relations_is_refused():
    @dataclasses.dataclass(frozen=True)
    class ReplaceOneOnly(UnamplifiedGaussian):
        neighboring = ("replace_one",)  # (a ClassVar: inherited annotation)
    mech = ReplaceOneOnly(clip_norm=0.5, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="accounted under .*'add_remove'"):
        privacy_event(mech, PoissonSampler(N, COHORT / N, seed=1), ROUNDS)


@dataclasses.dataclass(frozen=True)
class HalfNoiseGaussian(GaussianMechanism):
    """Broken: a subclass of the built-in Gaussian mechanism that adds z/2 while inheriting the
    event of z (registered under no name: it is never a config choice)."""
    mechanism: str = "gaussian"

    def privatizer(self, noise_multiplier, key=None):
        return super().privatizer(0.5 * noise_multiplier, key)


def test_the_library_self_check_passes_the_new_mechanism():
    """What a researcher runs on their mechanism: the contract and noise = charged event."""
    check_mechanism(UnamplifiedGaussian(clip_norm=1.0, noise_multiplier=1.0))


@pytest.mark.parametrize("mech", [UnderReported(clip_norm=1.0, noise_multiplier=1.0),
                                  HalfNoiseGaussian(clip_norm=1.0, noise_multiplier=1.0)],
                         ids=["user_mechanism_z_over_2", "builtin_gaussian_z_over_2"])
def test_z_over_2_noise_with_the_event_of_z_fails_the_noise_event_check(mech):
    """Adding z/2 while charging the event of z: the noise-vs-event check fails (the charged
    epsilon is that of z, the noise gives that of ~z/2), though the privatizer alone is a sound
    Gaussian privatizer at its own scale."""
    with pytest.raises(ContractViolation, match="claims more noise than is added"):
        check_noise_matches_event(mech)
    sigma = measured_multiplier(lambda key: mech.privatizer(1.0, key))
    np.testing.assert_allclose(sigma, 0.5, rtol=0.05)  # what it adds: z/2 in every round
    honest = UnamplifiedGaussian if isinstance(mech, UnderReported) else GaussianMechanism
    out = check_noise_matches_event(honest(clip_norm=1.0, noise_multiplier=1.0))
    assert out["charged_epsilon"] >= out["noise_epsilon"]
