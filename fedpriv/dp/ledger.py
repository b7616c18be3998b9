"""A privacy ledger: one (epsilon, delta) budget for a whole pipeline.

Every mechanism run on the same users — FL training (DP-FedAvg / DP-FTRL), adaptive-clipping
counts, FreD's mean/covariance releases (Hou et al. 2023), private unigram counts (Koga et al.
2023) — is recorded as a ``dp_accounting`` event. ``spend`` computes the epsilon the pipeline
would have *after* the step and raises ``PrivacyBudgetExceeded`` before anything is recorded
(callers spend before touching private data: fail closed).

Populations: each entry names the user populations it touches (default ``("users",)``).
Events on the same population compose sequentially; disjoint populations compose in
parallel (McSherry 2009), so the pipeline's epsilon is the max over populations — e.g. Koga
et al.'s PT spends the full budget on source users S and again on target users T.
Post-processing steps (e.g. public mid-training on a DP checkpoint) are recorded at zero cost
with ``record_post_processing`` so the ledger shows them.

Non-private choices (e.g. a vocabulary built from the users' own text, when the user asks for
it explicitly) are recorded with ``record_nonprivate`` as a ``NonPrivateDpEvent``: never
refused, and from then on ``spent()`` is infinite on the populations it touches. The budget
still bounds the DP releases: ``spend`` checks ``spent_if_public()`` — the epsilon that holds
if the non-private entries are taken as public — and ``report()`` gives both, saying which
entries were taken as public.

The ledger is plain data: ``to_dict``/``from_dict``/``save``/``load`` (JSON), saved with every
checkpoint and reported with every result.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Iterable

import attr
import dp_accounting as dpa

from fedpriv.dp import accounting, ddg
from fedpriv.errors import FedprivError


class PrivacyBudgetExceeded(FedprivError, RuntimeError):
    """Raised when a step would take the pipeline past its (epsilon, delta) budget."""


def event_to_json(event: dpa.DpEvent):
    """Serialise a ``dp_accounting`` event (nested) to JSON-able data."""
    fields = {}
    for k, v in attr.asdict(event, recurse=False).items():
        if isinstance(v, dpa.DpEvent):
            v = event_to_json(v)
        elif isinstance(v, (list, tuple)):
            v = [event_to_json(x) if isinstance(x, dpa.DpEvent) else x for x in v]
        fields[k] = v
    return {"__event__": type(event).__name__, **fields}


# events of fedpriv's own (dp_accounting does not define them), by class name
OWN_EVENTS = {cls.__name__: cls for cls in (ddg.DistributedDiscreteGaussianDpEvent,)}


def event_from_json(data) -> dpa.DpEvent:
    data = dict(data)
    name = data.pop("__event__")
    cls = OWN_EVENTS.get(name) or getattr(dpa.dp_event, name)
    kwargs = {}
    for k, v in data.items():
        if isinstance(v, dict) and "__event__" in v:
            v = event_from_json(v)
        elif isinstance(v, list):
            v = [event_from_json(x) if isinstance(x, dict) and "__event__" in x else x for x in v]
        kwargs[k] = v
    return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    name: str
    event: dpa.DpEvent
    populations: tuple[str, ...]
    note: str = ""
    time: float = 0.0
    details: dict = dataclasses.field(default_factory=dict)  # JSON-able: what ran (rounds, ...)

    @property
    def nonprivate(self) -> bool:
        """A non-private release (recorded with ``record_nonprivate``): epsilon = inf."""
        return isinstance(self.event, dpa.NonPrivateDpEvent)

    def same_release(self, other: "LedgerEntry") -> bool:
        """The same step (name, populations, event); time, note and details aside."""
        return (self.name == other.name and self.populations == other.populations
                and event_to_json(self.event) == event_to_json(other.event))


class PrivacyLedger:
    """One privacy budget for a pipeline of mechanisms on the same users.

    Args:
      epsilon: total budget epsilon (> 0).
      delta: total budget delta in (0, 1).
      neighboring: "add_remove" (default, user-level add/remove) or "replace_one".
      unit: the unit of privacy, reported with every result (default "user").
      accountant: "best" (smallest of RDP and PLD bounds), "rdp" or "pld".
    """

    def __init__(self, epsilon: float, delta: float, neighboring: str = "add_remove",
                 unit: str = "user", accountant: str = "best"):
        self.epsilon = accounting.check_epsilon(epsilon)
        self.delta = accounting.check_delta(delta)
        if neighboring not in accounting.NEIGHBORING:
            raise ValueError(f"neighboring must be one of {accounting.NEIGHBORING}")
        self.neighboring = neighboring
        self.unit = unit
        self.accountant = accountant
        self.entries: list[LedgerEntry] = []

    # ------------------------------------------------------------------ queries
    @property
    def populations(self) -> list[str]:
        return sorted({p for e in self.entries for p in e.populations})

    def _epsilon_of(self, entries: Iterable[LedgerEntry]) -> tuple[float, str]:
        events = [e.event for e in entries]
        return accounting.compute_epsilon(events, self.delta, self.neighboring, self.accountant)

    def epsilon_by_population(self, extra: LedgerEntry | None = None,
                              if_public: bool = False) -> dict[str, float]:
        """Epsilon per population; ``if_public``: taking the non-private entries as public."""
        entries = self.entries + ([extra] if extra is not None else [])
        pops = sorted({p for e in entries for p in e.populations})
        return {p: self._epsilon_of([e for e in entries if p in e.populations
                                     and not (if_public and e.nonprivate)])[0] for p in pops}

    @property
    def nonprivate_entries(self) -> list[str]:
        """Names of the non-private entries (``record_nonprivate``)."""
        return [e.name for e in self.entries if e.nonprivate]

    def spent(self) -> float:
        """Epsilon spent so far at the ledger's delta (max over disjoint populations); infinite
        once a non-private entry is recorded (see ``spent_if_public``)."""
        return max(self.epsilon_by_population().values(), default=0.0)

    def spent_if_public(self) -> float:
        """The epsilon that holds if the non-private entries are taken as public (equal to
        ``spent()`` when there are none): what the budget bounds."""
        return max(self.epsilon_by_population(if_public=True).values(), default=0.0)

    def spent_executed(self) -> float:
        """The pipeline's epsilon for the runs actually executed: each entry that charged a
        simulated population (``details['executed_event']``, ``noise_cohort_size``) counted
        with the event of the run that ran instead. Equal to ``spent()`` without such entries."""
        entries = [dataclasses.replace(e, event=event_from_json(e.details["executed_event"]))
                   if e.details.get("executed_event") else e for e in self.entries]
        pops = sorted({p for e in entries for p in e.populations})
        return max((self._epsilon_of([e for e in entries if p in e.populations])[0] for p in pops),
                   default=0.0)

    @property
    def simulated(self) -> bool:
        """Whether some entry charged a simulated population (see ``spent_executed``)."""
        return any(e.details.get("executed_event") for e in self.entries)

    def remaining(self) -> float:
        """Budget left for DP releases (non-private entries taken as public)."""
        return max(0.0, self.epsilon - self.spent_if_public())

    def dp_events(self) -> list[dpa.DpEvent]:
        """The events of the DP entries (non-private ones left out), e.g. to calibrate a next
        release so that the pipeline fits the budget."""
        return [e.event for e in self.entries if not e.nonprivate]

    def epsilon_if_spent(self, event: dpa.DpEvent, populations=("users",)) -> float:
        """The pipeline's epsilon if ``event`` were spent now (nothing is recorded)."""
        extra = LedgerEntry("?", event, tuple(populations))
        return max(self.epsilon_by_population(extra).values())

    # ------------------------------------------------------------------ updates
    def spend(self, name: str, event: dpa.DpEvent, populations: Iterable[str] = ("users",),
              note: str = "", details: dict | None = None) -> float:
        """Record ``event``, or raise ``PrivacyBudgetExceeded`` and record nothing.

        Call this *before* the mechanism touches private data. Returns the pipeline's epsilon
        after the step. ``details``: JSON-able record of what runs (e.g. rounds, sampler, z).
        """
        entry = self._entry(name, event, populations, note, details)
        eps = self._check(self.entries + [entry], name)
        self.entries.append(entry)
        return eps

    def entry(self, name: str) -> LedgerEntry | None:
        """The entry named ``name`` (None if absent; raises if the name is ambiguous)."""
        found = [e for e in self.entries if e.name == name]
        if len(found) > 1:
            raise PrivacyBudgetExceeded(f"the ledger has {len(found)} entries named {name!r}")
        return found[0] if found else None

    def replace(self, name: str, event: dpa.DpEvent, populations: Iterable[str] = ("users",),
                note: str = "", details: dict | None = None) -> float:
        """Replace the entry ``name`` by ``event`` (e.g. a resumed run extended to more rounds:
        the event of its new total schedule), or raise ``PrivacyBudgetExceeded`` and change
        nothing. The entry keeps its position. Returns the pipeline's epsilon after the step."""
        old = self.entry(name)
        if old is None:
            raise PrivacyBudgetExceeded(f"the ledger has no entry {name!r} to replace")
        new = self._entry(name, event, populations, note, details)
        entries = [new if e is old else e for e in self.entries]
        eps = self._check(entries, name)
        self.entries = entries
        return eps

    def absorb(self, recorded: "PrivacyLedger", exclude: str | None = None) -> float:
        """Make this ledger hold every entry of ``recorded`` (e.g. the ledger saved in a
        checkpoint being resumed) followed by its own entries that ``recorded`` lacks; raise
        ``PrivacyBudgetExceeded`` (changing nothing) if that exceeds this ledger's budget or
        the two ledgers account differently (delta, neighbouring relation, unit). Own entries
        named ``exclude`` are dropped: ``recorded`` is authoritative for that step."""
        for f in ("delta", "neighboring", "unit"):
            if getattr(self, f) != getattr(recorded, f):
                raise PrivacyBudgetExceeded(
                    f"the recorded ledger has {f}={getattr(recorded, f)!r} but this one "
                    f"{getattr(self, f)!r}: their costs cannot be combined")
        own = [e for e in self.entries if e.name != exclude
               and not any(e.same_release(r) for r in recorded.entries)]
        entries = list(recorded.entries) + own
        eps = self._check(entries, "recorded ledger")
        self.entries = entries
        return eps

    @staticmethod
    def _entry(name, event, populations, note, details) -> LedgerEntry:
        populations = tuple(populations)
        if not populations:
            raise ValueError("an entry must touch at least one population")
        if isinstance(event, dpa.NonPrivateDpEvent):  # infinite epsilon: never within a budget
            raise PrivacyBudgetExceeded(
                f"step {name!r} is not private (epsilon = inf) and cannot be spent; record an "
                "explicit non-private choice with record_nonprivate")
        return LedgerEntry(name, event, populations, note, time.time(), dict(details or {}))

    def _check(self, entries: list[LedgerEntry], name: str) -> float:
        """The budget bounds the DP entries; non-private ones (recorded on request, epsilon
        infinite) are taken as public here and reported as such."""
        entries = [e for e in entries if not e.nonprivate]
        pops = sorted({p for e in entries for p in e.populations})
        try:
            eps = max((self._epsilon_of([e for e in entries if p in e.populations])[0] for p in pops),
                      default=0.0)
        except dpa.UnsupportedEventError as err:
            raise PrivacyBudgetExceeded(
                f"cannot account for step {name!r} under {self.neighboring} neighbouring: {err}"
            ) from err
        if not eps <= self.epsilon:  # no slack: an amount over the budget, however small, is refused
            raise PrivacyBudgetExceeded(
                f"step {name!r} would raise epsilon to {eps:.4g} > budget {self.epsilon:g} "
                f"(delta={self.delta:g}; already spent {self.spent_if_public():.4g}); nothing was run")
        return eps

    def record_post_processing(self, name: str, populations: Iterable[str] = ("users",),
                               note: str = "post-processing of DP outputs: no privacy cost") -> None:
        self.entries.append(LedgerEntry(name, dpa.NoOpDpEvent(), tuple(populations), note, time.time()))

    def record_nonprivate(self, name: str, populations: Iterable[str] = ("users",),
                          note: str = "", details: dict | None = None) -> None:
        """Record a release made from private data without DP (e.g. a vocabulary of the users'
        own words, chosen explicitly): a ``NonPrivateDpEvent``. Never refused — the choice was
        the caller's — but from now on ``spent()`` is infinite on ``populations``; the budget
        and ``spent_if_public()`` take this entry as public. ``note`` says what was released."""
        populations = tuple(populations)
        if not populations:
            raise ValueError("an entry must touch at least one population")
        self.entries.append(LedgerEntry(name, dpa.NonPrivateDpEvent(), populations,
                                        note or "NON-PRIVATE: computed from private data without DP",
                                        time.time(), dict(details or {})))

    # ------------------------------------------------------------------ persistence
    def report(self) -> dict:
        """Budget, spent epsilon (per population) and every entry with its own epsilon."""
        rows = []
        for e in self.entries:
            own = self._epsilon_of([e])
            row = {"name": e.name, "populations": list(e.populations), "note": e.note,
                   "epsilon_alone": own[0], "accountant": own[1]}
            if e.details:
                row["details"] = {k: v for k, v in e.details.items() if k != "executed_event"}
            if e.details.get("executed_event"):  # a simulated population was charged (see details)
                row["epsilon_executed_alone"] = self._epsilon_of(
                    [dataclasses.replace(e, event=event_from_json(e.details["executed_event"]))])[0]
            rows.append(row)
        out = {"budget_epsilon": self.epsilon, "delta": self.delta, "unit": self.unit,
               "neighboring": self.neighboring, "spent_epsilon": self.spent(),
               "by_population": self.epsilon_by_population(), "entries": rows}
        if self.simulated:
            out.update(spent_epsilon_executed=self.spent_executed(),
                       simulated_note=("spent_epsilon is that of a simulated population (noise of a "
                                       "larger cohort, noise_cohort_size); spent_epsilon_executed is "
                                       "the epsilon of the runs actually executed"))
        if self.nonprivate_entries:
            out.update(
                nonprivate_entries=self.nonprivate_entries,
                spent_epsilon_if_public=self.spent_if_public(),
                by_population_if_public=self.epsilon_by_population(if_public=True),
                nonprivate_note=("NON-PRIVATE: the entries " + ", ".join(map(repr, self.nonprivate_entries))
                                 + " were computed from private data without DP, so epsilon is "
                                 "infinite; spent_epsilon_if_public is the epsilon that holds if "
                                 "they are taken as public"))
        return out

    def to_dict(self) -> dict:
        return {"epsilon": self.epsilon, "delta": self.delta, "neighboring": self.neighboring,
                "unit": self.unit, "accountant": self.accountant,
                "entries": [{"name": e.name, "event": event_to_json(e.event),
                             "populations": list(e.populations), "note": e.note, "time": e.time,
                             **({"details": e.details} if e.details else {})}
                            for e in self.entries]}

    @classmethod
    def from_dict(cls, d: dict) -> "PrivacyLedger":
        led = cls(d["epsilon"], d["delta"], d.get("neighboring", "add_remove"),
                  d.get("unit", "user"), d.get("accountant", "best"))
        led.entries = [LedgerEntry(e["name"], event_from_json(e["event"]), tuple(e["populations"]),
                                   e.get("note", ""), e.get("time", 0.0), dict(e.get("details", {})))
                       for e in d["entries"]]
        return led

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> "PrivacyLedger":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def __repr__(self):
        extra = (f", {self.spent_if_public():.4g} if {self.nonprivate_entries} are public"
                 if self.nonprivate_entries else "")
        return (f"PrivacyLedger(spent={self.spent():.4g}{extra} of epsilon={self.epsilon:g}, "
                f"delta={self.delta:g}, unit={self.unit}, entries={len(self.entries)})")
