"""Privacy accounting with ``dp_accounting`` (RDP and PLD) for the mechanisms of fedpriv.

Conventions (docs/design.md §3): the unit of privacy is the user; the noise multiplier ``z`` is the
noise std on a *sum* over the clip norm (per tree node for DP-FTRL).

Events:
* DP-FTRL (Kairouz et al. 2021): each client at most once per tree; the tree restarts every
  epoch of ``R`` rounds, so ``T`` rounds are ``T // R`` full trees of ``R`` leaves plus a
  remainder tree of ``T % R`` leaves (``epoch_lengths``), composed (App. D):
  ``dp_ftrl_event(z, T, rounds_per_epoch=R)`` — the one function the engine
  (``ShuffledPassSampler``) and the CLI both use.
* DP-FedAvg with Poisson sampling (McMahan et al. 2018): ``rounds`` x
  ``PoissonSampledDpEvent(q, inner)`` (add/remove-one user), ``inner`` = what one round
  releases about its cohort, e.g. ``GaussianDpEvent(z)`` or, with adaptive clipping, the pair
  ``ComposedDpEvent([GaussianDpEvent(z), GaussianDpEvent(2 sigma_b)])`` computed on the *same*
  sampled cohort — one subsampled mechanism, never two independently sampled ones
  (``poisson_sampled_event``).
* DP-FedAvg with fixed-size sampling without replacement: ``rounds`` x
  ``SampledWithoutReplacementDpEvent(N, m, inner')`` under *replace-one* neighbouring (Wang,
  Balle, Kasiviswanathan 2019, Thm. 27), ``inner'`` = ``inner`` with every Gaussian multiplier
  halved (``replace_one_event``): replacing one user moves a sum of updates clipped to C by up
  to 2C, and a centred clip count by 1 = 2 x 1/2 (``wor_sampled_event``).

A sampled composition of Gaussians is, exactly, one Gaussian with multiplier
``(sum_i z_i^-2)^-1/2`` (the pair's joint L2 sensitivity over its noise); ``compute_epsilon``
rewrites it so before calling ``dp_accounting`` (``canonical_event``). That lets PLD account for
it, and avoids a ``dp_accounting`` 0.6 pitfall: its own reduction returns the *first*
multiplier when one of them is a Python ``int`` (``Composed([Gaussian(1), Gaussian(1)])``
counted as ``Gaussian(1)``, not ``Gaussian(0.707)``).

Add/remove-one neighbouring is accounted with RDP under ``REPLACE_SPECIAL`` (the relation
``dp_accounting`` requires for tree aggregation; for Gaussian and Poisson-sampled Gaussian
events it equals add/remove) and with PLD under ``ADD_OR_REMOVE_ONE`` where PLD supports
every event. Pure-DP events (Laplace, discrete Laplace/Geometric) that RDP does not support
are added by basic composition. The reported epsilon is the smallest of the valid bounds.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from typing import Callable, Iterable

import attr
import dp_accounting as dpa
import numpy as np
from dp_accounting import pld, rdp
from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

from fedpriv.dp import calibrated, ddg
from fedpriv.dp.noise import check_int
from fedpriv.errors import FedprivError
from fedpriv.util import MAX_DELTA, check_delta  # noqa: F401 (re-exported)

NeighborRel = dpa.NeighboringRelation
NEIGHBORING = ("add_remove", "replace_one")


# ----------------------------------------------------------------------------- validation
def check_epsilon(epsilon: float) -> float:
    if not (isinstance(epsilon, (int, float, np.integer, np.floating)) and not isinstance(epsilon, bool)
            and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


# the largest delta accepted anywhere a guarantee is stated, and its check: fedpriv.util (a leaf
# module, so the configs check their delta fields without importing the accountants)


MAX_ROUNDS = 10**6  # far beyond any FL run; PLD composition of 1e9 rounds does not finish


class CalibrationError(FedprivError, ValueError):
    """No noise multiplier can be calibrated for the requested (epsilon, delta)."""


class UnsupportedAccountingError(FedprivError, ValueError, dpa.UnsupportedEventError):
    """No accountant asked for supports these events (a ``dp_accounting.UnsupportedEventError``,
    and a user error: its message names the accountant, the events and what to use instead)."""


def check_rounds(rounds: int) -> int:
    rounds = check_int("rounds", rounds)
    if rounds > MAX_ROUNDS:
        raise ValueError(f"rounds must be <= {MAX_ROUNDS:,} (accounting for more is not "
                         f"supported), got {int(rounds):,}")
    return int(rounds)


def check_sampling_rate(q: float) -> float:
    if not (isinstance(q, (int, float, np.integer, np.floating)) and not isinstance(q, bool)
            and 0 < q <= 1):
        raise ValueError(f"sampling rate must be in (0, 1], got {q!r}")
    return float(q)


# Largest noise multiplier accepted: epsilon is ~0 long before it (1e6: 0.006 over 10 rounds at
# delta 1e-6, RDP), and dp_accounting overflows (OverflowError) near 1e150.
MAX_NOISE_MULTIPLIER = 1e6


def check_noise_multiplier(z: float) -> float:
    if not (isinstance(z, (int, float, np.integer, np.floating)) and not isinstance(z, bool)
            and 0 <= z <= MAX_NOISE_MULTIPLIER):
        raise ValueError(f"noise multiplier must be a number in [0, {MAX_NOISE_MULTIPLIER:g}], "
                         f"got {z!r}")
    return float(z)


# ----------------------------------------------------------------------------- events
def epoch_lengths(rounds: int, rounds_per_epoch: int | None = None) -> list[int]:
    """Rounds of each epoch (tree) in a run of ``rounds`` rounds with epochs of
    ``rounds_per_epoch`` rounds: ``[R] * (T // R) + [T % R]`` (no empty tail); ``None`` = one
    epoch of all ``rounds``."""
    rounds = check_rounds(rounds)
    if rounds_per_epoch is None:
        return [rounds]
    r = check_int("rounds_per_epoch", rounds_per_epoch)
    return [r] * (rounds // r) + ([rounds % r] if rounds % r else [])


def dp_ftrl_event(noise_multiplier: float, rounds: int, rounds_per_epoch: int | None = None, *,
                  epochs: int | None = None) -> dpa.DpEvent:
    """DP-FTRL with tree aggregation: one tree per epoch, each client at most once per tree.

    The single builder of DP-FTRL's event (engine and CLI): trees of ``epoch_lengths(rounds,
    rounds_per_epoch)`` leaves, composed.

    Args:
      noise_multiplier: per-node noise std / clip norm.
      rounds: total rounds T.
      rounds_per_epoch: R, rounds per epoch (= leaves per tree); None = one pass, one tree.
      epochs: K equal epochs; accepted only when K divides T (then it is R = T / K exactly),
        since otherwise no engine run has that tree layout.
    """
    z = float(check_noise_multiplier(noise_multiplier))
    rounds = check_rounds(rounds)
    if epochs is not None:
        if rounds_per_epoch is not None:
            raise ValueError("give rounds_per_epoch or epochs, not both")
        if isinstance(epochs, bool) or int(epochs) != epochs or not 1 <= epochs <= rounds \
                or rounds % int(epochs):
            raise ValueError(f"epochs must divide rounds={rounds} (epochs of R = rounds/epochs "
                             f"rounds); got {epochs!r}: give rounds_per_epoch instead")
        rounds_per_epoch = rounds // int(epochs)
    steps = epoch_lengths(rounds, rounds_per_epoch)
    if len(steps) == 1:
        return dpa.SingleEpochTreeAggregationDpEvent(z, steps[0])
    return dpa.ComposedDpEvent([dpa.SingleEpochTreeAggregationDpEvent(z, s) for s in steps])


def replace_one_event(event: dpa.DpEvent) -> dpa.DpEvent:
    """``event`` (Gaussians in add/remove-one sensitivity units) re-expressed under replace-one:
    every Gaussian multiplier halved (replacing one user moves the query by up to twice its
    add/remove sensitivity). Anything but Gaussians and their compositions fails closed."""
    if isinstance(event, dpa.GaussianDpEvent):
        return dpa.GaussianDpEvent(float(event.noise_multiplier) / 2.0)
    if isinstance(event, dpa.ComposedDpEvent):
        return dpa.ComposedDpEvent([replace_one_event(e) for e in event.events])
    if isinstance(event, dpa.SelfComposedDpEvent):
        return dpa.SelfComposedDpEvent(replace_one_event(event.event), event.count)
    raise ValueError(f"no replace-one form of {type(event).__name__}: only Gaussian releases "
                     "can be amplified by sampling without replacement here")


def poisson_sampled_event(inner: dpa.DpEvent, sampling_rate: float, rounds: int) -> dpa.DpEvent:
    """``rounds`` x ``PoissonSampledDpEvent(q, inner)``: ``inner`` is everything one round
    releases about its (one) sampled cohort (add/remove one user)."""
    return dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(check_sampling_rate(sampling_rate), inner), check_rounds(rounds))


def wor_sampled_event(inner: dpa.DpEvent, population: int, cohort: int, rounds: int) -> dpa.DpEvent:
    """``rounds`` x ``SampledWithoutReplacementDpEvent(N, m, replace_one_event(inner))``
    (replace-one users); ``inner`` in add/remove units, as for ``poisson_sampled_event``."""
    if not (1 <= cohort <= population):
        raise ValueError(f"need 1 <= cohort ({cohort}) <= population ({population})")
    return dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(int(population), int(cohort), replace_one_event(inner)),
        check_rounds(rounds))


def dp_fedavg_poisson_event(noise_multiplier: float, sampling_rate: float, rounds: int) -> dpa.DpEvent:
    """DP-FedAvg: ``rounds`` Poisson-sampled Gaussian sums (add/remove one user)."""
    z = float(check_noise_multiplier(noise_multiplier))
    return poisson_sampled_event(dpa.GaussianDpEvent(z), sampling_rate, rounds)


def dp_fedavg_wor_event(noise_multiplier: float, population: int, cohort: int, rounds: int) -> dpa.DpEvent:
    """DP-FedAvg with fixed-size cohorts sampled without replacement (replace-one users)."""
    z = float(check_noise_multiplier(noise_multiplier))
    return wor_sampled_event(dpa.GaussianDpEvent(z), population, cohort, rounds)


@dataclasses.dataclass(frozen=True)
class RoundRelease:
    """What one round of an FL algorithm releases about its cohort, in add/remove-one units.

    A sampler turns it into the event of a run (``sampler.amplified_event(release, rounds)``).

    Attributes:
      fresh: the event of everything released with fresh noise each round, computed on the
        round's cohort — e.g. ``GaussianDpEvent(z)`` for DP-FedAvg's noisy sum, plus
        ``GaussianDpEvent(2 sigma_b)`` for the adaptive clip count (one composed event: both are
        computed on the same cohort). None if nothing is.
      tree_noise_multiplier: DP-FTRL: the sum goes through a tree whose noise is correlated
        across the rounds of the tree (per-node multiplier); None otherwise.
      restart_every: DP-FTRL: leaves per tree.
    """
    fresh: dpa.DpEvent | None = None
    tree_noise_multiplier: float | None = None
    restart_every: int | None = None

    def __post_init__(self):
        if self.fresh is None and self.tree_noise_multiplier is None:
            raise ValueError("a round release must release something (fresh or tree noise)")
        if self.tree_noise_multiplier is not None and self.restart_every is None:
            raise ValueError("a tree release needs restart_every")

    @property
    def is_tree(self) -> bool:
        return self.tree_noise_multiplier is not None


# ----------------------------------------------------------------------------- epsilon
def _effective_multiplier(event: dpa.DpEvent) -> float | None:
    """Multiplier of the one Gaussian equivalent to a composition of Gaussians on the same data
    (``(sum_i z_i^-2)^-1/2``), or None if ``event`` is not made of Gaussians only."""
    if isinstance(event, dpa.GaussianDpEvent):
        return float(event.noise_multiplier)
    if isinstance(event, dpa.SelfComposedDpEvent):
        z = _effective_multiplier(event.event)
        return None if z is None else z / math.sqrt(event.count)
    if isinstance(event, dpa.ComposedDpEvent) and event.events:
        zs = [_effective_multiplier(e) for e in event.events]
        if any(z is None for z in zs):
            return None
        if any(z == 0 for z in zs):
            return 0.0
        return sum(z ** -2 for z in zs) ** -0.5
    return None


def canonical_event(event: dpa.DpEvent) -> dpa.DpEvent:
    """``event`` with float multipliers, and a sampled composition of Gaussians replaced by its
    exactly equivalent single Gaussian (see the module docstring); anything else unchanged."""
    if isinstance(event, dpa.GaussianDpEvent):
        return dpa.GaussianDpEvent(float(event.noise_multiplier))
    if isinstance(event, (dpa.PoissonSampledDpEvent, dpa.SampledWithoutReplacementDpEvent)):
        z = _effective_multiplier(event.event)
        if z is None:
            return event  # left to the accountants, which refuse what they cannot account
        if isinstance(event, dpa.PoissonSampledDpEvent):
            return dpa.PoissonSampledDpEvent(event.sampling_probability, dpa.GaussianDpEvent(z))
        return dpa.SampledWithoutReplacementDpEvent(event.source_dataset_size, event.sample_size,
                                                    dpa.GaussianDpEvent(z))
    return event


def _flatten(event: dpa.DpEvent, count: int = 1):
    """Yield (canonical leaf_event, count) pairs through Composed/SelfComposed wrappers."""
    if isinstance(event, dpa.SelfComposedDpEvent):
        yield from _flatten(event.event, count * event.count)
    elif isinstance(event, dpa.ComposedDpEvent):
        for e in event.events:
            yield from _flatten(e, count)
    else:
        yield canonical_event(event), count


def check_event(event, where: str = "event") -> None:
    """Refuse (``ValueError`` naming the event and field) an event that is not a
    ``dp_accounting.DpEvent`` or has a parameter that is not a number (a string, a bool) or is
    NaN, at any depth: RDP would otherwise account ``GaussianDpEvent(nan)`` as epsilon 0."""
    if not isinstance(event, dpa.DpEvent):
        raise ValueError(f"{where} must be a dp_accounting DpEvent, got {type(event).__name__} {event!r}")
    for field in attr.fields(type(event)) if attr.has(type(event)) else ():
        if re.search(r"\bstr\b", getattr(field.type, "__name__", None) or str(field.type)):
            continue  # a declared text field (e.g. the DDG event's neighbouring relation)
        _check_event_value(getattr(event, field.name), f"{type(event).__name__}.{field.name}")


def _check_event_value(value, where: str) -> None:
    if isinstance(value, dpa.DpEvent):
        check_event(value, where)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_event_value(v, f"{where}[{i}]")
    elif isinstance(value, (bool, np.bool_, str, bytes)) or not isinstance(
            value, (int, float, np.integer, np.floating)) or math.isnan(value):
        raise ValueError(f"{where} must be a number, got {value!r}")


def pure_epsilon(event: dpa.DpEvent) -> float | None:
    """Pure-DP epsilon of a Laplace / discrete-Laplace (Geometric) event, else None."""
    if isinstance(event, dpa.LaplaceDpEvent):
        return math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier
    if isinstance(event, dpa.dp_event.DiscreteLaplaceDpEvent):
        return event.noise_parameter * event.sensitivity
    return None


class _QuietAbsl:
    """dp_accounting logs a warning per RDP order that fails to converge (harmless: the order is
    excluded from the minimum); at high sampling rates that floods the output."""

    def __enter__(self):
        from absl import logging as absl_logging
        self._logging, self._level = absl_logging, absl_logging.get_verbosity()
        absl_logging.set_verbosity(absl_logging.ERROR)

    def __exit__(self, *exc):
        self._logging.set_verbosity(self._level)


def _rdp_epsilon(events, delta, neighboring):
    with _QuietAbsl():
        return _rdp_epsilon_impl(events, delta, neighboring)


def _rdp_epsilon_impl(events, delta, neighboring):
    rel = NeighborRel.REPLACE_SPECIAL if neighboring == "add_remove" else NeighborRel.REPLACE_ONE
    leaves = [(leaf, count) for ev in events for leaf, count in _flatten(ev)
              if not isinstance(leaf, dpa.NoOpDpEvent)]
    secure = [(leaf, count) for leaf, count in leaves
              if isinstance(leaf, ddg.DistributedDiscreteGaussianDpEvent)]
    if any(leaf.neighboring != neighboring for leaf, _ in secure):
        return None  # its sensitivities are stated for another relation
    # the DDG bound (Kairouz et al. 2021, Prop. 14) is evaluated at integer orders: account
    # every event at those orders, then add the DDG curves to dp_accounting's RDP vector
    acc = rdp.RdpAccountant(orders=list(ddg.RDP_ORDERS) if secure else None,
                            neighboring_relation=rel)
    extra = 0.0
    for leaf, count in leaves:
        if isinstance(leaf, ddg.DistributedDiscreteGaussianDpEvent):
            continue
        if acc.supports(leaf):
            acc.compose(leaf, count)
            continue
        pe = pure_epsilon(leaf)
        if pe is None:
            return None
        extra += count * pe
    if not secure:
        return acc.get_epsilon(delta) + extra
    curve = getattr(acc, "_rdp", None)  # dp_accounting 0.6's RDP vector (at acc._orders)
    if curve is None or len(curve) != len(ddg.RDP_ORDERS):
        raise RuntimeError("dp_accounting's RdpAccountant changed: cannot add the DDG RDP curve")
    curve = np.asarray(curve, np.float64) + sum(count * ddg.event_rdp(leaf) for leaf, count in secure)
    return rdp.rdp_privacy_accountant.compute_epsilon(ddg.RDP_ORDERS, curve, delta)[0] + extra


# PLD accounts Gaussian releases from this noise multiplier on (below it its discretisation
# explodes in memory; RDP covers them): "pld" is refused for smaller ones, "best" uses RDP there.
PLD_MIN_NOISE_MULTIPLIER = 0.3
_PLD_MIN_Z = PLD_MIN_NOISE_MULTIPLIER


def _pld_epsilon(events, delta, neighboring, dry_run: bool = False):
    """PLD epsilon, or None where PLD does not apply; ``dry_run``: only whether it applies
    (True/None), nothing composed."""
    if neighboring != "add_remove":
        return None
    acc = pld.PLDAccountant(neighboring_relation=NeighborRel.ADD_OR_REMOVE_ONE)
    for ev in events:
        for leaf, count in _flatten(ev):
            if isinstance(leaf, dpa.NoOpDpEvent):
                continue
            if not acc.supports(leaf):
                return None
            inner = leaf.event if isinstance(leaf, dpa.PoissonSampledDpEvent) else leaf
            if isinstance(inner, dpa.GaussianDpEvent) and math.isinf(inner.noise_multiplier):
                continue  # infinite noise releases nothing (RDP: epsilon 0); PLD cannot discretise it
            if isinstance(inner, dpa.GaussianDpEvent) and inner.noise_multiplier < _PLD_MIN_Z:
                return None  # PLD discretisation explodes in memory; RDP covers this case
            if not dry_run:
                acc.compose(leaf, count)
    return True if dry_run else acc.get_epsilon(delta)


# PLD's cost grows with the privacy loss it discretises: measured on 2 shared CPU cores,
# 1e6 rounds at epsilon ~145 take ~15 s / 0.5 GB, 1e4 rounds at epsilon ~1,700 ~20 s / 1 GB,
# 1e5 rounds at ~15,000 ~80 s / 3.3 GB, 1e6 rounds at q = 0.5 > 240 s / 10 GB. Above this RDP
# epsilon, "best" reports RDP's bound (valid, and no privacy to speak of) and "pld" is refused.
MAX_PLD_EPSILON = 1000.0

_EPSILON_CACHE: dict = {}
_EPSILON_CACHE_SIZE = 4096


def compute_epsilon(events: dpa.DpEvent | Iterable[dpa.DpEvent], delta: float,
                    neighboring: str = "add_remove", accountant: str = "best") -> tuple[float, str]:
    """Epsilon at ``delta`` of the composition of ``events``.

    Args:
      events: one event or a list of events on the same users.
      delta: target delta in (0, 1).
      neighboring: "add_remove" (user added/removed) or "replace_one".
      accountant: "rdp", "pld", or "best" (smallest valid bound).

    Returns:
      ``(epsilon, accountant_name)``: the name says which bound was reported ("best" gives
      "rdp" where PLD does not apply or its RDP epsilon exceeds ``MAX_PLD_EPSILON``, so the
      answer comes in bounded time and memory).

    Raises:
      dp_accounting.UnsupportedEventError if no accountant supports every event (fail closed);
      ValueError for "pld" when RDP's epsilon exceeds ``MAX_PLD_EPSILON`` (PLD would not finish
      in bounded time and memory).
    """
    delta = check_delta(delta)
    if neighboring not in NEIGHBORING:
        raise ValueError(f"neighboring must be one of {NEIGHBORING}, got {neighboring!r}")
    if isinstance(events, dpa.DpEvent):
        events = [events]
    if not isinstance(events, Iterable):
        raise ValueError(f"events must be a dp_accounting DpEvent or a list of them, got "
                         f"{type(events).__name__} {events!r}")
    events = list(events)
    for i, ev in enumerate(events):
        check_event(ev, f"events[{i}]")
    if not events:
        return 0.0, "none"
    names = {"rdp": [_rdp_epsilon], "pld": [_pld_epsilon], "best": [_rdp_epsilon, _pld_epsilon]}
    if accountant not in names:
        raise ValueError(f"accountant must be rdp, pld or best, got {accountant!r}")
    # Memoised: events are immutable and their repr is deterministic; PLD/RDP of a subsampled
    # Gaussian take ~1 s, and ledgers/loops ask for the same composition again and again.
    key = (repr(events), delta, neighboring, accountant)
    if key in _EPSILON_CACHE:
        return _EPSILON_CACHE[key]
    results = []
    eps_rdp = None
    if accountant in ("best", "pld"):
        eps_rdp = _rdp_epsilon(events, delta, neighboring)
        if accountant == "best" and eps_rdp is not None:
            results.append((float(eps_rdp), "rdp"))
        if eps_rdp is not None and eps_rdp > MAX_PLD_EPSILON:
            if accountant == "pld" and _pld_epsilon(events, delta, neighboring, dry_run=True):
                raise ValueError(f"the PLD accountant is limited to epsilon <= {MAX_PLD_EPSILON:g} "
                                 f"(RDP gives {eps_rdp:.4g} here: PLD would not finish in bounded "
                                 "time and memory); use --accountant rdp or best")
        else:
            eps = _pld_epsilon(events, delta, neighboring)
            if eps is not None:
                results.append((float(eps), "pld"))
    else:
        eps = _rdp_epsilon(events, delta, neighboring)
        if eps is not None:
            results.append((float(eps), "rdp"))
    if not results:
        kinds = ", ".join(sorted({type(leaf).__name__ for ev in events for leaf, _ in _flatten(ev)}))
        hint = (" (PLD here: add/remove only, Gaussian noise multipliers >= "
                f"{_PLD_MIN_Z}; try accountant 'rdp' or 'best')" if accountant == "pld" else "")
        raise UnsupportedAccountingError(
            f"no {accountant} accountant supports these events under {neighboring} "
            f"neighbouring: {kinds}{hint}")
    if len(_EPSILON_CACHE) >= _EPSILON_CACHE_SIZE:
        _EPSILON_CACHE.clear()
    _EPSILON_CACHE[key] = min(results)
    return _EPSILON_CACHE[key]


class _PastMaximum(Exception):
    """The bracket search of ``calibrate_noise_multiplier`` walked past ``MAX_NOISE_MULTIPLIER``."""


def _adapter(neighboring: str, accountant: str) -> type:
    """A ``dp_accounting.PrivacyAccountant`` that ``calibrate_dp_mechanism`` can drive, whose
    epsilon is ``compute_epsilon``'s (``neighboring``, ``accountant``)."""
    class _Acc(dpa.PrivacyAccountant):
        def __init__(self):
            super().__init__(NeighborRel.ADD_OR_REMOVE_ONE)
            self.events = []

        def supports(self, event):
            return True

        def _maybe_compose(self, event, count, do_compose):
            if do_compose:
                self.events.append(dpa.SelfComposedDpEvent(event, count) if count != 1 else event)
            return None

        def get_epsilon(self, target_delta):
            return compute_epsilon(self.events, target_delta, neighboring, accountant)[0]
    return _Acc


def _bisect(acc_cls, make, epsilon, delta, bracket, tol, lowest, neighboring, accountant) -> float:
    """``calibrate_dp_mechanism`` from ``bracket``, with one-line errors for a target no
    multiplier in ``[lowest, MAX_NOISE_MULTIPLIER]`` reaches."""
    try:
        try:
            z = dpa.calibrate_dp_mechanism(acc_cls, make, epsilon, delta, bracket, tol=tol)
        except _PastMaximum:
            # the bracket search walked past the largest multiplier accepted
            eps_max = compute_epsilon(make(MAX_NOISE_MULTIPLIER), delta, neighboring, accountant)[0]
            if eps_max > epsilon:
                raise CalibrationError(
                    f"epsilon {epsilon:g} is too small to calibrate at delta {delta:g}: even the largest "
                    f"noise multiplier accepted ({MAX_NOISE_MULTIPLIER:g}) gives epsilon {eps_max:.4g}") from None
            z = dpa.calibrate_dp_mechanism(acc_cls, make, epsilon, delta,
                                           dpa.ExplicitBracketInterval(lowest, MAX_NOISE_MULTIPLIER), tol=tol)
    except NoBracketIntervalFoundError as err:
        eps_low = compute_epsilon(make(lowest), delta, neighboring, accountant)[0]
        if eps_low <= epsilon:
            raise CalibrationError(
                f"epsilon {epsilon:g} is too large to calibrate: even the smallest noise "
                f"multiplier tried ({lowest:g}) gives epsilon {eps_low:.4g}") from err
        raise CalibrationError(f"no noise multiplier reaches epsilon {epsilon:g} at delta "
                               f"{delta:g}") from err
    return z


def calibrate_noise_multiplier(make_event: Callable[[float], dpa.DpEvent], epsilon: float,
                               delta: float, neighboring: str = "add_remove",
                               accountant: str = "best", tol: float = 1e-4) -> float:
    """Smallest noise multiplier whose event has epsilon <= ``epsilon`` at ``delta``.

    Brent's method (``dp_accounting.calibrate_dp_mechanism``) on ``compute_epsilon``: the z
    returned has epsilon(z) <= ``epsilon`` and lies within ``tol`` of the smallest such z.
    ``accountant`` defaults to "best", the default of ``compute_epsilon``, the ledger and the
    CLI: z calibrated with the defaults is charged ~``epsilon`` (with "rdp" here and "best"
    there, a run would add more noise than it is charged for). Pass the accountant the run is
    charged with.

    The configs' calibrations are committed (``fedpriv.dp.calibrated``, written by ``python -m
    experiments.calibrations``): a tabulated z for this exact event is returned only after two
    evaluations show it is still this calibration's answer -- epsilon(z) <= ``epsilon`` and
    epsilon(z - tol) > ``epsilon`` -- so the result is the search's own z, at two evaluations
    instead of the search's ~25 (population_expansion:small's 16 stages: minutes -> seconds).
    Anything else, or an entry that fails either check, is searched.
    """
    check_epsilon(epsilon)
    check_delta(delta)
    z = _tabulated(make_event, epsilon, delta, neighboring, accountant, tol)
    if z is None:
        z = _search_noise_multiplier(make_event, epsilon, delta, neighboring, accountant, tol)
        if _RECORDING is not None:
            _RECORDING.append(CalibrationEntry(
                float(epsilon), float(delta), neighboring, accountant, float(tol), z,
                event_digest(make_event(z)),
                _is_answer(make_event, z, epsilon, delta, neighboring, accountant, tol)))
    return z


@dataclasses.dataclass(frozen=True)
class CalibrationEntry:
    """One calibration of ``calibrate_noise_multiplier``: its arguments, the z its search
    returned, the digest of ``make_event(z)`` (``event_digest``) and whether z passes the
    table's two checks (``_is_answer``; only then can it be tabulated)."""
    epsilon: float
    delta: float
    neighboring: str
    accountant: str
    tol: float
    z: float
    digest: str
    checked: bool = True

    @property
    def key(self) -> tuple:
        return (self.epsilon, self.delta, self.neighboring, self.accountant, self.tol)


def event_digest(event: dpa.DpEvent) -> str:
    """A short digest of ``repr(event)`` (dp_accounting's events are frozen dataclasses with a
    deterministic repr): the table's key for the event a calibration ended at."""
    return hashlib.sha256(repr(event).encode()).hexdigest()[:20]


# None, or a list that collects every calibration searched (experiments.calibrations)
_RECORDING: list | None = None
# False: never read the committed table (experiments.calibrations, tests of the search)
_USE_TABLE = True


def _table() -> dict:
    """``fedpriv.dp.calibrated.TABLE`` by (epsilon, delta, neighboring, accountant, tol)."""
    return calibrated.TABLE


def _tabulated(make_event, epsilon, delta, neighboring, accountant, tol) -> float | None:
    """The committed z of this calibration, checked by two evaluations (epsilon(z) <= target <
    epsilon(z - tol): with epsilon decreasing in z, the search's contract), else None."""
    if not _USE_TABLE:
        return None
    for z, digest in _table().get((float(epsilon), float(delta), neighboring, accountant, float(tol)), ()):
        try:
            mine = event_digest(make_event(z))
        except (ValueError, TypeError, ArithmeticError):  # another family's z, outside this one's range
            continue
        # an entry of this event that fails a check is stale (the accountant's numbers moved)
        if mine == digest and _is_answer(make_event, z, epsilon, delta, neighboring, accountant, tol):
            return z
    return None


def _is_answer(make_event, z, epsilon, delta, neighboring, accountant, tol) -> bool:
    """epsilon(z) <= ``epsilon`` < epsilon(z - tol): z meets the target, and no z smaller by
    ``tol`` does (epsilon decreases in z) -- the search's contract."""
    if z - tol <= 0:
        return False
    try:
        return (compute_epsilon(make_event(z), delta, neighboring, accountant)[0] <= epsilon
                < compute_epsilon(make_event(z - tol), delta, neighboring, accountant)[0])
    except (ValueError, dpa.UnsupportedEventError):
        return False


def _search_noise_multiplier(make_event, epsilon, delta, neighboring, accountant, tol) -> float:
    """``calibrate_noise_multiplier``'s search (no table)."""

    acc_cls = _adapter(neighboring, accountant)

    def make(z):  # the user's make_event, checked: a DpEvent, z within the accepted range
        if z > MAX_NOISE_MULTIPLIER:
            raise _PastMaximum
        event = make_event(z)
        if not isinstance(event, dpa.DpEvent):
            raise CalibrationError(f"make_event must return a dp_accounting DpEvent; make_event({z:g}) "
                                   f"returned {event!r}")
        return event

    lowest = 0.1
    low_accountant = "rdp" if accountant == "best" else accountant
    if accountant == "pld":
        # PLD accounts Gaussians only from _PLD_MIN_Z on: start where it applies (else refuse)
        z = lowest
        while z <= MAX_NOISE_MULTIPLIER and not _pld_epsilon([make(z)], delta, neighboring, dry_run=True):
            z = _PLD_MIN_Z if z < _PLD_MIN_Z else 2 * z
        lowest = z if z <= MAX_NOISE_MULTIPLIER else lowest
    # a target that even the smallest multiplier meets has no answer: say so before the search
    # (which would otherwise walk z past MAX_NOISE_MULTIPLIER looking for a bracket)
    eps_low = compute_epsilon(make(lowest), delta, neighboring, low_accountant)[0]
    if eps_low <= epsilon:
        floor = (f" (the pld accountant covers Gaussian noise multipliers >= {_PLD_MIN_Z} only: use "
                 "accountant 'rdp' or 'best')" if lowest != 0.1 else "")
        raise CalibrationError(
            f"epsilon {epsilon:g} is too large to calibrate: even the smallest noise "
            f"multiplier tried ({lowest:g}) gives epsilon {eps_low:.4g}{floor}")
    bracket = dpa.LowerEndpointAndGuess(lowest, max(1.0, 2 * lowest))
    if accountant == "best":
        # RDP's z is an upper end (best <= RDP); where PLD does not apply at it, "best" is RDP
        # and the search would be the same. Else bracket [z/2, z] when eps(z/2) > target:
        # PLD at a handful of points instead of the open-ended bracket search (~3x faster).
        z_rdp = _search_noise_multiplier(make_event, epsilon, delta, neighboring, "rdp", tol)
        if _pld_epsilon([make(z_rdp)], delta, neighboring, dry_run=True) is None:
            return z_rdp
        low = z_rdp / 2
        if low >= lowest and compute_epsilon(make(low), delta, neighboring, accountant)[0] > epsilon:
            bracket = dpa.ExplicitBracketInterval(low, z_rdp)
    z = _bisect(acc_cls, make, epsilon, delta, bracket, tol, lowest, neighboring, accountant)
    # The bisection returns the upper end of its final interval: epsilon(z) <= target.
    return float(z)


# ----------------------------------------------------------------------------- samplers' periods
def as_release(release) -> RoundRelease:
    """``release`` as a ``RoundRelease`` (a plain ``DpEvent`` is a fresh per-round release)."""
    if isinstance(release, RoundRelease):
        return release
    if isinstance(release, dpa.DpEvent):
        return RoundRelease(fresh=release)
    raise TypeError(f"expected a RoundRelease or a DpEvent, got {type(release).__name__}")


def periodic_event(release, rounds: int, period: int, participations: int) -> dpa.DpEvent:
    """The event of ``rounds`` rounds of a sampler that puts each client in at most one round of
    every ``period`` (an epoch of a shuffled pass, a min-separation group cycle) and in at most
    ``participations`` rounds: a tree must restart every ``period`` rounds, so each client is in
    each tree at most once (DP-FTRL's restarted-tree accounting, ``accounting.dp_ftrl_event``);
    a fresh release composes ``participations`` times. Any other restart is refused."""
    release = as_release(release)
    parts = []
    if release.is_tree:
        if release.restart_every != period:
            raise ValueError(f"tree restarts every {release.restart_every} rounds but the sampler's "
                             f"period (each client at most once in it) is {period} rounds: a client "
                             f"could appear twice in one tree")
        parts.append(dp_ftrl_event(release.tree_noise_multiplier, rounds, period))
    if release.fresh is not None:
        parts.append(dpa.SelfComposedDpEvent(release.fresh, participations))
    return parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)
