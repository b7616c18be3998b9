"""Accounting against dp_accounting and the paper's (z, epsilon) pairs; the privacy ledger."""
import json
import math

import dp_accounting as dpa
import pytest
from dp_accounting import pld, rdp
from hypothesis import given, settings, strategies as st

from fedpriv.dp import accounting as acc
from fedpriv.dp.geometric import geometric_dp_event
from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger, event_from_json, event_to_json
from tests import oracles


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
    raw = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(1.1)), 300)
    a = rdp.RdpAccountant()
    a.compose(raw)  # the event as the paper states it, built here (not by the function under test)
    p = pld.PLDAccountant()
    p.compose(raw)
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


# ----------------------------------------------------------------------------- issue 54
# (epsilon0, L1 sensitivity, k): Koga et al.'s 0.8 (Delta 1 and 50), and a small epsilon0 over many
# releases, where the exact composition is well below k eps0 (PLD's regime)
_GEO = [(0.8, 1, 1), (0.8, 1, 2), (0.8, 1, 5), (0.8, 50, 2), (0.8, 50, 5), (0.1, 1, 2), (0.1, 1, 30)]


def _geometric_forms(geo, k):
    """k releases of ``geo`` written every way a caller can: self-composed, composed, a list,
    and nested."""
    forms = {"self_composed": dpa.SelfComposedDpEvent(geo, k), "composed": dpa.ComposedDpEvent([geo] * k),
             "list": [geo] * k}
    if k > 1:
        forms["nested"] = [dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(geo, k - 1)]), geo]
    return forms


@pytest.mark.parametrize("eps0,sens,k", _GEO)
def test_k_geometric_releases_cost_their_composition_on_every_accountant_path(eps0, sens, k):
    """k pure-DP Geometric releases (``geometric.geometric_dp_event``, Koga et al. 2023's unigram
    counts) are charged their composition on every path of ``compute_epsilon``, whichever way
    the k releases are written: RDP (basic composition of pure DP) exactly ``k eps0``; PLD, and
    "best" (the smaller), never below the exact epsilon of k releases at delta
    (``oracles.geometric_composition_epsilon``: the privacy loss distribution by exact
    convolution) and never above ``k eps0``. A path that charged the k releases as one would give
    ``eps0``, below the exact value for k >= 2 -- and "best" would take it."""
    geo = geometric_dp_event(eps0, sens)
    exact = oracles.geometric_composition_epsilon(eps0, sens, k, 1e-6)
    assert exact > 0.99 * eps0 * min(k, 2)  # k >= 2 releases cost more than one
    for name, ev in _geometric_forms(geo, k).items():
        rdp = acc.compute_epsilon(ev, 1e-6, accountant="rdp")
        pld = acc.compute_epsilon(ev, 1e-6, accountant="pld")
        best = acc.compute_epsilon(ev, 1e-6, accountant="best")
        assert rdp == (pytest.approx(k * eps0, rel=1e-12), "rdp"), name
        assert exact * (1 - 1e-9) <= pld[0] <= k * eps0 * (1 + 1e-6), (name, pld, exact)
        assert best == min(rdp, pld), name
    led = PrivacyLedger(100.0, 1e-6)
    for i in range(k):
        led.spend(f"unigrams {i}", geo)
    assert exact * (1 - 1e-9) <= led.spent() <= k * eps0 * (1 + 1e-6)


def test_geometric_releases_beside_a_gaussian_run_are_each_charged():
    """With a release PLD cannot account (DP-FTRL's tree), "best" is the RDP path: the tree's
    epsilon plus ``k eps0`` (pure DP added by basic composition), for k = 1 and 3."""
    tree = acc.dp_ftrl_event(8.83, 1600)
    alone = acc.compute_epsilon(tree, 1e-6, accountant="rdp")[0]
    for k in (1, 3):
        geo = geometric_dp_event(0.8, 50)
        got = acc.compute_epsilon([tree, dpa.SelfComposedDpEvent(geo, k)], 1e-6)
        assert got == (pytest.approx(alone + 0.8 * k, rel=1e-12), "rdp")


_LEDGER_EVENTS = {
    "geometric": geometric_dp_event(0.8, 50),
    "dp_ftrl": acc.dp_ftrl_event(8.83, 100),
    "dp_fedavg_poisson": acc.dp_fedavg_poisson_event(1.1, 0.05, 40),
}


@pytest.mark.parametrize("name", sorted(_LEDGER_EVENTS))
def test_the_ledger_refuses_any_amount_over_its_budget(name):
    """``spend``, ``replace`` and ``absorb`` refuse a pipeline whose epsilon exceeds the budget by
    any amount -- one float64 ulp included -- and record nothing; a pipeline at exactly the
    budget is accepted. The budgets are the ledger's own epsilon of the step(s) (so the
    comparison is of equal computations), then the next float below it."""
    ev = _LEDGER_EVENTS[name]
    one = PrivacyLedger(1e6, 1e-6).epsilon_if_spent(ev)
    exact = PrivacyLedger(one, 1e-6)
    assert exact.spend("step", ev) == one                  # exactly at the budget: accepted
    for under in (math.nextafter(one, 0.0), one * (1 - 1e-12), one * (1 - 1e-9)):
        led = PrivacyLedger(under, 1e-6)
        with pytest.raises(PrivacyBudgetExceeded, match="budget"):
            led.spend("step", ev)
        assert led.entries == []
    two = PrivacyLedger(1e6, 1e-6)
    two.spend("a", ev)
    both = two.epsilon_if_spent(ev)
    tight = PrivacyLedger(math.nextafter(both, 0.0), 1e-6)
    tight.spend("a", ev)
    with pytest.raises(PrivacyBudgetExceeded):              # the second step, by one ulp
        tight.spend("b", ev)
    assert [e.name for e in tight.entries] == ["a"]
    bigger = dpa.SelfComposedDpEvent(ev, 2)
    with pytest.raises(PrivacyBudgetExceeded):              # replace by a costlier step
        tight.replace("a", bigger)
    assert tight.entries[0].event == ev
    recorded = PrivacyLedger(1e6, 1e-6)
    recorded.spend("b", ev)
    with pytest.raises(PrivacyBudgetExceeded):              # a checkpoint's entries on top of ours
        tight.absorb(recorded)
    assert [e.name for e in tight.entries] == ["a"]


_RELATIONS = ("add_remove", "replace_one")


@settings(max_examples=40, deadline=None, derandomize=True)
@given(delta=st.sampled_from([1e-6, 1e-5, 1e-7, 2e-6, 1e-6 * (1 + 1e-12)]),
       rel=st.sampled_from(_RELATIONS), mine_rel=st.sampled_from(_RELATIONS),
       round_trip=st.booleans())
def test_the_ledger_absorbs_only_a_ledger_at_its_own_delta_and_relation(delta, rel, mine_rel, round_trip):
    """A recorded ledger (e.g. a checkpoint's, optionally through its JSON form) is merged into
    this one only if both account at the same delta and the same neighbouring relation: costs at
    another delta, or stated for other neighbours, are not this ledger's and are refused (nothing
    changes); otherwise the merged ledger holds the recorded entries first."""
    geo = geometric_dp_event(0.5, 1)
    recorded = PrivacyLedger(10.0, delta, neighboring=rel)
    recorded.spend("recorded", geo)
    if round_trip:
        recorded = PrivacyLedger.from_dict(json.loads(json.dumps(recorded.to_dict())))
    mine = PrivacyLedger(10.0, 1e-6, neighboring=mine_rel)
    mine.spend("mine", geo)
    if delta == 1e-6 and rel == mine_rel:
        mine.absorb(recorded)
        assert [e.name for e in mine.entries] == ["recorded", "mine"]
    else:
        with pytest.raises(PrivacyBudgetExceeded, match="delta|neighboring"):
            mine.absorb(recorded)
        assert [e.name for e in mine.entries] == ["mine"]


def test_a_step_on_several_populations_is_checked_on_each_of_them():
    """A step charged to several user populations counts against the budget of every one of
    them, not only the first it names: two steps on (S, T) and (U, T) cost T both (1.6 > 1)
    though S and U each carry one (0.8); the second is refused, and ``spent`` is T's."""
    geo = geometric_dp_event(0.8, 1)
    led = PrivacyLedger(1.0, 1e-6)
    led.spend("S and T", geo, ("S", "T"))
    with pytest.raises(PrivacyBudgetExceeded, match="budget"):
        led.spend("U and T", geo, ("U", "T"))
    assert [e.name for e in led.entries] == ["S and T"]
    big = PrivacyLedger(2.0, 1e-6)
    big.spend("S and T", geo, ("S", "T"))
    big.spend("U and T", geo, ("U", "T"))
    assert big.spent() == pytest.approx(1.6, rel=1e-5) == big.epsilon_by_population()["T"]
