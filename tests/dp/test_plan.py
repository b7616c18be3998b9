"""A privacy plan is accounted with its run's accountant (``fedpriv.dp.plan.account``; issue 54).

A plan stands for the ledger its run opens: its epsilon is what that ledger would report, under
the accountant that ledger uses -- never a tighter bound the run does not use. Checked against
``dp_accounting``'s own RDP and PLD accountants (``tests/oracles.py``); the run side (every
experiment's ledgers carry the plan's accountant) is ``tests/experiments/test_plan_charges.py``.
"""
import dataclasses

import dp_accounting as dpa
import pytest

from fedpriv.dp.ledger import PrivacyBudgetExceeded
from fedpriv.dp.plan import Charge, PlannedRun, PrivacyPlan, account
from tests.oracles import pld_epsilon, rdp_epsilon

DELTA = 1e-6
# 200 Poisson-sampled Gaussian rounds: RDP's bound (2.63) is ~19 % above PLD's (2.22)
EVENT = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(1.0)), 200)
PURE = dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(1.0), 1)  # eps 1, pure DP, on another population


@pytest.fixture(scope="module")
def bounds():
    rdp, pld = rdp_epsilon([EVENT], DELTA), pld_epsilon([EVENT], DELTA)
    assert pld < 0.9 * rdp  # the two accountants really disagree here
    return {"rdp": rdp, "pld": pld, "best": min(rdp, pld)}


@pytest.mark.parametrize("accountant", ["rdp", "pld", "best"])
def test_a_plan_reports_the_epsilon_of_its_runs_accountant(accountant, bounds):
    run = PlannedRun("run", 10.0, DELTA, (Charge("fl", EVENT), Charge("count", PURE, ("other",))),
                     accountant=accountant)
    (acc,) = account(PrivacyPlan((run,)))
    assert acc.epsilon == acc.epsilon_dp == pytest.approx(bounds[accountant], rel=1e-6)


@pytest.mark.parametrize("accountant", ["rdp", "pld", "best"])
def test_a_budget_only_another_accountant_meets_is_refused(accountant, bounds):
    """A budget between PLD's and RDP's epsilon: a run accounting with RDP would be refused by its
    own ledger, so its plan must be refused too; PLD and "best" runs fit it."""
    budget = (bounds["rdp"] + bounds["pld"]) / 2
    run = PlannedRun("run", budget, DELTA, (Charge("fl", EVENT),), accountant=accountant)
    if bounds[accountant] > budget:
        with pytest.raises(PrivacyBudgetExceeded, match="run 'run'"):
            account(PrivacyPlan((run,)))
    else:
        (acc,) = account(PrivacyPlan((run,)))
        assert acc.epsilon == pytest.approx(bounds[accountant], rel=1e-6) and acc.epsilon <= budget
    # and the same run's copies are accounted alike
    copies = dataclasses.replace(run, name="copies", copies=3, epsilon=bounds[accountant] * 1.001)
    (acc,) = account(PrivacyPlan((copies,)))
    assert acc.epsilon == pytest.approx(bounds[accountant], rel=1e-6) and acc.copies == 3
