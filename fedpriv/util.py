"""Small helpers shared across fedpriv: power-of-two bucketing, argument checks, phase timing.

Power-of-two sizes bound how many shapes a jitted function compiles for (cohort capacity, lane
depth, FreD's chunked vmaps, tree depth): one bucketing rule, here.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import time

__all__ = ["next_pow2", "prev_pow2", "check_int", "check_positive", "PhaseTimer", "MAX_DELTA", "check_delta"]


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, int(n - 1).bit_length())


def prev_pow2(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"prev_pow2 needs n >= 1, got {n}")
    return 1 << (int(n).bit_length() - 1)


def check_int(value, name: str, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum`` (bools and non-integral numbers refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_positive(value, name: str, allow_zero: bool = False) -> float:
    """``value`` as a finite float > 0 (>= 0 with ``allow_zero``)."""
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0))
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


# The largest delta accepted anywhere a guarantee is stated (compute_epsilon, calibration, the
# ledger, the CLI, every config's delta fields): an (epsilon, delta) guarantee may fail outright
# with probability delta, so delta must be far below 1 / (number of users); every federated
# population has hundreds of users or more (the papers: delta = 1e-6, FreD 2e-6). A delta of
# 0.1 or 0.999999 would be reported as a guarantee while protecting no one.
MAX_DELTA = 1e-3


def check_delta(delta: float) -> float:
    """``delta`` as a float if it is a number in ``(0, MAX_DELTA]`` (see :data:`MAX_DELTA`)."""
    if not (isinstance(delta, numbers.Real) and not isinstance(delta, bool) and 0 < delta <= MAX_DELTA):
        raise ValueError(f"delta must be in (0, {MAX_DELTA:g}], got {delta!r} (a guarantee that fails "
                         "with probability delta: it must be far below 1 / the number of users)")
    return float(delta)


class PhaseTimer:
    """Wall and CPU seconds per phase of a run (``time.perf_counter`` / ``time.process_time``),
    accumulated over calls: ``with phases("data"): ...`` or ``phases.timed(name, fn)``.
    ``exclude``: phases timed inside this one are subtracted from it (no double counting).
    ``as_dict()``: ``{phase: {"wall": s, "cpu": s}}`` (this session only; a resumed run's
    earlier sessions are not included)."""

    def __init__(self):
        self.wall: dict = {}
        self.cpu: dict = {}

    def __call__(self, name: str, exclude=()):
        @contextlib.contextmanager
        def phase():
            before = {k: (self.wall.get(k, 0.0), self.cpu.get(k, 0.0)) for k in exclude}
            t, c = time.perf_counter(), time.process_time()
            try:
                yield
            finally:
                dw, dc = time.perf_counter() - t, time.process_time() - c
                for k, (w0, c0) in before.items():
                    dw -= self.wall.get(k, 0.0) - w0
                    dc -= self.cpu.get(k, 0.0) - c0
                self.wall[name] = self.wall.get(name, 0.0) + dw
                self.cpu[name] = self.cpu.get(name, 0.0) + dc
        return phase()

    def timed(self, name: str, fn):
        def wrapped(*a, **k):
            with self(name):
                return fn(*a, **k)
        return wrapped

    def as_dict(self) -> dict:
        return {k: {"wall": round(self.wall[k], 3), "cpu": round(self.cpu[k], 3)} for k in self.wall}
