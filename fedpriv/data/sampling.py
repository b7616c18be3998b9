"""Client-level sampling shared by text and token datasets (Wang et al. 2023, §2).

Splits into train/validation/test are *by client* (whole users go to one split) with an explicit
seed (:func:`split_client_ids`); per-client caps keep the first examples or a seeded random
subset (:func:`cap_examples`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedpriv.data.errors import ConfigError

__all__ = ["split_client_ids", "cap_examples", "check_max_examples"]


def split_client_ids(client_ids: Sequence[str], fractions: Sequence[float], seed: int
                     ) -> tuple[list[str], ...]:
    """Randomly partition client ids into ``len(fractions)`` disjoint groups.

    The ids are sorted, permuted with ``np.random.default_rng(seed)``, and cut at
    ``floor(cumsum(fractions) * n)`` (fractions are normalised to sum to 1); the rounding
    remainder goes to the first group. Same ids + fractions + seed -> same split.

    Raises:
      ValueError: negative fractions, or a group with a positive fraction ends up empty.
    """
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.ndim != 1 or fr.size == 0 or np.any(fr < 0) or fr.sum() <= 0:
        raise ValueError(f"fractions must be non-negative with a positive sum, got {fractions}")
    fr = fr / fr.sum()
    ids = sorted(client_ids)
    n = len(ids)
    perm = np.random.default_rng(seed).permutation(n)
    sizes = np.floor(fr * n).astype(np.int64)
    sizes[0] += n - sizes.sum()
    groups: list[list[str]] = []
    start = 0
    for i, size in enumerate(sizes):
        if fr[i] > 0 and size == 0:
            raise ValueError(f"split {i} (fraction {fr[i]:.3g}) gets no client out of {n}; "
                             "use fewer splits or more clients")
        groups.append([ids[j] for j in perm[start:start + size]])
        start += size
    return tuple(groups)


def check_max_examples(value, name: str = "max_examples_per_client") -> int | None:
    """``value`` if it is None (no cap) or an integer >= 1 (a cap of 0 or -1 would silently drop
    every client or slice off the last example); else :class:`ConfigError` naming ``name``."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be None (no cap) or an integer >= 1, got {value!r}")
    return int(value)


def cap_examples(examples: Sequence[str], max_examples: int | None, rng: np.random.Generator | None
                 ) -> list[str]:
    """At most ``max_examples`` of ``examples``: the first ones if ``rng`` is None, else a
    uniformly random subset drawn with ``rng`` (kept in original order). ``max_examples``: None
    (all) or an integer >= 1 (else :class:`ConfigError` naming ``max_examples_per_client``)."""
    check_max_examples(max_examples)
    if max_examples is None or len(examples) <= max_examples:
        return list(examples)
    if rng is None:
        return list(examples[:max_examples])
    keep = np.sort(rng.choice(len(examples), size=max_examples, replace=False))
    return [examples[i] for i in keep]
