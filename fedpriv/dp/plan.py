"""Privacy plans: what an experiment would charge, accounted before (and without) running it.

An experiment's :class:`PrivacyPlan` lists the ledgers it opens (:class:`PlannedRun`: one per
pipeline / table row / counterfactual run, each with the (epsilon, delta) budget it claims) and,
in order, the privacy events it would spend in each (:class:`Charge`) -- the very
``dp_accounting`` events the run builds (``fedpriv.recipes.lm.build_algorithm``,
``fedpriv.recipes.fred_pipeline.fred_release_event``, the expansion schemes' stages ...), built from the
config alone, no data and no training. :func:`account` replays every charge through a fresh
:class:`~fedpriv.dp.ledger.PrivacyLedger` -- the ledger the run uses, same budget, delta and
accountant -- and raises :class:`~fedpriv.dp.ledger.PrivacyBudgetExceeded` on the first charge
the run's ledger would refuse (fail closed). ``fedpriv.recipes.plans`` builds the plans of the
experiments; every ``configs/<experiment>.py`` exposes ``privacy_plan(cfg)`` (tests/experiments/
test_configs.py accounts every scale of every config).

An experiment that touches no private data declares it (``PrivacyPlan.nothing(reason)``); a
plan with no runs and no such declaration is refused by :func:`account`, so a config can never
pass the check by omission.
"""
from __future__ import annotations

import dataclasses
import math

import dp_accounting as dpa

from fedpriv.dp.ledger import PrivacyBudgetExceeded, PrivacyLedger, event_to_json

__all__ = ["Charge", "PlannedRun", "PrivacyPlan", "RunAccount", "account", "PrivacyBudgetExceeded"]


@dataclasses.dataclass(frozen=True)
class Charge:
    """One ``ledger.spend(name, event, populations)`` of a run. ``executed_event``: for a charge
    of a simulated population (``noise_cohort_size``), the event of the run actually executed
    (reported beside the charged epsilon, as the loop's ``details['executed_event']``)."""
    name: str
    event: dpa.DpEvent
    populations: tuple[str, ...] = ("users",)
    executed_event: dpa.DpEvent | None = None


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One ledger of an experiment: its budget and the charges it would receive, in order.

    ``epsilon`` None: the run makes no DP claim (a non-private baseline, e.g. FedAvg); it may
    not charge anything and is reported with epsilon = inf. ``nonprivate``: names of
    non-private choices the run records (``record_nonprivate``, e.g. a vocabulary of the users'
    own words; epsilon = inf, the budget bounds the DP charges only). ``copies``: identical
    runs (seeds, counterfactual rows) that each open their own ledger with this budget.
    ``neighboring``: the ledger's relation (the run's sampler's).
    """
    name: str
    epsilon: float | None
    delta: float
    charges: tuple[Charge, ...] = ()
    nonprivate: tuple[tuple[str, tuple[str, ...]], ...] = ()
    accountant: str = "best"
    copies: int = 1
    note: str = ""
    neighboring: str = "add_remove"
    # the paper-noise protocol (fedpriv.dp.population.PaperNoise): the declared population's
    # epsilon beside the one charged here; None when the run simulates no population
    paper_noise: object = None


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """Every ledger an experiment would open. ``releases_nothing``: the reason an experiment
    with no runs touches no private data (required when ``runs`` is empty)."""
    runs: tuple[PlannedRun, ...] = ()
    releases_nothing: str | None = None
    notes: tuple[str, ...] = ()

    @classmethod
    def nothing(cls, reason: str) -> "PrivacyPlan":
        if not reason:
            raise ValueError("say why the experiment releases nothing")
        return cls((), reason)


@dataclasses.dataclass(frozen=True)
class RunAccount:
    """What :func:`account` found for one run (the figures its ledger would report)."""
    name: str
    budget: float | None          # the run's claimed epsilon (None: no DP claim)
    delta: float
    epsilon: float                # ledger.spent(): inf with a non-private choice or no claim
    epsilon_dp: float             # ledger.spent_if_public(): what the budget bounds
    epsilon_executed: float | None  # ledger.spent_executed() (simulated populations replaced);
                                    # computed only with account(..., executed=True)
    charges: tuple[str, ...]
    copies: int = 1
    note: str = ""
    paper_noise: object = None    # PlannedRun.paper_noise (simulated vs charged epsilon)


def _account_run(run: PlannedRun, executed: bool) -> RunAccount:
    names = tuple(c.name for c in run.charges)
    if run.epsilon is None:
        if run.charges:
            raise PrivacyBudgetExceeded(f"run {run.name!r} claims no budget but charges {names}")
        return RunAccount(run.name, None, run.delta, math.inf, math.inf, math.inf, (),
                          run.copies, run.note or "non-private: no DP claim")
    if run.copies < 1:
        raise ValueError(f"run {run.name!r}: copies must be >= 1")
    ledger = PrivacyLedger(run.epsilon, run.delta, neighboring=run.neighboring,
                           accountant=run.accountant)
    for name, pops in run.nonprivate:
        ledger.record_nonprivate(name, pops)
    for c in run.charges:
        details = ({"executed_event": event_to_json(c.executed_event)}
                   if c.executed_event is not None else None)
        try:
            ledger.spend(c.name, c.event, c.populations, details=details)
        except PrivacyBudgetExceeded as err:
            raise PrivacyBudgetExceeded(f"run {run.name!r}: {err}") from err
    dp_eps = ledger.spent_if_public()
    if not dp_eps <= run.epsilon * (1 + 1e-9):  # (the ledger checked each step; re-check the end)
        raise PrivacyBudgetExceeded(f"run {run.name!r}: epsilon {dp_eps:.4g} > budget {run.epsilon:g}")
    eps = math.inf if ledger.nonprivate_entries else dp_eps  # = ledger.spent()
    exe = None
    if executed:  # (slow: the executed runs' events have small multipliers)
        exe = math.inf if ledger.nonprivate_entries else ledger.spent_executed()
    return RunAccount(run.name, run.epsilon, run.delta, eps, dp_eps, exe, names, run.copies, run.note,
                      run.paper_noise)


def account(plan: PrivacyPlan, executed: bool = False) -> list[RunAccount]:
    """Replay every charge of ``plan`` through a fresh ``PrivacyLedger`` per run (the run's
    budget, delta and accountant). Raises ``PrivacyBudgetExceeded`` on the first charge a run's
    ledger would refuse, and ``ValueError`` for a plan that charges nothing without declaring
    that the experiment releases nothing. ``executed``: also the epsilon of the runs actually
    executed where a charge simulates a larger population (reported, not bounded)."""
    if not isinstance(plan, PrivacyPlan):
        raise TypeError(f"privacy_plan must return a PrivacyPlan, got {type(plan).__name__}")
    if not plan.runs:
        if not plan.releases_nothing:
            raise ValueError("the privacy plan has no runs and does not declare that the "
                             "experiment releases nothing (PrivacyPlan.nothing(reason))")
        return []
    if plan.releases_nothing:
        raise ValueError("a plan with runs cannot declare that it releases nothing")
    return [_account_run(r, executed) for r in plan.runs]
