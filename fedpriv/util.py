"""Small helpers shared across fedpriv: power-of-two bucketing and argument checks.

Power-of-two sizes bound how many shapes a jitted function compiles for (cohort capacity, lane
depth, FreD's chunked vmaps, tree depth): one bucketing rule, here.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["next_pow2", "prev_pow2", "check_int", "check_positive"]


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

