"""Accounting against dp_accounting and the paper's (z, epsilon) pairs; the privacy ledger."""
import json
import math

import dp_accounting as dpa
import pytest
from dp_accounting import pld, rdp

from fedpriv.dp import accounting as acc
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger, event_from_json, event_to_json


@pytest.mark.parametrize("z, eps", [(8.83, 1.77), (1.13, 18.71)])
def test_dp_ftrl_matches_wang_et_al(z, eps):
    got, name = acc.compute_epsilon(acc.dp_ftrl_event(z, 1600), 1e-6)
    assert name == "rdp"
    assert abs(got - eps) < 0.01


def test_dp_ftrl_equals_raw_dp_accounting_and_restarts_cost_more():
    a = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
    a.compose(dpa.SingleEpochTreeAggregationDpEvent(2.0, 500))
    ours = acc.compute_epsilon(acc.dp_ftrl_event(2.0, 500), 1e-5)[0]
    assert ours == pytest.approx(a.get_epsilon(1e-5), rel=1e-12)
    one = acc.compute_epsilon(acc.dp_ftrl_event(2.0, 1000, epochs=1), 1e-5)[0]
    four = acc.compute_epsilon(acc.dp_ftrl_event(2.0, 1000, epochs=4), 1e-5)[0]
    assert four > one
    assert acc.epoch_lengths(10, 4) == [4, 4, 2] and acc.epoch_lengths(8, 4) == [4, 4]
    with pytest.raises(ValueError, match="divide"):
        acc.dp_ftrl_event(2.0, 10, epochs=3)  # no engine run has trees [4, 3, 3]


def test_dp_fedavg_poisson_is_min_of_rdp_and_pld():
    ev = acc.dp_fedavg_poisson_event(1.1, 0.02, 300)
    a = rdp.RdpAccountant()
    a.compose(ev)
    p = pld.PLDAccountant()
    p.compose(ev)
    got, name = acc.compute_epsilon(ev, 1e-6)
    assert got == pytest.approx(min(a.get_epsilon(1e-6), p.get_epsilon(1e-6)), rel=1e-9)
    assert acc.compute_epsilon(ev, 1e-6, accountant="rdp")[0] == pytest.approx(a.get_epsilon(1e-6))


def test_wor_sampling_uses_replace_one_and_half_multiplier():
    ev = acc.dp_fedavg_wor_event(2.0, 1000, 50, 100)
    a = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    a.compose(dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(1000, 50, dpa.GaussianDpEvent(1.0)), 100))
    assert acc.compute_epsilon(ev, 1e-6, "replace_one")[0] == pytest.approx(a.get_epsilon(1e-6))
    with pytest.raises(dpa.UnsupportedEventError):
        acc.compute_epsilon(ev, 1e-6, "add_remove")  # fail closed, not a wrong number


@pytest.mark.parametrize("make", [lambda z: acc.dp_ftrl_event(z, 800),
                                  lambda z: acc.dp_fedavg_poisson_event(z, 0.05, 100)])
def test_calibration_meets_target_tightly(make):
    z = acc.calibrate_noise_multiplier(make, 3.0, 1e-6, accountant="rdp")
    eps = acc.compute_epsilon(make(z), 1e-6, accountant="rdp")[0]
    assert eps <= 3.0 + 1e-9
    assert acc.compute_epsilon(make(z * 0.98), 1e-6, accountant="rdp")[0] > 3.0


def test_pure_dp_events_compose_basically():
    geo = dpa.dp_event.DiscreteLaplaceDpEvent(0.8 / 50, 50)
    assert acc.compute_epsilon(geo, 1e-6, accountant="rdp")[0] == pytest.approx(0.8)
    both = acc.compute_epsilon([geo, acc.dp_ftrl_event(8.83, 1600)], 1e-6, accountant="rdp")[0]
    assert both == pytest.approx(0.8 + 1.7732, abs=1e-3)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_epsilon_validation(bad):
    with pytest.raises(ValueError):
        acc.check_epsilon(bad)


def test_ledger_refuses_before_recording_and_reports():
    led = PrivacyLedger(2.0, 1e-6)
    led.spend("unigrams", dpa.dp_event.DiscreteLaplaceDpEvent(0.8 / 50, 50), ("users",))
    assert led.spent() == pytest.approx(0.8, abs=1e-4)
    with pytest.raises(PrivacyBudgetExceeded, match="budget"):
        led.spend("train", acc.dp_ftrl_event(1.13, 1600))
    assert len(led.entries) == 1  # nothing recorded
    z = acc.calibrate_noise_multiplier(lambda z: acc.dp_ftrl_event(z, 100), 1.15, 1e-6)
    led.spend("train", acc.dp_ftrl_event(z, 100))
    assert led.spent() <= 2.0
    led.record_post_processing("mid-training")
    rep = led.report()
    assert [e["name"] for e in rep["entries"]] == ["unigrams", "train", "mid-training"]
    assert rep["entries"][2]["epsilon_alone"] == 0
    assert rep["unit"] == "user"


def test_ledger_parallel_composition_over_disjoint_populations():
    led = PrivacyLedger(2.0, 1e-6)
    ev = acc.dp_ftrl_event(acc.calibrate_noise_multiplier(lambda z: acc.dp_ftrl_event(z, 200), 1.9, 1e-6), 200)
    led.spend("pretrain on S", ev, ("S",))
    led.spend("finetune on T", ev, ("T",))  # disjoint users: parallel composition
    assert led.spent() == pytest.approx(led.epsilon_by_population()["S"])
    with pytest.raises(PrivacyBudgetExceeded):
        led.spend("again on T", ev, ("T",))


def test_ledger_refuses_unaccountable_and_nonprivate_steps():
    led = PrivacyLedger(1.0, 1e-6)
    with pytest.raises(PrivacyBudgetExceeded):
        led.spend("no noise", dpa.NonPrivateDpEvent())
    with pytest.raises(PrivacyBudgetExceeded, match="cannot account"):
        led.spend("wor", acc.dp_fedavg_wor_event(5.0, 1000, 10, 10))
    with pytest.raises(ValueError):
        PrivacyLedger(0.0, 1e-6)
    with pytest.raises(ValueError):
        PrivacyLedger(1.0, 1.0)


def test_ledger_round_trips_through_json(tmp_path):
    led = PrivacyLedger(5.0, 1e-6)
    led.spend("a", acc.dp_fedavg_poisson_event(1.0, 0.01, 50), ("users",), note="x")
    led.spend("b", acc.dp_ftrl_event(6.0, 100, epochs=2), ("users",))
    path = tmp_path / "ledger.json"
    led.save(str(path))
    back = PrivacyLedger.load(str(path))
    assert back.spent() == pytest.approx(led.spent())
    assert [e.event for e in back.entries] == [e.event for e in led.entries]
    ev = acc.dp_fedavg_poisson_event(1.0, 0.01, 50)
    assert event_from_json(json.loads(json.dumps(event_to_json(ev)))) == ev


def test_best_calibration_brackets_from_rdp_and_meets_the_target():
    """calibrate_noise_multiplier(accountant="best") starts from RDP's z (an upper end): where PLD
    applies it returns a smaller z whose best epsilon is within tol of the target, never above;
    where PLD does not (the tree), it is RDP's z exactly."""
    import dp_accounting as dpa

    from fedpriv.dp import accounting
    make = lambda z: dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(z)), 500)
    z_rdp = accounting.calibrate_noise_multiplier(make, 2.0, 1e-6, accountant="rdp")
    z_best = accounting.calibrate_noise_multiplier(make, 2.0, 1e-6, accountant="best")
    eps = accounting.compute_epsilon(make(z_best), 1e-6)[0]
    assert z_best < z_rdp and eps <= 2.0 and eps > 2.0 * 0.99
    tree = lambda z: accounting.dp_ftrl_event(z, 64, 64)
    assert accounting.calibrate_noise_multiplier(tree, 5.0, 1e-6, accountant="best") == \
        accounting.calibrate_noise_multiplier(tree, 5.0, 1e-6, accountant="rdp")
