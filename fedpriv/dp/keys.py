"""Purpose-tagged PRNG keys: no two releases ever share noise (docs/design.md §3).

Every private release derives its key from the run's root key by folding in a distinct tag
per level (stage, run/row, purpose), e.g. ``tagged_key(seed, "fred", "mean-noise")`` and
``tagged_key(seed, "fl-training", "noise")``. Tags are strings or ints; a string is folded in as
its CRC-32 (stable across processes and Python versions, unlike ``hash``).
"""
from __future__ import annotations

import zlib

import jax
import numpy as np


def tag_value(tag) -> int:
    """The 31-bit integer folded into a key for ``tag`` (str -> CRC-32, int -> itself)."""
    if isinstance(tag, str):
        return zlib.crc32(tag.encode("utf-8")) & 0x7FFFFFFF
    if isinstance(tag, int) and not isinstance(tag, bool) and 0 <= tag < 2**31:
        return int(tag)
    raise ValueError(f"a key tag must be a string or an int in [0, 2^31), got {tag!r}")


def tagged_key(key_or_seed, *tags):
    """``fold_in`` each tag in turn into ``key_or_seed`` (a typed PRNG key or an int seed)."""
    key = jax.random.key(key_or_seed) if isinstance(key_or_seed, int) else key_or_seed
    for t in tags:
        key = jax.random.fold_in(key, tag_value(t))
    return key


def numpy_generator(key_or_seed, *tags) -> np.random.Generator:
    """A NumPy ``Generator`` for host-side releases (e.g. Geometric noise), seeded from
    ``tagged_key(key_or_seed, *tags)``'s key data: tagged like every JAX release."""
    data = np.asarray(jax.random.key_data(tagged_key(key_or_seed, *tags)), np.uint32).ravel()
    return np.random.default_rng(np.random.SeedSequence([int(x) for x in data]))
