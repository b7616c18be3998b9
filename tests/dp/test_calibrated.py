"""The committed calibrations (``fedpriv/dp/calibrated.py``, written by ``python -m
experiments.calibrations``): ``calibrate_noise_multiplier`` returns a tabulated z only for the
exact event the search ended at and only while two evaluations show it is still the search's
answer (epsilon(z) <= target < epsilon(z - tol)); anything else is searched. The table holds
what the search returns, within its tolerance (two configs' calibrations searched afresh here);
that every config's plan finds its calibrations there is checked where the plans are accounted
(tests/experiments/test_configs.py, test_paper_configs.py).
"""
import pytest

from experiments import calibrations
from fedpriv.dp import accounting as acc
from fedpriv.dp.calibrated import TABLE

TOL = 1e-4


@pytest.fixture(scope="module")
def family():
    """A config's calibration that "best" searches with PLD: pre_text:smoke's vote noise at
    epsilon 7.58 (``fedpriv.recipes.pretext.vote_noise``): (make_event, epsilon, delta)."""
    from experiments import common
    from fedpriv.recipes import plans, pretext
    from fedpriv.synth import release
    cfg = common.load_config("configs/pre_text.py:smoke")
    sampler = pretext.vote_sampler(cfg, plans.lm_train_clients(cfg.lm), 0)
    return (lambda z: release.votes_event(sampler, cfg.pe_rounds, z)), 7.58, cfg.lm.delta, cfg


@pytest.fixture(scope="module")
def searched(family):
    """The search's answer, afresh (table off), as the config computes it; it is the committed one."""
    make, eps, delta, cfg = family
    from fedpriv.recipes import plans, pretext
    with calibrations.recording() as found:
        z = pretext.vote_noise(cfg, plans.lm_train_clients(cfg.lm), eps)
    (entry,) = found
    assert entry.z == z and entry.checked and entry.key == (eps, delta, "add_remove", "best", TOL)
    assert entry.digest == acc.event_digest(make(z))
    # the committed entry is the search's answer as the machine that wrote the table computed it:
    # PLD's float evaluations may differ in the last digits between CPUs (measured: z 0.6836360931192768
    # in the table, 0.683636093119277 searched on an AMD EPYC), so the entry is compared within the
    # search's own resolution, and its two evaluations must accept it here (else it is not used)
    tabulated = acc._tabulated(make, eps, delta, "add_remove", "best", TOL)
    assert tabulated is not None and abs(tabulated - entry.z) < TOL, (tabulated, entry.z)
    return entry


@pytest.fixture
def searches(monkeypatch):
    """The searches ("best"; not the RDP search inside one) while the test runs."""
    calls = []
    real = acc._search_noise_multiplier

    def search(make_event, epsilon, delta, neighboring, accountant, tol):
        if accountant == "best":
            calls.append(epsilon)
        return real(make_event, epsilon, delta, neighboring, accountant, tol)
    monkeypatch.setattr(acc, "_search_noise_multiplier", search)
    return calls


def _table(monkeypatch, entry, *rows):
    monkeypatch.setattr(acc, "_table", lambda: {entry.key: tuple(rows)})


def test_a_tabulated_calibration_is_the_searchs_z_without_a_search(family, searched, searches, monkeypatch):
    make, eps, delta, _ = family
    z = searched.z
    _table(monkeypatch, searched, (z + 3 * TOL, acc.event_digest(make(z + 3 * TOL))), (z, searched.digest))
    assert acc.calibrate_noise_multiplier(make, eps, delta) == z
    assert searches == []
    # the two checks hold for it: it meets the target and tol less does not
    epsilon = lambda z: acc.compute_epsilon(make(z), delta)[0]  # noqa: E731
    assert epsilon(z) <= eps < epsilon(z - TOL)


@pytest.mark.parametrize("shift", [2.0, -2.0])
def test_an_entry_that_is_not_the_smallest_z_meeting_the_target_is_searched(family, searched, searches,
                                                                           monkeypatch, shift):
    """z + 2 tol meets the target but is not within tol of the smallest z; z - 2 tol does not
    meet it: both are refused (their digests match: the checks refuse them) and searched."""
    make, eps, delta, _ = family
    wrong = searched.z + shift * TOL
    _table(monkeypatch, searched, (wrong, acc.event_digest(make(wrong))))
    assert acc.calibrate_noise_multiplier(make, eps, delta) == searched.z
    assert searches == [eps]


def test_an_entry_of_another_event_or_calibration_is_not_used(family, searched, searches, monkeypatch):
    make, eps, delta, _ = family
    other = lambda z: acc.dp_fedavg_poisson_event(z, 0.05, 20)  # noqa: E731
    _table(monkeypatch, searched, (searched.z, acc.event_digest(other(searched.z))))
    assert acc.calibrate_noise_multiplier(make, eps, delta) == searched.z
    assert searches == [eps]
    _table(monkeypatch, searched, (searched.z, searched.digest))
    for kw in ({"tol": 1e-3}, {"accountant": "rdp"}, {"neighboring": "replace_one"}):  # other keys
        args = dict(dict(neighboring="add_remove", accountant="best", tol=TOL), **kw)
        assert acc._tabulated(make, eps, delta, **args) is None
    assert acc._tabulated(make, eps, delta, "add_remove", "best", TOL) == searched.z
    with calibrations.recording(use_table=True) as found:
        assert acc.calibrate_noise_multiplier(make, eps, delta) == searched.z
    assert searches == [eps] and found == []
    with calibrations.recording() as found:  # the table off: searched, and recorded
        assert acc.calibrate_noise_multiplier(make, eps, delta) == searched.z
    assert searches == [eps, eps] and found == [searched]


def test_the_rendered_table_is_read_back(family, searched, searches, monkeypatch):
    make, eps, delta, _ = family
    ns = {}
    exec(calibrations.render({searched: {"pre_text:smoke"}}), ns)
    assert ns["TABLE"] == {searched.key: ((searched.z, searched.digest),)}
    monkeypatch.setattr(acc, "_table", lambda: ns["TABLE"])
    assert acc.calibrate_noise_multiplier(make, eps, delta) == searched.z and searches == []


def test_the_table_holds_what_the_search_returns_for_dp_ftrl():
    """demo:smoke's DP-FTRL (a tree: "best" is RDP's search): the committed z of its plan, within
    the search's own resolution (``key[-1]``, its tol; the last digits of a float search may differ
    between CPUs, as the PLD fixture above measured)."""
    found = calibrations.plan_calibrations("demo", "smoke")
    assert found
    for e in found:
        tol = e.key[-1]
        assert any(abs(z - e.z) < tol for z, _ in TABLE.get(e.key, ())), (e, TABLE.get(e.key))
