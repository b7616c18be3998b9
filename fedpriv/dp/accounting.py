"""Privacy accounting with ``dp_accounting`` (RDP and PLD) for the mechanisms of fedpriv.

Conventions (DESIGN.md): the unit of privacy is the user; the noise multiplier ``z`` is the
noise std on a *sum* over the clip norm (per tree node for DP-FTRL).

Events:
* DP-FTRL, one pass (each client at most once in ``rounds`` rounds, Kairouz et al. 2021):
  ``SingleEpochTreeAggregationDpEvent(z, rounds)``; with ``epochs=K`` restarts (a client at
  most once per tree) one tree per epoch, composed (App. D of Kairouz et al.).
* DP-FedAvg with Poisson sampling (McMahan et al. 2018): ``rounds`` x
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` (add/remove-one-user).
* DP-FedAvg with fixed-size sampling without replacement: ``rounds`` x
  ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(z / 2))`` under *replace-one*
  neighbouring (Wang, Balle, Kasiviswanathan 2019, Thm. 27): replacing one user moves a
  sum of updates clipped to C by up to 2C, so the multiplier relative to that sensitivity
  is z/2.

Add/remove-one neighbouring is accounted with RDP under ``REPLACE_SPECIAL`` (the relation
``dp_accounting`` requires for tree aggregation; for Gaussian and Poisson-sampled Gaussian
events it equals add/remove) and with PLD under ``ADD_OR_REMOVE_ONE`` where PLD supports
every event. Pure-DP events (Laplace, discrete Laplace/Geometric) that RDP does not support
are added by basic composition. The reported epsilon is the smallest of the valid bounds.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import dp_accounting as dpa
from dp_accounting import pld, rdp

NeighborRel = dpa.NeighboringRelation
NEIGHBORING = ("add_remove", "replace_one")


# ----------------------------------------------------------------------------- validation
def check_epsilon(epsilon: float) -> float:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def check_delta(delta: float) -> float:
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def check_rounds(rounds: int) -> int:
    if int(rounds) != rounds or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    return int(rounds)


def check_sampling_rate(q: float) -> float:
    if not (isinstance(q, (int, float)) and 0 < q <= 1):
        raise ValueError(f"sampling rate must be in (0, 1], got {q!r}")
    return float(q)


def check_noise_multiplier(z: float) -> float:
    if not (isinstance(z, (int, float)) and z >= 0 and not math.isnan(z)):
        raise ValueError(f"noise multiplier must be >= 0, got {z!r}")
    return float(z)


# ----------------------------------------------------------------------------- events
def tree_steps_per_epoch(rounds: int, epochs: int = 1) -> list[int]:
    """Split ``rounds`` into ``epochs`` trees of (nearly) equal size, earlier trees larger."""
    rounds, epochs = check_rounds(rounds), int(epochs)
    if epochs < 1 or epochs > rounds:
        raise ValueError(f"epochs must be in [1, rounds={rounds}], got {epochs}")
    base, extra = divmod(rounds, epochs)
    return [base + (1 if i < extra else 0) for i in range(epochs)]


def dp_ftrl_event(noise_multiplier: float, rounds: int, epochs: int = 1,
                  steps_per_tree: Sequence[int] | None = None) -> dpa.DpEvent:
    """DP-FTRL with tree aggregation; one tree per epoch, each client at most once per tree.

    Args:
      noise_multiplier: per-node noise std / clip norm.
      rounds: total rounds T.
      epochs: number of passes K over the clients (trees restart every epoch).
      steps_per_tree: explicit tree sizes (overrides ``rounds``/``epochs``), e.g. from the
        sampler's real epoch lengths.
    """
    z = check_noise_multiplier(noise_multiplier)
    steps = list(steps_per_tree) if steps_per_tree is not None else tree_steps_per_epoch(rounds, epochs)
    if len(steps) == 1:
        return dpa.SingleEpochTreeAggregationDpEvent(z, steps[0])
    return dpa.ComposedDpEvent([dpa.SingleEpochTreeAggregationDpEvent(z, s) for s in steps])


def dp_fedavg_poisson_event(noise_multiplier: float, sampling_rate: float, rounds: int) -> dpa.DpEvent:
    """DP-FedAvg: ``rounds`` Poisson-sampled Gaussian sums (add/remove one user)."""
    return dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(check_sampling_rate(sampling_rate),
                                  dpa.GaussianDpEvent(check_noise_multiplier(noise_multiplier))),
        check_rounds(rounds))


def dp_fedavg_wor_event(noise_multiplier: float, population: int, cohort: int, rounds: int) -> dpa.DpEvent:
    """DP-FedAvg with fixed-size cohorts sampled without replacement (replace-one users)."""
    if not (1 <= cohort <= population):
        raise ValueError(f"need 1 <= cohort ({cohort}) <= population ({population})")
    z = check_noise_multiplier(noise_multiplier)
    return dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(int(population), int(cohort), dpa.GaussianDpEvent(z / 2.0)),
        check_rounds(rounds))


# ----------------------------------------------------------------------------- epsilon
def _flatten(event: dpa.DpEvent, count: int = 1):
    """Yield (leaf_event, count) pairs through Composed/SelfComposed wrappers."""
    if isinstance(event, dpa.SelfComposedDpEvent):
        yield from _flatten(event.event, count * event.count)
    elif isinstance(event, dpa.ComposedDpEvent):
        for e in event.events:
            yield from _flatten(e, count)
    else:
        yield event, count


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
    acc = rdp.RdpAccountant(neighboring_relation=rel)
    extra = 0.0
    for ev in events:
        for leaf, count in _flatten(ev):
            if isinstance(leaf, dpa.NoOpDpEvent):
                continue
            if acc.supports(leaf):
                acc.compose(leaf, count)
                continue
            pe = pure_epsilon(leaf)
            if pe is None:
                return None
            extra += count * pe
    return acc.get_epsilon(delta) + extra


_PLD_MIN_Z = 0.3


def _pld_epsilon(events, delta, neighboring):
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
            if isinstance(inner, dpa.GaussianDpEvent) and inner.noise_multiplier < _PLD_MIN_Z:
                return None  # PLD discretisation explodes in memory; RDP covers this case
            acc.compose(leaf, count)
    return acc.get_epsilon(delta)


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
      ``(epsilon, accountant_name)``.

    Raises:
      dp_accounting.UnsupportedEventError if no accountant supports every event (fail closed).
    """
    delta = check_delta(delta)
    if neighboring not in NEIGHBORING:
        raise ValueError(f"neighboring must be one of {NEIGHBORING}, got {neighboring!r}")
    if isinstance(events, dpa.DpEvent):
        events = [events]
    events = list(events)
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
    for fn in names[accountant]:
        eps = fn(events, delta, neighboring)
        if eps is not None:
            results.append((float(eps), fn.__name__.split("_")[1]))
    if not results:
        raise dpa.UnsupportedEventError(
            f"no {accountant} accountant supports these events under {neighboring} "
            f"neighbouring: {events}")
    if len(_EPSILON_CACHE) >= _EPSILON_CACHE_SIZE:
        _EPSILON_CACHE.clear()
    _EPSILON_CACHE[key] = min(results)
    return _EPSILON_CACHE[key]


def calibrate_noise_multiplier(make_event: Callable[[float], dpa.DpEvent], epsilon: float,
                               delta: float, neighboring: str = "add_remove",
                               accountant: str = "rdp", tol: float = 1e-4) -> float:
    """Smallest noise multiplier whose event has epsilon <= ``epsilon`` at ``delta``.

    Bisection (``dp_accounting.calibrate_dp_mechanism``) on ``compute_epsilon``.
    """
    check_epsilon(epsilon)
    check_delta(delta)

    class _Acc(dpa.PrivacyAccountant):  # adapter so calibrate_dp_mechanism can drive us
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

    bracket = dpa.LowerEndpointAndGuess(0.1, 1.0)
    z = dpa.calibrate_dp_mechanism(_Acc, make_event, epsilon, delta, bracket, tol=tol)
    # The bisection returns the upper end of its final interval: epsilon(z) <= target.
    return float(z)
